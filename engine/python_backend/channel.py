"""One end of the socket between the engine and a Python-model instance process.

A frame is an 8-byte head (payload length, metadata length: big-endian u32), the metadata (a pickle of plain
values only: tuples, lists, dicts, str, bytes, numbers, None) and the inline tensor bytes. Tensors travel
through shared memory (engine/shm.py): each side owns one memfd `Region` it writes, carved by an `Arena`,
and maps the other side's region read-only in practice. A message's tensors go into one block of the
sender's arena; the frame names the block and each tensor's (offset, size). Small messages, or any message
when the arena is full, carry their bytes inline instead, so nothing fails for want of space.

The receiver's arrays are numpy views over the peer's block, all based on one `_BlockOwner`: when the last
view is gone the block's offset is queued, and the next frame this side sends tells the peer to free it (the
engine pings every instance every second or so, so frees never wait long). BYTES tensors cross in their
wire form (4-byte length, then the bytes), so object arrays are never pickled.

Unpickling refuses every class (`_PlainUnpickler`): a model process that sends something else cannot make
the server run code. Thread-safe: `send` and `frame` may be called from any thread; `recv` from one reader
thread. The engine's side writes through outbox.py, which never blocks the event loop.

Overlap: engine/workers/framing.py and tensors.py (branch wt-workers) do the same for the frontends' channel
(their head and arena placement are the same idea); the lead may fold the two into one module.
"""

from __future__ import annotations

import collections
import contextlib
import io
import itertools
import pickle
import socket
import struct
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import EngineError, ErrorCode
from ..frontend.wire import array_from_bytes, array_to_bytes
from ..shm import Arena, Region
from ..types import DataType

HEAD = struct.Struct(">II")
ALIGN = 64
INLINE_BELOW = 4096  # tensors of a message smaller than this in all go inline: a block is not worth it
MAX_FRAME = (1 << 32) - 1

# A received tensor: name, datatype, array (a view over the peer's block or the frame).
Received = tuple[str, DataType, np.ndarray]


class ChannelClosed(Exception):
    """The other side is gone (EOF or a broken socket)."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"frame metadata may hold only plain values, not {module}.{name}")


class _BlockOwner:
    """The base of every array read from one block of the peer's region; reports the block when freed."""

    __slots__ = ("__array_interface__", "_channel", "_offset", "_pin")

    def __init__(self, pin: np.ndarray, offset: int, nbytes: int, channel: Channel) -> None:
        self._pin = pin
        self._offset = offset
        self._channel = channel
        self.__array_interface__ = {"data": (int(pin.ctypes.data) + offset, False), "shape": (nbytes,),
                                    "typestr": "|u1", "version": 3}

    def __del__(self) -> None:
        self._channel.peer_block_done(self._offset)


