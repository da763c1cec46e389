"""Reading one HTTP/1.1 connection's requests: llhttp (httptools) fed with what arrives, the head and body
held to `HttpLimits`, and the access policy asked as each head ends. The client's side of the connection.

`RequestReader` is owned by connection.py's `HttpProtocol`, which feeds it each read (`feed`) and gets
each complete request back through `on_request`, from inside the feed, in order: a pipelined request is
read while the one before it is answered. What it refuses comes back from `feed` as (status, message) for
the protocol to answer in its turn; what it must stop (our last answer is out, or the client broke a rule)
the protocol stops (`stop`). Its state is states.py's `ReadState`: IDLE, HEAD, BODY, STOPPED.

The limits it keeps (see connection.py for the rest of what a client cannot do):
- a body over `max_body_bytes`: a declared Content-Length over it is refused before the body is read, a
  chunked body as soon as it passes it (413);
- a head over `max_header_bytes` or `max_header_count` fields (431). Bytes fed while a head is incomplete
  are counted and feeding stops once over, so a huge header never piles up in llhttp (which joins pieces
  quadratically);
- its URL is parsed once, as its head completes (path.py `parse_target`), and the access check and the
  routes both read that one result; a path that cannot be read one way only (an encoded '/', a dot
  segment, a control character, bad percent-encoding) is answered 400 and not routed;
- an admin group (model-repository, logging, trace, shared-memory) from off loopback while the operator has
  not opened it (`loopback_only`, engine/access/policy.py `LoopbackOnly`): 403;
- the access policy (engine/access/policy.py) is asked once the head is in, with the declared body size, so
  a refused request (401, 403, 429 with Retry-After) has its body discarded as it arrives, never buffered;
  an admitted one holds its admission until the protocol answers or drops it.

A body of `DIRECT_BODY_BYTES` or more with a Content-Length is read in place: it gets a buffer of its own as
its head ends, what arrived with the head is copied in by the parser's callbacks, and the rest is read
straight into it (`body_buffer`, `body_read`: the protocol's `get_buffer` hands the socket that buffer),
with no bytes object made per read and no join. llhttp does not see those bytes, so when the body is
complete the request ends here and the next one starts with a fresh parser. A 600 KB tensor is then copied
once from the kernel and once into its batch (perf/history/peers.md, twentieth session: `memmove` was 23 %
of the server's samples, 10 % after). How large that buffer may be, and how it grows, is
engine/frontend/in_place.py's (HTTP/2 reads large DATA frames the same way).

The parser's callbacks are this object's bound methods, a reference cycle: `stop` cuts it, so buffers are
freed by reference counting, not by the cycle collector.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httptools

from ...access.policy import AccessPolicy, LoopbackOnly, Refusal, RefusalKind
from ..in_place import IN_PLACE_BYTES, in_place_size
from .path import Endpoint, parse_target
from .states import READ_AFTER, ReadEvent, ReadState, read_after, read_refused
from .types import HttpLimits, HttpRequest

_MALFORMED = Endpoint.MALFORMED
_HEAD, _BODY, _STOPPED = ReadState.HEAD, ReadState.BODY, ReadState.STOPPED
# each request's three moves, looked up once (states.py: one dict lookup per move)
_BEGIN, _HEAD_END, _COMPLETE = ReadEvent.BEGIN, ReadEvent.HEAD_END, ReadEvent.COMPLETE
_AFTER_BEGIN, _AFTER_HEAD_END = READ_AFTER[_BEGIN], READ_AFTER[_HEAD_END]
_AFTER_COMPLETE = READ_AFTER[_COMPLETE]

# A body with a Content-Length this large is read in place (the module docstring); a smaller one arrives in
# the protocol's reads (connection.py `READ_BYTES`, the same size), usually in one.
DIRECT_BODY_BYTES = IN_PLACE_BYTES


class _Reject(Exception):
    """Raised inside a parser callback to stop llhttp at once; `RequestReader._rejection` says why."""


def _nobody(req: HttpRequest) -> None:
    """Where complete requests go once the reader is stopped: nowhere (it holds no protocol then)."""


class RequestReader:
    """One connection's request parser and its limits. `state`, `current` (the request being read),
    `last_rx` (when bytes last arrived, parsed or discarded) and `head_at` (when the current head began)
    are read by the protocol for its timeouts."""

    def __init__(self, limits: HttpLimits, access: AccessPolicy | None,
                 on_request: Callable[[HttpRequest], None], now: float) -> None:
        self._limits = limits
        self._access = access
        self._on_request = on_request
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None  # for `100 Continue`
        self._loopback_only: LoopbackOnly | None = None
        self._ends: tuple[Any, Any] = (None, None)  # (peer, local) addresses, each request's `ends`
        self.state = ReadState.IDLE
        self.current: HttpRequest | None = None
        self._head_fed = 0  # bytes fed since the current head began (may miss part of one read)
        self._max_head_bytes = limits.max_header_bytes
        self._head_size = 0  # the head's header fields, measured once its reads pass max_head_bytes
        self._header_count = 0
        self._rejection: tuple[int, str] | None = None
        self.last_rx = now
        self.head_at = now
        # A body read in place (`on_headers_complete`): its buffer (`req.body`), its declared length, how much
        # of it has arrived, and whether the reads now go straight into it (past the parser).
        self._sized: bytearray | None = None
        self._length = 0
        self._filled = 0
        self.in_place = False

    def connected(self, transport: asyncio.Transport, ends: tuple[Any, Any],
                  loopback_only: LoopbackOnly | None) -> None:
        """The connection is made: where `100 Continue` goes, the ends each request carries, and the admin
        groups this peer may not call (None on loopback)."""
        self._transport = transport
        self._ends = ends
        self._loopback_only = loopback_only

    def feed(self, data: bytes | memoryview, now: float) -> tuple[int, str] | None:
        """Parse what arrived (nothing once stopped: it is discarded). Complete requests go to `on_request`
        as they end. Returns (status, message) when the client broke a rule: then the protocol answers it
        and stops reading."""
        self.last_rx = now
        parser = self._parser
        if parser is None:  # rejected or closing: discard what the client still sends
            return None
        if self.state is not _BODY:
            self._head_fed += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            return 400, "protocol upgrades are not supported"
        except httptools.HttpParserError as e:
            rejection, self._rejection = self._rejection, None
            if self.state is _STOPPED:
                return None  # our last answer is out: the rest of this input was cut off on purpose
            return rejection or (400, f"malformed HTTP request: {e}")
        state = self.state
        if state is _HEAD:
            if self._head_fed > self._limits.max_header_bytes:
                return 431, self._head_too_large()
        elif state is not _BODY:
            self._head_fed = 0
        elif self._sized is not None:  # the rest of this body is read straight into its buffer
            self.in_place = True
        return None

    def body_buffer(self) -> memoryview:
        """Where the next read goes while `in_place`: the unfilled part of the body's buffer, grown first if
        it is full (never past the declared length)."""
        filled, sized = self._filled, self._sized
        assert sized is not None
        if len(sized) == filled:
            sized = self._grow(filled + 1)
        return memoryview(sized)[filled:]

    def body_read(self, n: int, now: float) -> None:
        """`n` more bytes were read into `body_buffer()`. When the body is complete, the request ends as
        llhttp would end it, and a fresh parser takes the next one (this one never saw the body)."""
        self.last_rx = now
        self._filled += n
        if self._filled < self._length:
            return
        self.in_place = False
        self._parser = httptools.HttpRequestParser(self)
        self.on_message_complete()

    def _grow(self, need: int) -> bytearray:
        """A larger buffer for the body being read in place, holding what arrived: at least `need` bytes
        (in_place.py's bound). The old one is not resized (the transport may still hold a view of it)."""
        old, req = self._sized, self.current
        assert old is not None and req is not None
        size = in_place_size(self._length, need, self._head_fed + self._filled)
        req.body = self._sized = new = bytearray(size)
        new[:self._filled] = memoryview(old)[:self._filled]
        return new

    def stop(self) -> None:
        """Parse nothing more (the client broke a rule, or the connection is ending). The request being read,
        if any, stays in `current` until `drop_partial`; the cycle through the parser is cut."""
        self._parser = None
        self._on_request = _nobody
        self._transport = None
        self._unsize()
        self.state = read_after(self.state, ReadEvent.STOP)

    def drop_partial(self) -> HttpRequest | None:
        """Let go of the request being read and return it (for its admission to be released)."""
        req, self.current = self.current, None
        self._unsize()
        return req

    def _unsize(self) -> None:
        self.in_place = False
        self._sized = None

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        if self.state is _STOPPED:
            raise _Reject("the connection is closing")  # stop llhttp: no more requests on this connection
        self.state = _AFTER_BEGIN.get(self.state) or read_refused(self.state, _BEGIN)
        self.current = req = HttpRequest()
        req.ends = self._ends
        self.head_at = self.last_rx
        self._head_size = 0
        self._header_count = 0

    def on_url(self, url: bytes) -> None:
        assert self.current is not None
        self.current.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.current is not None
        self.current.headers[name.lower()] = value
        self._header_count += 1
        if self._head_fed > self._max_head_bytes:  # the reads of this head are large: measure it
            self._head_size += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        req = self.current
        parser = self._parser
        assert req is not None
        if parser is None:
            raise _Reject("the connection is closing")
        self.state = _AFTER_HEAD_END.get(self.state) or read_refused(self.state, _HEAD_END)
        limits = self._limits
        if self._header_count > limits.max_header_count:
            self._reject(431, f"Request has more than {limits.max_header_count} header fields")
        if self._head_size and self._head_size + len(req.url) > limits.max_header_bytes:
            self._reject(431, self._head_too_large())
        req.method = parser.get_method()
        req.keep_alive = parser.should_keep_alive()
        if req.keep_alive and b"connection" in req.headers:  # HTTP/1.0 keeps alive only when it asks
            req.http10 = parser.get_http_version() == "1.0"
        length = req.headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
            self._reject(413, _too_large(f"Request body size of {int(length)} bytes", limits.max_body_bytes))
        req.target = target = parse_target(req.url)  # the one reading of the path: access and routes use it
        if target.endpoint is _MALFORMED:
            req.refusal = Refusal(RefusalKind.MALFORMED, target.problem)
        elif self._loopback_only is not None and \
                (refusal := self._loopback_only.refusal(target.group)) is not None:
            req.refusal = refusal
        elif (access := self._access) is not None:
            declared = int(length) if length is not None and length.isdigit() else 0
            verdict = access.admit(target.group, req.headers, declared, self.last_rx)
            if isinstance(verdict, Refusal):
                req.refusal = verdict
            else:
                req.admission = verdict
                req.owner = verdict.owner
        if req.headers.get(b"expect", b"").lower() == b"100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if length is not None and req.refusal is None and length.isdigit() and \
                int(length) >= DIRECT_BODY_BYTES and b"transfer-encoding" not in req.headers:
            self._length = n = int(length)  # llhttp checked it: it is the body's length
            self._filled = 0
            # (`_head_fed` counts this request's reads so far, the one being parsed included)
            req.body = self._sized = bytearray(in_place_size(n, 0, self._head_fed))

    def on_body(self, body: bytes) -> None:
        req = self.current
        assert req is not None
        if req.refusal is not None:
            return  # refused at its head: the body is discarded, not buffered
        if (sized := self._sized) is not None:
            filled = self._filled
            end = filled + len(body)
            if end > len(sized):
                sized = self._grow(end)
            sized[filled:end] = body
            self._filled = end
            return
        if not req.body:
            req.body = body  # the usual case: the whole body in one piece, kept without a copy
            if len(body) > self._limits.max_body_bytes:
                self._reject(413, _too_large("Request body size", self._limits.max_body_bytes))
        else:
            if len(req.body) + len(body) > self._limits.max_body_bytes:
                self._reject(413, _too_large("Request body size", self._limits.max_body_bytes))
            joined = req.body if isinstance(req.body, bytearray) else bytearray(req.body)
            joined += body
            req.body = joined
        admission, access = req.admission, self._access  # an admission comes from `access`
        if admission is not None and access is not None and len(req.body) > admission.bytes \
                and access.budget is not None:
            # a body larger than it declared (chunked): its reservation grows with it, or it is refused
            refusal = access.grow(admission, len(req.body) - admission.bytes)
            if refusal is not None:
                req.refusal = refusal
                req.body = b""

    def on_message_complete(self) -> None:
        req = self.current
        self.current = None
        self._head_fed = 0
        self._sized = None
        if req is None or self.state is _STOPPED:
            return
        self.state = _AFTER_COMPLETE.get(self.state) or read_refused(self.state, _COMPLETE)
        self._on_request(req)

    def _reject(self, status: int, message: str) -> None:
        self._rejection = (status, message)
        raise _Reject(message)

    def _head_too_large(self) -> str:
        return f"Request line and header fields exceed {self._limits.max_header_bytes} bytes"


def _too_large(what: str, limit: int) -> str:
    return (f"{what} exceeds the maximum allowed value of {limit} bytes. "
            "Use --http-max-input-size to increase the limit.")


__all__ = ["RequestReader"]
