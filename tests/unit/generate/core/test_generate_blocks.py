"""The KV block pool and block tables (engine/generate/core/block_pool.py, kv_manager.py): plain functions, no
model. Free counts return to full, nothing leaks, hashing finds exactly the identical prefixes."""

from __future__ import annotations

import pytest

from engine.generate.core.block_pool import BlockHash, BlockPool, block_hashes
from engine.generate.core.kv_manager import KVCacheManager


def test_allocate_and_release_return_the_pool_to_full():
    pool = BlockPool(4)
    a = pool.allocate(3)
    assert a is not None and len(set(a)) == 3 and pool.num_free == 1
    assert pool.allocate(2) is None and pool.num_free == 1  # refused whole, nothing taken
    b = pool.allocate(1)
    assert b is not None and pool.num_free == 0 and pool.usage == 1.0
    pool.release(a + b)
    assert pool.num_free == 4 and pool.usage == 0.0
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release([a[0]])


def test_block_hashes_chain_the_whole_prefix():
    one = block_hashes([1, 2, 3, 4, 5, 6, 7], 3)
    assert len(one) == 2  # the partial last block has no hash
    assert one[0] == BlockHash(0, (1, 2, 3)) and one[1] == BlockHash(hash(one[0]), (4, 5, 6))
    other = block_hashes([9, 9, 9, 4, 5, 6], 3)
    assert other[1].tokens == one[1].tokens and other[1] != one[1]  # same tokens after another prefix
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, one) == block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 3)


def test_cached_blocks_are_shared_then_evicted_least_recently_freed_first():
    pool = BlockPool(3)
    (x,) = pool.allocate(1) or []
    h = BlockHash(0, (1, 2))
    pool.cache(x, h)
    assert pool.lookup(h) == x and pool.num_cached == 1
    pool.share([x])
    assert pool.ref_count(x) == 2
    pool.release([x, x])
    assert pool.num_free == 3 and pool.lookup(h) == x  # free, but still findable
    pool.share([x])  # a prefix hit takes it back off the free list
    assert pool.num_free == 2 and pool.ref_count(x) == 1
    pool.release([x])
    taken = pool.allocate(3)
    assert taken is not None and taken[-1] == x  # freed last, so evicted last
    assert pool.lookup(h) is None and pool.num_cached == 0


def test_a_duplicate_block_stays_uncached():
    pool = BlockPool(2)
    a, b = pool.allocate(2) or []
    h = BlockHash(0, (7,))
    pool.cache(a, h)
    pool.cache(b, h)
    assert pool.lookup(h) == a and pool.hash_of(b) is None


def test_block_tables_grow_by_whole_blocks_and_free_without_leaks():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    assert kv.allocate("r", 0, 5)  # 5 tokens: 2 blocks
    assert len(kv.block_table("r")) == 2 and kv.pool.num_free == 6
    assert kv.allocate("r", 5, 3)  # 8 tokens still fit in 2
    assert len(kv.block_table("r")) == 2
    assert kv.allocate("r", 8, 1)
    assert len(kv.block_table("r")) == 3
    assert not kv.allocate("s", 0, 21)  # 6 blocks: refused, nothing taken
    assert kv.pool.num_free == 5 and kv.block_table("s") == []
    kv.free("r")
    assert kv.pool.num_free == 8 and kv.block_table("r") == []


def test_identical_prefixes_share_blocks_and_leave_a_token_to_compute():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    tokens = list(range(10))  # 2 full blocks + 2 tokens
    assert kv.allocate("a", 0, len(tokens))
    kv.cache_computed("a", tokens, len(tokens))
    assert kv.pool.num_cached == 2
    blocks, cached = kv.computed_prefix("b", tokens + [99])
    assert cached == 8 and blocks == kv.block_table("a")[:2]
    assert kv.allocate("b", cached, 3, blocks)
    assert kv.block_table("b")[:2] == blocks and all(kv.pool.ref_count(b) == 2 for b in blocks)
    assert kv.pool.num_free == 16 - 3 - 1  # a: 3 blocks; b: 1 fresh block beside the 2 shared
    # a prompt that is exactly the cached blocks still computes its last block (its last token's logits)
    assert kv.computed_prefix("c", tokens[:8]) == (blocks[:1], 4)
    # another prefix finds nothing
    assert kv.computed_prefix("d", [5, *tokens[1:]]) == ([], 0)
    kv.free("a")
    kv.free("b")
    assert kv.pool.num_free == 16 and all(kv.pool.ref_count(i) == 0 for i in range(16))


def test_prefix_blocks_taken_from_the_free_list_count_against_admission():
    kv = KVCacheManager(num_blocks=3, block_size=2)
    tokens = [1, 2, 3, 4, 5]
    assert kv.allocate("a", 0, 5)
    kv.cache_computed("a", tokens, 5)
    kv.free("a")  # its 2 full blocks stay cached on the free list
    blocks, cached = kv.computed_prefix("b", tokens)
    assert cached == 4 and kv.pool.num_free == 3
    assert not kv.allocate("b", cached, 3, blocks)  # 2 shared (off the free list) + 2 fresh > 3
    assert kv.allocate("b", cached, 1, blocks) and kv.pool.num_free == 0


def test_prefix_caching_can_be_turned_off():
    kv = KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    assert kv.allocate("a", 0, 4)
    kv.cache_computed("a", [1, 2, 3, 4], 4)
    assert kv.pool.num_cached == 0 and kv.computed_prefix("b", [1, 2, 3, 4, 5]) == ([], 0)
