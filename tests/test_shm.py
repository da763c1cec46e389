"""engine/shm.py: regions (bounds, lifetimes, two processes, crash clean-up, named objects) and the arena.

Plain synchronous tests; where the point is two processes, a real child process (`subprocess` with the
region's fd in `pass_fds`) that imports engine.shm."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import EngineError, ErrorCode
from engine.shm import Arena, Region


def test_create_write_view_array_round_trip() -> None:
    with Region.create(4096, "t-round-trip") as region:
        assert region.size == 4096 and region.fd >= 0
        region.write(0, b"hello")
        assert bytes(region.view(0, 5)) == b"hello"
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        region.write(64, data)
        out = region.array(64, np.float32, (3, 4))
        assert np.array_equal(out, data)
        out[0, 0] = 99.0  # arrays and views are windows on the memory, not copies
        assert region.array(64, np.float32, (1,))[0] == 99.0
    assert region.closed and region.fd == -1


def test_view_past_the_end_is_invalid_arg() -> None:
    with Region.create(100, "t-bounds") as region:
        with pytest.raises(EngineError) as err:
            region.view(90, 11)
        assert err.value.code is ErrorCode.INVALID_ARG
        assert "runs past its 100 bytes" in err.value.message


def test_arena_alloc_free_returns_to_empty() -> None:
    with Region.create(1 << 16, "t-arena") as region:
        arena = Arena(region)
        offsets = [arena.alloc(100) for _ in range(10)]
        assert all(o is not None and o % 64 == 0 for o in offsets)
        assert arena.live_blocks == 10 and arena.used_bytes == 10 * 128
        for o in reversed(offsets):
            assert o is not None
            arena.free(o)
        assert arena.used_bytes == 0 and arena.live_blocks == 0
