"""Accepting on listening sockets shared by several frontend processes, one connection per wake-up.

Every frontend watches the same listening sockets (the engine bound them once and passed them to each). The
event loops' own accept takes every pending connection at once (asyncio up to its backlog, libuv until the
queue is empty), so a burst of connections (a load tester opening its 32) would all land in whichever
process woke first. Here each readiness event accepts one: the kernel wakes every watcher, each takes one
and the rest find the queue empty, so a burst is spread across the processes, and a busy process, whose
loop comes round less often, takes fewer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

log = logging.getLogger("hubserve.workers")


class Acceptor(asyncio.AbstractServer):
    """Accepts on `sockets`, one connection per readiness event each, with `factory`'s protocol. As an
    AbstractServer, so the HTTP drain can `close()` it as it closes a server."""

    def __init__(self, sockets: list[socket.socket], factory: Callable[[], asyncio.Protocol]) -> None:
        self._sockets = sockets
        self._factory = factory
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Future[Any]] = set()
        self.accepted = 0
        for sock in sockets:
            sock.setblocking(False)
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, sock: socket.socket) -> None:
        try:
            conn, _ = sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # another process took it
        except OSError as e:  # EMFILE and the like: logged, and the next wake-up tries again
            log.warning("accept failed: %s", e)
            return
        self.accepted += 1
        conn.setblocking(False)
        task = asyncio.ensure_future(self._loop.connect_accepted_socket(self._factory, conn))
        self._tasks.add(task)
        task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("an accepted connection could not be set up: %s", task.exception())

    def close(self) -> None:
        """Stop accepting; the sockets are closed here (the engine keeps its own copies while it runs)."""
        for sock in self._sockets:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets = []

    async def wait_closed(self) -> None:
        return None

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def start_serving(self) -> None:
        return None  # serving from construction

    async def serve_forever(self) -> None:
        raise NotImplementedError("an Acceptor serves from its owner's loop")

    def is_serving(self) -> bool:
        return bool(self._sockets)
