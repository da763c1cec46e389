"""The ensemble driver: runs each request's steps on the composing models, as the plan (plan.py) says.

An `EnsembleModel` is a served version like any other (`Model`: the same request checks, metadata, statistics
and classification), but instead of instances it has a plan. Each step is an ordinary request to its composing
model, submitted through `Model.submit` of the version the routing table picks at that moment, so it goes
through that model's own batcher: it is batched with the model's other traffic, queue policies and priorities
apply (the ensemble request's `priority` and `timeout` parameters go with every step), and it is counted in
that model's statistics (the per-step statistics). A step starts as soon as the tensors it reads exist, so
independent steps run concurrently, each in its own batcher.

Tensors pass between steps by reference: a step's input is the array its producer's response holds (a view of
the producer's batch output), so the driver copies nothing; the only copy is the one a batcher makes when it
concatenates a batch. There is no task per request or step: each step's completion is the `on_done` of its
future, and it submits whatever that step made ready.

`max_inflight_requests` (the ensemble config's) bounds the requests this ensemble runs at once; later ones
wait in arrival order, so a burst cannot flood the composing models' queues. This is backpressure on the
ensemble as a whole: Triton applies the field per step to decoupled models, which hubserve does not serve.

The ensemble's own statistics, in the statistics extension's form: success, failure and cancellation end
to end; `queue`, the wait for a free `max_inflight_requests` slot; `compute_infer`, the time from the first
step's submission to the last step's answer (the composing models break it down in their own statistics);
one execution and the batch size in `inference_count` per request.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from functools import partial
from pathlib import Path
from typing import Protocol

from ... import classification
from ...bounded_cache import BoundedCache
from ...config.model_config import ModelConfig
from ...errors import EngineError, ErrorCode
from ...model import Model, ModelState
from ...observability import observe
from ...observability.request_life import request_ended
from ...types import Completion, InferenceRequest, InferenceResponse, RequestedOutput, RequestPlan, Tensor
from .plan import EnsemblePlan, PlanProgress

_MAX_PLANS = 1024  # step request plans kept (one per step and distinct input shapes), then started afresh


class ModelLookup(Protocol):
    """Where a step finds its composing model: the routing table (engine/repository/routing.py
    `RoutingTable.get`)."""

    def get(self, name: str, version: str = "") -> Model: ...


class EnsembleModel(Model):
    """One version of a `platform: "ensemble"` model (`model_path`: its version folder, which holds nothing).
    Created LOADING by the repository once `plan` was built against the composing models; `start()` makes it
    READY; `stop()` waits for the requests it runs."""

    def __init__(self, config: ModelConfig, version: int, model_path: Path, plan: EnsemblePlan,
                 models: ModelLookup) -> None:
        assert config.ensemble is not None
        super().__init__(config, version, model_path)
        self.plan = plan
        self.models = models
        self._limit = config.ensemble.max_inflight_requests
        self._running = 0
        self._waiting: deque[_Run] = deque()
        self._idle = asyncio.Event()
        self._idle.set()
        # What each step asks of its model, worked out once: the outputs it maps, nothing else.
        self.step_outputs = [[RequestedOutput(name) for name, _ in step.outputs] for step in plan.steps]
        self._step_plans: BoundedCache[tuple, RequestPlan] = BoundedCache(_MAX_PLANS)

    @property
    def model_dir(self) -> Path:
        return self.model_path.parent  # `model_path` is the version folder: an ensemble has no model file

    async def start(self) -> None:
        self.labels = await asyncio.to_thread(classification.read_labels, self.config, self.model_dir)
        self.state = ModelState.READY

    async def stop(self) -> None:
        """Finish the requests accepted (their steps still run on the composing models). Called once, after
        routing has moved away."""
        self.state = ModelState.UNLOADING
        await self._idle.wait()

    @property
    def pending_count(self) -> int:
        return self._running + len(self._waiting)

    @property
    def queued_count(self) -> int:
        """Requests waiting for a free slot (their steps, once running, queue at the composing models)."""
        return len(self._waiting)

    def submit(self, request: InferenceRequest, received_ns: int = 0, on_done: Completion | None = None
               ) -> asyncio.Future[InferenceResponse]:
        """Validate against the ensemble's config, then run the steps (or wait for a free slot). Raises at
        once for a bad request. The future resolves with the ensemble's outputs; when it is done, the request
        is accounted, its steps still running are cancelled, and `on_done` is called with it."""
        inputs = self.prepare(request)
        wanted = classification.counts(request.outputs)
        if wanted is not None:
            on_done = classification.classifying(on_done, wanted, self.config.max_batch_size > 0, self.labels)
        specs = self._inputs
        tensors = {name: Tensor(name, specs[name].datatype, array.shape, array)
                   for name, array in inputs.items()}
        future: asyncio.Future[InferenceResponse] = asyncio.get_running_loop().create_future()
        run = _Run(self, request, tensors, future)
        future.add_done_callback(partial(self._completed, run, received_ns or run.enqueue_ns, on_done))
        self._idle.clear()
        if self._limit and self._running >= self._limit:
            self._waiting.append(run)
        else:
            self._begin(run)
        return future

    def _begin(self, run: _Run) -> None:
        self._running += 1
        run.started_ns = time.perf_counter_ns()
        self.stats.record_queue(run.started_ns - run.enqueue_ns)
        run.begin()

    def _completed(self, run: _Run, received_ns: int, on_done: Completion | None,
                   future: asyncio.Future[InferenceResponse]) -> None:
        """The ensemble future's one done-callback: account, cancel what still runs, let a waiting request
        in, then answer."""
        now = time.perf_counter_ns()
        cancelled = future.cancelled()
        error = None if cancelled else future.exception()
        request = run.request
        if observe.STATE.active:  # the ensemble's own access line and spans (its steps have theirs)
            if run.started_ns:
                request.queued_ns, request.dispatched_ns = run.enqueue_ns, run.started_ns
                request.computed_ns = now
            request.executed_batch = request_batch(request, self.config.max_batch_size > 0)
        request_ended(self.stats, self.name, self.version_str, request, error, cancelled, received_ns, now)
        if not cancelled and error is None:
            self.stats.record_execution(request_batch(request, self.config.max_batch_size > 0), 1, 0,
                                        now - run.started_ns, 0)
        run.cancel_steps()
        if run.started_ns:
            self._running -= 1
        else:
            self._waiting.remove(run)
        while self._waiting and (not self._limit or self._running < self._limit):
            self._begin(self._waiting.popleft())
        if not self._running and not self._waiting:
            self._idle.set()
        if on_done is not None:
            on_done(future)

    def step_plan(self, index: int, inputs: list[Tensor]) -> RequestPlan:
        """The request plan of step `index` for inputs of these datatypes and shapes, on which the composing
        model keeps its verdict (RequestPlan): a repeated step is not validated again by the same version."""
        key = (index, *((t.name, t.datatype, t.shape) for t in inputs))
        plan = self._step_plans.get(key)
        if plan is None:
            plan = self._step_plans.put(key, RequestPlan())
        return plan


class _Run:
    """One ensemble request on its way through the plan: the ensemble tensors so far (inputs and step
    outputs, by ensemble tensor name), the steps in flight, and the plan's progress. Lives on the loop."""

    __slots__ = ("ensemble", "enqueue_ns", "future", "progress", "request", "started_ns", "steps", "tensors")

    def __init__(self, ensemble: EnsembleModel, request: InferenceRequest, tensors: dict[str, Tensor],
                 future: asyncio.Future[InferenceResponse]) -> None:
        self.ensemble = ensemble
        self.request = request
        self.tensors = tensors
        self.future = future
        self.progress: PlanProgress = ensemble.plan.progress()
        self.steps: dict[int, asyncio.Future[InferenceResponse]] = {}
        self.enqueue_ns = time.perf_counter_ns()
        self.started_ns = 0

    def begin(self) -> None:
        for index in self.progress.start():
            self._launch(index)

    def _launch(self, index: int) -> None:
        """Submit step `index` to the version of its model that serves now. A refusal (no such model, a bad
        request, a full queue) fails the ensemble request at once, with the composing model's words."""
        if self.future.done():
            return
        ensemble = self.ensemble
        step = ensemble.plan.steps[index]
        tensors = self.tensors
        inputs = [Tensor(name, t.datatype, t.shape, t.data) for name, tensor in step.inputs
                  if (t := tensors.get(tensor)) is not None]
        request = InferenceRequest(step.model_name, step.model_version, inputs, self.request.id,
                                   ensemble.step_outputs[index], self.request.parameters,
                                   ensemble.step_plan(index, inputs))
        try:
            model = ensemble.models.get(step.model_name, step.model_version)
        except EngineError as e:
            self._fail(e)
            return
        start = time.perf_counter_ns()
        try:
            self.steps[index] = model.submit(request, start, partial(self._step_done, index))
        except EngineError as e:
            model.stats.fail.add(time.perf_counter_ns() - start)  # as the data plane accounts a refusal
            self._fail(e)

    def _step_done(self, index: int, step_future: asyncio.Future[InferenceResponse]) -> None:
        """A step's answer: keep its outputs as ensemble tensors and start what they made ready; the last
        step's answer completes the request."""
        self.steps.pop(index, None)
        if self.future.done():
            return  # the request failed or was cancelled meanwhile
        step = self.ensemble.plan.steps[index]
        if step_future.cancelled():
            self._fail(EngineError(ErrorCode.UNAVAILABLE, f"in ensemble '{self.ensemble.name}', the request "
                                                          f"to model '{step.model_name}' was cancelled"))
            return
        error = step_future.exception()
        if error is not None:
            if not isinstance(error, EngineError):
                error = EngineError(ErrorCode.INTERNAL, str(error))
            self._fail(error)
            return
        names = dict(step.outputs)
        for tensor in step_future.result().outputs:
            target = names.get(tensor.name)
            if target is not None:
                self.tensors[target] = tensor
        for ready in self.progress.completed(index):
            self._launch(ready)
        if self.progress.finished and not self.future.done():
            self._answer()

    def _answer(self) -> None:
        ensemble = self.ensemble
        request = self.request
        names = [o.name for o in request.outputs] if request.outputs is not None else ensemble.plan.outputs
        outputs = []
        for name in names:
            tensor = self.tensors.get(name)
            if tensor is None:  # validated at load; a composing model that changed since could cause it
                self._fail(EngineError(ErrorCode.INTERNAL, f"ensemble '{ensemble.name}' did not produce "
                                                           f"output '{name}'"))
                return
            outputs.append(Tensor(name, tensor.datatype, tensor.shape, tensor.data))
        self.future.set_result(InferenceResponse(ensemble.name, ensemble.version_str, outputs, request.id))

    def _fail(self, error: EngineError) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    def cancel_steps(self) -> None:
        """Cancel the steps still in flight (the request failed or its client left): a queued step leaves its
        model's queue unexecuted."""
        steps, self.steps = self.steps, {}
        for step_future in steps.values():
            step_future.cancel()


def request_batch(request: InferenceRequest, batching: bool) -> int:
    return request.batch_size if batching else 1

