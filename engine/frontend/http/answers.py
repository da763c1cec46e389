"""The wire form of the answers an HTTP/1.1 connection (connection.py) writes on its own, without a route:
the reason phrases of its status lines, the error body every error here has (`{"error": ...}`), the access
policy's refusals, and the 503 that refuses a connection over the connection limits; and the two plain
answers of the KServe v2 routes (routes.py, extension_routes.py): an error and a JSON document.
"""

from __future__ import annotations

from typing import Any

import orjson

from ...access.policy import HTTP_STATUS, Refusal, RefusalKind
from .types import Answer

REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
           405: b"Method Not Allowed",
           408: b"Request Timeout", 409: b"Conflict", 413: b"Payload Too Large",
           415: b"Unsupported Media Type", 429: b"Too Many Requests",
           431: b"Request Header Fields Too Large", 499: b"Client Closed Request",
           500: b"Internal Server Error", 501: b"Not Implemented", 503: b"Service Unavailable",
           504: b"Gateway Timeout"}


def error_answer(status: int, message: str) -> Answer:
    """An error the connection answers itself (a broken rule: 400, 408, 413, 431), or a route does, as every
    error here."""
    return status, orjson.dumps({"error": message}), b"application/json", b""


def json_answer(data: Any, status: int = 200) -> Answer:
    """A route's JSON answer."""
    return status, orjson.dumps(data), b"application/json", b""


def refusal_answer(refusal: Refusal) -> Answer:
    """The access policy's refusal as HTTP answers it: 401 (with `WWW-Authenticate: Bearer`), 403, or 429
    with `Retry-After`; the message in `{"error": ...}`, as every error here."""
    extra = b""
    if refusal.kind is RefusalKind.EXHAUSTED:
        extra = b"Retry-After: %d\r\n" % refusal.retry_after_secs
    elif refusal.kind is RefusalKind.UNAUTHENTICATED:
        extra = b"WWW-Authenticate: Bearer\r\n"
    return HTTP_STATUS[refusal.kind], orjson.dumps({"error": refusal.message}), b"application/json", extra


def connection_refusal(message: str) -> bytes:
    """The whole answer to a connection over the limits (connections.py `ConnectionCounter`), written as it
    is accepted and followed by the close."""
    body = orjson.dumps({"error": message})
    return b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" \
        b"Connection: close\r\n\r\n%s" % (len(body), body)


__all__ = ["REASONS", "connection_refusal", "error_answer", "json_answer", "refusal_answer"]
