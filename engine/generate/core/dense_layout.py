"""The dense KV layout: a decoder that takes its past as tensors and returns past + new as `present`.

The model (Hugging Face Optimum's `decoder_with_past` form, like perf/hubserve_models/tiny_decoder.py) wants
each call's past as `past_key_values.{i}.key/value` [batch, heads, past_len, head_dim] and gives back
`present.*` with the new tokens appended.

- **Gather (blocks → dense past).** For a group of B rows, the past is [B, heads, P, head_dim] with P the
  longest context in the group; each row's context is right-aligned (left padding) and its padding masked
  out by `attention_mask` (0).
- **Run.** The new tokens sit in slots P … P+S-1 (right-padded to the group's longest chunk S); the model's
  causal mask is by slot, so every real query sees exactly its own context and earlier new tokens.
- **One stream's chunks continue each other.** A single-row prefill's `present` is kept; the same
  request's next single-row chunk that continues it (speculative decoding's proposal steps, or a long
  prompt's next chunk) takes it as its past, without a gather (`_KeptPresent`).
- **The decode group's past is kept** (decode_group.py): a decode run's `present` is the next decode run's
  `past` for the same rows, so while the decoding requests stay the same nothing is gathered and ONNX
  Runtime is fed its own output back; when they change, the continuing rows are copied over (trimmed to the
  new longest context) and only the joining rows are gathered from blocks.

Chosen by `DecoderRunner` (runner.py) for a model served without `past_present_share_buffer`; called on the
engine's thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import invalid
from .decode_group import DecodeGroup
from .decoder_model import DecoderModel
from .kv_blocks import KVBlocks
from .kv_layout import Prefilled
from .request import Request
from .scheduler import ScheduledChunk


class DenseLayout:
    """The `KVLayout` (kv_layout.py) of a model that returns past + new as present."""

    def __init__(self, model: DecoderModel, blocks: KVBlocks) -> None:
        self.model, self.blocks = model, blocks
        self.group = DecodeGroup(blocks.block_size, blocks.flush_rows)
        self._kept: _KeptPresent | None = None  # the last single-row prefill's present (_KeptPresent)

    def _gather(self, group: Sequence[ScheduledChunk], width: int) -> np.ndarray:
        return self.blocks.gather(group, width, left_aligned=False)

    def check(self, where: str) -> None:
        """Contexts are right-aligned behind masked padding, which a length-based attention (ONNX Runtime's
        GroupQueryAttention counts the mask's ones) would misread: the same token over one past slot, with
        and without a masked slot before it, must give the same logits."""
        model = self.model
        if not model.has_mask:
            return
        rng = np.random.default_rng(0)
        rows: list[ScheduledChunk | None] = [None]
        ids, positions = np.zeros((1, 1), np.int64), np.ones((1, 1), np.int64)
        shape = (1, model.heads, 1, model.head_dim)
        past = [rng.standard_normal(shape).astype(model.kv_dtype) for _ in model.kv_names]
        padded = [np.concatenate([np.zeros_like(p), p], axis=2) for p in past]
        plain = model.session.run(["logits"], model.feed(ids, np.ones((1, 2), np.int64), positions, past,
                                                         rows))[0]
        behind = model.session.run(["logits"], model.feed(ids, np.array([[0, 1, 1]], np.int64), positions,
                                                          padded, rows))[0]
        if not np.allclose(plain, behind, rtol=1e-3, atol=1e-3):
            raise invalid(f"{where}: the model does not ignore past slots its attention_mask marks 0 (the "
                          "dense layout pads shorter contexts that way); a model with GroupQueryAttention "
                          "and a shared past/present buffer is served with past_present_share_buffer true")

    def prefill_groups(self, chunks: Sequence[ScheduledChunk], groups: list[list[int]]) -> list[list[int]]:
        return groups

    def prefill(self, group: Sequence[ScheduledChunk], input_ids: np.ndarray,
                positions: np.ndarray) -> Prefilled:
        """Each context right-aligned before the group's longest (P), the new tokens in slots P … P+S-1;
        or, for one row that continues the last single-row prefill, that run's `present` as its past."""
        model, batch = self.model, len(group)
        kept = None
        if batch == 1 and self._kept is not None:
            kept = self._kept.past_for(group[0], model.has_mask)
        if kept is not None:
            pasts, slot_positions = kept
            past = len(slot_positions)
            mask = np.ones((1, past + input_ids.shape[1]), np.int64)
            mask[0, :past] = slot_positions >= 0
        else:
            past = max(c.start for c in group)
            mask = np.zeros((batch, past + input_ids.shape[1]), np.int64)
            for row, c in enumerate(group):
                mask[row, past - c.start:past + len(c.token_ids)] = 1
            pasts = list(self._gather(group, past))
            slot_positions = np.arange(-past, 0) + group[0].start if batch == 1 else np.empty(0, np.int64)
        feed = model.feed(input_ids, mask, positions, pasts, group)
        started = time.perf_counter_ns()
        model.record(input_ids, mask)
        logits, *outs = model.session.run(model.output_names, feed)
        self._kept = None
        if batch == 1:
            c = group[0]
            new = np.arange(c.start, c.start + len(c.token_ids))
            self._kept = _KeptPresent(c.request, c.start, c.token_ids, outs,
                                      np.concatenate([slot_positions, new]))
        return Prefilled(logits, outs, [past] * batch, batch * past, started)

    def place(self, group: Sequence[ScheduledChunk]) -> DenseDecodeRun:
        before = self.group.rebuilds
        order, pasts, gathered = self.group.prepare(group, self._gather)
        return DenseDecodeRun(self, order, pasts, gathered, self.group.rebuilds - before)

    def clear(self) -> None:
        self.group.clear()


@dataclass(slots=True)
class _KeptPresent:
    """A single-row prefill run's `present` tensors, kept as the past of that request's next chunk when it
    continues it: a speculative step's chunk of its last token and proposals runs with the prefills (the
    decode group's kept tensors are not used for it), and would otherwise gather its whole context from
    the blocks every step. The slots of the proposals rejected since stay in the tensors, masked out (the
    model ignores masked slots: `DenseLayout.check`), until a quarter of the slots are dead; then the
    context is gathered compactly again. `positions`: each slot's position, -1 for a masked one; `start`
    and `token_ids`: that run's chunk, the tokens its new slots hold."""

    request: Request
    start: int
    token_ids: tuple[int, ...]
    pasts: list[np.ndarray]
    positions: np.ndarray

    def past_for(self, chunk: ScheduledChunk, masks: bool) -> tuple[list[np.ndarray], np.ndarray] | None:
        """The kept past for `chunk` with the slots of positions from its start on masked (-1), or None
        when it does not continue this one or would leave dead slots a model without an attention mask
        (`masks` False) cannot skip. It continues this one when it is the same request and every token
        before its start that this run fed is the request's token there: after a plain decode step in
        between (the decode group computed that token), the slot of a rejected proposal lies before it."""
        fed = chunk.start - self.start
        if chunk.request is not self.request or not 0 < fed <= len(self.token_ids):
            return None
        if list(self.token_ids[:fed]) != chunk.request.all_token_ids[self.start:chunk.start]:
            return None
        positions = np.where(self.positions < chunk.start, self.positions, -1)
        live = int(np.count_nonzero(positions >= 0))
        dead = len(positions) - live
        if live != chunk.start or 4 * dead > len(positions) or (dead and not masks):
            return None
        return self.pasts, positions


class DenseDecodeRun:
    """Decode runs over the decode group's kept past: each run's `present` is the next run's past
    (right-aligned, one slot wider each run)."""

    def __init__(self, layout: DenseLayout, order: list[int], pasts: list[np.ndarray], gathered: int,
                 regrouped: int) -> None:
        self._layout, self._model = layout, layout.model
        self.order, self._pasts, self.gathered, self.regrouped = order, pasts, gathered, regrouped
        self.input_ids = self.positions = np.empty((0, 1), np.int64)
        self._rows: Sequence[ScheduledChunk | None] = ()
        self._mask = np.empty((0, 0), np.int64)
        self._feed: dict[str, np.ndarray] = {}

    def load(self, starts: list[int], token_ids: list[int], rows: Sequence[ScheduledChunk | None]) -> None:
        self.positions = np.array(starts, np.int64)[:, None]
        self.input_ids = np.array(token_ids, np.int64).reshape(len(starts), 1)
        self._rows = rows

    def ready(self, context: int) -> int:
        width = self._pasts[0].shape[2]
        self._mask = (np.arange(width + 1) >= width - self.positions).astype(np.int64)
        self._feed = self._model.feed(self.input_ids, self._mask, self.positions, self._pasts, self._rows)
        return len(self.order) * width

    def run(self) -> np.ndarray:
        model = self._model
        model.record(self.input_ids, self._mask)
        logits, *self._pasts = model.session.run(model.output_names, self._feed)
        return logits

    def finish(self, group: Sequence[ScheduledChunk], steps: int) -> None:
        self._layout.group.advance(group, self.order, self._pasts, steps)
