"""Block tables: which blocks of the pool hold which sequence's keys and values, in token order.

Token `t` of a sequence lives in block `table[t // block_size]` at offset `t % block_size`. The scheduler
(scheduler.py) asks this manager, per step, for room for the tokens it is about to compute (`allocate`),
tells it which tokens have been computed (`cache_computed`, which makes newly full blocks findable by
other sequences), and frees a sequence's table when it finishes or is preempted (`free`).

Prefix sharing: before a waiting sequence is admitted, `computed_prefix` finds the longest run of its full
blocks already cached, and `allocate` shares them (reference counts) instead of computing them again. At
least one token is always left to compute, because the next token's logits come from computing one.
"""

from __future__ import annotations

from collections.abc import Sequence

from .block_pool import BlockHash, BlockPool, block_hashes


class KVCacheManager:
    """Owned by the scheduler; used on the engine's one thread."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self._tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[BlockHash]] = {}  # of each sequence's full, computed blocks
        self.prefix_queries = 0  # tokens of admitted sequences looked up in the prefix cache
        self.prefix_hits = 0     # of those, found

    def block_table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def computed_prefix(self, request_id: str, token_ids: Sequence[int], salt: int = 0
                        ) -> tuple[list[int], int]:
        """The cached blocks that hold the longest prefix of `token_ids` (a sequence not yet holding any
        blocks), and how many tokens they cover."""
        if not self.enable_prefix_caching:
            return [], 0
        usable = (len(token_ids) - 1) // self.block_size  # leave a token to compute
        hashes = block_hashes(token_ids[:usable * self.block_size], self.block_size, root=salt)
        found: list[int] = []
        for h in hashes:
            block_id = self.pool.lookup(h)
            if block_id is None:
                break
            found.append(block_id)
        return found, len(found) * self.block_size

    def count_prefix(self, num_tokens: int, num_cached_tokens: int) -> None:
        """Account an admitted sequence's prefix lookup (for the prefix-cache hit rate)."""
        self.prefix_queries += num_tokens
        self.prefix_hits += num_cached_tokens

    def allocate(self, request_id: str, num_computed_tokens: int, num_new_tokens: int,
                 prefix_blocks: Sequence[int] = ()) -> bool:
        """Make room for `num_new_tokens` more tokens after `num_computed_tokens` (which, for a sequence
        being admitted, are the ones `prefix_blocks` cover). False, changing nothing, when the pool has
        too few free blocks."""
        table = self._tables.get(request_id, [])
        if not prefix_blocks and num_computed_tokens + num_new_tokens <= len(table) * self.block_size:
            return True  # fits in the blocks it holds (most decode steps): nothing to take or rebuild
        if prefix_blocks and table:
            raise RuntimeError(f"request {request_id!r} holds blocks; prefix blocks come at admission")
        have = len(table) + len(prefix_blocks)
        need = self.blocks_needed(num_computed_tokens + num_new_tokens) - have
        taken_from_free = sum(1 for b in prefix_blocks if self.pool.ref_count(b) == 0)
        if max(need, 0) + taken_from_free > self.pool.num_free:
            return False
        self.pool.share(prefix_blocks)
        fresh = self.pool.allocate(need) if need > 0 else []
        assert fresh is not None  # checked above
        if prefix_blocks:
            self._hashes[request_id] = self._known_hashes(prefix_blocks)
        self._tables[request_id] = [*table, *prefix_blocks, *fresh]
        return True

    def _known_hashes(self, block_ids: Sequence[int]) -> list[BlockHash]:
        out = []
        for block_id in block_ids:
            h = self.pool.hash_of(block_id)
            assert h is not None  # found by lookup, and shared before anything could evict it
            out.append(h)
        return out

    def fills_a_block(self, request_id: str, num_computed_tokens: int) -> bool:
        """Whether `num_computed_tokens` completes a block not yet registered: only then has
        `cache_computed` anything to do (the scheduler asks first, to skip building the token list)."""
        return self.enable_prefix_caching and \
            num_computed_tokens // self.block_size > len(self._hashes.get(request_id, ()))

    def cache_computed(self, request_id: str, token_ids: Sequence[int], num_computed_tokens: int,
                       salt: int = 0) -> None:
        """Register the sequence's blocks that are now full and computed, so later prompts can share them
        (only prompts with the same `salt`: see block_hashes)."""
        if not self.enable_prefix_caching:
            return
        table = self._tables[request_id]
        known = self._hashes.get(request_id, [])
        full = num_computed_tokens // self.block_size
        if full <= len(known):
            return
        hashes = block_hashes(token_ids[:full * self.block_size], self.block_size, known, salt)
        for index in range(len(known), full):
            self.pool.cache(table[index], hashes[index])
        self._hashes[request_id] = hashes

    def free(self, request_id: str) -> None:
        """Give back a sequence's blocks (it finished, was aborted or preempted), last block first."""
        table = self._tables.pop(request_id, [])
        self._hashes.pop(request_id, None)
        self.pool.release(reversed(table))
