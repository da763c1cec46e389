"""A decode group's dense past tensors, kept between steps so a steady batch of decodes copies nothing in.

A decode step appends one token to every row. The model's `present` outputs are exactly the next step's
`past` for the same rows: `past` with the new keys and values concatenated at slot P, every row's context
still right-aligned. So while the group's membership holds, the runner feeds last step's `present` back as
this step's `past` and gathers nothing from the blocks. The block tables stay the truth: the runner still
writes each new token's keys and values into its block (prefix sharing, preemption and re-admission read
them there); this is only a cache of what the blocks hold, laid out for ONNX Runtime.

When the membership changes:
- a row whose request is gone (finished, preempted, or not scheduled this step) becomes a *free row*: it
  stays in the tensors, masked out (it attends only to its own dummy token; its output is dropped), so a
  leave copies nothing;
- a joining request takes a free row: its context is gathered from its blocks straight into that row of
  the kept tensors (only the joiner's own bytes move);
- the group is rebuilt (continuing rows copied once into fresh tensors, trimmed to the longest context, the
  joiners gathered) only when it must or when waste has piled up: a joiner longer than the past, more
  joiners than free rows, more than a quarter of the rows free, or more than a quarter of the past's slots
  padding every row shares.
A row continues only if it is the same request object, not preempted since, and at the position the group
expects, so a recycled request id or a recomputed sequence is always gathered afresh.

A decode step writes nothing to the blocks: a row's new tokens wait in the kept tensors until they fill a
block (that block is written in the step that filled it, before the step's prefills run or the scheduler
registers it for sharing), or until the row leaves while its request still owns its blocks (it skipped a
step); a finished or preempted request's blocks are no longer its own, and its tokens are dropped. Writing
each row's token every step was one scattered [heads, head_dim] write per KV tensor, a cache and TLB miss
each (~100 µs of a tiny-model step, ~300 µs of l4h256's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .request import Request, RequestState
from .scheduler import ScheduledChunk

# (chunks, width) → [tensors, len(chunks), heads, width, head_dim]: each context from its blocks, aligned as
# the model reads it (right-aligned for this module's dense past, left-aligned for shared_group.py's buffers)
Gather = Callable[[Sequence[ScheduledChunk], int], np.ndarray]
# (arrays, row, column of position 0, block table, first, end): write positions [first, end) of `row`,
# position p at column offset + p of each array [rows, heads, width, head_dim], into their blocks
Flush = Callable[[Sequence[np.ndarray], int, int, Sequence[int], int, int], None]


@dataclass(slots=True)
class Row:
    """One decoding request's row in a decode group (this module's, or shared_group.py's)."""

    request: Request
    preemptions: int
    length: int   # context tokens the tensors hold for this row (the next decode's start)
    synced: int   # of those, the first `synced` are in the blocks too
    table: Sequence[int] = ()  # the request's block table at its last decode

    @classmethod
    def joining(cls, chunk: ScheduledChunk) -> Row:
        """A joiner's row: its context, gathered from its blocks, is all in them."""
        return cls(chunk.request, chunk.request.num_preemptions, chunk.start, chunk.start)

    def holds_blocks(self) -> bool:
        """Whether the request still owns the blocks its table names (running, not preempted since)."""
        return self.request.state is RequestState.RUNNING and \
            self.request.num_preemptions == self.preemptions

    def decoded(self, chunk: ScheduledChunk, block_size: int, steps: int = 1) -> bool:
        """After the decode runs that wrote `chunk`'s token and the `steps - 1` fed back after it: that much
        longer; True when a block not yet in the blocks is now full."""
        self.length, self.table = chunk.start + steps, chunk.block_table
        return self.length // block_size * block_size > self.synced

    def write_back(self, flush: Flush, arrays: Sequence[np.ndarray], index: int, offset: int,
                   end: int | None = None) -> None:
        """Write the positions its blocks lack, [synced, end) (end: all it holds), from row `index` of
        `arrays` (position p at column offset + p), and count them written."""
        end = self.length if end is None else end
        if self.synced < end:
            flush(arrays, index, offset, self.table, self.synced, end)
            self.synced = end


def match_rows(rows: Sequence[Row | None], chunks: Sequence[ScheduledChunk]) -> tuple[list[int], list[int]]:
    """Per row, the index of the chunk that continues it (-1: none), and the chunks that continue no row.
    A row continues only for the same request object, not preempted since, at the position it expects."""
    by_id = {id(row.request): (i, row) for i, row in enumerate(rows) if row is not None}
    order = [-1] * len(rows)
    fresh: list[int] = []
    for index, chunk in enumerate(chunks):
        hit = by_id.get(id(chunk.request))
        if hit is not None and hit[1].length == chunk.start \
                and hit[1].preemptions == chunk.request.num_preemptions:
            order[hit[0]] = index
        else:
            fresh.append(index)
    return order, fresh


