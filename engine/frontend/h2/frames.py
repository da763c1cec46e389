"""HTTP/2 frames (RFC 9113 §4, §6): type, flag, error and setting numbers, and the serializers the core
writes with. Parsing lives in core.py's receive loop, which reads each 9-byte frame header with one
`FRAME_HEADER.unpack_from` call; the helpers here check the per-type payload rules the loop delegates.

Serializers return `bytes` ready for `transport.write`; callers concatenate several frames into one write.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # the client connection preface (§3.4)

# §4.1: Length (24) | Type (8) | Flags (8) | R (1) + Stream Identifier (31).
# The length is read as 16 + 8 bits.
FRAME_HEADER = struct.Struct(">HBBBL")
FRAME_HEADER_SIZE = 9
STREAM_ID_MASK = 0x7FFFFFFF  # the reserved bit is ignored on receipt (§4.1)

# Frame types (§6).
(DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE,
 CONTINUATION) = range(10)

# Flags (§6.1, §6.2, §6.5, §6.7).
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings (§6.5.2) and their defaults.
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6
DEFAULT_WINDOW = 65535  # §6.9.2
MAX_WINDOW = (1 << 31) - 1  # §6.9.1
DEFAULT_MAX_FRAME_SIZE = 16384  # §4.2
LARGEST_MAX_FRAME_SIZE = (1 << 24) - 1  # §6.5.2


class H2Error(enum.IntEnum):
    """Error codes for RST_STREAM and GOAWAY (§7)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


def error_code(value: int) -> H2Error | int:
    """An error code as received: named if we know it, else the number (unknown codes are legal, §7)."""
    try:
        return H2Error(value)
    except ValueError:
        return value


class H2ConnectionError(Exception):
    """A connection error (§5.4.1): the connection answers with GOAWAY carrying `code` and closes."""

    def __init__(self, code: H2Error, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class H2StreamError(Exception):
    """A stream error (§5.4.2): the stream is reset with RST_STREAM carrying `code`; the connection lives
    on."""

    def __init__(self, stream_id: int, code: H2Error, message: str) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.code = code
        self.message = message


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def frame_header(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    """Only the 9-byte header, for a payload the caller writes next to it without copying it first."""
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


def settings(pairs: Iterable[tuple[int, int]]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HL", key, value) for key, value in pairs))


SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment))


def rst_stream(stream_id: int, code: H2Error) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">L", code))


def goaway(last_stream_id: int, code: H2Error, debug: str = "") -> bytes:
    return frame(GOAWAY, 0, 0,
                 struct.pack(">LL", last_stream_id, code) + debug.encode("utf-8", "replace")[:1024])


def ping(payload: bytes, ack: bool = False) -> bytes:
    return frame(PING, ACK if ack else 0, 0, payload)


def headers(stream_id: int, block: bytes, end_stream: bool, max_frame_size: int) -> bytes:
    """A field block as HEADERS plus as many CONTINUATION frames as the peer's frame size needs (§6.2, §6.10).
    The frames are written back to back: nothing may come between them (§4.3)."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_frame_size:
        return frame(HEADERS, flags | END_HEADERS, stream_id, block)
    chunks = [block[i:i + max_frame_size] for i in range(0, len(block), max_frame_size)]
    out = [frame(HEADERS, flags, stream_id, chunks[0])]
    for chunk in chunks[1:-1]:
        out.append(frame(CONTINUATION, 0, stream_id, chunk))
    out.append(frame(CONTINUATION, END_HEADERS, stream_id, chunks[-1]))
    return b"".join(out)


def strip_padding(payload: memoryview, flags: int, stream_id: int) -> memoryview:
    """The payload of a DATA or HEADERS frame without its padding (§6.1, §6.2)."""
    if not flags & PADDED:
        return payload
    if not payload:
        raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR,
                                f"padded frame on stream {stream_id} has no pad length")
    pad = payload[0]
    if pad >= len(payload):  # "padding that exceeds the size remaining" is a PROTOCOL_ERROR (§6.1)
        raise H2ConnectionError(H2Error.PROTOCOL_ERROR,
                                f"padding of {pad} bytes exceeds the frame on stream {stream_id}")
    return payload[1:len(payload) - pad]


def parse_settings(payload: memoryview) -> list[tuple[int, int]]:
    """A SETTINGS payload as (identifier, value) pairs, with the value rules of §6.5.2 checked."""
    if len(payload) % 6:
        raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, "SETTINGS length is not a multiple of 6")  # §6.5
    pairs = [struct.unpack_from(">HL", payload, i) for i in range(0, len(payload), 6)]
    for key, value in pairs:
        if key == SETTINGS_ENABLE_PUSH and value > 1:
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR,
                                    f"SETTINGS_ENABLE_PUSH must be 0 or 1, got {value}")
        if key == SETTINGS_INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
            raise H2ConnectionError(H2Error.FLOW_CONTROL_ERROR,
                                    f"SETTINGS_INITIAL_WINDOW_SIZE {value} exceeds 2^31-1")
        if key == SETTINGS_MAX_FRAME_SIZE and not DEFAULT_MAX_FRAME_SIZE <= value <= LARGEST_MAX_FRAME_SIZE:
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR,
                                    f"SETTINGS_MAX_FRAME_SIZE {value} is outside 2^14..2^24-1")
    return pairs
