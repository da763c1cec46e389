"""engine/memory.py: when freed heap goes back to the OS. The thresholds are checked on glibc itself, in a
fresh interpreter each (they are process-wide and this one's heap is the suite's)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from engine.memory import MemoryReturn

GLIBC = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None


def test_memory_return_waits_for_enough_freed_then_a_quiet_tick_and_is_rate_limited():
    memory = MemoryReturn(threshold_bytes=100, min_interval_secs=2.0)
    memory.freed(60)
    assert not memory.due(0.0)
    memory.freed(60)
    assert not memory.due(0.25)  # enough, but buffers passed during this tick
    assert memory.due(0.5) and not memory.due(0.6)
    for tick in (1.0, 1.5, 2.0, 2.5, 3.0):  # a steady flow: never trimmed under it
        memory.freed(500)
        assert not memory.due(tick)
    assert memory.due(3.5)
    memory.freed(500)
    assert not memory.due(4.0)
    assert not memory.due(4.5)  # quiet, but within the interval: it waits, keeping the count
    assert memory.due(5.5) and not memory.due(10.0)


def _rss_after_free(env: dict[str, str]) -> tuple[bool, int, int]:
    """In a fresh interpreter: whether the thresholds were set, and the resident KiB with a 20 MiB buffer
    and after freeing it."""
    code = textwrap.dedent("""
        from engine.memory import keep_heap_while_serving
        def rss():
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        kept = keep_heap_while_serving()
        buf = bytearray(20 << 20)  # zeroed: every page is touched
        held = rss()
        del buf
        print(kept, held, rss())
    """)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    return out[0] == "True", int(out[1]), int(out[2])


@pytest.mark.skipif(not GLIBC, reason="glibc's thresholds; elsewhere keep_heap_while_serving does nothing")
def test_a_freed_large_buffer_stays_resident_for_the_next_request():
    kept, held, after = _rss_after_free({})
    assert kept
    assert after > held - (4 << 10), f"{held} KiB with the buffer, {after} KiB after freeing it"


@pytest.mark.skipif(not GLIBC, reason="glibc's thresholds; elsewhere keep_heap_while_serving does nothing")
def test_an_operators_own_malloc_settings_win():
    kept, held, after = _rss_after_free({"GLIBC_TUNABLES": "glibc.malloc.perturb=0"})
    assert not kept
    assert after < held - (16 << 10), "glibc's default maps a 20 MiB block and unmaps it when freed"
    kept, _, _ = _rss_after_free({"MALLOC_TRIM_THRESHOLD_": "1048576"})
    assert not kept
