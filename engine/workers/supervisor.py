"""The engine's frontend processes: start N, restart one that dies, drain them all on shutdown.

Each frontend is a fresh interpreter (`python -m engine.workers.frontend`), never a fork: the engine has ONNX
Runtime sessions and their threads, which a fork would copy in a broken state. What a frontend needs it
inherits through `pass_fds`: one end of a socketpair (its channel), one end of a SOCK_SEQPACKET pair (the
connections the engine accepts and hands it: listen.py), and two memfd regions made for it (its request
arena, which it writes, and its response arena, which the engine writes). The listening sockets stay with
the engine, so the ports are the same whichever frontend serves, a restarted one too.

Its settings come as JSON on its command line, with no secret in them: a command line is readable by every
local user (`ps`, /proc/<pid>/cmdline), and so is, for the same user, its environment. The secrets (the
restriction flags' header values) come through the read end of a pipe it inherits (`secrets_fd`), which the
engine fills and closes at the start and which the frontend reads to its end, then closes.

A frontend that dies (crash, SIGKILL, OOM) closes its channel: its session cancels what it had in flight and
drops its regions, and a new frontend is started in its slot with fresh ones, after a back-off if it died
young. Its clients see their connections drop; every other client is served on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .. import child_pythonpath
from ..dataplane import DataPlane
from ..frontend.options import FrontendOptions, RestrictionSecrets
from ..shm.regions import Region
from .control import ControlRunner
from .frontend import FrontendSpec
from .listen import Dispatcher
from .session import FrontendSession

log = logging.getLogger("hubserve.workers")

RESTART_BACKOFF_SECS = (0.0, 0.5, 1.0, 2.0, 5.0)  # by how many times in a row the slot died young
YOUNG_SECS = 10.0  # a frontend that dies sooner than this after its start died young


@dataclass
class _Slot:
    index: int
    process: subprocess.Popen[bytes] | None = None
    session: FrontendSession | None = None
    started_at: float = 0.0
    young_deaths: int = 0
    restarts: int = 0
    exited: asyncio.Event = field(default_factory=asyncio.Event)


class FrontendPool:
    """Owned by the engine's Server. `start()` spawns every frontend; `stop(grace)` drains them."""

    def __init__(self, count: int, dataplane: DataPlane, control: ControlRunner,
                 http_sockets: list[socket.socket], grpc_sockets: list[socket.socket],
                 options: FrontendOptions, arena_bytes: int,
                 secrets: RestrictionSecrets | None = None) -> None:
        self._dp = dataplane
        self._control = control
        self._http = http_sockets
        self._grpc = grpc_sockets
        self._options = options
        self._arena_bytes = arena_bytes
        self._secrets = (secrets or RestrictionSecrets()).to_json()
        self._slots = [_Slot(i) for i in range(count)]
        self._stopping = False
        self._restarts: set[asyncio.Task[None]] = set()
        self._dispatcher: Dispatcher | None = None

    @property
    def pids(self) -> list[int]:
        return [s.process.pid for s in self._slots if s.process is not None and s.process.poll() is None]

    def sessions(self) -> list[FrontendSession]:
        return [s.session for s in self._slots if s.session is not None and not s.session.closed]

    async def start(self) -> None:
        for slot in self._slots:
            await self._spawn(slot)
        self._dispatcher = Dispatcher(self._http, self._grpc, self.sessions)

    async def _spawn(self, slot: _Slot) -> None:
        loop = asyncio.get_running_loop()
        label = f"hubserve-frontend-{slot.index}"
        requests = Region.create(self._arena_bytes, f"{label}-requests")
        responses = Region.create(self._arena_bytes, f"{label}-responses")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handoff, their_handoff = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        secrets_in, secrets_out = os.pipe()
        spec = FrontendSpec(slot.index, theirs.fileno(), their_handoff.fileno(), (requests.fd, requests.size),
                            (responses.fd, responses.size), secrets_in, self._options)
        env = dict(os.environ)
        env["PYTHONPATH"] = child_pythonpath(env.get("PYTHONPATH"))
        try:
            process = subprocess.Popen([sys.executable, "-m", "engine.workers.frontend", spec.to_json()],
                                       pass_fds=[theirs.fileno(), their_handoff.fileno(), requests.fd,
                                                 responses.fd, secrets_in], env=env)
        finally:
            theirs.close()
            their_handoff.close()
            os.close(secrets_in)
        # Off the loop: a pipe holds 64 KiB, and a larger write waits for the frontend to read.
        await asyncio.to_thread(_send_secrets, secrets_out, self._secrets)
        handoff.setblocking(False)
        slot.process = process
        slot.started_at = time.monotonic()
        slot.exited = asyncio.Event()
        session = FrontendSession(slot.index, self._dp, self._control, requests, responses, handoff,
                                  lambda s: self._lost(slot, s))
        slot.session = session
        ours.setblocking(False)
        await loop.connect_accepted_socket(lambda: session, ours)
        log.info("frontend %d started (pid %d)", slot.index, process.pid)

    def _lost(self, slot: _Slot, session: FrontendSession) -> None:
        """A frontend's channel closed: it exited (drained or died). Reap it; restart it unless stopping."""
        task = asyncio.get_running_loop().create_task(self._reap(slot, session))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _reap(self, slot: _Slot, session: FrontendSession) -> None:
        process = slot.process
        if process is None or slot.session is not session:
            return
        try:
            code = await asyncio.wait_for(asyncio.to_thread(process.wait), 10)
        except asyncio.TimeoutError:  # the channel closed but the process lives on: it is broken
            process.kill()
            code = await asyncio.to_thread(process.wait)
        slot.exited.set()
        if self._stopping:
            log.info("frontend %d (pid %d) exited with %s", slot.index, process.pid, code)
            return
        young = time.monotonic() - slot.started_at < YOUNG_SECS
        slot.young_deaths = slot.young_deaths + 1 if young else 0
        delay = RESTART_BACKOFF_SECS[min(slot.young_deaths, len(RESTART_BACKOFF_SECS) - 1)]
        log.error("frontend %d (pid %d) exited with %s; its in-flight requests are lost; restarting it%s",
                  slot.index, process.pid, code, f" in {delay:g} s" if delay else "")
        if delay:
            await asyncio.sleep(delay)
        if not self._stopping:
            slot.restarts += 1
            await self._spawn(slot)

    async def stop(self, grace: float) -> None:
        """Drain: SIGTERM every frontend (it stops accepting and finishes what it has, through us), wait for
        them to exit within `grace` (and a few seconds for the processes themselves), kill what is left."""
        self._stopping = True
        if self._dispatcher is not None:
            self._dispatcher.close()  # new connections are refused from now on
        for task in list(self._restarts):
            task.cancel()  # a restart waiting out its back-off, or reaping: nothing to restart any more
        await asyncio.gather(*self._restarts, return_exceptions=True)
        live = [s for s in self._slots if s.process is not None and s.process.poll() is None]
        for slot in live:
            with _quiet():
                slot.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        waits = [asyncio.to_thread(s.process.wait) for s in live]  # type: ignore[union-attr]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), grace + 5)
        except asyncio.TimeoutError:
            for slot in live:
                with _quiet():
                    slot.process.kill()  # type: ignore[union-attr]
        for slot in live:
            await asyncio.to_thread(slot.process.wait)  # type: ignore[union-attr]


def _send_secrets(fd: int, data: bytes) -> None:
    """Write the frontend's secrets into its pipe and close our end (the end of its read). A frontend that
    died first leaves nobody to read: it is restarted with a pipe of its own."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


class _quiet:
    """Ignore a process that is already gone."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, ProcessLookupError)
