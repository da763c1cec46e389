"""Frames on the socket between the engine and a frontend: length-prefixed, one per loop round and direction.

A frame is a 8-byte head (the payload's length, then the metadata's length, both big-endian u32), the
metadata (a pickled tuple of plain Python values: ids, names, shapes, offsets, error texts) and then the
inline bytes (tensor bytes that did not go through a shared-memory arena), which the metadata addresses by
offset. Tensor bytes are never pickled: a sender lists them as buffers after the metadata and the socket
write gathers them; a receiver makes numpy views over the received frame.

`FrameReader` is sans-I/O: bytes in, complete frames out. A frame larger than what one read brings is
collected into one buffer allocated at its full size, so a large inline tensor costs one copy out of the
socket, not a chain of growing copies.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Sequence
from typing import Any

HEAD = struct.Struct(">II")  # payload length (metadata + inline bytes), metadata length
MAX_FRAME_BYTES = (1 << 32) - 1  # the u32 length field; a frontend's requests larger than this go in pieces


class FrameError(Exception):
    """The peer sent bytes that are not a frame: the channel is broken and is closed."""


def encode_frame(meta: Any, inline: Sequence[Any] = ()) -> list[Any]:
    """A frame as buffers for one gathered write: head, pickled `meta`, then the `inline` buffers as they
    are (not copied here). `meta` refers to inline bytes by their offset from the first inline buffer."""
    body = pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)
    size = len(body)
    for part in inline:
        size += len(part) if not isinstance(part, memoryview) else part.nbytes
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {size} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    return [HEAD.pack(size, len(body)), body, *inline]


class FrameReader:
    """Cuts a byte stream into frames: `feed(data)` returns the (meta, inline) pairs completed by `data`,
    where `inline` is a memoryview of the frame's inline bytes (valid as long as anything references it)."""

    __slots__ = ("_buf", "_filled", "_in_head")

    def __init__(self) -> None:
        self._buf: bytearray | None = None  # a frame being collected: its head, then head + payload in full
        self._filled = 0
        self._in_head = False

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[Any, memoryview]]:
        frames: list[tuple[Any, memoryview]] = []
        view = memoryview(data)
        pos, end = 0, len(view)
        while pos < end:
            buf = self._buf
            if buf is None:
                if end - pos >= HEAD.size:
                    size, _ = HEAD.unpack_from(view, pos)
                    if end - pos - HEAD.size >= size:  # the whole frame is in this read: no copy
                        frames.append(_parse(view, pos))
                        pos += HEAD.size + size
                        continue
                    buf = self._buf = bytearray(HEAD.size + size)
                    self._in_head = False
                else:
                    buf = self._buf = bytearray(HEAD.size)
                    self._in_head = True
                self._filled = 0
            take = min(len(buf) - self._filled, end - pos)
            buf[self._filled:self._filled + take] = view[pos:pos + take]
            self._filled += take
            pos += take
            if self._filled < len(buf):
                break
            if self._in_head:  # the head is complete: collect head + payload in one buffer of full size
                size, _ = HEAD.unpack_from(buf)
                whole = bytearray(HEAD.size + size)
                whole[:HEAD.size] = buf
                self._buf, self._in_head = whole, False
                if size:
                    continue
                buf = whole
            self._buf = None
            frames.append(_parse(memoryview(buf), 0))
        return frames


def _parse(view: memoryview, pos: int) -> tuple[Any, memoryview]:
    size, meta_size = HEAD.unpack_from(view, pos)
    if meta_size > size:
        raise FrameError(f"frame metadata of {meta_size} bytes in a payload of {size}")
    start = pos + HEAD.size
    try:
        meta = pickle.loads(view[start:start + meta_size])
    except Exception as e:  # anything unpickling can raise: the peer is broken
        raise FrameError(f"unreadable frame metadata: {e!r}") from None
    return meta, view[start + meta_size:start + size]
