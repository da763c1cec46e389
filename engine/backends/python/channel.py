"""One end of the socket between the engine and a Python-model instance process.

Frames and tensor placement are those of every process channel (engine/ipc/): an 8-byte head, the metadata,
then the inline tensor bytes. The metadata is a typed envelope (messages.py): the message, the headers of its
tensors, where they are, and the blocks of the receiver's region this side no longer views; the reader checks
every field's type, so a model process cannot make the server run code by what it sends. Tensors travel
through shared memory (engine/shm/regions.py): each side owns one memfd `Region` it writes, carved by an
`Arena`, and maps the other side's region. A message's tensors go into one block of the sender's arena; the
frame names the block and each tensor's (offset, size). Small messages, or any message when the arena is
full, carry their bytes inline instead, so nothing fails for want of space.

The receiver's arrays are numpy views over the peer's block (engine/ipc/tensors.py `PeerBlocks`): when the
last view is gone the block's offset is queued, and the next frame this side sends tells the peer to free it
(the engine pings every instance every second or so, so frees never wait long). BYTES tensors cross in
their wire form, so object arrays are never pickled.

Only the I/O is this module's: a blocking socket, a lock per side. Thread-safe: `send` and `frame` may be
called from any thread; `recv` (blocking: the instance process's reader thread) or `receive` (what has
arrived, never waiting: the engine's event loop, when the socket is readable) from one reader. Reads take what
the socket has, up to `RECV_BYTES`, in one system call, and cut it into frames (engine/ipc/frames.py
`FrameReader`): a burst of small frames costs one read, not two per frame. The engine's side writes through
outbox.py, which never blocks the event loop.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import select
import socket
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import EngineError, ErrorCode
from ...frontend.wire import array_to_bytes
from ...ipc.frames import HEAD, MAX_FRAME_BYTES, FrameError, FrameReader, encode_frame
from ...ipc.tensors import Inline, PeerBlocks, Reads, place, read_arrays
from ...shm.regions import Arena, Region
from ...types import DataType
from .messages import Envelope, TensorHeader, ToEngineFrame, ToInstanceFrame, decoder, encode_envelope

INLINE_BELOW = 4096  # tensors of a message smaller than this in all go inline: a block is not worth it
RECV_BYTES = 65536  # one read's buffer: a fresh one per read (np.empty: not zeroed), as arrays view it
READS_CACHED = 256  # tensor header tuples whose Reads are kept (a model sends few distinct ones)

# A received tensor: name, datatype, array (a view over the peer's block or the frame).
Received = tuple[str, DataType, np.ndarray]
# Tensors to send: name, datatype, array.
Tensors = Sequence[tuple[str, DataType, np.ndarray]]


class ChannelClosed(Exception):
    """The other side is gone (EOF or a broken socket)."""


class Channel:
    """Frames over `sock`; tensors written into `own` (this side's region) and read from `peer`. `sends` and
    `receives`: the envelopes of this side's frames and of the peer's (messages.py): `engine_side` and
    `instance_side` make the two ends."""

    def __init__(self, sock: socket.socket, own: Region | None, peer: Region | None, sends: Envelope,
                 receives: Envelope) -> None:
        self._sock = sock
        self._envelope = sends
        self._decode = decoder(receives)
        self._own = own
        self._arena = Arena(own) if own is not None else None
        self._peer = peer
        # Writable views: a model may write into its inputs (in Triton they are its shared memory); a block is
        # one message's alone until this side reports it freed.
        self._blocks = PeerBlocks(peer, read_only=False) if peer is not None else None
        self._frames = FrameReader(self._decode)
        # What a frame's tensor headers read as, by the headers (frozen Structs, hashable): a model answers
        # the same few shapes again and again, so each frame skips the datatype lookups and Reads' checks.
        self._reads: dict[tuple[TensorHeader, ...], tuple[list[tuple[str, DataType]], Reads]] = {}
        self._closed_by_peer = False  # EOF seen: the frames before it are still taken
        self._arrived: collections.deque[tuple[Any, memoryview]] = collections.deque()  # cut, not yet taken
        self._lock = threading.Lock()  # the arena
        self._send_lock = threading.Lock()  # one frame at a time on the socket (send)

    @property
    def socket(self) -> socket.socket:
        return self._sock

    def send(self, message: Any, tensors: Tensors = ()) -> None:
        """Send one frame: `message` (one of messages.py's, for the peer's side) and `tensors` (name,
        datatype, array), blocking until the socket took it all. The instance process's side uses it; the
        engine's side writes through an `Outbox` (outbox.py) instead, which never blocks its caller. Do not
        mix the two on one channel."""
        with self._send_lock:
            chunks = collections.deque(self.frame(message, tensors))
            try:
                write_some(self._sock, chunks, 0)
            except OSError as e:
                raise ChannelClosed(str(e)) from None

    def frame(self, message: Any, tensors: Tensors = ()) -> list[memoryview]:
        """One frame's bytes, ready to write in order: the tensors placed in an arena block (copied there) or
        left inline as views of the arrays (no copy). Raises EngineError when a frame is too large or a
        tensor has no wire form. Thread-safe; the frees this side owes the peer ride on this frame."""
        chunks = [array_to_bytes(a, dt) for _, dt, a in tensors]
        inline_bytes = 0
        for chunk in chunks:
            inline_bytes += len(chunk)
        if inline_bytes < INLINE_BELOW:
            return self._small_frame(message, tensors, chunks)
        inline = Inline()
        with self._lock:
            placement = place(chunks, self._arena, self._own, inline, INLINE_BELOW)
        freed = self._blocks.take_freed() if self._blocks is not None else []
        # Shapes: numpy's tuples of ints. `_value_`: the v2 name without the `value` property's descriptor
        # call (~0.3 us a tensor on Python 3.11, on both sides of every frame).
        specs = tuple([TensorHeader(name, dt._value_, a.shape) for name, dt, a in tensors])
        try:
            parts = encode_frame(self._envelope(message, specs, placement, freed), inline.take(),
                                 encode_envelope)
        except FrameError as e:
            with self._lock:
                if placement[0] >= 0 and self._arena is not None:
                    self._arena.free(placement[0])
            if self._blocks is not None:
                self._blocks.return_freed(freed)
            raise EngineError(ErrorCode.INVALID_ARG, f"a message too large for the instance channel: {e}"
                              ) from None
        return [memoryview(p).cast("B") for p in parts]

    def _small_frame(self, message: Any, tensors: Tensors, chunks: list[Any]) -> list[memoryview]:
        """`frame` for tensors under INLINE_BELOW in all (a small model's every batch and answer): inline, so
        no arena, no lock and no `place`, and the frame is one bytes object, built in one join. What it
        writes is what the general path writes for such tensors (engine/ipc/tensors.py `place`, frames.py
        `encode_frame`). Why its own path: it runs twice per request of a small model, once in each process,
        and each step it skips costs a few µs on a loaded machine, where the code runs with cold caches."""
        locations = []
        offset = 0
        for chunk in chunks:
            n = len(chunk)
            locations.append((offset, n))
            offset += n
        freed = self._blocks.take_freed() if self._blocks is not None else []
        specs = tuple([TensorHeader(name, dt._value_, a.shape) for name, dt, a in tensors])
        body = encode_envelope(self._envelope(message, specs, (-1, tuple(locations)), freed))
        size = len(body) + offset
        if size > MAX_FRAME_BYTES:  # metadata of over 4 GiB: not a frame (encode_frame's check)
            if self._blocks is not None:
                self._blocks.return_freed(freed)
            raise EngineError(ErrorCode.INVALID_ARG, "a message too large for the instance channel: a "
                              f"frame of {size} bytes exceeds the limit of {MAX_FRAME_BYTES}")
        return [memoryview(b"".join([HEAD.pack(size, len(body)), body, *chunks]))]

    def recv(self) -> tuple[Any, list[Received]]:
        """The next frame's message and tensors, waiting for it. Raises ChannelClosed at EOF, and for a frame
        that is not one (its metadata not an envelope of the peer's messages, a block outside the peer's
        region)."""
        while not self._arrived:
            if self._closed_by_peer:
                raise ChannelClosed("the other side closed the channel")
            self._read_some(0)
        return self._unpack(*self._arrived.popleft())

    def receive(self) -> list[tuple[Any, list[Received]]]:
        """The frames that have arrived, never waiting (the socket stays blocking for the writers: each read
        is MSG_DONTWAIT); [] when none is complete yet. Raises ChannelClosed as `recv` does, once the frames
        that came before the EOF have been taken."""
        while self._read_some(socket.MSG_DONTWAIT):
            pass
        if self._closed_by_peer and not self._arrived:
            raise ChannelClosed("the other side closed the channel")
        out = []
        while self._arrived:
            out.append(self._unpack(*self._arrived.popleft()))
        return out

    def _read_some(self, flags: int) -> bool:
        """One read into a fresh buffer, cut into frames. True when it filled the buffer (there may be more
        to read at once); False after a shorter read, at EOF, or with MSG_DONTWAIT on a drained socket."""
        if self._closed_by_peer:
            return False
        buf = np.empty(RECV_BYTES, np.uint8).data
        try:
            n = self._sock.recv_into(buf, RECV_BYTES, flags)
        except BlockingIOError:
            return False
        except OSError as e:
            raise ChannelClosed(str(e)) from None
        if n == 0:
            self._closed_by_peer = True
            return False
        try:
            self._arrived.extend(self._frames.feed(buf[:n]))
        except FrameError as e:
            raise ChannelClosed(f"unreadable frame: {e}") from None
        return n == RECV_BYTES  # a full buffer: there may be more

    def _unpack(self, envelope: Any, inline: memoryview) -> tuple[Any, list[Received]]:
        """A frame's message and its tensors, as views over the peer's block or the frame's bytes; the
        blocks the peer says it no longer views are freed in this side's arena."""
        try:
            if envelope.freed and self._arena is not None:
                with self._lock:
                    for offset in envelope.freed:
                        self._arena.free(offset)
            headers = envelope.tensors
            known = self._reads.get(headers)
            if known is None:
                known = self._reads_of(headers)
            named, reads = known
            placement = envelope.placement
            arrays = (self._blocks.read(reads, placement, inline) if self._blocks is not None
                      else read_arrays(reads, placement, None, inline))
        except (FrameError, EngineError, ValueError, TypeError) as e:  # a broken peer
            raise ChannelClosed(f"unreadable frame: {e}") from None
        received = [(name, dt, array) for (name, dt), array in zip(named, arrays, strict=True)]
        return envelope.message, received

    def _reads_of(self, headers: tuple[TensorHeader, ...]) -> tuple[list[tuple[str, DataType]], Reads]:
        """Raises EngineError for a datatype that is not one."""
        typed = [(t.name, DataType.from_v2(t.datatype), t.shape) for t in headers]
        known = [(name, dt) for name, dt, _ in typed], Reads(typed)
        if len(self._reads) >= READS_CACHED:
            self._reads.clear()
        self._reads[headers] = known
        return known

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


def engine_side(sock: socket.socket, own: Region | None, peer: Region | None) -> Channel:
    """The engine's end (process.py): sends messages.ToInstance, receives messages.ToEngine."""
    return Channel(sock, own, peer, ToInstanceFrame, ToEngineFrame)


def instance_side(sock: socket.socket, own: Region | None, peer: Region | None) -> Channel:
    """The instance process's end (stub.py): sends messages.ToEngine, receives messages.ToInstance."""
    return Channel(sock, own, peer, ToEngineFrame, ToInstanceFrame)


def write_some(sock: socket.socket, chunks: collections.deque[memoryview], flags: int) -> None:
    """Write from the front of `chunks` (byte views), dropping what the socket took, until all is written or,
    with MSG_DONTWAIT in `flags`, until the socket would block. Without it, a full socket is waited on (poll)
    even when its descriptor is non-blocking: the engine's is, once the loop watches it (libuv's poll handle,
    under uvloop's add_reader, sets O_NONBLOCK). Raises OSError when the socket breaks."""
    while chunks:
        try:
            if len(chunks) == 1:  # a small frame (Channel._small_frame): no list of buffers to build
                sent = sock.send(chunks[0], flags)
            else:
                sent = sock.sendmsg(list(itertools.islice(chunks, 0, 64)), (), flags)
        except BlockingIOError:
            if flags & socket.MSG_DONTWAIT:
                return
            writable = select.poll()
            writable.register(sock.fileno(), select.POLLOUT)
            writable.poll()
            continue
        while sent:
            first = chunks[0]
            if len(first) <= sent:
                sent -= len(first)
                chunks.popleft()
            else:
                chunks[0] = first[sent:]
                sent = 0
