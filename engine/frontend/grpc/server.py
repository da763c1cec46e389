"""The gRPC listener on our HTTP/2 stack, driven by engine/server.py as a grpc server is: `add_insecure_port`
(bind now, learn the port), `start`, `stop(grace)`.

Graceful stop: stop accepting, send every connection the two-step GOAWAY (RFC 9113 §6.8), let the streams it
admitted finish within the grace period, then close whatever is left.

One sweeper task per server, on a coarse tick (at most a second), does everything timed: it advances each
connection's flood windows and checks its timeouts (`H2Connection.tick`), resets streams stalled mid-message
(`GrpcApp.sweep`), and hands dropped request buffers back to the OS. The request path only counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Any

from ...access.policy import AccessPolicy, LoopbackOnly
from ...memory import release_freed_memory
from ..connections import ConnectionCounter
from ..h2.connection import READ_BYTES, H2Connection
from ..h2.streams import Limits
from .app import CallLimits, GrpcApp
from .handlers import GrpcHandlers

BACKLOG = 1024  # connections the kernel queues for accept, per listening socket


def bind_listeners(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for `host:port` (port 0 = any free one; `[::]` for IPv6), one per address the host
    resolves to, all on the same port, as grpc binds; non-blocking, backlog BACKLOG."""
    infos = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    both_families = len({info[0] for info in infos}) > 1
    error: OSError | None = None
    sockets: list[socket.socket] = []
    for family, kind, proto, _, addr in dict.fromkeys(infos):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and both_families:  # IPv4 has a socket of its own
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr[0], port, *addr[2:]))
        except OSError as e:
            sock.close()
            error = error or e
            continue
        sock.listen(BACKLOG)
        sock.setblocking(False)
        sockets.append(sock)
        port = int(sock.getsockname()[1])  # the other addresses take the same port
    if not sockets:
        raise error or OSError(f"could not bind {host}:{port}")
    return sockets


class H2GrpcServer:
    def __init__(self, handlers: GrpcHandlers, max_message_bytes: int, limits: Limits | None = None,
                 ssl_context: ssl.SSLContext | None = None, handshake_timeout_secs: float | None = None,
                 counter: ConnectionCounter | None = None, access: AccessPolicy | None = None,
                 loopback_only: LoopbackOnly | None = None, call_limits: CallLimits | None = None) -> None:
        """`handlers` answers the RPCs: GrpcHandlers over the engine, or a frontend process's
        (engine/workers/forwarding.py FrontendGrpcHandlers); the server itself calls nothing on the engine.
        `ssl_context`: the sockets this server listens on speak TLS (ALPN h2), each handshake bounded by
        `handshake_timeout_secs`. `counter` counts the process's connections against its limits (shared with
        HTTP). `access` and `loopback_only`: who may call what (engine/access/policy.py). `call_limits`: what
        gRPC calls may hold (this process's share of the server-wide ones)."""
        self._counter = counter
        self._limits = limits = limits or Limits()
        self._tls: dict[str, Any] = ({"ssl": ssl_context, "ssl_handshake_timeout": handshake_timeout_secs}
                                     if ssl_context is not None else {})
        self._app = GrpcApp(handlers, max_message_bytes, limits, access,
                            loopback_only, call_limits)
        timeouts = [t for t in (limits.client_timeout_secs, limits.idle_timeout_secs) if t > 0]
        self._tick_secs = min(1.0, max(0.05, min(timeouts, default=1.0) / 4))
        self._sweeper: asyncio.Task[None] | None = None
        self._sockets: list[socket.socket] = []
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[H2Connection] = set()
        self._all_closed = asyncio.Event()
        self._read_buffer = memoryview(bytearray(READ_BYTES))  # every connection's reads (H2Connection)

    def add_insecure_port(self, address: str) -> int:
        """Bind `host:port` now (port 0 = any free one; `[::]:port` for IPv6), on every address the host
        resolves to, as grpc does; returns the bound port."""
        host, _, port_text = address.rpartition(":")
        return self.add_sockets(bind_listeners(host, int(port_text)))

    def add_sockets(self, sockets: list[socket.socket]) -> int:
        """Serve on listening sockets bound already (engine/frontend/listeners.py); returns their port."""
        self._sockets.extend(sockets)
        return int(sockets[0].getsockname()[1])

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def connection(self) -> H2Connection:
        """A new connection's protocol, for a caller that accepts connections itself (a frontend process
        of a multi-process server, on listening sockets its engine bound)."""
        return self._connection()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            # the backlog bind_listeners gave: create_server listens again, with 100 unless told
            self._servers.append(await loop.create_server(self._connection, sock=sock, backlog=BACKLOG,
                                                          **self._tls))
        self._sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._tick_secs)
            now = loop.time()
            for conn in list(self._connections):
                conn.tick(now)
            self._app.sweep(now)
            if self._app.memory.due(now):
                loop.run_in_executor(None, release_freed_memory)  # milliseconds: off the loop

    def _connection(self) -> H2Connection:
        """A protocol for a connection being accepted. It counts as open only once connected
        (`_opened`): over TLS a failed handshake never connects it, and it must not stay in the set."""
        return H2Connection(self._app, self._limits, self._read_buffer, self._closed, self._opened,
                            self._counter)

    def _opened(self, conn: H2Connection) -> None:
        self._connections.add(conn)
        self._all_closed.clear()

    def _closed(self, conn: Any) -> None:
        self._connections.discard(conn)
        if not self._connections:
            self._all_closed.set()

    async def stop(self, grace: float | None) -> None:
        for server in self._servers:
            server.close()
        if self._connections:
            for conn in list(self._connections):
                conn.shutdown()
            try:
                await asyncio.wait_for(self._all_closed.wait(), grace or 0)
            except asyncio.TimeoutError:
                for conn in list(self._connections):
                    conn.abort()
        self._app.health.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
