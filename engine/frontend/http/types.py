"""What the HTTP/1.1 connection (connection.py) and the routes (routes.py) hand each other: the
parsed `HttpRequest`, an `Answer` now or a `Pending` one later with its `OnDone`, the `ResponseStream` a
route may write a streamed answer through, and `HttpLimits`, what one connection may cost. Neither side
imports the other: both import these.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...access.caller import Address
from ...access.policy import Admission, Refusal
from .path import HttpTarget

# A route's answer: (status, body, content type, extra header lines). A body is bytes, or a list of
# bytes-likes (an inference's JSON header and views of its output tensors) written as they are.
Answer = tuple[int, "bytes | list[Any]", bytes, bytes]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one connection may cost the server (ServerOptions carries them; see engine/server.py)."""

    max_body_bytes: int = 64 << 20
    max_header_bytes: int = 16 << 10
    max_header_count: int = 100
    client_timeout_secs: float = 30.0
    idle_timeout_secs: float = 300.0


class ResponseStream(Protocol):
    """The one way a route streams an answer over HTTP/1.1 (generate_stream, the OpenAI API's server-sent
    events, a /v1 stream forwarded from the engine with --workers N). The route's task writes it while its
    `Pending` is in flight: `start` once (the head: status, content type, extra header lines), then `send`
    each piece as it is produced, awaiting `drain` between pieces (it returns once the client has read
    enough, so a slow reader holds at most a few pieces and the task waits instead of buffering). The
    stream ENDS when the Pending's future resolves: the connection then writes the body's end (the last
    chunk, or the close of a close-delimited body) and releases what the access policy let the request
    hold, so a key's concurrency slot is held for the stream's life. The connection chooses the framing
    (RFC 9112 §6.3, §7.1): chunked when the connection stays open, close-delimited for a client that asked
    for `Connection: close` (HTTP/1.0 without keep-alive). Every call is a no-op once the client is gone:
    the connection cancels the future then, which cancels the route's task."""

    def start(self, status: int, content_type: bytes, extra: bytes = b"") -> None: ...

    def send(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class HttpRequest:
    """One parsed request. `target` is its URL parsed once (path.py), by the connection as the head
    arrives: the access check and the routes read that, never `url` again (`url` stays for messages and
    nothing else). `body` is the bytes of a body that came in one piece, else a bytearray; `stream` is the
    connection's, set when the request is dispatched. `admission` is what the access policy
    (engine/access/policy.py) let it hold, until it is answered or dropped; `refusal` why the policy refused
    it (its body is then discarded as it arrives, and it is answered in its turn without being routed).
    `http10`: an HTTP/1.0 client that asked to keep the connection open, which a streamed answer must not send
    chunked (RFC 9112 §7.1); only looked up when the request has a Connection header. `owner` is the owner id
    of the API key it presented (engine/access/api_keys.py `owner_id`; "" without keys) and `ends` its
    connection's (peer, local) addresses: who sent it (engine/access/caller.py), set by the connection from
    its admission, or by the engine for a forwarded request. Routes read `owner`, never the header."""

    __slots__ = ("admission", "body", "ends", "headers", "http10", "keep_alive", "method", "owner", "refusal",
                 "start_ns", "stream", "target", "url")

    def __init__(self) -> None:
        self.method = b""
        self.url = b""
        self.target: HttpTarget | None = None
        self.headers: dict[bytes, bytes] = {}
        self.body: bytes | bytearray = b""
        self.keep_alive = True
        self.http10 = False
        self.admission: Admission | None = None
        self.refusal: Refusal | None = None
        self.start_ns = time.perf_counter_ns()
        self.stream: ResponseStream | None = None
        self.owner = ""
        self.ends: tuple[Address | None, Address | None] = (None, None)


# How a connection learns that its in-flight answer is ready: called once with the `Pending`'s future.
OnDone = Callable[[asyncio.Future[Any]], None]


class Pending(Protocol):
    """An answer still being computed. The routes' `handle()` has arranged for the connection's `on_done`
    to be called with `future` once it is done (cancelled included), and the connection then calls
    `answer()`: an inference passes it to the data plane, whose one done-callback accounts the request and
    then answers, so no second callback is attached here. A route that streamed its answer (through
    `req.stream`) resolves the future once the stream is over, and `answer()` is not called."""

    future: asyncio.Future[Any]

    def answer(self) -> Answer: ...


__all__ = ["Answer", "HttpLimits", "HttpRequest", "OnDone", "Pending", "ResponseStream"]
