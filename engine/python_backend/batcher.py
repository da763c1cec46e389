"""`RequestBatcher`: the dynamic batcher for Python models, answering each request on its own.

It is the engine's `Batcher` (queues, windows, priorities, timeouts, instance and rate-limiter slots are
all the same) with one step replaced: a formed batch is not concatenated, run and sliced, but handed to the
instance as its requests (`execute_requests`, backend.py), and each answer is checked against the config
and against what that request asked for, so one bad answer fails its own request only:
- a count of responses other than the count of requests fails the batch (Triton's rule), saying both;
- a response's TritonError becomes that request's error, with its code;
- an output the request named missing (with none named, those the model returned count), or of another
  datatype or shape than the config declares, fails that request, naming the output and both values;
  outputs nobody asked for are dropped, as Triton drops them.

It also keeps the model's readiness true (`on_health`): while an instance is down (crashed or hung, being
restarted), the version is not ready and the index says why; and it wires each instance to the loop and to
BLS (`bind`, from `Model.start`, before warm-up).

Runs on the event loop, as the Batcher does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from .. import observe
from ..batch_policy import Pending
from ..batching import Batcher
from ..config_types import ModelConfig, TensorSpec
from ..errors import EngineError, ErrorCode
from ..instances import Instance, InstancePool
from ..stats import ModelStats
from ..types import InferenceResponse, Tensor
from .bls import Gateway, Router, WaitNode
from .runner import Answer

_CODES = {code.name: code for code in ErrorCode}


class RequestBatcher(Batcher):
    def __init__(self, config: ModelConfig, version: str, pool: InstancePool, stats: ModelStats,
                 router: Router | None, on_health: Callable[[str], None]) -> None:
        super().__init__(config, version, pool, stats)
        self._router = router
        self._on_health = on_health
        self._down: dict[str, str] = {}
        self._specs = {spec.name: spec for spec in config.outputs}
        self.wait_nodes: list[WaitNode] = []  # this version's instances, for BLS deadlock detection

    def bind(self) -> None:
        """Wire every instance to the loop, BLS and readiness. Called once the instances exist."""
        loop = asyncio.get_running_loop()
        gateway = Gateway(self._router) if self._router is not None else None
        for backend in self._pool.backends():
            backend.bind(loop, gateway, self._health)
            self.wait_nodes.append(backend.node)

    def _health(self, instance: str, reason: str) -> None:
        if reason:
            self._down[instance] = reason
        else:
            self._down.pop(instance, None)
        self._on_health("; ".join(self._down[k] for k in sorted(self._down)))

    # ------------------------------------------------------------------ execution

    def _start(self, instance: Instance, batch: list[Pending], seq: int) -> None:
        asyncio.get_running_loop().create_task(self._run(instance, batch, seq))

    async def _run(self, instance: Instance, batch: list[Pending], seq: int) -> None:
        start = time.perf_counter_ns()
        for p in batch:
            self._stats.record_queue(start - p.enqueue_ns)
        elements = sum(p.batch_size for p in batch)
        observed = observe.STATE.active  # what the access line and the spans read (engine/observe.py)
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
            self._pool.release(instance)
        self._deliver(seq, results)

    def _check(self, instance: str, batch: list[Pending], answers: list[Answer]
               ) -> list[tuple[Pending, InferenceResponse | EngineError]]:
        if len(answers) != len(batch):
            error = EngineError(ErrorCode.INTERNAL, "Failed to process the request(s) for model "
                                f"'{instance}', message: execute() returned {len(answers)} responses for "
                                f"{len(batch)} requests; it must return one InferenceResponse per request, "
                                "in order")
            return [(p, error) for p in batch]
        return [(p, self._response(p, answer)) for p, answer in zip(batch, answers, strict=True)]

    def _response(self, p: Pending, answer: Answer) -> InferenceResponse | EngineError:
        request = p.request
        if answer[0] != "ok":
            _, code, message = answer
            return EngineError(_CODES.get(code, ErrorCode.INTERNAL), message)
        given = {name: (datatype, array) for name, datatype, array in answer[1]}
        # Named outputs must all come back; with none named, what the model returned of its outputs does.
        names = [o.name for o in request.outputs] if request.outputs is not None else \
            [o.name for o in self.config.outputs if o.name in given]
        tensors = []
        for name in names:
            found = given.get(name)
            if found is None:
                returned = ", ".join(repr(n) for n in given) or "none"
                return EngineError(ErrorCode.INTERNAL, f"model '{self.config.name}' returned no output "
                                   f"'{name}', which the request asked for (it returned {returned})")
            datatype, array = found
            spec = self._specs[name]
            if datatype is not spec.datatype:
                return EngineError(ErrorCode.INTERNAL, f"model '{self.config.name}' returned output '{name}' "
                                   f"as {datatype.value}; its config declares {spec.datatype.value}")
            problem = self._shape_problem(spec, tuple(array.shape), p.batch_size)
            if problem:
                return EngineError(ErrorCode.INTERNAL, f"model '{self.config.name}' returned output '{name}' "
                                   f"with shape {list(array.shape)}; {problem}")
            tensors.append(Tensor(name, datatype, tuple(int(d) for d in array.shape), array))
        return InferenceResponse(request.model_name, self._version, tensors, request.id,
                                 _parameters(answer[2]))

    def _shape_problem(self, spec: TensorSpec, shape: tuple[int, ...], batch_size: int) -> str:
        dims = spec.reshape if spec.reshape is not None else spec.dims
        if self.config.max_batch_size > 0:
            want = [batch_size, *dims]
            shown = f"[{batch_size}{''.join(f',{d}' for d in dims)}] (this request's batch of {batch_size})"
        else:
            want = list(dims)
            shown = str(want)
        if len(shape) != len(want) or any(w != -1 and w != g for w, g in zip(want, shape, strict=True)):
            return f"its config declares {shown}"
        return ""


def _parameters(text: str) -> dict[str, Any]:
    if not text or text == "{}":
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
