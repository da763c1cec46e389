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
from dataclasses import dataclass, field

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
        model, batch, width = self.model, len(group), input_ids.shape[1]
        kept = None
        if batch == 1 and self._kept is not None:
            kept = self._kept.continued(group[0], width, model.has_mask)
        if kept is not None:
            pasts, mask = kept.pasts, kept.mask[:, :kept.width]
            past = kept.width - width
        else:
            past = max(c.start for c in group)
            mask = np.zeros((batch, past + width + (_HEADROOM if batch == 1 else 0)), np.int64)
            for row, c in enumerate(group):
                mask[row, past - c.start:past + len(c.token_ids)] = 1
            pasts = list(self._gather(group, past))
            if batch == 1:
                kept = _KeptPresent(group[0].request, mask, past + width, past + width)
            mask = mask[:, :past + width]
        feed = model.feed(input_ids, mask, positions, pasts, group)
        started = time.perf_counter_ns()
        model.record(input_ids, mask)
        logits, *outs = model.session.run(model.output_names, feed)
        self._kept = None
        if kept is not None:
            c = group[0]
            kept.ran(c.start, c.token_ids, outs)
            self._kept = kept
        return Prefilled(logits, outs, [past] * batch, batch * past, started)

    def place(self, group: Sequence[ScheduledChunk]) -> DenseDecodeRun:
        before = self.group.rebuilds
        order, pasts, gathered = self.group.prepare(group, self._gather)
        return DenseDecodeRun(self, order, pasts, gathered, self.group.rebuilds - before)

    def clear(self) -> None:
        self.group.clear()


_HEADROOM = 64  # slots a kept present's mask row has past its width, so the next chunks need no new row


@dataclass(slots=True)
class _KeptPresent:
    """A single-row prefill run's `present` tensors, kept as the past of that request's next chunk when it
    continues it: a speculative step's chunk of its last token and proposals runs with the prefills (the
    decode group's kept tensors are not used for it), and would otherwise gather its whole context from
    the blocks every step. The slots of the proposals rejected since stay in the tensors, masked out (the
    model ignores masked slots: `DenseLayout.check`), until a quarter of the slots are dead; then the
    context is gathered compactly again.

    `mask`: one row of `attention_mask` kept across the request's runs, longer than needed (the slots past
    `width` are scratch), slot i 1 while it holds a kept token; `live` counts those. A continuing chunk
    marks the slots of the tokens the target did not keep 0 and its own new ones 1 in place and runs on a
    view of it: per proposal step, no mask, slot positions or token list rebuilt over the whole context.
    `start` and `token_ids`: the last run's chunk, the tokens its new slots hold (the last of `width`)."""

    request: Request
    mask: np.ndarray
    width: int
    live: int
    start: int = 0
    token_ids: tuple[int, ...] = ()
    pasts: list[np.ndarray] = field(default_factory=list)

    def continued(self, chunk: ScheduledChunk, new: int, masks: bool) -> _KeptPresent | None:
        """This state moved on to `chunk` (its `new` tokens appended, the slots from its start on masked),
        or None, untouched, when `chunk` does not continue it or would leave dead slots a model without an
        attention mask (`masks` False) cannot skip, or more than a quarter of them. It continues it when it
        is the same request and every token before its start that the last run fed is the request's token
        there: after a plain decode step in between (the decode group computed that token), the slot of a
        rejected proposal lies before it."""
        fed = chunk.start - self.start
        if chunk.request is not self.request or not 0 < fed <= len(self.token_ids):
            return None
        if self.token_ids[:fed] != _tokens(chunk.request, self.start, chunk.start):
            return None
        dropped = len(self.token_ids) - fed  # the last run's slots from the chunk's start on
        live, dead = self.live - dropped, self.width - self.live + dropped
        if live != chunk.start or 4 * dead > self.width or (dead and not masks):
            return None
        width = self.width + new
        if width > self.mask.shape[1]:
            grown = np.zeros((1, width + _HEADROOM), np.int64)
            grown[:, :self.width] = self.mask[:, :self.width]
            self.mask = grown
        self.mask[0, self.width - dropped:self.width] = 0
        self.mask[0, self.width:width] = 1
        self.width, self.live = width, live + new
        return self

    def ran(self, start: int, token_ids: tuple[int, ...], pasts: list[np.ndarray]) -> None:
        """The run of the chunk at `start` with `token_ids` gave `pasts` (its slots: `width`)."""
        self.start, self.token_ids, self.pasts = start, token_ids, pasts


def _tokens(request: Request, start: int, end: int) -> tuple[int, ...]:
    """The request's tokens at positions start … end - 1, without joining its prompt and output when they
    all lie in one of them (a decoding request's do)."""
    prompt = len(request.prompt_token_ids)
    if start >= prompt:
        return tuple(request.output_token_ids[start - prompt:end - prompt])
    if end <= prompt:
        return tuple(request.prompt_token_ids[start:end])
    return tuple(request.all_token_ids[start:end])


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
