"""Shared-memory regions and the allocator over them: how tensors cross between hubserve's processes.

Three users, one module:
- the multi-process server (issue 13): the engine process and each frontend share memfd regions, the fd
  handed over by `subprocess` `pass_fds`; the writer of a region carves it with an `Arena`, the reader views
  the blocks it is told about and tells the writer when it is done with each;
- Python-model instance processes (issue 14): the same memfd regions, the same `Arena`;
- the system-shared-memory extension (issue 16): a client's POSIX object, opened by `Region.open_named`.

Why memfd (`os.memfd_create`): the object has no name in /dev/shm, so a process that crashes (SIGKILL, OOM)
can leak nothing; the kernel frees the memory when the last fd and the last mapping are gone. Created
regions are sealed against shrinking and growing, so the other side cannot truncate the object under our
mapping (which would turn a read into SIGBUS).

Lifetimes: `Region.close()` is idempotent and never crashes. It closes the fd at once; the mapping is unmapped
at once when no view or array into it is alive, and otherwise when the last of them is released (each view
keeps the mapping alive, so a view stays valid and readable after close, never dangling; before Python 3.13
the mapping also keeps a private dup of the fd until then). Calls on a
closed region raise EngineError UNAVAILABLE. Every offset and size is checked; a bad one raises EngineError
INVALID_ARG with a message a client can act on (for the extension these numbers come from requests).

Not thread-safe: a region or an arena belongs to one thread (the event loop of its process).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import mmap
import operator
import os
import stat
import sys
from typing import Any

import numpy as np

from ..errors import EngineError, ErrorCode, invalid

SHM_ROOT = "/dev/shm"  # where glibc's shm_open puts POSIX shared-memory objects
NAME_MAX = 255
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
# Before 3.13 mmap keeps a dup of the fd for itself (until the mapping is unmapped); from 3.13 it need not.
_MMAP_OPTIONS: dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) else {}
_RW = mmap.PROT_READ | mmap.PROT_WRITE


def _index(value: Any, what: str) -> int:
    """`value` as a Python int (numpy integers included; bool, float and str refused)."""
    if isinstance(value, bool):
        raise invalid(f"shared memory: {what} must be an integer, got a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise invalid(f"shared memory: {what} must be an integer, got {type(value).__name__}") from None


def _check_size(size: Any) -> int:
    size = _index(size, "size")
    if size <= 0:
        raise invalid(f"shared memory: size must be positive, got {size}")
    if size > sys.maxsize:
        raise invalid(f"shared memory: size {size} is larger than this machine can map")
    return size


def check_key(key: str) -> str:
    """The object name inside /dev/shm for a client's `key`, as shm_open names it: one leading '/' allowed,
    then one file name (no '/', not '.' or '..', no NUL, at most 255 bytes). Raises INVALID_ARG."""
    if not isinstance(key, str):
        raise invalid(f"shared-memory key must be a string, got {type(key).__name__}")
    name = key[1:] if key.startswith("/") else key
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise invalid(f"shared-memory key {key!r} is not a valid name: expected '/name', one name with no "
                      f"'/', '.', '..' or NUL")
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise invalid(f"shared-memory key is longer than {NAME_MAX} bytes")
    return name


class Region:
    """One mapped shared-memory object. Made by `create` (a new memfd, in the process that writes it),
    `attach` (the other process, given the fd) or `open_named` (a client's POSIX object).

    The process that holds a Region owns its fd and mapping; `close()` releases both (see the module
    docstring for views that outlive it). Offsets given to `view`, `array` and `write` are relative to the
    region's start (for `open_named`, to the client's offset)."""

    __slots__ = ("_base", "_mm", "_whole", "fd", "label", "size")

    def __init__(self, mm: mmap.mmap, fd: int, size: int, base: int, label: str) -> None:
        """Use `create`, `attach` or `open_named`."""
        self._mm: mmap.mmap | None = mm
        self._whole: memoryview | None = memoryview(mm)
        self._base = base  # where the region starts inside the mapping (open_named maps from a page boundary)
        self.fd = fd
        self.size = size
        self.label = label

    @classmethod
    def create(cls, size: int, label: str = "hubserve") -> Region:
        """A new memfd of `size` bytes, zero-filled, sealed at that size, mapped read-write. Its fd is
        close-on-exec and not inheritable, as Python makes every fd: hand it to a child with
        `subprocess.Popen(..., pass_fds=[region.fd])`, which makes it inheritable in that child only."""
        size = _check_size(size)
        try:
            fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as exc:
            raise EngineError(ErrorCode.RESOURCE_EXHAUSTED,
                              f"cannot create shared-memory region '{label}': {exc.strerror}") from None
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, _RW, **_MMAP_OPTIONS)
        except OSError as exc:
            os.close(fd)
            raise EngineError(ErrorCode.RESOURCE_EXHAUSTED,
                              f"cannot create shared-memory region '{label}' of {size} bytes: "
                              f"{exc.strerror}") from None
        return cls(mm, fd, size, 0, label)

    @classmethod
    def attach(cls, fd: int, size: int, label: str = "hubserve") -> Region:
        """The other process's side of a `create`d region: map the first `size` bytes of the inherited `fd`.
        The Region takes ownership of `fd` (closes it on `close()`, or here if mapping fails). Refuses an fd
        that is not a regular file (memfd) or is smaller than `size`."""
        fd = _index(fd, "fd")
        try:
            size = _check_size(size)
            try:
                st = os.fstat(fd)
            except OSError as exc:
                raise invalid(f"cannot attach shared-memory region '{label}': fd {fd}: "
                              f"{exc.strerror}") from None
            if not stat.S_ISREG(st.st_mode):
                raise invalid(f"cannot attach shared-memory region '{label}': fd {fd} is not a memory object")
            if st.st_size < size:
                raise invalid(f"cannot attach shared-memory region '{label}': it has {st.st_size} bytes, "
                              f"{size} were asked for")
            try:
                mm = mmap.mmap(fd, size, mmap.MAP_SHARED, _RW, **_MMAP_OPTIONS)
            except OSError as exc:
                raise invalid(f"cannot map shared-memory region '{label}': {exc.strerror}") from None
        except BaseException:
            _close_quietly(fd)
            raise
        return cls(mm, fd, size, 0, label)

    @classmethod
    def open_named(cls, key: str, offset: int, size: int) -> Region:
        """`size` bytes at `offset` of a client's POSIX shared-memory object (`key` as given to shm_open).
        Never creates, truncates or unlinks the object; does not follow a symlink; refuses what is not a
        regular file and a range past the object's size. The fd is closed once mapped (`fd` is -1).

        A client that shrinks its object while it is registered can still make a read SIGBUS; Triton has
        the same exposure. Only memfd regions (`create`) are sealed."""
        name = check_key(key)
        offset = _index(offset, "offset")
        size = _check_size(size)
        if offset < 0:
            raise invalid(f"shared-memory region '{key}': offset must not be negative, got {offset}")
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(os.path.join(SHM_ROOT, name), flags)
        except OSError as exc:
            raise invalid(f"unable to open shared-memory region '{key}': {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise invalid(f"shared-memory region '{key}' is not a shared-memory object")
            if offset + size > st.st_size:
                raise invalid(f"shared-memory region '{key}': offset {offset} + byte size {size} runs past "
                              f"the object's {st.st_size} bytes")
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            try:
                mm = mmap.mmap(fd, offset - start + size, mmap.MAP_SHARED, _RW, offset=start, **_MMAP_OPTIONS)
            except OSError as exc:
                raise invalid(f"unable to map shared-memory region '{key}': {exc.strerror}") from None
        finally:
            os.close(fd)
        return cls(mm, -1, size, offset - start, key)

    @property
    def closed(self) -> bool:
        return self._mm is None

    def _span(self, offset: Any, nbytes: Any) -> tuple[memoryview, int, int]:
        """The whole mapping and [start, end) in it for `nbytes` at `offset`; raises on a closed region
        or a range outside it."""
        whole = self._whole
        if whole is None:
            raise self._closed_error()
        if type(offset) is not int:
            offset = _index(offset, "offset")
        if type(nbytes) is not int:
            nbytes = _index(nbytes, "byte size")
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise self._range_error(offset, nbytes)
        start = self._base + offset
        return whole, start, start + nbytes

    def view(self, offset: int, nbytes: int) -> memoryview:
        """A writable memoryview of `nbytes` at `offset`. It keeps the mapping alive: release it (or drop
        it) when done, or the memory stays mapped after `close()`."""
        whole, start, end = self._span(offset, nbytes)
        return whole[start:end]

    def array(self, offset: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        """A writable numpy array of `dtype` and `shape` over the region at `offset` (no copy; it keeps the
        mapping alive like a view)."""
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise invalid(f"shared memory: {dtype!r} is not a numpy dtype") from None
        if dtype.hasobject or dtype.itemsize == 0:
            raise invalid(f"shared memory: cannot place {dtype} (Python objects or no size) in shared memory")
        dims = tuple(_index(d, "shape dimension") for d in shape)
        count = 1
        for d in dims:
            if d < 0:
                raise invalid(f"shared memory: shape {list(dims)} has a negative dimension")
            count *= d
        whole, start, _ = self._span(offset, count * dtype.itemsize)
        return np.frombuffer(whole, dtype=dtype, count=count, offset=start).reshape(dims)

    def write(self, offset: int, data: Any) -> None:
        """Copy `data` (any C-contiguous buffer: bytes, memoryview, ndarray) to `offset`."""
        try:
            src = memoryview(data)
        except TypeError:
            raise invalid(f"shared memory: cannot write {type(data).__name__}: not a buffer") from None
        with src:
            if not src.c_contiguous:
                raise invalid("shared memory: cannot write a non-contiguous buffer; copy it first")
            whole, start, end = self._span(offset, src.nbytes)
            whole[start:end] = src.cast("B") if src.ndim != 1 or src.format != "B" else src

    def close(self) -> None:
        """Close the fd and unmap (deferred while views are alive, see the module docstring). Idempotent."""
        mm, whole = self._mm, self._whole
        if mm is None or whole is None:
            return
        self._mm = self._whole = None
        whole.release()
        # With views alive mmap refuses to close; each view holds the mmap, which unmaps when the last goes.
        with contextlib.suppress(BufferError):
            mm.close()
        if self.fd >= 0:
            _close_quietly(self.fd)
            self.fd = -1

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._mm is None else f"fd={self.fd}"
        return f"Region({self.label!r}, size={self.size}, {state})"

    def _closed_error(self) -> EngineError:
        return EngineError(ErrorCode.UNAVAILABLE, f"shared-memory region '{self.label}' is closed")

    def _range_error(self, offset: int, nbytes: int) -> EngineError:
        if offset < 0:
            return invalid(f"shared-memory region '{self.label}': offset must not be negative, got {offset}")
        if nbytes < 0:
            return invalid(f"shared-memory region '{self.label}': byte size must not be negative, "
                           f"got {nbytes}")
        return invalid(f"shared-memory region '{self.label}': offset {offset} + byte size {nbytes} runs past "
                       f"its {self.size} bytes")


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class Arena:
    """A ring allocator over one Region, used by the one process that writes the region. The other side only
    reads the blocks it is told about, and tells the writer when it is done with one; the writer then calls
    `free`.

    Blocks are handed out in ring order. Frees may come in any order: a block freed out of order is a hole
    until the blocks before it (oldest end) or after it (newest end) are freed too, then the ends move past it
    all at once. So a mostly-FIFO or mostly-LIFO stream reuses space at once, nothing fragments over time
    (when every block is freed the ring is empty again, from offset 0), and a block held long only holds the
    space allocated after it until it is freed. alloc and free are O(1) amortised.

    `alloc` answers None when there is no room; the caller then sends its bytes inline instead, so nothing
    fails for want of arena space."""

    def __init__(self, region: Region, align: int = 64) -> None:
        align = _index(align, "align")
        if align < 1 or align & (align - 1):
            raise invalid(f"arena: align must be a power of two, got {align}")
        self.region = region
        self.align = align
        self.capacity = region.size - region.size % align
        self._mask = align - 1
        self._blocks: collections.deque[list[int]] = collections.deque()  # [offset, size, live] in ring order
        self._live: dict[int, list[int]] = {}  # offset -> its entry in _blocks
        self._head = 0  # where the next block goes
        self._wrapped = False  # blocks run from the oldest to the end, then from 0 to _head
        self.used_bytes = 0  # the bytes of live blocks (each rounded up to `align`)

    @property
    def live_blocks(self) -> int:
        return len(self._live)

    @property
    def span_bytes(self) -> int:
        """The bytes from the oldest live block to the newest, holes and wrap padding included: what is not
        free for new blocks. Equals used_bytes when frees came in order."""
        if not self._blocks:
            return 0
        tail = self._blocks[0][0]
        return self.capacity - tail + self._head if self._wrapped else self._head - tail

    def alloc(self, nbytes: int) -> int | None:
        """The offset of a new block of at least `nbytes` (a multiple of `align`), or None if none fits."""
        if type(nbytes) is not int:
            nbytes = _index(nbytes, "byte size")
        if nbytes < 0:
            raise invalid(f"arena: byte size must not be negative, got {nbytes}")
        size = ((nbytes + self._mask) & ~self._mask) or self.align
        head = self._head
        blocks = self._blocks
        if self._wrapped:
            if blocks[0][0] - head < size:
                return None
            offset = head
        elif self.capacity - head >= size:
            offset = head
        elif blocks and blocks[0][0] >= size:
            offset = 0  # the end of the region is too short: wrap, leaving the rest of it as padding
            self._wrapped = True
        else:
            return None
        block = [offset, size, 1]
        blocks.append(block)
        self._live[offset] = block
        self._head = offset + size
        self.used_bytes += size
        return offset

    def free(self, offset: int) -> None:
        """Give back the block at `offset`. An offset that is not a live block (never allocated, or already
        freed) raises EngineError INTERNAL: the peer that reported it is out of step."""
        block = self._live.pop(offset, None)
        if block is None:
            raise EngineError(ErrorCode.INTERNAL,
                              f"arena of '{self.region.label}': offset {offset} is not an allocated block "
                              f"(never allocated or already freed)")
        block[2] = 0
        self.used_bytes -= block[1]
        blocks = self._blocks
        if block is blocks[0]:
            while blocks and not blocks[0][2]:
                blocks.popleft()
            if self._wrapped and blocks and blocks[0][0] < self._head:
                self._wrapped = False  # the oldest live block is now past the wrap
        elif block is blocks[-1]:
            while blocks and not blocks[-1][2]:
                newest = blocks.pop()
                if self._wrapped and newest[0] == 0:
                    self._wrapped = False  # the first block after the wrap is gone: back to the old end
                    self._head = blocks[-1][0] + blocks[-1][1] if blocks else 0
                else:
                    self._head = newest[0]
        if not blocks:
            self._head = 0
            self._wrapped = False
