"""The KV cache's blocks as bookkeeping: a free list, reference counts, and a hash index for prefix sharing.

The pool holds no tensors (the runner does: runner.py); it says which block ids are whose. A block holds the
keys and values of `block_size` consecutive tokens of one sequence. A block is in use while its reference
count is above zero; several sequences share a block (count > 1) when their token prefixes are identical.

A full block can be *cached*: registered under the hash of its tokens chained with the hash of every block
before it (`BlockHash`), so a later sequence whose prompt starts with the same tokens reuses it instead of
computing it again. A cached block whose count drops to zero goes back on the free list but keeps its hash:
it is reused by a prefix hit until allocation needs it, at which point it is evicted (least recently freed
first) and its hash forgotten.

Called only by the KV cache manager (kv_manager.py), on the engine's one thread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockHash:
    """A full block's identity: its tokens and the chained hash of the blocks before it. Equal values mean
    equal token prefixes (the tokens compare exactly; only the parent chain rests on a 64-bit hash)."""

    parent: int               # hash() of the previous block's BlockHash; 0 for a sequence's first block
    tokens: tuple[int, ...]


def block_hashes(token_ids: Sequence[int], block_size: int,
                 known: Sequence[BlockHash] = (), root: int = 0) -> list[BlockHash]:
    """The hashes of every full block of `token_ids`, extending `known` (the hashes of its first blocks).
    `root` is the first block's parent: what else its keys and values depend on (a LoRA adapter: lora.py)."""
    hashes = list(known)
    parent = hash(hashes[-1]) if hashes else root
    for start in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        h = BlockHash(parent, tuple(token_ids[start:start + block_size]))
        hashes.append(h)
        parent = hash(h)
    return hashes


class BlockPool:
    """`num_blocks` blocks, ids 0 … num_blocks-1."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._hash_of: list[BlockHash | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # LRU first
        self._cached: dict[BlockHash, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks allocation may take: unused ones, cached or not."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        """The fraction of blocks in use by some sequence (0.0 – 1.0)."""
        return 1.0 - len(self._free) / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def hash_of(self, block_id: int) -> BlockHash | None:
        """The hash a block is cached under, or None."""
        return self._hash_of[block_id]

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The cached block holding exactly these tokens after exactly this prefix, if any."""
        return self._cached.get(block_hash)

    def allocate(self, count: int) -> list[int] | None:
        """`count` fresh blocks (reference count 1), or None, changing nothing, when fewer are free. Takes
        the least recently freed first and evicts their hashes."""
        if count > len(self._free):
            return None
        ids = []
        for _ in range(count):
            block_id, _ = self._free.popitem(last=False)
            old = self._hash_of[block_id]
            if old is not None:
                del self._cached[old]
                self._hash_of[block_id] = None
            self._ref_counts[block_id] = 1
            ids.append(block_id)
        return ids

    def share(self, block_ids: Iterable[int]) -> None:
        """Take one more reference on each block (a prefix hit); a cached free block leaves the free list."""
        for block_id in block_ids:
            if self._ref_counts[block_id] == 0:
                del self._free[block_id]
            self._ref_counts[block_id] += 1

    def release(self, block_ids: Iterable[int]) -> None:
        """Drop one reference on each block, in the order given; a block no longer used goes to the back of
        the free list (so give a sequence's blocks last first: its tail is evicted before its prefix)."""
        for block_id in block_ids:
            count = self._ref_counts[block_id]
            if count <= 0:
                raise RuntimeError(f"block {block_id} released more often than taken")
            self._ref_counts[block_id] = count - 1
            if count == 1:
                self._free[block_id] = None

    def cache(self, block_id: int, block_hash: BlockHash) -> None:
        """Register a full, computed block under its hash. An identical block cached first stays the one
        found; this one then stays uncached and is simply freed with its sequence."""
        if self._hash_of[block_id] is None and block_hash not in self._cached:
            self._cached[block_hash] = block_id
            self._hash_of[block_id] = block_hash
