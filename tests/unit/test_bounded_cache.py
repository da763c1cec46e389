"""engine/bounded_cache.py: the one bounded memo the hot paths share. Pure, synchronous."""

from __future__ import annotations

import pytest

from engine.bounded_cache import BoundedCache


def test_a_put_value_is_found_and_returned() -> None:
    cache: BoundedCache[bytes, int] = BoundedCache(4)
    assert cache.put(b"a", 1) == 1
    assert cache.get(b"a") == 1
    assert cache.get(b"b") is None


def test_a_full_cache_starts_afresh_before_a_new_key() -> None:
    cache: BoundedCache[int, str] = BoundedCache(3)
    for k in range(3):
        cache.put(k, str(k))
    assert len(cache) == 3
    cache.put(3, "3")
    assert dict(cache) == {3: "3"}  # emptied, then the new entry: never more than max_entries


def test_putting_a_key_again_when_full_keeps_the_others() -> None:
    cache: BoundedCache[int, str] = BoundedCache(2)
    cache.put(1, "a")
    cache.put(2, "b")
    cache.put(2, "c")
    assert dict(cache) == {1: "a", 2: "c"}


def test_a_key_longer_than_max_key_len_is_answered_but_not_kept() -> None:
    cache: BoundedCache[bytes, int] = BoundedCache(8, max_key_len=4)
    assert cache.put(b"12345", 5) == 5
    assert b"12345" not in cache
    cache.put(b"1234", 4)
    assert cache.get(b"1234") == 4


def test_endless_distinct_keys_never_grow_it_past_its_bound() -> None:
    cache: BoundedCache[int, int] = BoundedCache(16)
    for k in range(10_000):
        cache.put(k, k)
        assert len(cache) <= 16


def test_tuple_keys_are_not_length_checked_without_a_limit() -> None:
    cache: BoundedCache[tuple[int, ...], str] = BoundedCache(2)
    cache.put(tuple(range(100)), "long")
    assert cache.get(tuple(range(100))) == "long"


def test_a_cache_holds_at_least_one_entry() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BoundedCache(0)