class Channel:
    """Frames over `sock`; tensors written into `own` (this side's region) and read from `peer`."""

    def __init__(self, sock: socket.socket, own: Region | None, peer: Region | None) -> None:
        self._sock = sock
        self._own = own
        self._arena = Arena(own, ALIGN) if own is not None else None
        self._peer = peer
        self._pin = np.frombuffer(peer.view(0, peer.size), np.uint8) if peer is not None else None
        self._lock = threading.Lock()  # the arena and the frees owed
        self._send_lock = threading.Lock()  # one frame at a time on the socket (send)
        self._done: list[int] = []  # blocks of the peer's region no longer viewed here

    def peer_block_done(self, offset: int) -> None:
        self._done.append(offset)  # atomic under the GIL; runs wherever the last view was dropped

    @property
    def socket(self) -> socket.socket:
        return self._sock

    def send(self, meta: Any, tensors: Sequence[tuple[str, DataType, np.ndarray]] = ()) -> None:
        """Send one frame: `meta` (plain values) and `tensors` (name, datatype, array), blocking until the
        socket took it all. The instance process's side uses it; the engine's side writes through an
        `Outbox` (outbox.py) instead, which never blocks its caller. Do not mix the two on one channel."""
        with self._send_lock:
            chunks = collections.deque(self.frame(meta, tensors))
            try:
                write_some(self._sock, chunks, 0)
            except OSError as e:
                raise ChannelClosed(str(e)) from None

    def frame(self, meta: Any, tensors: Sequence[tuple[str, DataType, np.ndarray]] = ()) -> list[memoryview]:
        """One frame's bytes, ready to write in order: the tensors placed in an arena block (copied there) or
        left inline as views of the arrays (no copy). Raises EngineError when a frame is too large or a
        tensor has no wire form. Thread-safe; the frees this side owes the peer ride on this frame."""
        chunks = [array_to_bytes(a, dt) for _, dt, a in tensors]
        with self._lock:
            block, places, inline = self._place(chunks)
            done, self._done = self._done, []
        specs = tuple((name, dt.value, tuple(int(d) for d in a.shape), off, n)
                      for (name, dt, a), (off, n) in zip(tensors, places, strict=True))
        body = pickle.dumps((meta, specs, block, done), protocol=pickle.HIGHEST_PROTOCOL)
        size = len(body) + sum(len(c) for c in inline)
        if size > MAX_FRAME:
            with self._lock:
                self._done.extend(done)
                if block >= 0 and self._arena is not None:
                    self._arena.free(block)
            raise EngineError(ErrorCode.INVALID_ARG, f"a message of {size} bytes is too large for the "
                                                     "instance channel")
        return [memoryview(HEAD.pack(size, len(body)) + body), *(memoryview(c).cast("B") for c in inline)]

    def _place(self, chunks: list[Any]) -> tuple[int, list[tuple[int, int]], list[Any]]:
        """Where the chunks go: one arena block (offset >= 0), else inline (-1). Called under the lock."""
        sizes = [len(c) for c in chunks]
        total = 0
        for n in sizes:
            total = _aligned(total) + n
        arena, region = self._arena, self._own
        if arena is not None and region is not None and total >= INLINE_BELOW:
            block = arena.alloc(total)
            if block is not None:
                places, offset = [], 0
                for chunk, n in zip(chunks, sizes, strict=True):
                    offset = _aligned(offset)
                    if n:
                        region.write(block + offset, chunk)
                    places.append((offset, n))
                    offset += n
                return block, places, []
        places, offset = [], 0
        for n in sizes:
            places.append((offset, n))
            offset += n
        return -1, places, [c for c in chunks if len(c)]

    def recv(self) -> tuple[Any, list[Received]]:
        """The next frame's metadata and tensors. Raises ChannelClosed at EOF."""
        head = self._read(HEAD.size)
        size, meta_size = HEAD.unpack(head)
        if meta_size > size:
            raise ChannelClosed(f"frame metadata of {meta_size} bytes in a payload of {size}")
        payload = memoryview(self._read(size)) if size else memoryview(b"")
        try:
            meta, specs, block, freed = _PlainUnpickler(io.BytesIO(payload[:meta_size])).load()
        except Exception as e:  # a broken peer: anything unpickling raises
            raise ChannelClosed(f"unreadable frame: {e}") from None
        if freed:
            with self._lock:
                arena = self._arena
                for offset in freed:
                    if arena is not None:
                        arena.free(offset)
        inline = payload[meta_size:]
        base: Any = inline
        if block >= 0:
            if self._pin is None:
                raise ChannelClosed("a tensor in shared memory, but this side maps no peer region")
            end = max((o + n for _, _, _, o, n in specs), default=0)
            if block + end > self._pin.size:
                raise ChannelClosed(f"block {block}+{end} is outside the peer region")
            base = np.asarray(_BlockOwner(self._pin, block, end, self))
        tensors = []
        for name, datatype, shape, offset, nbytes in specs:
            dt = DataType.from_v2(datatype)
            tensors.append((name, dt, array_from_bytes(name, dt, tuple(shape), base[offset:offset + nbytes])))
        return meta, tensors

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                k = self._sock.recv_into(view[got:])
            except OSError as e:
                raise ChannelClosed(str(e)) from None
            if k == 0:
                raise ChannelClosed("the other side closed the channel")
            got += k
        return buf

    @property
    def arena_used_bytes(self) -> int:
        return self._arena.used_bytes if self._arena is not None else 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        if self._own is not None:
            self._own.close()
        if self._peer is not None:
            self._peer.close()


def write_some(sock: socket.socket, chunks: collections.deque[memoryview], flags: int) -> None:
    """Write from the front of `chunks` (byte views), dropping what the socket took, until all is written or,
    with MSG_DONTWAIT in `flags`, until the socket would block. Raises OSError when the socket breaks."""
    while chunks:
        try:
            sent = sock.sendmsg(list(itertools.islice(chunks, 0, 64)), (), flags)
        except BlockingIOError:
            return
        while sent:
            first = chunks[0]
            if len(first) <= sent:
                sent -= len(first)
                chunks.popleft()
            else:
                chunks[0] = first[sent:]
                sent = 0


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
