"""A memo of decodings that a client cannot grow without bound: `BoundedCache`.

Why one class: the hot paths remember what they decoded by the exact bytes or shape that produced it (an
HTTP request target, an HTTP binary request's JSON header, a gRPC ModelInfer request's key and its response
head, an HPACK header block, an ensemble step's input signature). A client repeats the same few, so a lookup
saves the decode; a client that sends endless distinct ones must not grow the memo. Every such memo keeps at
most `max_entries` and, when full, starts afresh (a clear, not an LRU eviction: the common case is a handful
of keys that all fit, and a lookup then stays one dict lookup with no bookkeeping). A key longer than
`max_key_len` (bytes keys: a target, a header) is never kept, so a few huge keys cannot hold much memory.

A dict itself, so the hot path's `get` is the built-in one. Values must be safe to hand out more than once
(immutable, or shared on purpose). Used on the loop (or one connection's) only: no lock.
"""

from __future__ import annotations

from collections.abc import Hashable, Sized
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(dict[K, V]):
    """At most `max_entries` entries; `put` empties it first when full. `max_key_len`, when given, is the
    longest key (`len(key)`) that `put` keeps; a longer one is answered but not remembered."""

    __slots__ = ("max_entries", "max_key_len")

    def __init__(self, max_entries: int, max_key_len: int | None = None) -> None:
        super().__init__()
        if max_entries < 1:
            raise ValueError(f"a bounded cache holds at least 1 entry, got max_entries={max_entries}")
        self.max_entries = max_entries
        self.max_key_len = max_key_len

    def put(self, key: K, value: V) -> V:
        """Remember `value` for `key` (unless the key is too long) and return it."""
        limit = self.max_key_len
        if limit is not None and isinstance(key, Sized) and len(key) > limit:
            return value
        if len(self) >= self.max_entries and key not in self:
            self.clear()
        self[key] = value
        return value
