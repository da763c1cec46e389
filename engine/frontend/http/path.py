"""One parse of an HTTP request's target: which endpoint it names, and so which API group it is in.

Why one: the access check (engine/access/policy.py, asked by connection.py) and the router
(routes.py, and with --workers N the frontend's forwarding and the engine's control runner) must read a
request the same way. When the check classified the raw path and the router percent-decoded it,
`/v2/%72epository/...` was in no group for the check and the repository API for the router: every restriction
and key group was skipped. Now the connection parses the target once (`parse_target`), the check asks the
result for its group, and the router dispatches on the same result's `endpoint`; a frontend process forwards
the parsed result itself (`to_wire`), never the text to be read again. The decoded segments are matched
against the endpoint table (frontend/endpoints.py), whose row fixes both the group and the handler, so
whatever routes is in the group of what it routes to, by construction.

The rules (RFC 3986 §3.3, read strictly, as an API server may):
- the target is an absolute path (origin-form), with an optional query after the first `?`; no fragment;
- it is split at `/` first, then each segment is percent-decoded once, then read as UTF-8: `%2F` (an encoded
  `/`), `%` not followed by two hex digits, bytes that are not UTF-8, a control character (raw or encoded,
  C0, DEL or C1), an empty segment (`//`) and a dot segment (`.` or `..`, raw or encoded) are refused (400):
  each is a path two readers could take for two different things. One trailing `/` is allowed and ignored;
- a second round of decoding never happens: `%2572` is the three characters `%72`, in every reader.
The query is kept as it came (`query`): the batch API reads its own parameters from it.
"""

from __future__ import annotations

import unicodedata
from typing import Any, NamedTuple

from ...access.groups import ApiGroup
from ...bounded_cache import BoundedCache
from ..endpoints import Endpoint, match


class HttpTarget(NamedTuple):
    """A parsed request target. `segments`: the path's segments, decoded; `name`: the model (model and
    repository endpoints) or the shared-memory region (empty: every region); `version`: the model version
    ("" for the default); `action`: a shared-memory endpoint's (`status`, `register`, `unregister`);
    `problem`: why a MALFORMED target was refused, in words a client can act on. A tuple: made once per
    request, so it must cost little."""

    endpoint: Endpoint
    segments: tuple[str, ...] = ()
    query: str = ""
    name: str = ""
    version: str = ""
    action: str = ""
    problem: str = ""

    @property
    def group(self) -> ApiGroup | None:
        return self.endpoint.group

    @property
    def path(self) -> str:
        """The decoded path, for messages."""
        return "/" + "/".join(self.segments)

    def to_wire(self) -> tuple[str, tuple[str, ...], str, str, str, str]:
        """Plain values, as a forwarded request crosses to the engine (workers/messages.py `HttpCall`)."""
        return (self.endpoint.name, self.segments, self.query, self.name, self.version, self.action)

    @staticmethod
    def from_wire(wire: tuple[Any, ...]) -> HttpTarget:
        endpoint, segments, query, name, version, action = wire
        return HttpTarget(Endpoint[endpoint], tuple(segments), query, name, version, action)


_MALFORMED, _NONE = Endpoint.MALFORMED, Endpoint.NONE
_new = tuple.__new__  # a target straight from its fields: the named tuple's own __new__ is a Python frame


def malformed(problem: str) -> HttpTarget:
    """A target refused before anything else is asked of it (400, `problem` the message)."""
    return HttpTarget(_MALFORMED, (), "", "", "", "", problem)


# Parses of recent targets, by the target's bytes: a client repeats the same few (its model's infer), and a
# lookup costs a tenth of a parse. Bounded in entries and key size, and emptied when full, so distinct
# targets cannot grow it; a target is immutable, so handing one out twice is safe.
CACHE_MAX_ENTRIES = 1024
CACHE_MAX_URL_BYTES = 256
_CACHE: BoundedCache[bytes, HttpTarget] = BoundedCache(CACHE_MAX_ENTRIES, CACHE_MAX_URL_BYTES)


