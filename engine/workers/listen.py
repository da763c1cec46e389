"""Connections to frontends: the engine accepts on the listening sockets and hands each connection to the
frontend with the fewest open, as an fd over a SOCK_SEQPACKET pair (`send_fds`); the frontend serves it.

Why not every frontend accepting on shared listening sockets: measured, with two frontends on shared sockets
perf_analyzer's 16 connections all landed in one process (an event loop's accept takes every pending
connection at once, and the process already awake wins every race), and accepting one per wake-up still
gave 4 of 4 to one frontend at concurrency 4. SO_REUSEPORT spreads by a hash of the addresses, blind to load
(16 connections over 2 sockets split 10/6 or worse about a third of the time). Handing out from the engine
balances exactly, costs the engine one accept and one sendmsg per connection (not per request), keeps the
ports with the engine whatever happens to a frontend (a restarted one simply starts receiving), and on
shutdown the engine closes the listeners, so new connections are refused at once.

Each frontend reports how many connections it has open in every frame it sends (remote.py); the engine adds
the ones it handed it since.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any, Protocol

log = logging.getLogger("hubserve.workers")

HTTP_TAG, GRPC_TAG = b"h", b"g"
ACCEPTS_PER_WAKEUP = 64  # the engine's accept loop yields to its other work after this many


class Receiver(Protocol):
    """The engine's view of a frontend that can take connections (session.py FrontendSession)."""

    handoff: socket.socket | None

    @property
    def open_connections(self) -> int: ...

    def handed(self) -> None: ...


class Dispatcher:
    """The engine's accept loop: every listening socket watched; each connection accepted goes to the
    receiver with the fewest open connections (ties in turn)."""

    def __init__(self, http: Sequence[socket.socket], grpc: Sequence[socket.socket],
                 receivers: Callable[[], Sequence[Receiver]]) -> None:
        self._loop = asyncio.get_running_loop()
        self._receivers = receivers
        self._sockets = [*http, *grpc]
        self._turn = 0
        for sock, tag in [*((s, HTTP_TAG) for s in http), *((s, GRPC_TAG) for s in grpc)]:
            sock.setblocking(False)
            self._loop.add_reader(sock.fileno(), self._accept, sock, tag)

    def _accept(self, sock: socket.socket, tag: bytes) -> None:
        for _ in range(ACCEPTS_PER_WAKEUP):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:  # EMFILE and the like: the next wake-up tries again
                log.warning("accept failed: %s", e)
                return
            with conn:  # our copy is closed once handed over (or when nobody could take it)
                self._hand(conn, tag)

    def _hand(self, conn: socket.socket, tag: bytes) -> None:
        live = [r for r in self._receivers() if r.handoff is not None]
        if not live:
            return  # no frontend up (all restarting): the client sees its connection closed
        self._turn += 1
        n = len(live)
        order = sorted(range(n), key=lambda i: (live[i].open_connections, (i - self._turn) % n))
        for i in order:
            receiver = live[i]
            try:
                socket.send_fds(receiver.handoff, [tag], [conn.fileno()])  # type: ignore[arg-type]
            except OSError:  # its queue is full, or it is gone: the next one
                continue
            receiver.handed()
            return
        log.warning("no frontend could take a new connection: closed")

    def close(self) -> None:
        """Stop accepting and close the listening sockets: new connections are refused from now on."""
        for sock in self._sockets:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets = []


class ConnectionReceiver(asyncio.AbstractServer):
    """A frontend's side: connections arriving as fds, served with the HTTP or gRPC protocol. As an
    AbstractServer, so the HTTP drain can `close()` it as it closes a listening server.

    With TLS (`http_ssl`, `grpc_ssl`) the handshake runs here, in the frontend: the engine handed over the
    raw TCP socket and never reads from it."""

    def __init__(self, handoff: socket.socket, http: Callable[[], asyncio.BaseProtocol],
                 grpc: Callable[[], asyncio.BaseProtocol], http_ssl: ssl.SSLContext | None = None,
                 grpc_ssl: ssl.SSLContext | None = None, handshake_timeout_secs: float | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._handoff: socket.socket | None = handoff
        self._factories = {HTTP_TAG: http, GRPC_TAG: grpc}
        self._tls: dict[bytes, dict[str, Any]] = {
            tag: {"ssl": ctx, "ssl_handshake_timeout": handshake_timeout_secs}
            for tag, ctx in ((HTTP_TAG, http_ssl), (GRPC_TAG, grpc_ssl)) if ctx is not None}
        self._tasks: set[asyncio.Future[Any]] = set()
        self.received = 0
        handoff.setblocking(False)
        self._loop.add_reader(handoff.fileno(), self._receive)

    def _receive(self) -> None:
        handoff = self._handoff
        if handoff is None:
            return
        for _ in range(ACCEPTS_PER_WAKEUP):
            try:
                tag, fds, _, _ = socket.recv_fds(handoff, 1, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.error("the engine's connection hand-off failed: %s", e)
                self.close()
                return
            if not tag and not fds:  # the engine closed its end
                self.close()
                return
            for fd in fds:
                self._serve(socket.socket(fileno=fd), tag)

    def _serve(self, conn: socket.socket, tag: bytes) -> None:
        factory = self._factories.get(tag)
        if factory is None or self._handoff is None:
            conn.close()
            return
        self.received += 1
        conn.setblocking(False)
        task = asyncio.ensure_future(self._loop.connect_accepted_socket(factory, conn,
                                                                        **self._tls.get(tag, {})))
        self._tasks.add(task)
        task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, (ssl.SSLError, ConnectionError, TimeoutError)):
            # A failed TLS handshake (a plain-text client, a missing or untrusted client certificate, a
            # timeout) is the client's business, as in one process: never a log line per attempt.
            log.debug("a TLS handshake failed: %s", error)
        elif error is not None:
            log.warning("a connection could not be set up: %s", error)

    def close(self) -> None:
        """Take no more connections (the engine hands new ones to the other frontends)."""
        handoff, self._handoff = self._handoff, None
        if handoff is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(handoff.fileno())
            handoff.close()

    async def wait_closed(self) -> None:
        return None

    def is_serving(self) -> bool:
        return self._handoff is not None

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def start_serving(self) -> None:
        return None  # serving from construction

    async def serve_forever(self) -> None:
        raise NotImplementedError("a ConnectionReceiver serves from its owner's loop")
