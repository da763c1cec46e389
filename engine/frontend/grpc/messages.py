"""gRPC's message layer (grpc/doc/PROTOCOL-HTTP2.md "Length-Prefixed-Message", grpc/doc/compression.md): the
5-byte prefix, decompressing a request message, framing (and compressing) a response message, and which
encoding a call's responses get. Pure functions of bytes and header values; call.py's `Call` uses them.
"""

from __future__ import annotations

import struct
from typing import Any

from ...errors import EngineError
from .. import compression
from ..h2.headers import literal
from .handlers import GrpcStatus as S
from .rpcs import RESPONSE_HEAD

PREFIX = struct.Struct(">BL")  # Compressed-Flag, Message-Length
ACCEPT_ENCODING = literal(b"grpc-accept-encoding", compression.ACCEPT.encode())
# Response heads of calls whose responses are compressed, by encoding.
COMPRESSED_HEADS = {e: RESPONSE_HEAD + literal(b"grpc-encoding", e.encode()) + ACCEPT_ENCODING
                    for e in compression.ENCODINGS}


class MessageError(Exception):
    """A request message that cannot be read: the call ends with `status`, `message` and the encoded header
    field `extra` in its trailers."""

    def __init__(self, status: int, message: str, extra: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


def response_encoding(encoding: str, accept: bytes) -> str | None:
    """How to compress a call's responses: like its requests, when the client compresses them with an encoding
    it accepts back (tritonclient's `compression_algorithm`), else not at all. grpc servers compress nothing
    unasked, and the hot path of clients that don't compress (perf_analyzer) stays as it is."""
    if encoding not in compression.ENCODINGS:
        return None
    return encoding if compression.accepted_encoding(accept.decode("latin-1"), encoding) else None


def response_head(encoding: str | None) -> bytes:
    """The response header block of a call whose responses are compressed with `encoding` (None: not)."""
    return RESPONSE_HEAD if encoding is None else COMPRESSED_HEADS[encoding]


def decompress(flag: int, encoding: str, message: memoryview, limit: int) -> bytes:
    """A message with the Compressed-Flag `flag` set, decompressed with the call's grpc-encoding within
    `limit` bytes; MessageError when it cannot be."""
    if flag != 1:
        raise MessageError(S.INTERNAL, f"invalid Compressed-Flag {flag} on a request message")
    if compression.is_identity(encoding):
        raise MessageError(S.INTERNAL, "a request message is marked compressed but has no grpc-encoding")
    try:
        return compression.decode(encoding, message, limit)
    except compression.UnsupportedEncoding as unsupported:
        raise MessageError(S.UNIMPLEMENTED, unsupported.message, ACCEPT_ENCODING) from None
    except compression.TooLarge as too_large:
        raise MessageError(S.RESOURCE_EXHAUSTED, too_large.message) from None
    except EngineError as corrupt:
        raise MessageError(S.INTERNAL, corrupt.message) from None


def frame(parts: list[Any], size: int, encoding: str | None) -> list[Any]:
    """A response message of `size` bytes in `parts`, length-prefixed, compressed with `encoding` if not None:
    the parts to write, the message's bytes not copied when uncompressed."""
    if encoding is None:
        return [PREFIX.pack(0, size), *parts]
    body = compression.encode(encoding, parts)
    return [PREFIX.pack(1, len(body)), body]


__all__ = ["ACCEPT_ENCODING", "PREFIX", "MessageError", "decompress", "frame", "response_encoding",
           "response_head"]
