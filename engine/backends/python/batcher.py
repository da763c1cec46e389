"""`RequestBatcher`: the dynamic batcher for Python models, answering each request on its own.

It is the engine's `Batcher` (queues, windows, priorities, timeouts, instance and rate-limiter slots are
all the same) with one step replaced: a formed batch is not concatenated, run and sliced, but handed to the
instance as its requests (`execute_requests`, backend.py), and each answer is checked against the config
and against what that request asked for (answers.py `AnswerCheck`), so one bad answer fails its own request
only; a count of responses other than the count of requests fails the batch (Triton's rule), saying both.

Its `bind()` (from `PythonModel.start`, before warm-up) wires each instance to the loop, BLS and the model's
readiness (answers.py `InstanceBinding`).

Runs on the event loop, as the Batcher does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ...config.model_config import ModelConfig
from ...errors import EngineError
from ...instances.pool import Instance, InstancePool
from ...observability import observe
from ...observability.stats import ModelStats
from ...scheduling.batching.batcher import Batcher
from ...scheduling.batching.policy import Pending
from ...types import InferenceResponse
from .answers import AnswerCheck, InstanceBinding, count_error
from .bls import Router
from .decoupled import Relay
from .runner import Answer


class RequestBatcher(Batcher):
    def __init__(self, config: ModelConfig, version: str, pool: InstancePool, stats: ModelStats,
                 router: Router | None, on_health: Callable[[str], None]) -> None:
        super().__init__(config, version, pool, stats)
        self._binding = InstanceBinding(pool, router, on_health)
        self.wait_nodes = self._binding.wait_nodes  # this version's instances, for BLS deadlock detection
        self._answers = AnswerCheck(config, version)

    def bind(self) -> None:
        """Wire every instance to the loop, BLS and readiness. Called once the instances exist."""
        self._binding.bind()

    # ------------------------------------------------------------------ execution

    def _start(self, instance: Instance, batch: list[Pending], seq: int) -> None:
        run = self._run_decoupled if self.config.decoupled else self._run
        asyncio.get_running_loop().create_task(run(instance, batch, seq))

    async def _run_decoupled(self, instance: Instance, batch: list[Pending], seq: int) -> None:
        """A decoupled model's batch (decoupled.py): the instance is free once execute returns; each request
        ends when its model sends the final flag, or fails with the batch when execute raised."""
        start = time.perf_counter_ns()
        for p in batch:
            self._stats.queue.add(start - p.enqueue_ns)
        if observe.STATE.active:  # its access line's queue; its compute ends at its final response (Relay)
            elements = sum(p.batch_size for p in batch)
            for p in batch:
                req = p.request
                req.queued_ns, req.dispatched_ns, req.executed_batch = p.enqueue_ns, start, elements
        relays = [Relay(p, self._response, self._relay_finished, self._stats, start) for p in batch]
        failure: EngineError | None = None
        try:
            await instance.backend.execute_requests(
                [p.request for p in batch], [p.inputs for p in batch], instance.executor, relays)
            self._stats.record_execution(sum(p.batch_size for p in batch), len(batch), 0,
                                         time.perf_counter_ns() - start, 0)
        except Exception as e:
            failure = self._execution_error(e)
        finally:
            self._pool.release(instance)  # its requests count as finished one by one (_relay_finished)
        if failure is not None:
            for relay in relays:
                relay.fail(failure)

    def _relay_finished(self) -> None:
        """A decoupled request's last response (or its failure): its client may come back (early dispatch
        counts it), and it is no longer in flight."""
        self.policy.finished(1)
        self._done(1)

    def _response(self, p: Pending, answer: Answer) -> InferenceResponse | EngineError:
        """One answer of the model, checked (answers.py): a decoupled model's Relay calls it per send."""
        return self._answers.response(p.request, answer, p.batch_size)

    async def _run(self, instance: Instance, batch: list[Pending], seq: int) -> None:
        start = time.perf_counter_ns()
        for p in batch:
            self._stats.record_queue(start - p.enqueue_ns)
        elements = sum(p.batch_size for p in batch)
        observed = observe.STATE.active  # what the access line and the spans read (observability/observe.py)
        if observed:
            for p in batch:
                req = p.request
                req.queued_ns, req.dispatched_ns, req.executed_batch = p.enqueue_ns, start, elements
        try:
            answers = await instance.backend.execute_requests(
                [p.request for p in batch], [p.inputs for p in batch], instance.executor)
            infer_ns = time.perf_counter_ns() - start
            out_start = time.perf_counter_ns()
            results = self._check(instance.name, batch, answers)
            end = time.perf_counter_ns()
            output_ns = end - out_start
            self._stats.record_execution(elements, len(batch), 0, infer_ns, output_ns)
            if observed:
                for p in batch:
                    p.request.computed_ns = end
        except Exception as e:  # the instance failed (or died): this batch fails, the next may not
            results = self._failed(batch, e)
        finally:
            # Batcher._release: the policy counts these requests finished, then the instance frees up.
            # Without the count, early dispatch thought every request ever taken was still executing (its
            # population never matched) and most batches of a lone client waited out the window.
            self._release(instance, batch)
        self._deliver(seq, results)

    def _check(self, instance: str, batch: list[Pending], answers: list[Answer]
               ) -> list[tuple[Pending, InferenceResponse | EngineError]]:
        error = count_error(instance, len(answers), len(batch))
        if error is not None:
            return [(p, error) for p in batch]
        return [(p, self._answers.response(p.request, answer, p.batch_size))
                for p, answer in zip(batch, answers, strict=True)]
