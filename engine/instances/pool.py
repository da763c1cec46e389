"""The instance pool: a model version's instances, and the thread boundary.

An `InstancePool` holds a model version's instances, placed by placement.py. Each instance owns a
single-thread executor; its backend is created, run and closed on that thread only. The number of free
instances is the model's concurrency limit; the server-wide `RateLimiter` (rate_limiter.py) may refuse an
instance on top of that. A batch runs on its instance's thread unless the instance's `InlinePolicy`
(inline_policy.py) says it is cheaper run in place, on the loop.

The batcher (engine/scheduling/batching/batcher.py, what Triton calls the scheduler) decides what runs; this
pool only runs it. Everything here runs on the event loop thread, except the backend calls handed to the
instances' threads.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import backends
from ..config.model_config import ModelConfig
from .inline_policy import INLINE_WALL_LIMIT_NS, InlinePolicy
from .placement import Placement
from .rate_limiter import RateLimiter

_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux only


def _voluntary_switches() -> int | None:
    """Times this thread has given up the CPU of its own accord; None where the OS cannot say per thread."""
    return None if _RUSAGE_THREAD is None else resource.getrusage(_RUSAGE_THREAD).ru_nvcsw


def _run(backend: Any, inputs: dict[str, np.ndarray], output_names: list[str]
         ) -> tuple[dict[str, np.ndarray], int, int]:
    """One backend run: its outputs, wall time and this thread's CPU time, in ns."""
    start, cpu_start = time.perf_counter_ns(), time.thread_time_ns()
    outputs = backend.execute(inputs, output_names)
    return outputs, time.perf_counter_ns() - start, time.thread_time_ns() - cpu_start


@dataclass(eq=False)
class Instance:
    """One instance: its thread, its backend (made on that thread by `InstancePool.start`) and its policy
    for running small batches in place."""

    placement: Placement
    executor: ThreadPoolExecutor
    backend: Any = None
    busy: bool = False
    inline: InlinePolicy = field(default_factory=lambda: InlinePolicy(eligible=False))  # set by start()

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
            Instance(p, ThreadPoolExecutor(1, thread_name_prefix=f"{config.name}.{p.name}"))
            for p in placements
        ]
        self._free: deque[Instance] = deque(self._instances)
        self.on_release: Callable[[], None] = lambda: None
        for p in placements:
            limiter.register(p.resources, p.device.index)
        limiter.add_listener(self._limiter_released)

    @property
    def size(self) -> int:
        return len(self._instances)

    async def start(self) -> None:
        """Create every backend on its own thread; on any failure close those already made."""
        loop = asyncio.get_running_loop()

        def make(instance: Instance) -> Any:
            return backends.create(self.config, self._model_path, instance.placement.device, instance.name)

        try:
            created = await asyncio.gather(
                *(loop.run_in_executor(i.executor, make, i) for i in self._instances), return_exceptions=True
            )
            for instance, result in zip(self._instances, created, strict=True):
                if isinstance(result, BaseException):
                    raise result
                instance.backend = result
                instance.inline = InlinePolicy(eligible=getattr(result, "cpu_bound", False)
                                               and instance.placement.device.kind == "cpu")
        except BaseException:
            await self.close()
            raise

    def backends(self) -> list[Any]:
        """Every instance's backend, in placement order (None before `start`)."""
        return [i.backend for i in self._instances]

    def has_free(self) -> bool:
        return bool(self._free)

    def try_acquire(self) -> Instance | None:
        if not self._free:
            return None
        instance = self._free[0]
        if not self._limiter.try_acquire(instance.placement.resources, instance.placement.device.index):
            return None
        self._free.popleft()
        instance.busy = True
        return instance

    def try_acquire_at(self, index: int) -> Instance | None:
        """Acquire the instance at `index` (placement order) if it is free and the limiter agrees: for the
        sequence batcher's direct strategy, whose sequences are pinned to one instance."""
        instance = self._instances[index]
        if instance.busy or not self._limiter.try_acquire(instance.placement.resources,
                                                          instance.placement.device.index):
            return None
        self._free.remove(instance)
        instance.busy = True
        return instance

    def release(self, instance: Instance) -> None:
        instance.busy = False
        self._free.append(instance)
        if self._limiter.limiting:
            # Offers the slot to every pool, ours included.
            self._limiter.release(instance.placement.resources, instance.placement.device.index)
        else:
            self._limiter.release_quietly()
            self.on_release()

    def _limiter_released(self) -> None:
        if self._free:
            self.on_release()

    def runs_inline(self, instance: Instance, elements: int) -> bool:
        """Whether a batch of `elements` on `instance` costs less run in place, on the loop, than the hand-off
        to the instance's thread would (inline_policy.py): then the batcher calls `execute_inline`, else
        `execute`."""
        return instance.inline.runs_inline(elements)

    def execute_inline(self, instance: Instance, inputs: dict[str, np.ndarray], output_names: list[str],
                       elements: int = 1) -> tuple[dict[str, np.ndarray], int]:
        """Run one batch of `elements` on `instance`, in place on the loop; returns the outputs and the
        backend's own time in ns. Tells the instance's policy what the run cost."""
        waits = _voluntary_switches()
        outputs, took, cpu = _run(instance.backend, inputs, output_names)
        # Whether the run gave up the CPU matters only for a run that held the loop too long: a short one
        # is not asked (one system call fewer per inline batch).
        gave_up = None if waits is None or took <= INLINE_WALL_LIMIT_NS \
            else (_voluntary_switches() or 0) > waits
        instance.inline.ran_inline(elements, took, cpu, gave_up)
        return outputs, took

    async def execute(self, instance: Instance, inputs: dict[str, np.ndarray],
                      output_names: list[str], elements: int = 1) -> tuple[dict[str, np.ndarray], int]:
        """Run one batch of `elements` on `instance`'s thread; returns the outputs and the backend's own time
        in ns. Tells the instance's policy what the run cost."""
        outputs, took, cpu = await asyncio.get_running_loop().run_in_executor(
            instance.executor, _run, instance.backend, inputs, output_names)
        instance.inline.ran_on_thread(elements, cpu)
        return outputs, took

    async def warm_up(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> None:
        """Run one warm-up sample on every instance at once, each on its own thread (warmup.py). Called only
        while the version is LOADING, before any request can reach the pool, so it takes no slots."""
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(loop.run_in_executor(i.executor, i.backend.execute, inputs, output_names)
              for i in self._instances),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    @property
    def instance_names(self) -> list[str]:
        return [i.name for i in self._instances]

    def canary(self, index: int, inputs: dict[str, np.ndarray], output_names: list[str]
               ) -> asyncio.Future[dict[str, np.ndarray]]:
        """Run `inputs` once on instance `index`'s own thread, at any time, taking no slot (canary.py says
        why): while the instance runs a batch, the canary waits on its thread behind it. The caller reads the
        result or error; one left unread after its deadline is not reported as never retrieved."""
        instance = self._instances[index]
        future = asyncio.get_running_loop().run_in_executor(instance.executor, instance.backend.execute,
                                                            inputs, output_names)
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        return future

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
