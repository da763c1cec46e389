"""KServe v2 over HTTP/1.1: `HttpApp`, which owns the connections (connection.py), their one timeout
sweeper, the release of freed request memory, and the drain on shutdown. The endpoints are routes.py's.

Why not a web framework: on the small models that dominate serving traffic, a framework's per-request
machinery (request objects, middleware, routing tables, header multidicts) costs more CPU than the inference.
Here a request is parsed by llhttp in C, routed by splitting the path, and answered with one `write` of status
line, headers and body (no Nagle stall, no second packet). Inference does not even create a task: the
connection attaches a callback to the batcher's future.

Semantics: keep-alive by default (HTTP/1.1), `Connection: close` honoured, `Expect: 100-continue` answered,
pipelined requests answered in order (one at a time per connection); the limits and timeouts of
`HttpLimits` are the connection's (413, 431, 408). A client that disconnects cancels its in-flight request,
which takes it out of the batcher's queue.

Timeouts come from one sweeper per app (no timer per request); freed request buffers go back to the OS after
large bodies (rate-limited).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Sequence
from typing import Protocol

from ...access.policy import AccessPolicy, LoopbackOnly
from ...memory import MemoryReturn, release_freed_memory
from ..connections import ConnectionCounter
from .connection import READ_BYTES, HttpProtocol
from .types import Answer, HttpLimits, HttpRequest, OnDone, Pending


class Routes(Protocol):
    """What answers an app's requests: HttpRoutes, or a frontend process's forwarding routes."""

    def handle(self, req: HttpRequest, on_done: OnDone) -> Answer | Pending: ...

TRIM_INTERVAL_SECS = 1.0  # at most one malloc_trim a second, after large bodies stopped coming (MemoryReturn)
DRAIN_QUIET_SECS = 1.0  # draining: an idle keep-alive connection is closed once this quiet


class HttpApp:
    """One per server: the routes (`handle`, called by each connection per request), the set of open
    connections, their sweeper and the release of freed request memory."""

    def __init__(self, routes: Routes, limits: HttpLimits, counter: ConnectionCounter | None = None,
                 access: AccessPolicy | None = None, loopback_only: LoopbackOnly | None = None) -> None:
        """`routes` answers the requests: HttpRoutes (routes.py) over the engine, the metrics port's, or a
        frontend process's forwarding routes (engine/workers/forwarding.py FrontendRoutes); the app itself
        calls nothing on the engine. `counter` counts
        the process's connections against its limits (connections.py; shared with gRPC). `access`, when keys,
        restrictions or a byte budget are configured, is asked by each connection about each request before
        its body is read (engine/access/policy.py). `loopback_only`: the admin groups that answer only clients
        on loopback (None: none; engine/access/policy.py LoopbackOnly)."""
        self.counter = counter
        self.routes = routes
        self.handle = self.routes.handle  # bound once: a connection's call per request goes straight there
        self.limits = limits
        self.access = access
        self.loopback_only = loopback_only
        self.connections: set[HttpProtocol] = set()
        # Every connection reads into this one buffer and parses what it read before the loop goes on, so
        # one is enough (connection.py `get_buffer`); a large body is read into its own (reader.py).
        self.read_buffer = memoryview(bytearray(READ_BYTES))
        self.closing = False
        self._sweeper: asyncio.Task[None] | None = None
        # large bodies let go, for the sweeper to trim after: any one is enough (LARGE_BODY_BYTES)
        self.memory = MemoryReturn(threshold_bytes=1, min_interval_secs=TRIM_INTERVAL_SECS)

    def protocol(self) -> HttpProtocol:
        return HttpProtocol(self)

    def large_body_dropped(self, size: int) -> None:
        """Called by a connection when a large request body is let go; the sweeper trims the heap once they
        stop."""
        self.memory.freed(size)

    def start_sweeper(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def stop_sweeper(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    async def _sweep_forever(self) -> None:
        """Every quarter of the client timeout (at most a second): each connection applies its timeouts, and
        freed heap goes back to the OS once large bodies were let go and then none for a tick."""
        interval = max(0.05, min(1.0, self.limits.client_timeout_secs / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self.connections):
                conn.sweep(now)
            if self.memory.due(now):
                await asyncio.get_running_loop().run_in_executor(None, release_freed_memory)


async def serve(app: HttpApp, sockets: Sequence[socket.socket], ssl_context: ssl.SSLContext | None = None,
                handshake_timeout_secs: float | None = None) -> list[asyncio.Server]:
    """Serve on listening sockets bound already (engine/frontend/listeners.py: every port is bound before the
    models load); with `ssl_context` every connection is TLS (HTTPS), its handshake bounded by
    `handshake_timeout_secs`."""
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(app.protocol, sock=sock, backlog=1024, ssl=ssl_context,
                                        ssl_handshake_timeout=handshake_timeout_secs if ssl_context else None)
               for sock in sockets]
    app.start_sweeper()
    return servers


async def shutdown(app: HttpApp, servers: Sequence[asyncio.AbstractServer], timeout_s: float) -> None:
    """Stop accepting and drain: every request that reached us is answered (with Connection: close); an idle
    keep-alive connection is closed once quiet for DRAIN_QUIET_SECS, so a request the client was sending
    as the drain began is answered, not cut off; whatever is left at the deadline is dropped."""
    app.closing = True
    for server in servers:
        server.close()
    deadline = time.monotonic() + timeout_s
    quiet = min(DRAIN_QUIET_SECS, timeout_s / 4)
    while app.connections and time.monotonic() < deadline:
        now = time.monotonic()
        for conn in list(app.connections):
            conn.close_if_quiet(now, quiet)
        await asyncio.sleep(0.02)
    for conn in list(app.connections):
        conn.abort()
    await app.stop_sweeper()


__all__ = ["HttpApp", "HttpLimits", "serve", "shutdown"]
