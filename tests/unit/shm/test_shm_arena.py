"""engine/shm/regions.py, the Arena: alignment, a full arena, bad frees, reuse in any free order, and a
million out-of-order cycles with flat memory and no fragmentation. Plain synchronous tests over real
regions."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT
from engine.errors import EngineError, ErrorCode
from engine.shm.regions import Arena, Region


@contextlib.contextmanager
def expect(code: ErrorCode, *words: str) -> Iterator[None]:
    """The block raises EngineError with `code` and a message holding `words`."""
    with pytest.raises(EngineError) as err:
        yield
    assert err.value.code is code, err.value
    for word in words:
        assert word in err.value.message, err.value.message


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_arena_alignment_and_sizes() -> None:
    with Region.create(1 << 16, "t-align") as region:
        for align in (1, 8, 64, 4096):
            arena = Arena(region, align)
            offsets = [arena.alloc(n) for n in (1, 0, 100, 4097, 3)]
            assert all(o is not None and o % align == 0 for o in offsets), (align, offsets)
            assert len(set(offsets)) == 5  # a zero-byte block still has its own offset
            assert arena.used_bytes == sum(max(align, -(-n // align) * align) for n in (1, 0, 100, 4097, 3))
            for o in offsets:
                arena.free(o)  # type: ignore[arg-type]
            assert arena.used_bytes == 0 and arena.live_blocks == 0
        for align in (0, 3, -64, 48):
            with expect(ErrorCode.INVALID_ARG, "power of two"):
                Arena(region, align)


def test_arena_full_answers_none_then_recovers() -> None:
    with Region.create(1000, "t-full") as region:
        arena = Arena(region, 64)
        assert arena.capacity == 960
        assert arena.alloc(961) is None and arena.alloc(2**70) is None
        blocks = [arena.alloc(320) for _ in range(3)]
        assert blocks == [0, 320, 640]
        assert arena.alloc(1) is None and arena.used_bytes == 960
        arena.free(320)  # a hole in the middle: not usable until an end reaches it
        assert arena.alloc(64) is None
        arena.free(0)  # the oldest end moves past both
        assert arena.alloc(640) == 0  # wrapped to the start
        assert arena.alloc(1) is None
        arena.free(640)
        assert arena.alloc(320) == 640  # the oldest block is now past the wrap: the old end is free again
        with expect(ErrorCode.INVALID_ARG, "negative"):
            arena.alloc(-1)


def test_arena_free_of_unknown_or_freed_offsets_is_internal() -> None:
    with Region.create(4096, "t-free") as region:
        arena = Arena(region)
        offset = arena.alloc(10)
        assert offset is not None
        with expect(ErrorCode.INTERNAL, "offset 64 is not an allocated block"):
            arena.free(64)
        arena.free(offset)
        with expect(ErrorCode.INTERNAL, "already freed"):
            arena.free(offset)
        assert arena.used_bytes == 0


def test_arena_lifo_and_fifo_reuse_space_at_once() -> None:
    with Region.create(4096, "t-orders") as region:
        arena = Arena(region)
        for _ in range(1000):  # LIFO: the newest end moves back
            a, b = arena.alloc(1000), arena.alloc(1000)
            assert (a, b) == (0, 1024)
            arena.free(1024)
            arena.free(0)
        held = arena.alloc(1000)
        for _ in range(1000):  # FIFO behind one held block: wraps around the region
            offset = arena.alloc(1000)
            assert offset is not None
            arena.free(held)  # type: ignore[arg-type]
            held = offset
        assert arena.span_bytes <= 2048


def test_arena_blocks_never_overlap_under_random_frees() -> None:
    """Each live block is filled with its own byte and checked just before it is freed: no alloc ever hands
    out memory that a live block holds."""
    with Region.create(1 << 15, "t-overlap") as region:
        for seed in range(20):
            rng = random.Random(seed)
            arena = Arena(region, rng.choice([1, 8, 64]))
            live: dict[int, tuple[int, int]] = {}
            for step in range(2000):
                if live and (len(live) > 30 or rng.random() < 0.5):
                    keys = list(live)
                    offset = keys[0] if rng.random() < 0.6 else rng.choice(keys)
                    nbytes, mark = live.pop(offset)
                    assert bytes(region.view(offset, nbytes)) == bytes([mark]) * nbytes, (seed, step)
                    arena.free(offset)
                else:
                    nbytes = rng.randrange(1, 3000)
                    got = arena.alloc(nbytes)
                    if got is not None:
                        assert got + nbytes <= arena.capacity
                        live[got] = (nbytes, step % 251)
                        region.write(got, bytes([step % 251]) * nbytes)
                assert arena.live_blocks == len(live) and 0 <= arena.span_bytes <= arena.capacity
            for offset in live:
                arena.free(offset)
            assert arena.used_bytes == 0 and arena.span_bytes == 0
            assert arena.alloc(arena.capacity) == 0


def million_out_of_order_cycles() -> None:
    """A million alloc/free pairs over 16 live blocks, each step freeing a random one of them (requests of
    different models finish out of order, some much later than others). No fragmentation: at every check
    the span from the oldest live block to the newest is at most the bytes allocated since the oldest one,
    plus one wrap's padding, however long the run; no alloc fails; used bytes return to 0; RSS stays flat.
    Run in a child process of its own: in the suite's process other tests' server threads allocate meanwhile,
    and RSS then grew by 1.8 MiB in a CI run that had nothing to do with the arena."""
    sizes = [100, 4000, 64, 16000, 700, 9000, 1, 2500]
    aligned = [max(64, -(-n // 64) * 64) for n in sizes]
    pad = max(aligned)
    bits = random.Random(3).getrandbits
    with Region.create(16 << 20, "t-million") as region:
        arena = Arena(region)
        alloc, free = arena.alloc, arena.free
        window = [alloc(sizes[k & 7]) or 0 for k in range(16)]
        born = [sum(aligned[k & 7] for k in range(j)) for j in range(16)]  # bytes allocated before each
        total = sum(aligned[k & 7] for k in range(16))
        rss_before = worst = 0
        for rounds in range(1000):
            for _ in range(1000):
                slot, kind = bits(4), bits(3)
                free(window[slot])
                offset = alloc(sizes[kind])
                assert offset is not None
                window[slot], born[slot] = offset, total
                total += aligned[kind]
            span = arena.span_bytes
            assert span <= total - min(born) + pad, (rounds, span, total - min(born))
            worst = max(worst, span)
            if rounds == 50:
                rss_before = rss_bytes()
        assert arena.live_blocks == 16 and worst > arena.used_bytes  # frees did come out of order
        for offset in window:
            free(offset)
        assert arena.used_bytes == 0 and arena.live_blocks == 0 and arena.span_bytes == 0
        assert rss_bytes() - rss_before < 1 << 20

def test_a_million_out_of_order_cycles_keep_memory_flat_and_space_bounded() -> None:
    child = subprocess.run(
        [sys.executable, "-c", "import test_shm_arena; test_shm_arena.million_out_of_order_cycles()"],
        # the child imports this module, its conftest and this checkout's engine as this run does
        cwd=Path(__file__).parent, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])},
        capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
