"""The server-wide rate limiter: limits across models on what executes at once.

Two limits, both optional: a cap on batches executing at once (`--max-concurrent-executions`), and
Triton-style named resources (`rate_limiter` in an instance group, counts from `--rate-limit-resource`) that
instances must hold while they execute, so one busy model cannot starve the others. One `RateLimiter` per
server (engine/server.py), shared by every instance pool (pool.py); all of it runs on the event loop thread.
Pure bookkeeping: it never waits, and tells its listeners (the pools) when something was released.

Triton's rule for resources: each device has its own copies of a resource, and an instance takes from its
device's (a CPU instance's device is 0, as Triton numbers it), unless the resource is `global: true`, which
has one set of copies for the whole server. A count not given on the command line is the largest one
instance asks for, per device; `--rate-limit-resource NAME:COUNT` gives every device (and the global set)
COUNT copies, `NAME:COUNT:DEVICE` that device only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..config.model_config import RateLimiterResource

GLOBAL = -1  # the device key of a global resource's one set of copies
Key = tuple[str, int]  # (resource name, device or GLOBAL)


def _key(resource: RateLimiterResource, device: int) -> Key:
    return (resource.name, GLOBAL if resource.global_ else device)


class RateLimiter:
    """Server-wide execution limits. `try_acquire` never waits: a batcher that is refused is called back
    through its listener when something is released."""

    def __init__(self, max_concurrent_executions: int = 0, resources: Mapping[str, int] | None = None,
                 device_resources: Mapping[Key, int] | None = None) -> None:
        """`resources`: name -> copies on every device (and globally); `device_resources`: (name, device)
        -> copies on that device, over `resources`' count (`--rate-limit-resource NAME:COUNT[:DEVICE]`)."""
        self._max = max_concurrent_executions  # 0 = unlimited
        self._running = 0
        self._every_device = dict(resources or {})
        self._per_device = dict(device_resources or {})
        self._total: dict[Key, int] = {}
        self._free: dict[Key, int] = {}
        self._listeners: list[Callable[[], None]] = []

    def _explicit(self, key: Key) -> int | None:
        count = self._per_device.get(key)
        return self._every_device.get(key[0]) if count is None else count

    def _copies(self, key: Key) -> int:
        """Copies of `key` free now; a count given on the command line is there from the start."""
        free = self._free.get(key)
        if free is None:
            free = self._total[key] = self._free[key] = self._explicit(key) or 0
        return free

    def register(self, resources: tuple[RateLimiterResource, ...], device: int = 0) -> None:
        """Make the copies an instance on `device` takes from: the count the server was told, else the
        largest single need on that device (or globally)."""
        for r in resources:
            key = _key(r, device)
            free = self._copies(key)
            total = self._total[key]
            if self._explicit(key) is None and r.count > total:
                # grow by the difference: units held right now stay held (free may be below total)
                self._free[key] = free + r.count - total
                self._total[key] = r.count

    def free(self, name: str, device: int = GLOBAL) -> int:
        """Copies of `name` free now on `device` (GLOBAL: the global set)."""
        return self._free.get((name, device), self._explicit((name, device)) or 0)

    @property
    def limiting(self) -> bool:
        """Whether anything here can refuse an instance; if not, releases concern only their own pool."""
        return bool(self._max or self._free)

    def try_acquire(self, resources: tuple[RateLimiterResource, ...], device: int = 0) -> bool:
        """Take what an instance on `device` needs to execute, all or nothing."""
        if self._max and self._running >= self._max:
            return False
        if any(self._copies(_key(r, device)) < r.count for r in resources):
            return False
        for r in resources:
            self._free[_key(r, device)] -= r.count
        self._running += 1
        return True

    def release(self, resources: tuple[RateLimiterResource, ...], device: int = 0) -> None:
        self._running -= 1
        for r in resources:
            self._free[_key(r, device)] += r.count
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
