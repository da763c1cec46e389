"""A decode group's KV buffers for a shared-KV model: one buffer per KV tensor that the model reads as `past`
and writes as `present` in place, kept for the engine's life.

A shared-KV decoder (tiny_decoder.py's `shared_kv` form; ONNX Runtime's GroupQueryAttention, the form
onnxruntime-genai's exported models run with `past_present_share_buffer`) takes `past` as a buffer
[rows, heads, capacity, head_dim] whose row r holds its context left-aligned in slots 0 … len_r - 1, and the
rows' lengths through `attention_mask` (row r has len_r + new ones). It writes each row's new keys and
values at slot len_r of that same buffer and attends each row over its own length only. So, unlike the dense
form (decode_group.py):
- a step copies no past: nothing is concatenated and no `present` is allocated;
- rows of different lengths cost no padding: a row's attention reads its own slots, whatever the longest.

**Layout.** One buffer per KV tensor, [max_rows, heads, max_len, head_dim], made once with `np.zeros`: the
pages are the kernel's zero pages until written, and a row only ever writes its own first len_r slots of
each head, so what is resident is about what the contexts hold, not max_rows × max_len. A run takes the
first `hi` rows (a view of each buffer: its bindings are kept per `hi`), `hi` being one past the highest row
in use.

**Rows follow the requests** as decode_group.py's do: a continuing row (the same request object, not
preempted since, at the expected length) keeps its place; a leaver's row becomes free (a free row below `hi`
runs a dummy token at slot 0, its output dropped); a joiner takes the lowest free row, its context gathered
from its blocks into that row. When more than a quarter of the first `hi` rows are free, the highest rows in
use move down into the lowest free ones (each moved row's own slots are copied, nothing else), so the run
stays dense. Nothing is ever rebuilt whole. The blocks stay the truth (runner.py writes every new token
there); this is their copy laid out for ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .request import Request
from .scheduler import ScheduledChunk

# (chunks, width) → [tensors, len(chunks), heads, width, head_dim], each context left-aligned
GatherLeft = Callable[[Sequence[ScheduledChunk], int], np.ndarray]


@dataclass(slots=True)
class _Row:
    request: Request
    preemptions: int
    length: int  # context tokens the buffer holds for this row (the next decode's start)


class SharedDecodeGroup:
    """The rows in use (None: free) and one buffer per KV tensor [max_rows, heads, max_len, head_dim]."""

    def __init__(self, shape: tuple[int, int, int], dtype: type, max_len: int, max_rows: int) -> None:
        self._shape = shape  # (KV tensors, heads, head_dim)
        self._dtype = dtype
        self.max_len = max_len
        self._rows: list[_Row | None] = [None] * max_rows
        self._buffers: list[np.ndarray] = []
        self.hi = 0        # rows a run takes: one past the highest row in use
        self.moves = 0     # rows moved down to keep the run dense
        self.grown = 0     # times max_rows was outgrown (more decoding requests than it; the buffers remade)

    def __len__(self) -> int:
        return self.hi

    def views(self) -> list[np.ndarray]:
        """Each buffer's first `hi` rows, the run's past and present."""
        return [buffer[:self.hi] for buffer in self._buffers]

    def clear(self) -> None:
        """Nobody is decoding: every row is free (the buffers stay; their pages are reused)."""
        self._rows = [None] * len(self._rows)
        self.hi = 0

    def prepare(self, chunks: Sequence[ScheduledChunk], gather: GatherLeft) -> tuple[list[int], int]:
        """Place this step's decode chunks in rows, each joiner's context in its row's slots. Returns, per
        row of the run (the first `hi`), the index of its chunk in `chunks` (-1: free), and how many rows
        were gathered from blocks."""
        if len(chunks) > len(self._rows):
            self._grow(len(chunks))
        if not self._buffers:
            tensors, heads, head_dim = self._shape
            self._buffers = [np.zeros((len(self._rows), heads, self.max_len, head_dim), self._dtype)
                             for _ in range(tensors)]
        by_id = {id(row.request): (i, row) for i, row in enumerate(self._rows) if row is not None}
        order = [-1] * len(self._rows)
        fresh: list[int] = []
        for index, chunk in enumerate(chunks):
            hit = by_id.get(id(chunk.request))
            if hit is not None and hit[1].length == chunk.start \
                    and hit[1].preemptions == chunk.request.num_preemptions:
                order[hit[0]] = index
            else:
                fresh.append(index)
        for row, index in enumerate(order):
            if index < 0:
                self._rows[row] = None
        free = [row for row, index in enumerate(order) if index < 0]
        slots = free[:len(fresh)]  # the lowest free rows
        for row, index in zip(slots, fresh, strict=True):
            order[row] = index
            self._rows[row] = _Row(chunks[index].request, chunks[index].request.num_preemptions, 0)
        width = max((chunks[i].start for i in fresh), default=0)
        if width:
            joined = gather([chunks[i] for i in fresh], width)
            rows = np.array(slots, np.int64)
            for t, buffer in enumerate(self._buffers):
                buffer[rows, :, :width] = joined[t]
        self.hi = max((row + 1 for row, index in enumerate(order) if index >= 0), default=0)
        if order[:self.hi].count(-1) > self.hi // 4:
            self._compact(chunks, order)
        return order[:self.hi], len(fresh)

    def _compact(self, chunks: Sequence[ScheduledChunk], order: list[int]) -> None:
        """Move the highest rows in use into the lowest free ones until the rows in use are the first."""
        used = [row for row in range(self.hi) if order[row] >= 0]
        holes = [row for row in range(len(used)) if order[row] < 0]
        for dst, src in zip(holes, reversed(used), strict=False):
            if src < dst:
                break
            length = chunks[order[src]].start
            for buffer in self._buffers:
                buffer[dst, :, :length] = buffer[src, :, :length]
            order[dst], order[src] = order[src], -1
            self._rows[dst], self._rows[src] = self._rows[src], None
            self.moves += 1
        self.hi = len(used)

    def _grow(self, rows: int) -> None:
        """More decoding requests than rows (max_rows set below the engine's max_num_seqs): remake the
        buffers with room for them, keeping what the rows hold."""
        self.grown += 1
        new_rows = max(rows, 2 * len(self._rows))
        if self._buffers:
            tensors, heads, head_dim = self._shape
            shape = (new_rows, heads, self.max_len, head_dim)
            grown: list[np.ndarray] = [np.zeros(shape, self._dtype) for _ in range(tensors)]
            for new, old in zip(grown, self._buffers, strict=True):
                new[:len(old)] = old
            self._buffers = grown
        self._rows += [None] * (new_rows - len(self._rows))

    def advance(self, chunks: Sequence[ScheduledChunk], order: Sequence[int]) -> None:
        """After the run: the model wrote each live row's new token in place; each is one token longer."""
        for row, index in zip(self._rows, order, strict=False):
            if row is not None:
                row.length = chunks[index].start + 1
