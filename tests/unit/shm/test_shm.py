"""engine/shm/regions.py, the regions: bounds, lifetimes, two processes, crash clean-up, named objects (the
arena's tests are in test_shm_arena.py).

Plain synchronous tests; where the point is two processes, a real child process (`subprocess`, the region's
fd in `pass_fds`) that imports engine.shm.regions from this checkout."""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import ROOT
from engine.errors import EngineError, ErrorCode
from engine.shm.regions import SHM_ROOT, Region

REPO = ROOT
CHILD_TIMEOUT_S = 60


def unique_label(what: str) -> str:
    return f"hubserve-test-{what}-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def expect(code: ErrorCode, *words: str) -> Iterator[None]:
    """The block raises EngineError with `code` and a message holding `words`, and no absolute path
    (messages go to clients)."""
    with pytest.raises(EngineError) as err:
        yield
    assert err.value.code is code, err.value
    for word in words:
        assert word in err.value.message, err.value.message
    assert SHM_ROOT not in err.value.message and str(REPO) not in err.value.message


def child(code: str, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[str]:
    """A Python child running `code`, with this checkout's engine importable and `pass_fds` inherited."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, pass_fds=pass_fds,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def read_line(proc: subprocess.Popen[str]) -> str:
    """The child's next line of stdout, waiting at most CHILD_TIMEOUT_S."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], CHILD_TIMEOUT_S)
    assert ready, "child did not answer in time"
    return proc.stdout.readline().strip()


def holders(label: str) -> list[str]:
    """Every fd and mapping of the memfd named `label` in the processes we can see: while any exists the
    kernel keeps the memory; when none does, it has freed it (a memfd has no name in any file system)."""
    found = []
    needle = f"memfd:{label}"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if needle in os.readlink(f"/proc/{pid}/fd/{fd}"):
                        found.append(f"pid {pid} fd {fd}")
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
            found += [f"pid {pid} map" for line in maps if needle in line]
    return found


@pytest.fixture
def named_object() -> Iterator[tuple[str, bytes]]:
    """A POSIX shm object of 3 pages + 100 bytes in /dev/shm, made the way shm_open makes one, with known
    bytes; removed afterwards. Yields its key ('/name') and contents."""
    path, data = Path(SHM_ROOT, unique_label("named")), random.Random(7).randbytes(3 * 4096 + 100)
    path.write_bytes(data)
    try:
        yield "/" + path.name, data
    finally:
        path.unlink()


# --- one region -----------------------------------------------------------------------------------------

def test_create_write_view_array_round_trip() -> None:
    with Region.create(4096, "t-round-trip") as region:
        assert region.size == 4096 and region.fd >= 0
        assert bytes(region.view(0, 4096)) == bytes(4096)  # zero-filled
        region.write(0, b"hello")
        assert bytes(region.view(0, 5)) == b"hello"
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        region.write(64, data)
        out = region.array(64, np.float32, (3, 4))
        assert np.array_equal(out, data) and out.flags.writeable
        out[0, 0] = 99.0  # arrays and views are windows on the memory, not copies
        assert region.array(64, "<f4", (1,))[0] == 99.0
        region.write(200, memoryview(b"abc"))
        region.write(4096, b"")  # nothing, at the very end
        assert region.array(4096, np.int64, (0, 3)).shape == (0, 3)
        assert bytes(region.view(np.int64(200), np.uint16(3))) == b"abc"  # numpy integers are integers
    assert region.closed and region.fd == -1


@pytest.mark.parametrize(("offset", "nbytes", "words"), [
    (-1, 10, ("offset must not be negative",)),
    (0, -1, ("byte size must not be negative",)),
    (90, 11, ("offset 90 + byte size 11 runs past its 100 bytes",)),
    (100, 1, ("runs past",)),
    (101, 0, ("runs past",)),
    (2**64 - 1, 2, ("runs past",)),  # would wrap to 1 in uint64 arithmetic
    (2, 2**64 - 1, ("runs past",)),
    (2**200, 0, ("runs past",)),
    (-(2**200), 0, ("negative",)),
])
def test_view_out_of_bounds_is_invalid_arg(offset: int, nbytes: int, words: tuple[str, ...]) -> None:
    with Region.create(100, "t-bounds") as region:
        with expect(ErrorCode.INVALID_ARG, "'t-bounds'", *words):
            region.view(offset, nbytes)
        with expect(ErrorCode.INVALID_ARG, *words):
            region.array(offset, np.uint8, (nbytes,)) if nbytes >= 0 else region.view(offset, nbytes)


@pytest.mark.parametrize("bad", [1.0, "1", None, True, b"1"])
def test_offsets_must_be_integers(bad: Any) -> None:
    with Region.create(100, "t-types") as region:
        uses = (lambda: region.view(bad, 1), lambda: region.view(0, bad), lambda: region.write(bad, b"x"))
        for use in uses:
            with expect(ErrorCode.INVALID_ARG, "must be an integer"):
                use()


def test_array_checks_shape_and_dtype() -> None:
    with Region.create(4096, "t-array") as region:
        with expect(ErrorCode.INVALID_ARG, "negative dimension"):
            region.array(0, np.float32, (2, -3))
        with expect(ErrorCode.INVALID_ARG, "runs past"):
            region.array(0, np.float32, (1025,))
        with expect(ErrorCode.INVALID_ARG, "runs past"):
            region.array(8, np.float64, (512,))
        # The product of huge dimensions is far past the end, not an overflowed small number.
        with expect(ErrorCode.INVALID_ARG, "runs past"):
            region.array(0, np.float32, (2**32, 2**32, 2**32))
        for dtype in (object, "S0", "no such type"):
            with expect(ErrorCode.INVALID_ARG, "dtype" if dtype == "no such type" else "Python objects"):
                region.array(0, dtype, (1,))
        with expect(ErrorCode.INVALID_ARG, "integer"):
            region.array(0, np.float32, (1.5,))  # type: ignore[arg-type]


def test_write_checks_the_buffer() -> None:
    with Region.create(64, "t-write") as region:
        with expect(ErrorCode.INVALID_ARG, "runs past"):
            region.write(60, b"12345")
        with expect(ErrorCode.INVALID_ARG, "non-contiguous"):
            region.write(0, np.arange(16, dtype=np.int8)[::2])
        with expect(ErrorCode.INVALID_ARG, "not a buffer"):
            region.write(0, "text")
        assert bytes(region.view(0, 64)) == bytes(64)  # the refused writes left nothing behind
        region.write(0, np.ones((2, 2, 2), dtype=np.float64))  # any C-contiguous shape
        assert region.array(0, np.float64, (8,)).sum() == 8.0


@pytest.mark.parametrize("size", [0, -1, 2**63, 2**200, 1.5])
def test_create_refuses_bad_sizes(size: int) -> None:
    with expect(ErrorCode.INVALID_ARG):
        Region.create(size, "t-size")


# --- lifetimes ------------------------------------------------------------------------------------------

def test_close_is_idempotent_and_use_after_close_is_unavailable() -> None:
    label = unique_label("closed")
    region = Region.create(4096, label)
    assert holders(label)
    region.close()
    region.close()
    assert region.closed and holders(label) == []  # fd closed and unmapped: the kernel has freed it
    for use in (lambda: region.view(0, 1), lambda: region.array(0, np.uint8, (1,)),
                lambda: region.write(0, b"x")):
        with expect(ErrorCode.UNAVAILABLE, "is closed"):
            use()
    assert "closed" in repr(region)


def test_views_outlive_close_and_the_unmap_waits_for_the_last() -> None:
    label = unique_label("views")
    region = Region.create(8192, label)
    region.write(0, b"still here")
    view = region.view(0, 10)
    array = region.array(4096, np.int32, (4,))
    derived = array[1:3]  # a view of the array also keeps the memory
    del array
    region.close()
    assert bytes(view) == b"still here"  # readable, not dangling
    derived[:] = 7
    assert derived.tolist() == [7, 7]
    assert any(" map" in h for h in holders(label))
    view.release()
    assert holders(label)  # `derived` still holds it
    del derived
    assert holders(label) == []


def test_thousands_of_regions_leave_no_fds_or_memory() -> None:
    """Counted in a child process of its own: in the suite's process other tests' servers and clients open
    fds and allocate meanwhile (the arena's RSS test failed a CI run on that)."""
    proc = child("""
import os
from engine.shm.regions import Region

def rss_bytes():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

fds_before = len(os.listdir("/proc/self/fd"))
for _ in range(100):
    Region.create(1 << 20, "t-churn").close()
rss_before = rss_bytes()
for _ in range(3000):
    region = Region.create(1 << 20, "t-churn")
    region.write(0, b"x" * 4096)
    region.view(0, 10)
    region.close()
print(len(os.listdir("/proc/self/fd")) - fds_before, rss_bytes() - rss_before, flush=True)
""")
    try:
        fds, rss = map(int, read_line(proc).split())
    finally:
        proc.kill()
        proc.wait(CHILD_TIMEOUT_S)
    assert fds == 0
    assert rss < 8 << 20, rss


# --- two processes --------------------------------------------------------------------------------------

def test_a_child_attaches_by_inherited_fd_and_both_see_each_others_writes() -> None:
    with Region.create(1 << 16, "t-two") as region:
        region.write(0, b"from parent")
        region.write(4096, np.arange(100, dtype=np.int64))
        proc = child(f"""
import sys, numpy as np
from engine.shm.regions import Region
region = Region.attach({region.fd}, {region.size}, "t-two-child")
assert bytes(region.view(0, 11)) == b"from parent"
assert region.array(4096, np.int64, (100,)).sum() == 4950
region.write(100, b"from child")
print("written", flush=True)
sys.stdin.readline()          # the parent wrote again
print(bytes(region.view(0, 5)).decode(), flush=True)
region.close()
""", pass_fds=(region.fd,))
        try:
            assert read_line(proc) == "written"
            assert bytes(region.view(100, 10)) == b"from child"
            region.write(0, b"again")
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert read_line(proc) == "again"
            assert proc.wait(CHILD_TIMEOUT_S) == 0
        finally:
            proc.kill()
            proc.wait()


def test_a_region_created_by_a_child_is_attached_from_a_received_fd() -> None:
    """The fd can also travel over a Unix socket (SCM_RIGHTS), e.g. to a process started earlier."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        proc = child(f"""
import socket
from engine.shm.regions import Region
sock = socket.socket(fileno={theirs.fileno()})
region = Region.create(8192, "t-sent")
region.write(8000, b"made by the child")
socket.send_fds(sock, [b"region"], [region.fd])
sock.recv(1)                  # the parent attached; closing our side must not take its memory
region.close()
sock.send(b"x")
""", pass_fds=(theirs.fileno(),))
        try:
            _, fds, _, _ = socket.recv_fds(ours, 16, 1)
            with Region.attach(fds[0], 8192, "t-sent") as region:
                ours.send(b"x")
                assert ours.recv(1) == b"x"
                assert proc.wait(CHILD_TIMEOUT_S) == 0
                assert bytes(region.view(8000, 17)) == b"made by the child"
        finally:
            proc.kill()
            proc.wait()


def test_attach_refuses_a_short_or_wrong_fd() -> None:
    with Region.create(4096, "t-short") as region:
        fd = os.dup(region.fd)
        with expect(ErrorCode.INVALID_ARG, "has 4096 bytes, 8192 were asked for"):
            Region.attach(fd, 8192)
        with pytest.raises(OSError):
            os.fstat(fd)  # attach owned it and closed it on failure
    read_end, write_end = os.pipe()
    os.close(write_end)
    with expect(ErrorCode.INVALID_ARG, "not a memory object"):
        Region.attach(read_end, 1)
    with pytest.raises(OSError):
        os.fstat(read_end)  # closed by the refusal too


def test_a_killed_child_leaks_nothing() -> None:
    """A child that created a region, attached the parent's and opened a named object is SIGKILLed: no
    process holds its memfd any more (so the kernel freed it), /dev/shm has no new entries, and the
    parent's region is intact."""
    own, mb = unique_label("crash-own"), 32
    shm_before = set(os.listdir(SHM_ROOT))
    named = unique_label("crash-named")
    Path(SHM_ROOT, named).write_bytes(bytes(4096))
    try:
        with Region.create(1 << 20, unique_label("crash-parent")) as parents:
            parents.write(0, b"parent data")
            proc = child(f"""
import sys
from engine.shm.regions import Region
own = Region.create({mb << 20}, "{own}")
own.view(0, own.size)[:] = b"\\x01" * own.size     # resident, not just reserved
inherited = Region.attach({parents.fd}, {parents.size})
inherited.write(100, b"child was here")
named = Region.open_named("/{named}", 0, 4096)
print("ready", flush=True)
sys.stdin.readline()
""", pass_fds=(parents.fd,))
            try:
                assert read_line(proc) == "ready"
                assert holders(own)
                with open(f"/proc/{proc.pid}/status") as status:
                    shmem_kb = next(int(line.split()[1]) for line in status if line.startswith("RssShmem:"))
                assert shmem_kb >= mb * 1024
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(CHILD_TIMEOUT_S)
            assert proc.returncode == -signal.SIGKILL
            assert holders(own) == []
            assert bytes(parents.view(0, 11)) == b"parent data"
            assert bytes(parents.view(100, 14)) == b"child was here"
        assert os.path.exists(os.path.join(SHM_ROOT, named))  # opened by the child, never unlinked
    finally:
        os.unlink(os.path.join(SHM_ROOT, named))
    assert set(os.listdir(SHM_ROOT)) - shm_before == set()


# --- named objects --------------------------------------------------------------------------------------

def test_open_named_maps_the_range_at_any_offset(named_object: tuple[str, bytes]) -> None:
    key, data = named_object
    with Region.open_named(key, 4100, 200) as region:  # not page-aligned
        assert region.fd == -1 and region.size == 200
        assert bytes(region.view(0, 200)) == data[4100:4300]
        region.write(0, b"written by the server")
        with expect(ErrorCode.INVALID_ARG, "runs past its 200 bytes"):
            region.view(150, 51)
    with open(os.path.join(SHM_ROOT, key[1:]), "rb") as obj:
        contents = obj.read()
    assert contents[4100:4121] == b"written by the server" and len(contents) == len(data)
    with Region.open_named(key[1:], 0, len(data)) as whole:  # a key without its leading '/'
        assert bytes(whole.view(len(data) - 1, 1)) == data[-1:]


@pytest.mark.parametrize(("offset", "size", "words"), [
    (0, 3 * 4096 + 101, ("runs past the object's 12388 bytes",)),
    (3 * 4096 + 100, 1, ("runs past",)),
    (2**64, 1, ("runs past",)),
    (-1, 1, ("offset must not be negative",)),
    (0, 0, ("size must be positive",)),
    (0, -5, ("size must be positive",)),
])
def test_open_named_checks_the_range_against_the_object(named_object: tuple[str, bytes], offset: int,
                                                        size: int, words: tuple[str, ...]) -> None:
    key, _ = named_object
    with expect(ErrorCode.INVALID_ARG, *words):
        Region.open_named(key, offset, size)


@pytest.mark.parametrize("key", ["", "/", "//x", "/a/b", "a/b", "/..", "..", "/.", "/../etc/passwd",
                                 "/x\0y", "/" + "x" * 256])
def test_open_named_refuses_keys_that_are_not_one_name(key: str) -> None:
    with expect(ErrorCode.INVALID_ARG, "key"):
        Region.open_named(key, 0, 1)


def test_open_named_never_creates_and_refuses_what_is_not_an_object(tmp_path: Path) -> None:
    missing = unique_label("missing")
    with expect(ErrorCode.INVALID_ARG, f"'/{missing}'", "No such file"):
        Region.open_named("/" + missing, 0, 1)
    assert not os.path.exists(os.path.join(SHM_ROOT, missing))
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret" * 100)
    link, folder = unique_label("link"), unique_label("dir")
    os.symlink(outside, os.path.join(SHM_ROOT, link))
    os.mkdir(os.path.join(SHM_ROOT, folder))
    try:
        with expect(ErrorCode.INVALID_ARG, "unable to open"):
            Region.open_named("/" + link, 0, 1)  # a symlink out of /dev/shm is not followed
        with expect(ErrorCode.INVALID_ARG, "unable to open"):
            Region.open_named("/" + folder, 0, 1)
    finally:
        os.unlink(os.path.join(SHM_ROOT, link))
        os.rmdir(os.path.join(SHM_ROOT, folder))