def parse_target(url: bytes) -> HttpTarget:
    """The request target as the connection received it (`/v2/models/m/infer?x=1`), parsed and classified.
    Never raises: a target that breaks a rule comes back MALFORMED with the rule in `problem`."""
    target = _CACHE.get(url)
    if target is None:
        target = _CACHE.put(url, _parse(url))
    return target


def _parse(url: bytes) -> HttpTarget:
    path, _, raw_query = url.partition(b"?")
    query = raw_query.decode("latin-1") if raw_query else ""
    if not path.startswith(b"/"):
        return malformed("the request target must be a path starting with '/'")
    if b"%" not in path and b"#" not in path and path.isascii():  # the usual target: nothing to decode
        text = path[1:].decode("ascii")
        segments = text.split("/")
        if len(segments) > 1 and not segments[-1]:
            segments.pop()  # one trailing '/'
        if len(segments) == 1 and not segments[0]:
            return HttpTarget(_NONE, (), query)
        if not text.isprintable() or "" in segments or "." in segments or ".." in segments:
            return malformed(next(_segment_problem(s) for s in segments
                                  if s in _DOTS_OR_EMPTY or not s.isprintable()))
        return classify(tuple(segments), query)
    if b"#" in path:
        return malformed("the request target must not carry a fragment ('#')")
    parts = path[1:].split(b"/")
    if len(parts) > 1 and not parts[-1]:
        parts.pop()
    if parts == [b""]:
        return HttpTarget(_NONE, (), query)
    decoded: list[str] = []
    for part in parts:
        segment = _decode(part)
        if isinstance(segment, _Problem):
            return malformed(segment.text)
        decoded.append(segment)
    return classify(tuple(decoded), query)


_DOTS_OR_EMPTY = ("", ".", "..")


class _Problem:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_HEX = frozenset(b"0123456789abcdefABCDEF")


def _decode(part: bytes) -> str | _Problem:
    """One raw segment, percent-decoded once and read as UTF-8, or why it cannot be."""
    data = part
    if b"%" in part:
        out = bytearray()
        i, n = 0, len(part)
        while i < n:
            byte = part[i]
            if byte != 0x25:  # '%'
                out.append(byte)
                i += 1
                continue
            digits = part[i + 1:i + 3]
            if len(digits) != 2 or digits[0] not in _HEX or digits[1] not in _HEX:
                return _Problem("invalid percent-encoding in the request path: '%' must be followed by two "
                                "hex digits")
            value = int(digits, 16)
            if value == 0x2F:
                return _Problem("an encoded '/' (%2F) in the request path is refused: a path segment cannot "
                                "hold '/'")
            out.append(value)
            i += 3
        data = bytes(out)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _Problem("the request path is not valid UTF-8 (after percent-decoding)")
    if text in _DOTS_OR_EMPTY or any(unicodedata.category(c) == "Cc" for c in text):
        return _Problem(_segment_problem(text))
    return text


def _segment_problem(segment: str) -> str:
    if segment == "":
        return "empty segment ('//') in the request path"
    if segment in (".", ".."):
        return f"dot segment '{segment}' in the request path is refused (raw or percent-encoded)"
    return "control character in the request path (raw or percent-encoded) is refused"


def classify(segments: tuple[str, ...], query: str = "") -> HttpTarget:
    """The endpoint decoded segments name, matched against the endpoint table (frontend/endpoints.py)."""
    endpoint, captured = match(segments)
    if not captured:
        return _new(HttpTarget, (endpoint, segments, query, "", "", "", ""))
    return _new(HttpTarget, (endpoint, segments, query, captured.get("name", ""), captured.get("version", ""),
                             captured.get("action", ""), ""))


def model_target(endpoint: Endpoint, name: str, version: str = "") -> HttpTarget:
    """The target of a request made here rather than received (a frontend asking the engine for a model's
    metadata): built from its parts, so a name is never encoded and read back."""
    segments = ("v2", "models", name, *(("versions", version) if version else ()))
    return HttpTarget(endpoint, segments, "", name, version)


__all__ = ["Endpoint", "HttpTarget", "classify", "malformed", "model_target", "parse_target"]
