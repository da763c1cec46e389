"""Message compression for both protocols: gzip and deflate, as HTTP `Content-Encoding` / `Accept-Encoding`
(RFC 9110 §8.4) and gRPC `grpc-encoding` / `grpc-accept-encoding` (grpc/doc/compression.md) name them.

"deflate" is the zlib format (RFC 1950) in both, as tritonclient and grpc write it. Decoding is bounded: the
output may not exceed the caller's limit (the message or body limit), and zlib is asked for at most one byte
past it, so a small "decompression bomb" costs the limit, never what it claims to inflate to.

Called by the HTTP routes (http/routes.py) and the gRPC call (grpc/call.py) on the loop.
"""

from __future__ import annotations

import zlib
from typing import Any

from ..errors import EngineError, ErrorCode, invalid

# zlib's wbits for each encoding: 16 + MAX_WBITS reads/writes the gzip wrapper, MAX_WBITS the zlib one.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
ENCODINGS = tuple(_WBITS)  # what we decode and encode, in our order of preference
ACCEPT = ", ".join(("identity", *ENCODINGS))  # the value of grpc-accept-encoding we advertise
_LEVEL = 1  # fastest: these are tensors on a local network, where CPU costs more than bytes


class UnsupportedEncoding(EngineError):
    """An encoding we cannot decode: HTTP answers 415, gRPC UNIMPLEMENTED with grpc-accept-encoding."""

    def __init__(self, encoding: str) -> None:
        super().__init__(ErrorCode.UNSUPPORTED, f"unsupported compression '{encoding}': this server accepts "
                                                f"{', '.join(ENCODINGS)} or identity")


class TooLarge(EngineError):
    """Decompressed data over the limit: HTTP answers 413, gRPC RESOURCE_EXHAUSTED."""

    def __init__(self, limit: int) -> None:
        super().__init__(ErrorCode.RESOURCE_EXHAUSTED,
                         f"decompressed message larger than max (over {limit} bytes)")


def is_identity(encoding: str) -> bool:
    return encoding in ("", "identity")


def decode(encoding: str, data: Any, limit: int) -> bytes:
    """`data` (bytes-like) decompressed. Raises UnsupportedEncoding for an encoding other than gzip and
    deflate, TooLarge when the result would exceed `limit` bytes, and INVALID_ARG for corrupt or truncated
    data (or bytes after the end of the compressed stream)."""
    wbits = _WBITS.get(encoding.strip().lower())
    if wbits is None:
        raise UnsupportedEncoding(encoding)
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, limit + 1)  # never more than one byte past the limit
    except zlib.error as e:
        raise invalid(f"could not decompress the {encoding} data: {e}") from None
    if len(out) > limit:
        raise TooLarge(limit)
    if not inflater.eof:
        raise invalid(f"could not decompress the {encoding} data: it ends before the compressed stream does")
    if inflater.unused_data:
        raise invalid(f"{len(inflater.unused_data)} bytes follow the end of the {encoding} data")
    return out


def encode(encoding: str, parts: list[Any]) -> bytes:
    """`parts` (bytes-likes, in order) compressed as one `encoding` stream."""
    deflater = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WBITS[encoding])
    out = [deflater.compress(p) for p in parts]
    out.append(deflater.flush())
    return b"".join(out)


def accepted(header: str) -> str | None:
    """The encoding to answer with, from an Accept-Encoding value (tokens, each with an optional `;q=`
    weight): the first one we encode whose weight is not 0, or None for identity."""
    for token in _tokens(header):
        if token in _WBITS:
            return token
    return None


def accepted_encoding(header: str, encoding: str) -> bool:
    """Whether a grpc-accept-encoding (or Accept-Encoding) value lists `encoding`."""
    return encoding in _tokens(header)


def _tokens(header: str) -> list[str]:
    """The codings a header lists, lower-cased, without those weighted q=0 (RFC 9110 §12.5.3)."""
    out = []
    for item in header.split(","):
        token, _, params = item.partition(";")
        weight = params.replace(" ", "").lower()
        if weight.startswith("q=") and weight[2:].strip("0.") == "" and weight[2:]:
            continue  # q=0, q=0.0, ...: "not acceptable"
        out.append(token.strip().lower())
    return out
