"""Runs a step's chunks through an ONNX decoder with past, its keys and values kept in the engine's blocks.

The model takes and returns each call's KV cache as tensors; the engine keeps keys and values in fixed-size
blocks instead (kv_blocks.py), so that sequences grow, share prefixes and leave without moving each other's
memory. How the two meet is the model's KV layout (kv_layout.py), chosen once when the runner is built:

- `DenseLayout` (dense_layout.py): past in as dense tensors, contexts right-aligned behind masked padding,
  `present` = past + new out (Optimum's form);
- `SharedLayout` (shared_layout.py, `shared_kv`): one buffer per KV tensor bound as past and present, which
  the model (ONNX Runtime's GroupQueryAttention) writes in place, contexts left-aligned.

What both share is here:

- **Groups.** Dense tensors pad every row to the longest: a 256-token prefill chunk batched with decodes
  would make every decode compute 256 positions. So the decodes (one token each) run as one batch, and the
  prefill chunks in batches of similar length (`prefill_groups`), each batch one session run.
- **Scatter (run → blocks).** Only the new tokens' keys and values are written back into their blocks; the
  block tables stay the truth for admission, preemption and prefix sharing. A prefill's tokens are written at
  once; a decode's wait in the decode group's tensors until they fill a block or the row leaves
  (decode_group.py, shared_group.py).
- **Decode runs.** The rows are placed once per schedule (the layout keeps the decode group's past between
  steps), then each run's logits are picked and, in a multi-step decode, the picked tokens fed back.

Per step this costs, besides the model: for a steady decode group, a block's worth of keys and values written
per row every block_size steps; on a membership change, one copy of the continuing rows (dense) plus a
gather of the joining ones; for prefill chunks, a gather of their cached context (usually none) and a write
of their tokens. `RunnerStats` counts the time, and perf/bench_generate.py prints it. Called on the engine's
thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from .decoder_model import DecoderModel, RunShape
from .dense_layout import DenseLayout
from .kv_blocks import KVBlocks
from .kv_layout import KVLayout
from .lora import LoraShape
from .scheduler import ScheduledChunk
from .shared_group import SharedDecodeGroup
from .shared_layout import SharedLayout

__all__ = ["DecoderRunner", "RunShape", "RunnerStats", "prefill_groups"]


@dataclass(slots=True)
class RunnerStats:
    """Where a runner's time went, in nanoseconds, since it was made (or `reset`)."""

    steps: int = 0
    runs: int = 0             # session runs (a step runs one per group)
    tokens: int = 0           # new tokens computed
    past_slots: int = 0       # context slots gathered into dense past tensors, padding included
    padded_slots: int = 0     # of those, padding
    gather_ns: int = 0        # blocks → dense past, and the other inputs
    run_ns: int = 0           # ONNX Runtime
    decode_run_ns: int = 0    # of which, decode runs
    scatter_ns: int = 0       # present → blocks, and picking the logits
    decode_rows: int = 0      # decode rows run
    gathered_rows: int = 0    # of those, with their past gathered from blocks (not kept from the last step)
    free_rows: int = 0        # rows run masked out: a decode group's free rows (decode_group.py)
    rebuilds: int = 0         # decode runs whose group's tensors were rebuilt (not kept or filled in place)

    def reset(self) -> None:
        for name in self.__slots__:  # type: ignore[attr-defined]
            setattr(self, name, 0)


