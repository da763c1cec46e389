"""How a runner hands an ONNX decoder its past: the seam between `DecoderRunner` and its two KV layouts.

A decoder with past takes each call's keys and values as tensors and gives back the new tokens' too; the
engine keeps them in blocks (kv_blocks.py). Two models want them two ways, and the runner picks one layout
when it is built (runner.py), then calls only this interface:

- `DenseLayout` (dense_layout.py): Hugging Face Optimum's `decoder_with_past` form. The past goes in as
  dense [batch, heads, past_len, head_dim] tensors, contexts right-aligned behind masked padding, and
  `present` comes back with the new tokens appended (the model's Concat copies the past).
- `SharedLayout` (shared_layout.py): ONNX Runtime's GroupQueryAttention with a shared past/present buffer
  (`past_present_share_buffer`). One buffer per KV tensor is bound as both past and present and written in
  place, contexts left-aligned and each row attending over its own length: no padding and no copy.

What stays in the runner is what both share: grouping the chunks, the new tokens' ids and positions, picking
the logits, writing prefill tokens to their blocks, and the statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .scheduler import ScheduledChunk


@dataclass(slots=True)
class Prefilled:
    """One prefill run's result, for the runner to write back and count: the logits [B, seq, vocab]; each
    KV tensor's values after the run ([B, heads, width, head_dim]); the column of each row's first new
    token in them; the context slots the run read (padding included); and when the session run started
    (`time.perf_counter_ns`: what came before is gather time)."""

    logits: np.ndarray
    outs: Sequence[np.ndarray]
    firsts: list[int]
    past_slots: int
    run_started_ns: int


class DecodeRun(Protocol):
    """A schedule's decode rows placed for one or more runs (`KVLayout.place`). The runner fills and
    advances `input_ids` and `positions` ([rows, 1]) between runs; the layout owns the past."""

    order: list[int]      # each row's chunk index in the group (-1: a free row)
    gathered: int         # rows whose past was gathered from blocks for these runs
    regrouped: int        # the group's tensors rebuilt (dense) or rows moved (shared) to place them
    input_ids: np.ndarray
    positions: np.ndarray

    def load(self, starts: list[int], token_ids: list[int], rows: Sequence[ScheduledChunk | None]) -> None:
        """Set `input_ids` and `positions` for the first run from each row's token and start."""

    def ready(self, context: int) -> int:
        """Make the next run's mask (`context`: the live rows' context slots); the slots it reads."""

    def run(self) -> np.ndarray:
        """The run; its logits [rows, 1, vocab] (valid until the next run)."""

    def finish(self, group: Sequence[ScheduledChunk], steps: int) -> None:
        """After the last of `steps` runs: the group keeps the rows' past and writes the filled blocks."""


class KVLayout(Protocol):
    """One way of giving a decoder its past (dense_layout.py, shared_layout.py). Called on the engine's
    thread by `DecoderRunner` only."""

    def check(self, where: str) -> None:
        """Refuse, at load, a model whose attention does not take its past the way this layout gives it,
        before it answers anything wrongly (a few one-token runs)."""

    def prefill_groups(self, chunks: Sequence[ScheduledChunk], groups: list[list[int]]) -> list[list[int]]:
        """The prefill groups (`prefill_groups`) as this layout can run them, one session run each."""

    def prefill(self, group: Sequence[ScheduledChunk], input_ids: np.ndarray,
                positions: np.ndarray) -> Prefilled:
        """Run prefill chunks over their cached context gathered from their blocks (`input_ids`,
        `positions`: [B, width], each row's tokens first)."""

    def place(self, group: Sequence[ScheduledChunk]) -> DecodeRun:
        """Place a step's decode chunks in the decode group's rows, gathering the joiners' past."""

    def clear(self) -> None:
        """Nobody is decoding: let go of the decode group's kept tensors."""
