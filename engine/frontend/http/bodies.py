"""A request's body as the KServe v2 routes read it: decompressed when the client compressed it, and, for the
endpoints that take a JSON object (the repository, shared memory, logging and trace extensions), parsed
within the wire's limits. Called by the handlers of routes.py and extension_routes.py.
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import invalid
from .. import compression
from ..wire import limits as wire_limits
from .codec import check_json_depth, too_deep
from .types import HttpRequest


def request_body(req: HttpRequest, limit: int) -> bytes | bytearray:
    """The request body, decompressed when it has a Content-Encoding (gzip, deflate), within `limit` bytes:
    compression.TooLarge beyond it, compression.UnsupportedEncoding for other encodings."""
    body = req.body
    encoding = req.headers.get(b"content-encoding")
    if encoding is None or compression.is_identity(encoding.decode("latin-1").strip().lower()):
        return body
    return compression.decode(encoding.decode("latin-1"), body, limit)


def json_body(req: HttpRequest, limit: int) -> dict[str, Any]:
    """The request body as a JSON object ({} for none), within `limit` bytes decompressed and the wire's
    JSON depth: EngineError INVALID_ARG for anything else."""
    body = request_body(req, limit)
    if not body.strip():
        return {}  # tritonclient sends some requests with no body
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        if str(e).startswith("depth limit exceeded"):  # orjson stops at 1024 levels
            raise too_deep() from None
        raise invalid(f"malformed JSON in request body: {e}") from None
    if not isinstance(doc, dict):
        raise invalid("request body must be a JSON object")
    check_json_depth(doc, wire_limits().max_json_depth)
    return doc


__all__ = ["json_body", "request_body"]