class DecoderRunner:
    """One ONNX Runtime session (decoder_model.py), the KV blocks' storage (kv_blocks.py) and the model's KV
    layout. `model`: the model file or bytes, with `options` the session options (one intra-op thread and no
    spinning, as engine/backends/onnxruntime.py sets them), `providers` its execution providers and
    `kv_shape` the folder's stated KV heads and head size (decoder_model.py); or a `DecoderModel` already
    made (the model folder's loader makes it first, to size the blocks from its KV shape:
    generate/serving/kv_budget.py), and then those three are not used. Made by the model folder's loader
    (or a benchmark); called by `GenerationEngine.step` (engine.py).

    On the CUDA or TensorRT provider (generate/serving/device.py) the blocks stay host memory and each run's
    tensors are host arrays that ONNX Runtime copies to the device and back: correct on any provider, not
    the fastest on a GPU. Not run on a GPU here (none in CI)."""

    def __init__(self, model: Path | bytes | DecoderModel, num_blocks: int, block_size: int,
                 options: ort.SessionOptions | None = None,
                 providers: Sequence[Any] = ("CPUExecutionProvider",), where: str = "model",
                 shared_kv: bool = False, max_len: int = 512, max_rows: int = 32,
                 kv_shape: tuple[int | None, int | None] = (None, None)) -> None:
        if isinstance(model, DecoderModel):
            decoder = model
        else:
            decoder = DecoderModel(model, options or ort.SessionOptions(), providers, where, shared_kv,
                                   kv_shape)
        self.model = decoder
        self.blocks = KVBlocks(len(decoder.kv_names), decoder.heads, decoder.head_dim, decoder.kv_dtype,
                               num_blocks, block_size)
        self.stats = RunnerStats()
        self._range = np.arange(512, dtype=np.int64)[None]  # positions for one row's chunks (_positions)
        self.shared_kv = shared_kv
        # a shared-KV model's decode buffers (shared_group.py), for the load log line and tests; else None
        self.shared_group: SharedDecodeGroup | None = None
        self.layout: KVLayout
        if shared_kv:
            shared = SharedLayout(decoder, self.blocks, max_len, max_rows)
            self.layout, self.shared_group = shared, shared.group
        else:
            self.layout = DenseLayout(decoder, self.blocks)
        self.layout.check(where)

    @property
    def lora(self) -> LoraShape | None:
        """The adapter inputs' shape; None: the model takes no adapters (lora.py)."""
        return self.model.lora

    @property
    def cache(self) -> np.ndarray:
        """The KV blocks' array (kv_blocks.py)."""
        return self.blocks.cache

    @property
    def trace(self) -> list[RunShape] | None:
        """Set to a list, each session run is recorded in it (RunShape), for perf/bench_generate.py."""
        return self.model.trace

    @trace.setter
    def trace(self, runs: list[RunShape] | None) -> None:
        self.model.trace = runs

    @property
    def kv_bytes_per_token(self) -> int:
        return self.blocks.bytes_per_token

    def execute(self, chunks: Sequence[ScheduledChunk]) -> np.ndarray:
        """Compute every chunk's tokens into its blocks; the last position's logits of each chunk with
        `sample`, one row each in chunk order ([n, vocab]; n may be 0: a step of prefill chunks only, such
        as the first chunk of a prompt longer than the token budget). A chunk with `num_draft` proposals
        (speculative decoding) gets 1 + num_draft rows: its last 1 + num_draft positions', in order; it
        runs with the prefill chunks, and all its tokens are written (the scheduler's lengths say which
        count)."""
        self.stats.steps += 1
        decodes = [i for i, c in enumerate(chunks) if len(c.token_ids) == 1]
        decode = self._decode
        if len(decodes) == len(chunks) and all(c.sample for c in chunks):
            return decode(chunks)  # a step of decodes only (the usual one): its logits are the answer
        if len(chunks) == 1 and not decodes:  # a proposal step of one stream, or one prompt chunk: no groups
            self.layout.clear()
            last = self._prefill(chunks)[0]
            return last if chunks[0].sample else last[:0]
        prefills = [i for i, c in enumerate(chunks) if len(c.token_ids) > 1]
        rows: dict[int, np.ndarray] = {}  # each chunk's rows of logits [m, vocab]
        if decodes:
            rows.update(zip(decodes, decode([chunks[i] for i in decodes])[:, None], strict=True))
        else:  # nobody is decoding: let go of the kept tensors
            self.layout.clear()
        for group in self.layout.prefill_groups(chunks, prefill_groups(chunks, prefills)):
            rows.update(zip(group, self._prefill([chunks[i] for i in group]), strict=True))
        wanted = [rows[i] for i, c in enumerate(chunks) if c.sample]
        return np.concatenate(wanted) if wanted else np.empty((0, self.model.vocab), self.model.logits_dtype)

    def _prefill(self, group: Sequence[ScheduledChunk]) -> list[np.ndarray]:
        """Prefill chunks, batched, over their cached context (the layout gathers and runs them); each
        chunk's last 1 + num_draft positions' logits. Only the real new tokens are written to their
        blocks."""
        t0 = time.perf_counter_ns()
        batch = len(group)
        if batch == 1:  # one row: its tokens as they are, its positions a view of a kept range
            c = group[0]
            input_ids = np.array((c.token_ids,), np.int64)
            position_ids = self._positions(c.start, len(c.token_ids))
        else:
            width = max(len(c.token_ids) for c in group)
            input_ids = np.zeros((batch, width), np.int64)
            position_ids = np.zeros((batch, width), np.int64)
            for row, c in enumerate(group):
                count = len(c.token_ids)
                input_ids[row, :count] = c.token_ids
                position_ids[row, :count] = np.arange(c.start, c.start + count)
        done = self.layout.prefill(group, input_ids, position_ids)
        t1, t2 = done.run_started_ns, time.perf_counter_ns()
        tokens = self.blocks.write(group, done.outs, done.firsts)
        # copies: a shared-KV run's logits are bound, and the next run overwrites them
        last = [done.logits[row, len(c.token_ids) - 1 - c.num_draft:len(c.token_ids)].copy()
                for row, c in enumerate(group)]
        t3 = time.perf_counter_ns()
        self._count(batch, tokens, done.past_slots, sum(c.start for c in group), t0, t1, t2, t3)
        return last

    def _positions(self, start: int, count: int) -> np.ndarray:
        """[1, count] positions start … start + count - 1: a view of a range kept for the runner's life
        (the model only reads it), regrown as contexts grow."""
        if start + count > self._range.shape[1]:
            self._range = np.arange(2 * (start + count), dtype=np.int64)[None]
        return self._range[:, start:start + count]

    def _decode(self, group: Sequence[ScheduledChunk]) -> np.ndarray:
        """One decode step: a token for each of `group` over the decode group's kept past (decode_group.py,
        or shared_group.py's buffers); the logits in `group`'s order."""
        logits: list[np.ndarray] = []

        def keep(last: np.ndarray) -> list[int]:
            logits.append(last)
            return []  # nothing is fed back after the last step

        self._decode_steps(group, 1, keep)
        return logits[0].copy()  # a shared-KV run's logits are kept and bound: the next run overwrites them

    def execute_steps(self, chunks: Sequence[ScheduledChunk], steps: int,
                      pick: Callable[[np.ndarray], list[int]]) -> np.ndarray:
        """A multi-step decode (engine.py): `steps` decode runs over `chunks` (each one token that samples,
        with blocks for `steps` tokens), each run's logits [chunks, vocab] handed to `pick` (the engine's
        sampler) and the tokens it picks fed back as the next run's input, with no schedule in between.
        Returns the picked tokens, [chunks, steps]."""
        self.stats.steps += 1
        tokens = np.empty((len(chunks), steps), np.int64)
        step = 0

        def feed_back(last: np.ndarray) -> list[int]:
            nonlocal step
            picked = pick(last)
            tokens[:, step] = picked
            step += 1
            return picked

        self._decode_steps(chunks, steps, feed_back)
        return tokens

    def _decode_steps(self, group: Sequence[ScheduledChunk], steps: int,
                      pick: Callable[[np.ndarray], list[int]]) -> None:
        """`steps` decode runs, the rows placed once (by the layout): after each run every live row is one
        longer and takes the token `pick` returns for its chunk (unused after the last). Built from plain
        lists once, then numpy in place per run: at tens of rows numpy's per-call cost and per-row Python
        are what add up. The blocks these runs filled are written after the last."""
        t0 = time.perf_counter_ns()
        placed = self.layout.place(group)
        order, gathered, regrouped = placed.order, placed.gathered, placed.regrouped
        batch = len(order)
        starts, token_ids, live, picked = _decode_rows(group, order)  # a free row: token 0 at slot 0
        placed.load(starts, token_ids, [group[i] if i >= 0 else None for i in order])
        input_ids, positions = placed.input_ids, placed.positions
        rows_of_chunks = _rows_of_chunks(batch, len(group), live, picked)
        fed_rows = slice(None) if rows_of_chunks is None else rows_of_chunks  # each chunk's row
        for step in range(steps):
            past_slots = placed.ready(sum(starts) + step * len(live))
            t1 = time.perf_counter_ns()
            logits = placed.run()
            t2 = time.perf_counter_ns()
            last = _decode_logits(logits, rows_of_chunks)
            if step == steps - 1:  # writes the blocks these runs filled (the rest wait in the group)
                placed.finish(group, steps)
            fed = pick(last)
            if step < steps - 1:
                input_ids[fed_rows, 0] = fed
                positions[fed_rows] += 1
            t3 = time.perf_counter_ns()
            self._count_decode(batch, len(live), gathered, regrouped, t2 - t1)
            self._count(batch, len(live), past_slots, sum(starts) + step * len(live), t0, t1, t2, t3)
            t0, gathered, regrouped = t3, 0, 0  # the rows were placed once, before the first run

    def _count_decode(self, batch: int, live: int, gathered: int, regrouped: int, run_ns: int) -> None:
        s = self.stats
        s.decode_rows += live
        s.free_rows += batch - live
        s.gathered_rows += gathered
        s.rebuilds += regrouped
        s.decode_run_ns += run_ns

    def _count(self, batch: int, tokens: int, past_slots: int, context: int,
               t0: int, t1: int, t2: int, t3: int) -> None:
        s = self.stats
        s.runs += 1
        s.tokens += tokens
        s.past_slots += past_slots
        s.padded_slots += past_slots - context
        s.gather_ns += t1 - t0
        s.run_ns += t2 - t1
        s.scatter_ns += t3 - t2


