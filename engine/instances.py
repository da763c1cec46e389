"""Instances and the thread boundary.

An `InstancePool` holds a model version's instances. Each instance owns a single-thread executor; its backend is
created, run and closed on that thread only, which is the ONLY place the event loop hands work to a thread.
The number of free instances is the model's concurrency limit. A server-wide `RateLimiter` adds two more
limits across models: a cap on batches executing at once, and Triton-style named resources that instances
must hold while they execute, so one busy model cannot starve the others.

All methods except `Instance.run`'s worker run on the event loop thread.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import backends
from .config import InstanceKind, ModelConfig, RateLimiterResource
from .devices import CPU, Device
from .errors import unavailable


# A hand-off to an instance thread and back costs about 75 us of CPU per batch on the small VMs we measure on
# (futex wake-ups, the GIL, the loop's wake-up pipe): `simple` under concurrency 8 over gRPC, server on one
# core, used ~215 us of server CPU per inference with every batch on the thread and ~190 us with every batch
# inline (batches of ~2.7). A CPU batch that costs less than the hand-off is cheaper run in place, so tiny
# models run inline; anything slower keeps its thread. Only backends that say their execution time is CPU
# time (`cpu_bound = True`) qualify: one that waits on a device or a sleep uses no CPU yet blocks.
#
# The decision rests on a running average of each batch size's CPU time, not on the last run. In the server
# a `simple` run takes ~60 us of CPU (~25 us alone in a loop: the loop, timer and instance threads share the
# core's caches), and some runs take several times that (cache misses, page faults); with a one-sample rule
# each such run sent that batch size back to the thread until a thread run measured fast again — 70 % of
# batches under perf_analyzer at concurrency 4. A sample counts at most INLINE_SAMPLE_CAP_NS, so an outlier
# moves the average by ~15 us while a backend that is really slow crosses INLINE_BELOW_NS within a few runs.
#
# An inline run that still takes longer than INLINE_WALL_LIMIT_NS of wall time is a strike against the
# instance if the run itself may have been the cause: it used that much CPU, or it gave up the CPU (a
# voluntary context switch: a sleep, a lock, a device wait). A strike sends that batch size back to the
# thread at once (its average set to the cap); INLINE_STRIKES of them turn inlining off for good. Why not at
# the first: waiting for the GIL is a voluntary switch too — ORT releases the GIL while it computes, and the
# timer thread may hold it when the run ends — so on one busy core a fast backend collects a strike now and
# then (once in ~60 s of saturated load here), while a backend that blocks collects one every time it is
# tried inline. A run that was merely preempted (involuntary switches only) says nothing about the backend.
INLINE_BELOW_NS = 100_000
INLINE_SAMPLE_CAP_NS = 2 * INLINE_BELOW_NS
INLINE_AVERAGE_WEIGHT = 1 / 8  # of the newest sample
INLINE_WALL_LIMIT_NS = 2_000_000
INLINE_STRIKES = 3


_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux only


def _voluntary_switches() -> int | None:
    """Times this thread has given up the CPU of its own accord; None where the OS cannot say per thread."""
    return None if _RUSAGE_THREAD is None else resource.getrusage(_RUSAGE_THREAD).ru_nvcsw


@dataclass(frozen=True, slots=True)
class Placement:
    name: str
    device: Device
    resources: tuple[RateLimiterResource, ...] = ()
    priority: int = 0


def place(config: ModelConfig, gpus: tuple[int, ...]) -> list[Placement]:
    """Where each instance runs: `count` instances on the CPU, or `count` on each listed (or every) GPU."""
    out: list[Placement] = []
    for group in config.instance_groups:
        kind = group.kind
        if kind is InstanceKind.AUTO:
            kind = InstanceKind.GPU if gpus else InstanceKind.CPU
        if kind is InstanceKind.CPU:
            devices = [CPU] * group.count
        else:
            wanted = group.gpus or gpus
            if not wanted:
                raise unavailable(f"model '{config.name}': instance group '{group.name}' wants a GPU, "
                                  "but none is visible; use kind KIND_CPU")
            missing = [g for g in wanted if g not in gpus]
            if missing:
                raise unavailable(f"model '{config.name}': instance group '{group.name}' names GPU {missing[0]}, "
                                  f"but the visible GPUs are {list(gpus) or 'none'}")
            devices = [Device("gpu", g) for g in wanted for _ in range(group.count)]
        for i, device in enumerate(devices):
            out.append(Placement(f"{group.name}_{i}", device, group.resources, group.priority))
    return out


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


@dataclass(eq=False)
class Instance:
    placement: Placement
    executor: ThreadPoolExecutor
    backend: Any = None
    busy: bool = False
    # The largest batch (in elements) whose average CPU time is under INLINE_BELOW_NS; 0 = none yet, -1 = never.
    inline_elements: int = 0
    cpu_ns: dict[int, float] = field(default_factory=dict)  # batch elements -> running average of CPU ns
    inline_strikes: int = 0

    def measured(self, elements: int, cpu_ns: int) -> None:
        """Fold one run's CPU time into its batch size's average and move `inline_elements` accordingly."""
        if self.inline_elements < 0:
            return
        sample = min(cpu_ns, INLINE_SAMPLE_CAP_NS)
        average = self.cpu_ns.get(elements)
        average = sample if average is None else average + (sample - average) * INLINE_AVERAGE_WEIGHT
        self.cpu_ns[elements] = average
        if average < INLINE_BELOW_NS:
            self.inline_elements = max(self.inline_elements, elements)
        elif elements <= self.inline_elements:
            self.inline_elements = elements - 1  # this size got slow: it and larger ones back to the thread

    def blocked_inline(self, elements: int) -> None:
        """An inline run of `elements` held the loop past INLINE_WALL_LIMIT_NS, maybe by its own doing."""
        self.inline_strikes += 1
        if self.inline_strikes >= INLINE_STRIKES:
            self.inline_elements = -1  # it keeps blocking the loop: never inline this instance again
        else:
            self.cpu_ns[elements] = INLINE_SAMPLE_CAP_NS
            self.inline_elements = min(self.inline_elements, elements - 1)

    @property
    def name(self) -> str:
        return self.placement.name


class InstancePool:
    """A model version's instances. The batcher calls `try_acquire` when it has work, runs the batch with
    `execute`, and the pool calls `on_release` whenever an instance (or a limiter slot) frees up."""

    def __init__(self, config: ModelConfig, model_path: Path, placements: list[Placement],
                 limiter: RateLimiter) -> None:
        self.config = config
        self._model_path = model_path
        self._limiter = limiter
        self._instances = [
            Instance(p, ThreadPoolExecutor(1, thread_name_prefix=f"{config.name}.{p.name}")) for p in placements
        ]
        self._free: deque[Instance] = deque(self._instances)
        self.on_release: Callable[[], None] = lambda: None
        for p in placements:
            limiter.register(p.resources)
        limiter.add_listener(self._limiter_released)

    @property
    def size(self) -> int:
        return len(self._instances)

    async def start(self) -> None:
        """Create every backend on its own thread; on any failure close those already made."""
        loop = asyncio.get_running_loop()

        def make(instance: Instance) -> Any:
            return backends.create(self.config, self._model_path, instance.placement.device)

        try:
            created = await asyncio.gather(
                *(loop.run_in_executor(i.executor, make, i) for i in self._instances), return_exceptions=True
            )
            for instance, result in zip(self._instances, created):
                if isinstance(result, BaseException):
                    raise result
                instance.backend = result
        except BaseException:
            await self.close()
            raise

    def has_free(self) -> bool:
        return bool(self._free)

    def try_acquire(self) -> Instance | None:
        if not self._free:
            return None
        instance = self._free[0]
        if not self._limiter.try_acquire(instance.placement.resources):
            return None
        self._free.popleft()
        instance.busy = True
        return instance

    def release(self, instance: Instance) -> None:
        instance.busy = False
        self._free.append(instance)
        if self._limiter.limiting:
            self._limiter.release(instance.placement.resources)  # offers the slot to every pool, ours included
        else:
            self._limiter.release_quietly()
            self.on_release()

    def _limiter_released(self) -> None:
        if self._free:
            self.on_release()

    async def execute(self, instance: Instance, inputs: dict[str, np.ndarray],
                      output_names: list[str], elements: int = 1) -> tuple[dict[str, np.ndarray], int]:
        """Run one batch of `elements` on `instance`; returns the outputs and the backend's own time in ns.

        Normally on the instance's thread. A CPU batch no larger than one already measured to take under
        INLINE_BELOW_NS runs on the loop instead: handing it to a thread would cost the loop more than
        running it (see INLINE_BELOW_NS)."""
        backend = instance.backend

        def run() -> tuple[dict[str, np.ndarray], int, int]:
            start, cpu_start = time.perf_counter_ns(), time.thread_time_ns()
            outputs = backend.execute(inputs, output_names)
            return outputs, time.perf_counter_ns() - start, time.thread_time_ns() - cpu_start

        inline_ok = instance.inline_elements >= 0 and getattr(backend, "cpu_bound", False) \
            and instance.placement.device.kind == "cpu"
        if inline_ok and elements <= instance.inline_elements:
            waits = _voluntary_switches()
            outputs, took, cpu = run()
            if took > INLINE_WALL_LIMIT_NS and (waits is None or cpu > INLINE_WALL_LIMIT_NS // 2
                                                or (_voluntary_switches() or 0) > waits):
                instance.blocked_inline(elements)
                return outputs, took
        else:
            outputs, took, cpu = await asyncio.get_running_loop().run_in_executor(instance.executor, run)
        if inline_ok:
            instance.measured(elements, cpu)  # CPU time: preemption inflates the wall clock, not the cost
        return outputs, took

    async def warm_up(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> None:
        """Run one warm-up sample on every instance at once, each on its own thread (engine/warmup.py). Called
        only while the version is LOADING, before any request can reach the pool, so it takes no slots."""
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(loop.run_in_executor(i.executor, i.backend.execute, inputs, output_names) for i in self._instances),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def close(self) -> None:
        """Close each backend on its own thread, then stop the threads. Callers drain work first."""
        self._limiter.remove_listener(self._limiter_released)
        loop = asyncio.get_running_loop()

        def close_backend(instance: Instance) -> None:
            if instance.backend is not None:
                instance.backend.close()
                instance.backend = None

        await asyncio.gather(
            *(loop.run_in_executor(i.executor, close_backend, i) for i in self._instances),
            return_exceptions=True,
        )
        for instance in self._instances:
            instance.executor.shutdown(wait=False)
