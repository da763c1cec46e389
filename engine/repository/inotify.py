"""Linux inotify over a folder tree, read on the event loop (`loop.add_reader`): no thread.

Why not watchfiles on Linux: its Rust `watch` call sleeps in `step` slices on a worker thread, taking the GIL
after each one to check signals and its stop event (about 50 wake-ups a second at `step=20`), and returns
every `rust_timeout` for an `anyio.to_thread` round trip. An idle server paid that on every core it shared
with inference (perf/history/pipelines.md). An inotify descriptor in the loop's own epoll set wakes the
loop only when a file changes, and closing it is the whole shutdown.

Watches are per directory: every folder under the root gets one, and a folder created (or moved in) later
gets one as its event is read. A queue overflow reads as "look at everything" (`Batch.overflow`), like a
lost event: the watcher rescans.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name, NUL-padded)


class RootGone(OSError):
    """The watched root itself was removed or moved: the watch cannot go on."""


@dataclass(slots=True)
class Batch:
    paths: list[Path] = field(default_factory=list)
    overflow: bool = False


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return libc


class InotifyTree:
    """An inotify descriptor watching `root` and every folder under it. `read()` drains what is queued
    (non-blocking); `fileno()` is for the loop's reader. Linux only: `available()` says so."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._libc = _libc()
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self._fd = fd
        self._dirs: dict[int, Path] = {}
        try:
            self._root_wd = self._add(root, must=True)
            self._add_tree(root)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def available() -> bool:
        try:
            return hasattr(_libc(), "inotify_init1")
        except OSError:
            return False

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _add(self, path: Path, must: bool = False) -> int:
        wd = int(self._libc.inotify_add_watch(self._fd, os.fsencode(path), MASK))
        if wd < 0:
            err = ctypes.get_errno()
            # A folder gone (or turned into a file) before its watch: its parent's event already says so.
            if must or err not in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
                raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
            return -1
        self._dirs[wd] = path
        return wd

    def _add_tree(self, top: Path) -> None:
        for dirpath, dirnames, _ in os.walk(top):
            for name in dirnames:
                self._add(Path(dirpath) / name)

    def read(self) -> Batch:
        batch = Batch()
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return batch
            offset = 0
            while offset < len(data):
                wd, mask, _, length = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size
                name = data[offset:offset + length].rstrip(b"\0")
                offset += length
                if mask & IN_Q_OVERFLOW:
                    batch.overflow = True
                    continue
                folder = self._dirs.get(wd)
                if folder is None:
                    continue
                if wd == self._root_wd and mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                    raise RootGone(errno.ENOENT, f"{self.root} was removed or moved")
                if mask & IN_IGNORED:
                    del self._dirs[wd]  # its folder is gone; the parent's event said so
                    continue
                path = folder / os.fsdecode(name) if name else folder
                batch.paths.append(path)
                if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO) and self._add(path) >= 0:
                    self._add_tree(path)


__all__ = ["Batch", "InotifyTree", "RootGone"]
