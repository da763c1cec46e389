"""The server-wide rate limiter: limits across models on what executes at once.

Two limits, both optional: a cap on batches executing at once (`--max-concurrent-executions`), and
Triton-style named resources (`rate_limiter` in an instance group, counts from `--rate-limit-resource`) that
instances must hold while they execute, so one busy model cannot starve the others. One `RateLimiter` per
server (engine/server.py), shared by every instance pool (pool.py); all of it runs on the event loop thread.
Pure bookkeeping: it never waits, and tells its listeners (the pools) when something was released.
"""

from __future__ import annotations

from collections.abc import Callable

from ..config.model_config import RateLimiterResource


class RateLimiter:
    """Server-wide execution limits. `try_acquire` never waits: a batcher that is refused is called back
    through its listener when something is released."""

    def __init__(self, max_concurrent_executions: int = 0, resources: dict[str, int] | None = None) -> None:
        self._max = max_concurrent_executions  # 0 = unlimited
        self._running = 0
        self._explicit = dict(resources or {})
        self._total: dict[str, int] = dict(self._explicit)
        self._free: dict[str, int] = dict(self._explicit)
        self._listeners: list[Callable[[], None]] = []

    def register(self, resources: tuple[RateLimiterResource, ...]) -> None:
        """Size a resource to the largest single need when the server was not told its count."""
        for r in resources:
            total = self._total.get(r.name, 0)
            if r.name not in self._explicit and r.count > total:
                # grow by the difference: units held right now stay held (free may be below total)
                self._free[r.name] = self._free.get(r.name, 0) + r.count - total
                self._total[r.name] = r.count

    @property
    def limiting(self) -> bool:
        """Whether anything here can refuse an instance; if not, releases concern only their own pool."""
        return bool(self._max or self._free)

    def try_acquire(self, resources: tuple[RateLimiterResource, ...]) -> bool:
        if self._max and self._running >= self._max:
            return False
        if any(self._free.get(r.name, 0) < r.count for r in resources):
            return False
        for r in resources:
            self._free[r.name] -= r.count
        self._running += 1
        return True

    def release(self, resources: tuple[RateLimiterResource, ...]) -> None:
        self._running -= 1
        for r in resources:
            self._free[r.name] += r.count
        # Offer freed capacity to each batcher first in turn: always asking the same one first would let a
        # model with a backlog take every slot it releases and starve the others.
        listeners = list(self._listeners)
        if len(self._listeners) > 1:
            self._listeners.append(self._listeners.pop(0))
        for listener in listeners:
            listener()

    def release_quietly(self) -> None:
        """A release that frees nothing another pool waits for (no cap, no resources)."""
        self._running -= 1

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
