"""A decode group's KV buffers for a shared-KV model: one buffer per KV tensor that the model reads as `past`
and writes as `present` in place, kept for the engine's life.

A shared-KV decoder (perf/hubserve_models/tiny_decoder.py's `shared_kv` form; ONNX Runtime's
GroupQueryAttention, the form onnxruntime-genai's exported models run with `past_present_share_buffer`) takes
`past` as a buffer [rows, heads, capacity, head_dim] whose row r holds its context left-aligned in slots 0 …
len_r - 1, and the rows' lengths through `attention_mask` (row r has len_r + new ones). It writes each row's
new keys and values at slot len_r of that same buffer and attends each row over its own length only. So,
unlike the dense form (decode_group.py):
- a step copies no past: nothing is concatenated and no `present` is allocated;
- rows of different lengths cost no padding: a row's attention reads its own slots, whatever the longest.

**Layout.** One buffer per KV tensor, [max_rows, heads, max_len, head_dim], made and touched when the
engine is built: max_num_seqs × max_model_len × the model's KV bytes per token (16 MiB for the example
tiny_decoder's 32 × 512 × 1 KiB), like a static KV cache, beside the blocks. A run takes the first `hi` rows
(a view of each buffer: its bindings are kept per `hi`), `hi` being one past the highest row in use.

**The blocks stay the truth** for prefix sharing, preemption and re-admission, but a decode step writes
nothing to them: a row's new tokens wait in its buffer until they fill a block (then that block is written,
in the step that filled it, before this step's prefills or the scheduler's registration of the block for
sharing can read it), or until the row leaves the group while its request still owns its blocks (it
skipped a step). A row per step costs one scattered write of [heads, head_dim] per KV tensor otherwise,
which at l4h256's 8 tensors × 8 heads was ~300 µs of a 5 ms step (each write a cache and TLB miss); a block's
worth is one contiguous copy per tensor.

**Rows follow the requests** as decode_group.py's do: a continuing row (the same request object, not
preempted since, at the expected length) keeps its place; a leaver's row becomes free (a free row below `hi`
runs a dummy token at slot 0, its output dropped); a joiner takes the lowest free row, its context gathered
from its blocks into that row. When more than a quarter of the first `hi` rows are free, the highest rows in
use move down into the lowest free ones (each moved row's own slots are copied, nothing else), so the run
stays dense. Nothing is ever rebuilt whole.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .decode_group import Flush, Gather, Row, match_rows
from .scheduler import ScheduledChunk


class SharedDecodeGroup:
    """The rows in use (None: free) and one buffer per KV tensor [max_rows, heads, max_len, head_dim]."""

    def __init__(self, shape: tuple[int, int, int], dtype: type, max_len: int, max_rows: int,
                 block_size: int, flush: Flush) -> None:
        self._shape = shape  # (KV tensors, heads, head_dim)
        self._dtype = dtype
        self.max_len = max_len
        self._block_size = block_size
        self._flush = flush
        self._rows: list[Row | None] = [None] * max_rows
        self._buffers = self._allocate(max_rows)
        self.hi = 0        # rows a run takes: one past the highest row in use
        self.moves = 0     # rows moved down to keep the run dense
        self.grown = 0     # times max_rows was outgrown (more decoding requests than it; the buffers remade)

    def __len__(self) -> int:
        return self.hi

    @property
    def nbytes(self) -> int:
        """The memory the buffers take (all of it resident: `_allocate`)."""
        return sum(buffer.nbytes for buffer in self._buffers)

    @property
    def buffers(self) -> list[np.ndarray]:
        """One buffer per KV tensor, every row: [max_rows, heads, max_len, head_dim]."""
        return self._buffers

    def views(self) -> list[np.ndarray]:
        """Each buffer's first `hi` rows, the run's past and present."""
        return [buffer[:self.hi] for buffer in self._buffers]

    def clear(self) -> None:
        """Nobody is decoding: every row is free (the buffers stay; their pages are reused)."""
        for index, row in enumerate(self._rows):
            if row is not None:
                self._leave(index, row)
        self._rows = [None] * len(self._rows)
        self.hi = 0

    def _leave(self, index: int, row: Row) -> None:
        """A row's request leaves the group: if it still owns its blocks (it only skipped this step), the
        tokens not yet written there are; a finished or preempted one's blocks are no longer its own."""
        if row.holds_blocks():
            row.write_back(self._flush, self._buffers, index, 0)

    def prepare(self, chunks: Sequence[ScheduledChunk], gather: Gather) -> tuple[list[int], int]:
        """Place this step's decode chunks in rows, each joiner's context in its row's slots. Returns, per
        row of the run (the first `hi`), the index of its chunk in `chunks` (-1: free), and how many rows
        were gathered from blocks."""
        if len(chunks) > len(self._rows):
            self._grow(len(chunks))
        order, fresh = match_rows(self._rows, chunks)
        for row, index in enumerate(order):
            if index < 0:
                left = self._rows[row]
                if left is not None:
                    self._leave(row, left)
                self._rows[row] = None
        free = [row for row, index in enumerate(order) if index < 0]
        slots = free[:len(fresh)]  # the lowest free rows
        for row, index in zip(slots, fresh, strict=True):
            order[row] = index
            self._rows[row] = Row.joining(chunks[index])
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
        grown = self._allocate(new_rows)
        for new, old in zip(grown, self._buffers, strict=True):
            new[:len(old)] = old
        self._buffers = grown
        self._rows += [None] * (new_rows - len(self._rows))

    def _allocate(self, rows: int) -> list[np.ndarray]:
        """Buffers for `rows` rows, written through once (np.full) so their pages are resident now: a first
        touch mid-step costs a page fault per page (about 170 µs of a 5 ms step when a joiner lands on
        fresh pages), and the memory a group can take is then known, and taken, when the engine is built."""
        tensors, heads, head_dim = self._shape
        return [np.full((rows, heads, self.max_len, head_dim), 0, self._dtype) for _ in range(tensors)]

    def advance(self, chunks: Sequence[ScheduledChunk], order: Sequence[int], steps: int = 1) -> None:
        """After the run (or the `steps` runs of a multi-step decode): the model wrote each live row's new
        tokens in place; each is `steps` longer. A row whose blocks these filled writes them now, before
        anything can read them there (a prefill of this step, or a prompt sharing them once the scheduler
        registers them after the step)."""
        bs = self._block_size
        for i, (row, index) in enumerate(zip(self._rows, order, strict=False)):
            if row is not None and row.decoded(chunks[index], bs, steps):
                row.write_back(self._flush, self._buffers, i, 0, row.length // bs * bs)