class DecodeGroup:
    """The rows of the last decode run (None: a free row) and their `present` tensors (one per KV tensor)."""

    def __init__(self, block_size: int, flush: Flush) -> None:
        self._rows: list[Row | None] = []
        self._pasts: list[np.ndarray] = []
        self._block_size = block_size
        self._flush = flush
        self.rebuilds = 0  # times the tensors were rebuilt rather than kept or filled in place

    def __len__(self) -> int:
        """Rows in the tensors, free ones included."""
        return len(self._rows)

    def clear(self) -> None:
        for index, row in enumerate(self._rows):
            if row is not None:
                self._leave(index, row)
        self._rows, self._pasts = [], []

    def _leave(self, index: int, row: Row) -> None:
        """A row's request leaves the group: the tokens its blocks lack are written if it still owns them."""
        if row.holds_blocks():
            row.write_back(self._flush, self._pasts, index, self._pasts[0].shape[2] - row.length)

    def prepare(self, chunks: Sequence[ScheduledChunk], gather: Gather,
                ) -> tuple[list[int], list[np.ndarray], int]:
        """Place this step's decode chunks in rows and build their past tensors. Returns, per row, the
        index of its chunk in `chunks` (-1: a free row); one past array per KV tensor [rows, heads, P,
        head_dim]; and how many rows were gathered from blocks (the rest came from the kept tensors)."""
        order, fresh = match_rows(self._rows, chunks)
        for row, index in enumerate(order):
            left = self._rows[row]
            if index < 0 and left is not None:
                self._leave(row, left)
        width = self._pasts[0].shape[2] if self._pasts else 0
        free = [row for row, index in enumerate(order) if index < 0]
        shared_pad = min((width - chunks[i].start for i in order if i >= 0), default=width)
        if (not self._pasts or len(fresh) > len(free) or len(free) - len(fresh) > len(order) // 4
                or any(chunks[i].start > width for i in fresh) or shared_pad > max(8, width // 4)):
            return self._rebuild(chunks, order, fresh, gather)
        for row in free:  # a leaver's row (or one free already) stays free unless a joiner takes it
            self._rows[row] = None
        if fresh:
            joined = gather([chunks[i] for i in fresh], width)
            slots = free[:len(fresh)]
            for t, past in enumerate(self._pasts):
                past[slots] = joined[t]
            for row, index in zip(slots, fresh, strict=True):
                order[row] = index
                self._rows[row] = Row.joining(chunks[index])
        return order, self._pasts, len(fresh)

    def _rebuild(self, chunks: Sequence[ScheduledChunk], order: list[int], fresh: list[int],
                 gather: Gather) -> tuple[list[int], list[np.ndarray], int]:
        """Fresh tensors with no free rows: the continuing rows first (cut or left-padded to the longest
        context), then the joiners, gathered from their blocks."""
        self.rebuilds += 1
        kept = [(row, index) for row, index in enumerate(order) if index >= 0]
        new_order = [index for _, index in kept] + fresh
        width = max(chunks[i].start for i in new_order)
        joined = gather([chunks[i] for i in fresh], width) if fresh else None
        if not kept:
            assert joined is not None
            pasts = list(joined)
        else:
            old_rows = np.array([row for row, _ in kept], np.int64)
            pasts = [_copy_rows(old, old_rows, width, None if joined is None else joined[t])
                     for t, old in enumerate(self._pasts)]
        self._rows = [self._rows[row] for row, _ in kept] + [Row.joining(chunks[i]) for i in fresh]
        self._pasts = pasts
        return new_order, pasts, len(fresh)

    def advance(self, chunks: Sequence[ScheduledChunk], order: Sequence[int],
                presents: list[np.ndarray], steps: int = 1) -> None:
        """After the run (or the `steps` runs of a multi-step decode): the last `present` is the next
        step's past, each live row `steps` tokens longer; the blocks these filled are written now."""
        self._pasts = presents
        width, bs = presents[0].shape[2], self._block_size
        for i, (row, index) in enumerate(zip(self._rows, order, strict=True)):
            if row is not None and row.decoded(chunks[index], bs, steps):
                row.write_back(self._flush, presents, i, width - row.length, row.length // bs * bs)


def _copy_rows(old: np.ndarray, rows: np.ndarray, width: int, joined: np.ndarray | None) -> np.ndarray:
    """One KV tensor of a rebuilt group: `rows` of `old` (cut or left-padded to `width`), then `joined`."""
    kept = old[rows, :, max(old.shape[2] - width, 0):]  # a fancy index: already a fresh contiguous array
    if joined is None and kept.shape[2] == width:
        return kept
    past = np.zeros((len(rows) + (0 if joined is None else len(joined)), old.shape[1], width, old.shape[3]),
                    old.dtype)
    past[:len(rows), :, width - kept.shape[2]:] = kept
    if joined is not None:
        past[len(rows):] = joined
    return past
