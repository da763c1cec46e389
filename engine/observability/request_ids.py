"""What a client's request id may be: at most MAX_REQUEST_ID_CHARS printable characters (`str.isprintable`:
no control character, no line or paragraph separator, no invisible format character such as a bidi
override); in a header (X-Request-ID, gRPC x-request-id metadata), printable ASCII.

Why a rule: a request id goes where clients should not write freely. It is echoed in a response header
(HTTP X-Request-ID, gRPC x-request-id metadata), written into every access line (`--log-verbose 1`) and
carried by trace spans. A newline in it forged a second access line in the text log; a 5,000-character id
wrote 5,000 characters into each line. The bound: 256 characters holds every id clients are seen to send (a
UUID is 36, a W3C traceparent 55, "<client>-<uuid>-<sequence>" style ids well under 128) with room to spare,
and keeps an access line about one screen line. Printable non-ASCII stays allowed in the JSON and protobuf
`id` (Triton takes any string there, and tritonclient users send UTF-8 ids); a header's bytes are not text
until decoded, so there the rule is ASCII. The OpenAI API's X-Request-ID keeps its own stricter rule
(frontend/openai/routes.py).

Who checks: every frontend where an id enters, once per request, before the request is queued: the HTTP JSON
`id` (frontend/http/codec.py; a cached plan holds an id checked when the plan was made), X-Request-ID
(frontend/http/routes.py), the generate extension's `id` (frontend/http/generate_codec.py), the gRPC `id`
field (frontend/grpc/codec.py, ModelInfer and ModelStreamInfer) and x-request-id metadata
(frontend/grpc/call.py, for every RPC, since every answer echoes it). Each answers INVALID_ARG in its
protocol's form (HTTP 400, gRPC INVALID_ARGUMENT).

Cost: `str.isprintable` is one C loop over a short string (an ASCII id is checked a byte at a time); measured
at well under a microsecond per id, next to the ~20 µs a request costs.
"""

from __future__ import annotations

from ..errors import invalid

MAX_REQUEST_ID_CHARS = 256


def request_id_problem(request_id: str) -> str | None:
    """Why `request_id` is refused, in words a client can act on, or None for a usable (or empty) id."""
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        return f"is {len(request_id)} characters long; at most {MAX_REQUEST_ID_CHARS} are allowed"
    if not request_id.isprintable():
        return "must be printable: no control characters such as a line break, no separators or format " \
               "characters"
    return None


def check_request_id(request_id: str, where: str = "request id") -> str:
    """`request_id` itself, or INVALID_ARG naming `where` the id came from and the rule it breaks."""
    if len(request_id) <= MAX_REQUEST_ID_CHARS and request_id.isprintable():
        return request_id  # the usual case: two C calls
    raise invalid(f"{where} {request_id_problem(request_id)}")


def header_request_id_problem(value: bytes) -> str | None:
    """Why a header's request id (its raw bytes) is refused, or None."""
    if not value.isascii():
        return "must be printable ASCII"
    return request_id_problem(value.decode("ascii"))


def check_header_request_id(value: bytes, where: str) -> str:
    """A header's request id as text, or INVALID_ARG naming `where` and the rule it breaks."""
    problem = header_request_id_problem(value)
    if problem is not None:
        raise invalid(f"{where} {problem}")
    return value.decode("ascii")


__all__ = ["MAX_REQUEST_ID_CHARS", "check_header_request_id", "check_request_id", "header_request_id_problem",
           "request_id_problem"]
