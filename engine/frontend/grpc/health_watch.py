"""grpc.health.v1 Health/Watch for every stream of one process: `HealthWatch`, one notifier that reads the
state once per tick for all the services watched and tells only the streams whose status changed.

Why one notifier rather than a loop per stream: each Watch stream used to poll the state itself every half
second, a task and a timer each, so 4,000 idle streams cost 4 % of a core. Readiness comes from many places
(the repository's model states, a Python instance restarting, a failed canary, the drain at shutdown) and,
with --workers N, from another process; one read per tick of the services watched costs the same whatever
the number of streams, and nothing is added to those paths. A stream pays only when its status changes.

Owned by the process's GrpcApp (call.py), which caps the streams (CallLimits); `statuses(services)` is
the handlers' `watch_statuses` (the DataPlane's readiness here, one forwarded HEALTH control with --workers
N). A new stream of a service already watched gets the last status read at once; one of a service not yet
watched wakes the notifier for a read now. The task runs only while some stream watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("hubserve.grpc")

POLL_S = 0.5  # how often the state is read while some stream watches

Notify = Callable[[int], None]  # a stream's: send this status (grpc.health.v1 ServingStatus)
Statuses = Callable[[list[str]], Awaitable[list[int]]]


class HealthWatch:
    def __init__(self, statuses: Statuses, poll_s: float = POLL_S) -> None:
        self._statuses = statuses
        self._poll_s = poll_s
        self._watchers: dict[str, list[Notify]] = {}  # service → its streams, in the order they came
        self._last: dict[str, int] = {}  # service → the status its streams were last told
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def count(self) -> int:
        return sum(len(w) for w in self._watchers.values())

    def watch(self, service: str, notify: Notify) -> None:
        """A stream watches `service` ("" the server): `notify(status)` now (the last status read, from the
        loop) or at the next read, then on every change, until `unwatch`."""
        self._watchers.setdefault(service, []).append(notify)
        last = self._last.get(service)
        if last is not None:
            asyncio.get_running_loop().call_soon(self._tell_new, service, notify, last)
        else:
            self._wake.set()  # a service not read yet: read now
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def unwatch(self, service: str, notify: Notify) -> None:
        watchers = self._watchers.get(service)
        if watchers is None:
            return
        try:
            watchers.remove(notify)
        except ValueError:
            return
        if not watchers:
            del self._watchers[service]
            self._last.pop(service, None)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._watchers.clear()
        self._last.clear()

    def _tell_new(self, service: str, notify: Notify, status: int) -> None:
        """A new stream's first status, unless it left meanwhile or a read since told it already."""
        if notify in self._watchers.get(service, ()) and self._last.get(service) == status:
            notify(status)

    async def _run(self) -> None:
        try:
            while self._watchers:
                self._wake.clear()  # a stream of a new service set during the read: read again at once
                services = list(self._watchers)
                try:
                    statuses = await self._statuses(services)
                except Exception as e:  # the engine going away, say: the streams keep their last status
                    log.warning("Health/Watch could not read the state: %r", e)
                    statuses = [self._last.get(s, -1) for s in services]
                for service, status in zip(services, statuses, strict=True):
                    watchers = self._watchers.get(service)
                    if watchers is None or status < 0:
                        continue
                    first = service not in self._last
                    if first or self._last[service] != status:
                        self._last[service] = status
                        for notify in list(watchers):
                            notify(status)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._poll_s)
        finally:
            self._task = None


__all__ = ["POLL_S", "HealthWatch", "Notify", "Statuses"]
