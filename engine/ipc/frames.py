"""Frames on a process channel: length-prefixed, typed metadata, tensor bytes inline after it.

A frame is an 8-byte head (the payload's length, then the metadata's length, both big-endian u32), the
metadata in the channel's own codec (typed msgspec messages: engine/workers/messages.py between the engine
and its frontends, engine/backends/python/messages.py between the engine and a Python model's instances),
and then the inline bytes (tensor bytes that did not go through a shared-memory arena), which the metadata
addresses by offset. Tensor bytes are never encoded: a sender lists them as buffers after the metadata and
the socket write gathers them; a receiver makes numpy views over the received frame.

Nothing here unpickles: a peer process (a frontend, a Python model's instance) that is compromised or broken
cannot make the engine run code by what it sends, only break its own channel (the codec raises FrameError,
upon which the channel is closed).

`FrameReader` is sans-I/O: bytes in, complete frames out. A frame larger than what one read brings is
collected into one buffer allocated at its full size, so a large inline tensor costs one copy out of the
socket, not a chain of growing copies. A blocking reader that knows the sizes (the head first) can read the
payload itself and call `parse_frame`.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

HEAD = struct.Struct(">II")  # payload length (metadata + inline bytes), metadata length
MAX_FRAME_BYTES = (1 << 32) - 1  # the u32 length field; a larger message goes in pieces or is refused
JOIN_BELOW_BYTES = 65536  # a frame smaller than this leaves `encode_frame` as one bytes object


class FrameError(Exception):
    """The peer sent bytes that are not a frame, or metadata its channel's codec cannot read: the channel is
    broken and is closed. Raised by `encode_frame` too, for a frame too large for the head."""


# A channel's metadata codec (engine/workers/messages.py, engine/backends/python/messages.py). A decoder
# raises FrameError for anything it cannot read.
Encode = Callable[[Any], bytes]
Decode = Callable[[memoryview], Any]


def encode_frame(meta: Any, inline: Sequence[Any], encode: Encode) -> list[Any]:
    """A frame as buffers for one gathered write: head, `meta` encoded by the channel's `encode`, then the
    `inline` buffers as they are (not copied here). `meta` refers to inline bytes by
    their offset from the first inline buffer. A frame under JOIN_BELOW_BYTES is one bytes object instead:
    copying a few KiB costs less than handing the transport and the kernel a buffer per small tensor
    (`simple`'s answers: 2 × 64 bytes each)."""
    body = encode(meta)
    size = len(body)
    for part in inline:
        size += part.nbytes if isinstance(part, memoryview) else len(part)
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {size} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    if size < JOIN_BELOW_BYTES:
        return [b"".join([HEAD.pack(size, len(body)), body, *inline])]
    return [HEAD.pack(size, len(body)), body, *inline]


def parse_frame(view: memoryview, pos: int, decode: Decode) -> tuple[Any, memoryview]:
    """The frame whose head starts at `pos` in `view` (all of it there): (metadata, inline bytes)."""
    size, meta_size = HEAD.unpack_from(view, pos)
    if meta_size > size:
        raise FrameError(f"frame metadata of {meta_size} bytes in a payload of {size}")
    start = pos + HEAD.size
    return decode(view[start:start + meta_size]), view[start + meta_size:start + size]


class FrameReader:
    """Cuts a byte stream into frames: `feed(data)` returns the (meta, inline) pairs completed by `data`,
    where `inline` is a memoryview of the frame's inline bytes (valid as long as anything references it).
    Raises FrameError for a broken frame; the stream is then out of step and the channel must close.
    `decode`: the channel's metadata decoder."""

    __slots__ = ("_buf", "_decode", "_in_head", "_want")

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        # A frame being collected: its head, then head + payload. It grows with the bytes that arrive, never
        # to the size a head declares before they do: a broken or hostile peer declaring 1 GiB costs only
        # what it really sends.
        self._buf: bytearray | None = None
        self._want = 0  # the bytes `_buf` must reach
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
                        frames.append(parse_frame(view, pos, self._decode))
                        pos += HEAD.size + size
                        continue
                    self._want, self._in_head = HEAD.size + size, False
                else:
                    self._want, self._in_head = HEAD.size, True
                buf = self._buf = bytearray()
            take = min(self._want - len(buf), end - pos)
            buf += view[pos:pos + take]
            pos += take
            if len(buf) < self._want:
                break
            if self._in_head:  # the head is complete: go on collecting its payload in the same buffer
                size, _ = HEAD.unpack_from(buf)
                self._want, self._in_head = HEAD.size + size, False
                if size:
                    continue
            self._buf = None
            frames.append(parse_frame(memoryview(buf), 0, self._decode))
        return frames
