"""The KV blocks' storage: keys and values of every layer, in fixed-size blocks, read and written by slot.

One array [2 * layers, heads, num_blocks * block_size + 1, head_dim]: token `t` of a sequence is slot
`table[t // block_size] * block_size + t % block_size`. The extra last slot stays zero: it is what padding
reads. The block tables (kv_manager.py) stay the truth for admission, preemption and prefix sharing; this
holds the tensors. Made by `DecoderRunner` (runner.py); both KV layouts gather contexts from it and write
new tokens into it; the decode groups (decode_group.py, shared_group.py) write their rows back through
`flush_rows`. Called on the engine's thread.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .scheduler import ScheduledChunk


class KVBlocks:
    """The storage of `num_blocks` blocks of `block_size` tokens for `tensors` KV tensors."""

    def __init__(self, tensors: int, heads: int, head_dim: int, dtype: type[np.floating], num_blocks: int,
                 block_size: int) -> None:
        self.block_size = block_size
        self.zero_slot = num_blocks * block_size
        self.slots_per_head = self.zero_slot + 1
        self.cache = np.zeros((tensors, heads, self.slots_per_head, head_dim), dtype)
        self._rows = self.cache.reshape(-1, head_dim)  # a view: one row per (tensor, head, slot)
        # the first row of each (tensor, head) in _rows, shaped to broadcast against [B, P] or [N]
        self._bases = (np.arange(tensors * heads) * self.slots_per_head).reshape(tensors, heads)

    @property
    def bytes_per_token(self) -> int:
        return int(self.cache[:, :, 0].nbytes)

    @property
    def nbytes(self) -> int:
        """The blocks' memory (the zero slot left out)."""
        return self.bytes_per_token * (self.slots_per_head - 1)

    def slots(self, table: Sequence[int], start: int, count: int) -> np.ndarray:
        """The slots of positions start … start + count - 1 of the sequence whose blocks `table` names."""
        positions = np.arange(start, start + count)
        return np.asarray(table, np.int64)[positions // self.block_size] * self.block_size \
            + positions % self.block_size

    def gather(self, group: Sequence[ScheduledChunk], width: int, left_aligned: bool) -> np.ndarray:
        """Every KV tensor's context for `group` from its blocks, `width` slots wide, the rest read from the
        zero slot: [tensors, B, heads, width, head_dim]. Each context is right-aligned (its padding first,
        masked out: the dense layout) or left-aligned (slots 0 … start - 1: the shared-KV layout). One
        `np.take` of [tensors, B, heads, width] rows of head_dim values reads every past tensor of the call
        at once, already in the contiguous layout ONNX Runtime reads."""
        index = np.full((len(group), width), self.zero_slot, np.int64)
        for row, c in enumerate(group):
            if c.start:
                at = slice(0, c.start) if left_aligned else slice(width - c.start, width)
                index[row, at] = self.slots(c.block_table, 0, c.start)
        past_rows = self._bases[:, None, :, None] + index[None, :, None, :]  # [tensors, B, heads, width]
        return np.take(self._rows, past_rows, axis=0)

    def write(self, group: Sequence[ScheduledChunk], outs: Sequence[np.ndarray],
              firsts: Sequence[int]) -> int:
        """Write each chunk's new tokens from a prefill run's KV tensors `outs` ([B, heads, width,
        head_dim], row r's first new token at column firsts[r]) into their blocks. Returns how many. One
        row (one stream's proposal step, or one prompt's chunk) is copied a block's run of slots at a time,
        as `flush_rows` does: a handful of slice copies where indexing every token costs each tensor two
        fancy-indexed copies and their index arithmetic."""
        if len(group) == 1:
            c = group[0]
            self.flush_rows(outs, 0, firsts[0] - c.start, c.block_table, c.start, c.start + len(c.token_ids))
            return len(c.token_ids)
        counts = [len(c.token_ids) for c in group]
        rows = np.repeat(np.arange(len(group)), counts)
        cols = np.concatenate([np.arange(first, first + n) for first, n in zip(firsts, counts, strict=True)])
        slots = np.concatenate([self.slots(c.block_table, c.start, len(c.token_ids)) for c in group])
        for i, out in enumerate(outs):
            self._rows[self._bases[i][None, :] + slots[:, None]] = out[rows, :, cols, :]  # [N, heads, d]
        return len(rows)

    def flush_rows(self, arrays: Sequence[np.ndarray], row: int, offset: int, table: Sequence[int],
                   first: int, end: int) -> None:
        """Write positions [first, end) of a decode group's `row` (position p at column offset + p of each
        KV tensor's array) into the blocks `table` names: one copy per tensor and block of [heads, slots,
        head_dim] (a block's slots are contiguous on both sides)."""
        bs = self.block_size
        position = first
        while position < end:
            count = min(end, (position // bs + 1) * bs) - position
            slot = table[position // bs] * bs + position % bs
            column = offset + position
            for t, array in enumerate(arrays):
                self.cache[t, :, slot:slot + count] = array[row, :, column:column + count]
            position += count
