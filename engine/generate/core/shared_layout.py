"""The shared-KV layout: a decoder that writes its new keys and values into its past buffer in place.

A model served with `past_present_share_buffer` (ONNX Runtime's GroupQueryAttention) gets one buffer per KV
tensor bound as both `past_key_values.*` and `present.*`, which it writes in place; contexts are
left-aligned and each row attends over its own length (the mask's ones): no padding and no Concat copy.

- **Prefill.** Each context left-aligned in a buffer as wide as the longest context plus the widest chunk,
  and every row's mask counting its start plus the full width, so a shorter chunk's padding tokens land
  after its real ones (never read: they are not written back, and the next token overwrites the first).
  Its CPU kernel batches several new tokens only from slot 0, so a chunk with cached context runs alone.
- **Decode.** The decode rows live in the buffers of shared_group.py. Each run height (rows) keeps an
  IOBinding of their views as past and present, with input_ids, position_ids and logits bound once to
  arrays filled in place (`_DecodeBinding`); only the mask is bound per run.

Chosen by `DecoderRunner` (runner.py) for a model served with `past_present_share_buffer`; called on the
engine's thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from ...errors import invalid
from .decoder_model import DecoderModel
from .kv_blocks import KVBlocks
from .kv_layout import Prefilled
from .scheduler import ScheduledChunk
from .shared_group import SharedDecodeGroup


@dataclass(slots=True)
class _DecodeBinding:
    """A shared-KV decode run at one height (rows): its buffers' views bound as past and present, and
    input_ids, position_ids and logits bound once to arrays kept here, which each schedule fills in place.
    Only the mask is bound per run (its width is the longest row's length), from `mask`'s memory. The Python
    right after an ONNX Runtime run finds its caches cold (each array made and bound there cost several
    times what it costs alone), so a decode run makes as few as it can."""

    binding: ort.IOBinding
    input_ids: np.ndarray   # [rows, 1]
    positions: np.ndarray   # [rows, 1]
    logits: np.ndarray      # [rows, 1, vocab]
    mask: np.ndarray        # [rows * max_len]: each run's [rows, width] mask is its first rows × width


class SharedLayout:
    """The `KVLayout` (kv_layout.py) of a model that writes its present into its past buffer."""

    def __init__(self, model: DecoderModel, blocks: KVBlocks, max_len: int, max_rows: int) -> None:
        self.model, self.blocks = model, blocks
        self.group = SharedDecodeGroup((len(model.kv_names), model.heads, model.head_dim), model.kv_dtype,
                                       max_len, max_rows, blocks.block_size, blocks.flush_rows)
        # per run height (rows) a binding of the group's views, remade only if its buffers are (grown)
        self._bindings: dict[int, _DecodeBinding] = {}
        self._bound = 0
        self._columns = np.arange(max_len)  # a mask's column indices, compared with each row's position

    def _gather(self, group: Sequence[ScheduledChunk], width: int) -> np.ndarray:
        return self.blocks.gather(group, width, left_aligned=True)

    def check(self, where: str) -> None:
        """The model must be able to bind one buffer as past and present: one one-token run."""
        model = self.model
        rows: list[ScheduledChunk | None] = [None]
        ids, positions = np.zeros((1, 1), np.int64), np.ones((1, 1), np.int64)
        buffers = [np.zeros((1, model.heads, 2, model.head_dim), model.kv_dtype) for _ in model.kv_names]
        try:
            self._run_bound(self._bind_kv(buffers), ids, np.ones((1, 2), np.int64), positions, rows)
        except Exception as e:
            raise invalid(f"{where}: with past_present_share_buffer true the model must write its "
                          f"present into its past buffer (GroupQueryAttention); it could not: "
                          f"{str(e).splitlines()[0][:300]}. Set it to false for a model that returns "
                          "past + new as present (Optimum's form)") from None

    def prefill_groups(self, chunks: Sequence[ScheduledChunk], groups: list[list[int]]) -> list[list[int]]:
        """The chunks starting at slot 0 together, each chunk with cached context alone (the CPU kernel takes
        a batch of several new tokens over a past only at batch size 1)."""
        return [part for g in groups for part in _fresh_together(chunks, g)]

    def prefill(self, group: Sequence[ScheduledChunk], input_ids: np.ndarray,
                positions: np.ndarray) -> Prefilled:
        past, width = max(c.start for c in group), input_ids.shape[1]
        mask = np.zeros((len(group), past + width), np.int64)
        for row, c in enumerate(group):
            mask[row, :c.start + width] = 1
        outs = list(self._gather(group, past + width))
        started = time.perf_counter_ns()
        logits = self._run_bound(self._bind_kv(outs), input_ids, mask, positions, group)
        return Prefilled(logits, outs, [c.start for c in group], sum(c.start for c in group), started)

    def place(self, group: Sequence[ScheduledChunk]) -> SharedDecodeRun:
        shared = self.group
        before = shared.moves
        order, gathered = shared.prepare(group, self._gather)
        if self._bound != shared.grown:
            self._bindings, self._bound = {}, shared.grown
        kept = self._bindings.get(len(order))
        if kept is None:
            kept = self._bindings[len(order)] = self._decode_binding(shared.views())
        return SharedDecodeRun(self, kept, order, gathered, shared.moves - before, self._columns)

    def clear(self) -> None:
        self.group.clear()

    def _run_bound(self, binding: ort.IOBinding, input_ids: np.ndarray, mask: np.ndarray,
                   positions: np.ndarray, rows: Sequence[ScheduledChunk | None]) -> np.ndarray:
        """One run whose KV buffers `binding` already holds (past and present bound to the same values); the
        other inputs bound here. Returns the logits [batch, seq, vocab]."""
        model = self.model
        for name, value in model.feed(input_ids, mask, positions, (), rows).items():
            binding.bind_cpu_input(name, value)
        logits = np.empty((*input_ids.shape, model.vocab), model.logits_dtype)
        binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
        model.record(input_ids, mask)
        model.session.run_with_iobinding(binding)
        return logits

    def _bind_kv(self, buffers: Sequence[np.ndarray]) -> ort.IOBinding:
        """A binding whose past and present are the same buffers, so the model writes them in place."""
        binding = self.model.session.io_binding()
        for (past, present), buffer in zip(self.model.kv_names, buffers, strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        return binding

    def _decode_binding(self, views: Sequence[np.ndarray]) -> _DecodeBinding:
        """A decode binding for the rows of `views` (the group's buffers' first rows, each as wide as the
        context). The binding holds a reference to every array bound to it."""
        model = self.model
        rows, width = len(views[0]), views[0].shape[2]
        ids, positions = np.zeros((rows, 1), np.int64), np.zeros((rows, 1), np.int64)
        logits = np.empty((rows, 1, model.vocab), model.logits_dtype)
        kept = _DecodeBinding(self._bind_kv(views), ids, positions, logits, np.zeros(rows * width, np.int64))
        kept.binding.bind_cpu_input("input_ids", kept.input_ids)
        if model.has_positions:
            kept.binding.bind_cpu_input("position_ids", kept.positions)
        kept.binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(kept.logits))
        return kept


class SharedDecodeRun:
    """Decode runs over the shared group's buffers, past and present both, each row's mask counting its own
    length: nothing padded, nothing copied."""

    def __init__(self, layout: SharedLayout, kept: _DecodeBinding, order: list[int], gathered: int,
                 regrouped: int, columns: np.ndarray) -> None:
        self._layout, self._model, self._kept, self._columns = layout, layout.model, kept, columns
        self.order, self.gathered, self.regrouped = order, gathered, regrouped
        self.input_ids, self.positions = kept.input_ids, kept.positions
        self._mask = kept.mask

    def load(self, starts: list[int], token_ids: list[int], rows: Sequence[ScheduledChunk | None]) -> None:
        self.input_ids[:, 0], self.positions[:, 0] = token_ids, starts
        if self._model.lora is not None:  # once for the schedule's runs
            for name, value in self._model.adapter_inputs(rows).items():
                self._kept.binding.bind_cpu_input(name, value)

    def ready(self, context: int) -> int:
        batch, width = len(self.order), int(self.positions.max()) + 1
        self._mask = self._kept.mask[:batch * width].reshape(batch, width)  # row r: ones in 0 … its position
        np.less_equal(self._columns[:width], self.positions, out=self._mask, casting="unsafe")
        return context

    def run(self) -> np.ndarray:
        model, kept = self._model, self._kept
        if model.has_mask:
            kept.binding.bind_cpu_input("attention_mask", self._mask)
        model.record(self.input_ids, self._mask)
        model.session.run_with_iobinding(kept.binding)
        return kept.logits

    def finish(self, group: Sequence[ScheduledChunk], steps: int) -> None:
        self._layout.group.advance(group, self.order, steps)


def _fresh_together(chunks: Sequence[ScheduledChunk], group: list[int]) -> list[list[int]]:
    fresh = [i for i in group if chunks[i].start == 0]
    return ([fresh] if fresh else []) + [[i] for i in group if chunks[i].start]
