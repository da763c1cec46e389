"""A decode group's dense past tensors, kept between steps so a steady batch of decodes copies nothing in.

A decode step appends one token to every row. The model's `present` outputs are exactly the next step's
`past` for the same rows: `past` with the new keys and values concatenated at slot P, every row's context
still right-aligned. So while the group's membership holds, the runner feeds last step's `present` back as
this step's `past` and gathers nothing from the blocks. The block tables stay the truth: the runner still
writes each new token's keys and values into its block (prefix sharing, preemption and re-admission read
them there); this is only a cache of what the blocks hold, laid out for ONNX Runtime.

When the membership changes (a request finished, was preempted, skipped a step, or joined), the group is
rebuilt: rows that continue are taken from the kept tensors (one contiguous copy per tensor, trimming the
columns every row now pads), and only the joining rows are gathered from their blocks. A row continues only
if it is the same request object, not preempted since, and at the position the group expects, so a
recycled request id or a recomputed sequence is always gathered afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .request import Request
from .scheduler import ScheduledChunk

# (chunks, past width) → [tensors, len(chunks), heads, past width, head_dim], each context right-aligned
Gather = Callable[[Sequence[ScheduledChunk], int], np.ndarray]


@dataclass(slots=True)
class _Row:
    request: Request
    preemptions: int
    length: int  # context tokens the dense past holds for this row (the next decode's start)


class DecodeGroup:
    """The rows of the last decode run and their `present` tensors (one array per KV tensor)."""

    def __init__(self) -> None:
        self._rows: list[_Row] = []
        self._pasts: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        self._rows, self._pasts = [], []

    def prepare(self, chunks: Sequence[ScheduledChunk], gather: Gather,
                ) -> tuple[list[int], list[np.ndarray], int]:
        """Order this step's decode chunks into rows and build their past tensors. Returns, per row, the
        index of its chunk in `chunks`; one past array per KV tensor [rows, heads, P, head_dim]; and how
        many rows were gathered from blocks (the rest came from the kept tensors)."""
        by_id = {id(row.request): (i, row) for i, row in enumerate(self._rows)}
        keep: list[tuple[int, int]] = []   # (chunk index, old row)
        fresh: list[int] = []
        for index, chunk in enumerate(chunks):
            hit = by_id.get(id(chunk.request))
            if hit is not None and hit[1].length == chunk.start \
                    and hit[1].preemptions == chunk.request.num_preemptions:
                keep.append((index, hit[0]))
            else:
                fresh.append(index)
        if not fresh and len(keep) == len(self._rows):
            order = [0] * len(keep)
            for index, old in keep:
                order[old] = index
            return order, self._pasts, 0
        order = [index for index, _ in keep] + fresh
        width = max(chunks[i].start for i in order)
        old_rows = np.array([old for _, old in keep], np.int64)
        joined = gather([chunks[i] for i in fresh], width) if fresh else None
        if not keep:
            assert joined is not None
            pasts = list(joined)
        else:
            pasts = [self._rebuild(old, old_rows, width, joined[t] if joined is not None else None)
                     for t, old in enumerate(self._pasts)]
        self._rows = [_Row(chunks[i].request, chunks[i].request.num_preemptions, 0) for i in order]
        self._pasts = pasts
        return order, pasts, len(fresh)

    @staticmethod
    def _rebuild(old: np.ndarray, old_rows: np.ndarray, width: int, joined: np.ndarray | None) -> np.ndarray:
        """One KV tensor of the new membership: the kept rows first (cut or left-padded to `width`), then
        the joined ones."""
        kept = old[old_rows, :, max(old.shape[2] - width, 0):]  # a fancy index: a fresh contiguous array
        if joined is None and kept.shape[2] == width:
            return kept
        past = np.zeros((len(old_rows) + (0 if joined is None else len(joined)), old.shape[1], width,
                         old.shape[3]), old.dtype)
        past[:len(old_rows), :, width - kept.shape[2]:] = kept
        if joined is not None:
            past[len(old_rows):] = joined
        return past

    def advance(self, chunks: Sequence[ScheduledChunk], order: Sequence[int],
                presents: list[np.ndarray]) -> None:
        """After the run: `present` is the next step's past, each row one token longer."""
        for row, index in zip(self._rows, order, strict=True):
            row.length = chunks[index].start + 1
        self._pasts = presents
