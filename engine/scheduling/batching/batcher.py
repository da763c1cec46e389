"""Dynamic batching on the event loop: `Batcher` drives the pure `BatchPolicy` (policy.py), which owns
the queues and says which requests form the next batch now or how long to wait.

There is no background task: `_dispatch()` runs whenever something changes — a request arrives, an instance
frees up, a timer fires — and forms batches only while an instance is free. So requests
arriving while every instance is busy wait in the queue and join the next batch ("batch as late as possible").
A timer is armed only for the earliest of the batching window and the next queue timeout, so timeouts fire
on time even when no instance frees up.

Semantics (Triton's `dynamic_batching`) are the policy's: see policy.py.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
from mypy_extensions import mypyc_attr

from ...config.model_config import ModelConfig
from ...errors import EngineError, ErrorCode, invalid
from ...instances.pool import Instance, InstancePool
from ...observability import observe
from ...observability.request_life import requests_succeeded
from ...observability.stats import ModelStats
from ...types import Completion, InferenceRequest, InferenceResponse, Tensor
from ..inflight import InflightBatcher
from ..timers import THRESHOLD_S, FdTimer, PreciseTimer
from .adaptive_window import AdaptiveWindow
from .policy import BatchPolicy, Pending

log = logging.getLogger("hubserve.batching")


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed in modules mypyc leaves uncompiled
class Batcher(InflightBatcher):
    """The asyncio side: futures, timers, and running formed batches on instances. Runs on the event loop."""

    def __init__(self, config: ModelConfig, version: str, pool: InstancePool, stats: ModelStats) -> None:
        super().__init__()
        self.config = config
        self._version = version
        self._pool = pool
        self._stats = stats
        self.policy = BatchPolicy(config.max_batch_size, config.dynamic_batching)
        # the queue level and policy of a request that names neither a priority nor a timeout, for `_pending`
        default_level = self.policy.level_of(0)
        self._default_queue = (default_level, self.policy.queue_policy(default_level))
        self._timer: asyncio.TimerHandle | None = None
        # Sub-2 ms waits: a timerfd on the loop where there is one, else a timer thread; created on first use
        self._fd_timer: FdTimer | None = None
        self._use_fd = FdTimer.available()
        self._fd_armed = False
        self._precise: PreciseTimer | None = None
        self._precise_token: int | None = None
        self._timer_at = 0.0  # perf_counter seconds of the pending timer, 0 when none
        self._preserve = bool(config.dynamic_batching and config.dynamic_batching.preserve_ordering)
        self._next_seq = 0
        self._deliver_seq = 0
        self._finished: dict[int, list[tuple[Pending, InferenceResponse | EngineError]]] = {}
        self._output_names = [o.name for o in config.outputs]
        self._output_types = {o.name: o.datatype for o in config.outputs}
        # Outputs configured with `reshape` leave in their configured dims, as Triton answers and as the
        # metadata says: the model's own shape (`reshape.shape`) stays inside.
        self._output_dims = {o.name: o.dims for o in config.outputs if o.reshape is not None}
        self.adaptive: AdaptiveWindow | None = None
        target_ms = config.parameters.get("p95_latency_target_ms")
        if target_ms is not None and config.dynamic_batching is not None:
            self.adaptive = AdaptiveWindow(int(float(target_ms) * 1e6), config.max_batch_size)
            self.policy.delay_ns = 0  # until something is measured, batch whatever is queued
        pool.on_release = self._dispatch

    def enqueue(self, request: InferenceRequest, inputs: dict[str, np.ndarray], received_ns: int = 0,
                on_done: Completion | None = None) -> asyncio.Future[InferenceResponse]:
        """Queue a validated request; the future resolves with its response. Raises at once when the queue is
        full. Cancelling the future (the client left, its deadline passed) takes the request out of the queue,
        so it is never executed.

        The request is accounted (success, failure or cancelled, timed from `received_ns`, when the frontend
        received it) and then `on_done` is called with the future, the frontend's answer, once, whatever
        happens to it: a successful one by its batch's answer pass (`_resolve`), with no loop round of its
        own; a failed, timed-out or cancelled one by the future's done-callback. So a client that reads its
        answer and then asks for statistics finds its request counted."""
        pending = self._pending(request, inputs)
        received = pending.received_ns = received_ns or pending.enqueue_ns
        future: asyncio.Future[InferenceResponse] = asyncio.get_running_loop().create_future()
        pending.future = future
        if self.adaptive is not None:
            self.adaptive.on_arrival(pending.enqueue_ns)
        policy = self.policy
        policy.enqueue(pending)
        pending.on_done = on_done
        pending.callback = self._accept(future, pending, request, received, on_done)
        # With every instance busy and no queued request able to time out, `_dispatch` would find nothing to
        # do (the pool calls it when an instance frees up): under load, most arrivals skip it
        if policy.with_deadline or self._pool.has_free():
            self._dispatch()
        return future

    @property
    def queued_count(self) -> int:
        """Requests in the policy's queues, waiting for an instance (executing ones have left them)."""
        return len(self.policy)

    def _withdraw(self, token: Pending) -> None:
        token.callback = token.on_done = None  # (see _resolve)
        if self.policy.remove(token):
            self._done(1)

    async def submit(self, request: InferenceRequest, inputs: dict[str, np.ndarray]) -> InferenceResponse:
        """`enqueue` and wait; cancelling the caller cancels the request."""
        return await self.enqueue(request, inputs)

    def _pending(self, request: InferenceRequest, inputs: dict[str, np.ndarray]) -> Pending:
        policy = self.policy
        batching = self.config.max_batch_size > 0
        first = next(iter(inputs.values()))
        batch_size = int(first.shape[0]) if batching and first.ndim else 1
        shape_key = tuple([a.shape[1:] for a in inputs.values()]) if batching else ()  # a list: one call
        params = request.parameters
        if "priority" in params or "timeout" in params:
            level = policy.level_of(_int_param(request, "priority"))
            qp = policy.queue_policy(level)
            timeout_us = qp.default_timeout_us
            override = _int_param(request, "timeout")
            if override and qp.allow_timeout_override:
                timeout_us = override
        else:  # no priority, no timeout (most requests): the model's defaults, worked out once
            level, qp = self._default_queue
            timeout_us = qp.default_timeout_us
        now = time.perf_counter_ns()
        return Pending(request, inputs, batch_size, shape_key, now, level,
                       now + timeout_us * 1000 if timeout_us else 0, qp.timeout_action)

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self) -> None:
        """Form and start batches while an instance is free. Called on every state change."""
        policy = self.policy
        if not policy.queued:
            return
        now = time.perf_counter_ns()
        for p in policy.expire(now):
            self._fail(p, EngineError(ErrorCode.UNAVAILABLE,
                                      f"request timed out in the queue of model '{self.config.name}'"))
            self._done(1)
        wait_ns: int | None = None
        while policy.queued and self._pool.has_free():
            decision = policy.peek(now)
            if not decision.batch:
                wait_ns = decision.wait_ns
                break
            instance = self._pool.try_acquire()
            if instance is None:
                break  # the limiter said no; the pool calls _dispatch again when it frees up
            policy.take(decision.batch)
            reasons = self._stats.dispatch_reasons
            reasons[decision.reason] = reasons.get(decision.reason, 0) + 1
            seq = self._next_seq
            self._next_seq += 1
            self._start(instance, decision.batch, seq)
        deadline = policy.next_deadline_ns()
        if deadline is not None:
            wait_ns = min(wait_ns, deadline - now) if wait_ns is not None else deadline - now
        if wait_ns is not None:
            self._arm_timer(max(wait_ns, 0) / 1e9)

    def _arm_timer(self, delay_s: float) -> None:
        """Ask for one `_dispatch` after `delay_s`; an earlier pending timer already covers a later one."""
        now = time.perf_counter()
        when = now + delay_s
        if self._timer_at > now and self._timer_at <= when:
            return
        self._timer_at = when
        if delay_s < THRESHOLD_S and self._use_fd:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._fd_timer is None:
                try:
                    self._fd_timer = FdTimer(asyncio.get_running_loop(), self._on_timer)
                except OSError as e:  # out of descriptors, say: the timer thread still works
                    log.warning("model '%s' times its batching window with a thread: %s", self.config.name, e)
                    self._use_fd = False
            if self._fd_timer is not None:
                self._fd_timer.arm(delay_s)  # replaces an armed deadline: no cancel needed
                self._fd_armed = True
                return
        self._cancel_timer()
        if delay_s < THRESHOLD_S:
            if self._precise is None:
                self._precise = PreciseTimer(asyncio.get_running_loop(), self.config.name)
            self._precise_token = self._precise.call_later(delay_s, self._on_timer)
        else:
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    def _cancel_timer(self) -> None:
        if self._fd_armed and self._fd_timer is not None:
            self._fd_timer.disarm()
            self._fd_armed = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._precise_token is not None and self._precise is not None:
            self._precise.cancel(self._precise_token)
            self._precise_token = None

    def _on_timer(self) -> None:
        self._timer = None
        self._fd_armed = False
        self._precise_token = None
        self._timer_at = 0.0
        self._dispatch()

    def _start(self, instance: Instance, batch: list[Pending], seq: int) -> None:
        """Run a formed batch. A batch the instance runs in place (engine/instances/inline_policy.py) goes in
        a plain callback on the next loop round: no task, whose creation and steps would cost more than such a
        batch's inference. Not at once, inside `_dispatch`: the instance stays busy until then, so requests
        arriving in the same round queue behind it and form the next batch, as they do behind a thread run."""
        elements = sum([p.batch_size for p in batch])  # a list: one call, not one per request
        loop = asyncio.get_running_loop()
        if self._pool.runs_inline(instance, elements):
            loop.call_soon(self._execute_inline, instance, batch, seq, elements)
        else:
            loop.create_task(self._execute(instance, batch, seq, elements))

    def _execute_inline(self, instance: Instance, batch: list[Pending], seq: int, elements: int) -> None:
        try:
            start, inputs = self._inputs(batch, elements)
            input_ns = time.perf_counter_ns() - start
            outputs, infer_ns = self._pool.execute_inline(instance, inputs, self._output_names, elements)
            results = self._results(batch, outputs, elements, input_ns, infer_ns)
        except Exception as e:  # a backend bug or runtime failure fails this batch only
            results = self._failed(batch, e)
        finally:
            self._release(instance, batch)
        self._deliver(seq, results)

    async def _execute(self, instance: Instance, batch: list[Pending], seq: int, elements: int) -> None:
        try:
            start, inputs = self._inputs(batch, elements)
            input_ns = time.perf_counter_ns() - start
            outputs, infer_ns = await self._pool.execute(instance, inputs, self._output_names, elements)
            results = self._results(batch, outputs, elements, input_ns, infer_ns)
        except Exception as e:  # a backend bug or runtime failure fails this batch only
            results = self._failed(batch, e)
        finally:
            self._release(instance, batch)
        self._deliver(seq, results)

    def _release(self, instance: Instance, batch: list[Pending]) -> None:
        """The batch has its results: its clients count as answered for early dispatch (their answers go out
        in this loop round), then the instance frees up, which dispatches the next batch. Releasing before
        delivering lets the next batch reach its thread before this one's answers are encoded."""
        self.policy.finished(len(batch))
        self._pool.release(instance)

    def _inputs(self, batch: list[Pending], elements: int) -> tuple[int, dict[str, np.ndarray]]:
        """When the batch left the queue (accounted as each request's queue time, in one call for the
        batch), and its inputs."""
        start = time.perf_counter_ns()
        self._stats.record_queue_waits([start - p.enqueue_ns for p in batch])
        if observe.STATE.active:  # what the access line and the spans read (engine/observability/observe.py)
            for p in batch:
                req = p.request
                req.queued_ns, req.dispatched_ns, req.executed_batch = p.enqueue_ns, start, elements
        return start, _concat(batch)

    def _results(self, batch: list[Pending], outputs: dict[str, np.ndarray], elements: int, input_ns: int,
                 infer_ns: int) -> list[tuple[Pending, InferenceResponse | EngineError]]:
        out_start = time.perf_counter_ns()
        results = self._split(batch, outputs, elements)
        end = time.perf_counter_ns()
        output_ns = end - out_start
        self._stats.record_execution(elements, len(batch), input_ns, infer_ns, output_ns)
        if observe.STATE.active:
            for p in batch:
                p.request.computed_ns = end
        if self.adaptive is not None:
            self.adaptive.on_execution(elements, input_ns + infer_ns + output_ns)
            self.policy.delay_ns = self.adaptive.window_ns
        return results

    def _failed(self, batch: list[Pending], error: Exception
                ) -> list[tuple[Pending, InferenceResponse | EngineError]]:
        failure = self._execution_error(error)
        log.warning("a batch of model '%s' failed (request ids %s): %s", self.config.name,
                    ", ".join(p.request.id or "-" for p in batch), failure.message)
        return [(p, failure) for p in batch]

    def _split(self, batch: list[Pending], outputs: dict[str, np.ndarray], total: int
               ) -> list[tuple[Pending, InferenceResponse | EngineError]]:
        """Slice each output back to its requests (views, no copies); `total` is the batch's elements."""
        batching = self.config.max_batch_size > 0
        for name, arr in outputs.items():
            if batching and (arr.ndim == 0 or arr.shape[0] != total):
                raise EngineError(ErrorCode.INTERNAL,
                                  f"model '{self.config.name}' returned output '{name}' with batch dimension "
                                  f"{arr.shape[0] if arr.ndim else 'none'} for a batch of {total}")
        results: list[tuple[Pending, InferenceResponse | EngineError]] = []
        offset = 0
        for p in batch:
            req = p.request
            names = [o.name for o in req.outputs] if req.outputs is not None else self._output_names
            tensors = []
            for name in names:
                arr = outputs[name]
                if batching and len(batch) > 1:
                    arr = arr[offset:offset + p.batch_size]
                if self._output_dims and name in self._output_dims:
                    arr = arr.reshape(((p.batch_size,) if batching else ()) + self._output_dims[name])
                tensors.append(Tensor(name, self._output_types[name], arr.shape, arr))
            offset += p.batch_size
            results.append((p, InferenceResponse(req.model_name, self._version, tensors, req.id)))
        return results

    def _deliver(self, seq: int, results: list[tuple[Pending, InferenceResponse | EngineError]]) -> None:
        if not self._preserve:
            self._resolve(results)
            return
        self._finished[seq] = results
        while self._deliver_seq in self._finished:
            self._resolve(self._finished.pop(self._deliver_seq))
            self._deliver_seq += 1

    def _resolve(self, results: list[tuple[Pending, InferenceResponse | EngineError]]) -> None:
        """Answer a batch's requests. A failed one's future is failed, and its done-callback accounts and
        answers it in a later loop round, as any cancelled or timed-out request's does. The answered ones
        go in one pass, here: each future's done-callback is taken off before it is resolved, the batch is
        accounted in one call (request_life.requests_succeeded), and then each frontend's `on_done` runs
        at once, so a request costs no loop round of its own between its batch and its encoded answer."""
        if self.adaptive is not None:
            now = time.perf_counter_ns()
            for p, _ in results:
                self.adaptive.on_latency(now - p.received_ns)
            self.policy.delay_ns = self.adaptive.window_ns
        answered: list[Pending] = []
        for p, result in results:
            fut = p.future
            callback, p.callback = p.callback, None  # the callback holds the pending: no cycle is left behind
            if fut is not None and not fut.done():
                if isinstance(result, EngineError):
                    fut.set_exception(result)
                else:
                    if callback is not None:
                        fut.remove_done_callback(callback)
                    fut.set_result(result)
                    answered.append(p)
        self._done(len(results))
        if answered:
            requests_succeeded(self._stats, self.config.name, self._version, [p.request for p in answered],
                               [p.received_ns for p in answered], time.perf_counter_ns())
            for p in answered:
                on_done, p.on_done = p.on_done, None
                if on_done is not None:
                    try:
                        on_done(p.future)  # type: ignore[arg-type]  # set above
                    except Exception:  # one frontend's bug must not leave the rest of the batch unanswered
                        log.exception("answering a request of model '%s' failed", self.config.name)

    def _fail(self, p: Pending, error: EngineError) -> None:
        p.callback = p.on_done = None  # (see _resolve)
        if p.future is not None and not p.future.done():
            p.future.set_exception(error)

    def close(self) -> None:
        self._cancel_timer()
        if self._fd_timer is not None:
            self._fd_timer.close()
            self._fd_timer = None
        if self._precise is not None:
            self._precise.close()
            self._precise = None


def _int_param(request: InferenceRequest, key: str) -> int:
    value = request.parameters.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or int(value) != value:
        raise invalid(f"request parameter '{key}' must be a non-negative integer, got {value!r}")
    return int(value)


def _concat(batch: list[Pending]) -> dict[str, np.ndarray]:
    """One copy to form a batch; none for a batch of one."""
    if len(batch) == 1:
        return batch[0].inputs
    names = batch[0].inputs.keys()
    return {name: np.concatenate([p.inputs[name] for p in batch]) for name in names}