def _decode_rows(group: Sequence[ScheduledChunk], order: Sequence[int],
                 ) -> tuple[list[int], list[int], list[int], list[int]]:
    """A decode run's rows from a decode group's order (-1: a free row): each row's start and token (0 and
    0 for a free row), the live rows, and each live row's chunk. Plain lists, one pass: at tens of rows
    numpy's per-call cost is what adds up."""
    batch = len(order)
    starts, token_ids = [0] * batch, [0] * batch
    live: list[int] = []
    for row, index in enumerate(order):
        if index >= 0:
            chunk = group[index]
            starts[row], token_ids[row] = chunk.start, chunk.token_ids[0]
            live.append(row)
    return starts, token_ids, live, [order[row] for row in live]


def _rows_of_chunks(batch: int, chunks: int, live: list[int], picked: list[int]) -> np.ndarray | None:
    """Each chunk's row in a decode run, or None when row i is chunk i for every row (no free rows, in
    order): what `_decode_logits` takes, worked out once for the runs of a multi-step decode."""
    if len(live) == batch and picked == list(range(chunks)):
        return None
    rows = np.empty(chunks, np.int64)
    rows[picked] = live
    return rows


def _decode_logits(logits: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    """The decode run's logits [chunks, vocab] in chunk order (`rows`: `_rows_of_chunks`)."""
    return logits[:, 0] if rows is None else logits[rows, 0]


def prefill_groups(chunks: Sequence[ScheduledChunk], indices: Sequence[int],
                   max_waste: float = 1.5) -> list[list[int]]:
    """Prefill chunks batched by similar length: sorted by (length, start), a chunk joins the group before
    it while the group's padded work (rows × longest chunk × (longest start + longest chunk), what dense
    tensors compute) stays within `max_waste` × its real work; one session run per group."""
    groups: list[list[int]] = []
    real = 0
    for i in sorted(indices, key=lambda i: (len(chunks[i].token_ids), chunks[i].start)):
        n, start = len(chunks[i].token_ids), chunks[i].start
        if groups:
            group = groups[-1]
            width = max(n, *(len(chunks[j].token_ids) for j in group))
            past = max(start, *(chunks[j].start for j in group))
            if (len(group) + 1) * width * (past + width) <= max_waste * (real + n * (start + n)):
                group.append(i)
                real += n * (start + n)
                continue
        groups.append([i])
        real = n * (start + n)
    return groups
