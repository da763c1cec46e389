"""The sequence batcher on the event loop: `SequenceBatcher` drives the pure `SequencePolicy`
(policy.py) as `Batcher` drives `BatchPolicy`, with the same surface for `Model` (`enqueue`,
`pending_count`, `drain`, `close`).

What it adds to a batch before the backend sees it, per row: the control inputs the config names (START,
END, READY, CORRID, in their configured datatypes) and each implicit state (the sequence's state after its
previous request, or the initial state on START). After the run, each state output row becomes the
sequence's state, and only the configured outputs are answered. Requests carry their sequence in the request
parameters `sequence_id` (an unsigned 64-bit integer or a string), `sequence_start` and `sequence_end`, as
both protocols deliver them.

As in `Batcher`, there is no background task: `_dispatch()` runs on every change (arrival, instance
released, timer) and one timer covers both the direct / oldest delays and the next idle release.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...config.model_config import ModelConfig
from ...config.sequence import ControlInput, ControlKind, SequenceBatchingConfig, StateSpec
from ...errors import EngineError, ErrorCode, invalid
from ...instances.pool import Instance, InstancePool
from ...observability import observe
from ...observability.stats import ModelStats
from ...types import Completion, DataType, InferenceRequest, InferenceResponse, Tensor
from ..inflight import InflightBatcher
from .policy import DEFAULT_BACKLOG, BacklogLimits, Batch, CorrId, Entry, SequencePolicy

_UINT64_MAX = 2**64 - 1
Result = InferenceResponse | EngineError
_FLAGS: dict[ControlKind, Any] = {ControlKind.START: lambda e: e.start, ControlKind.END: lambda e: e.end,
                                  ControlKind.READY: lambda e: True}


@dataclass(eq=False, slots=True)
class _Item:
    request: InferenceRequest
    inputs: dict[str, np.ndarray]
    enqueue_ns: int
    future: asyncio.Future[InferenceResponse] | None = None


class SequenceBatcher(InflightBatcher):
    """Runs on the event loop. Owns the policy; the pool's `on_release` calls `_dispatch`."""

    def __init__(self, config: ModelConfig, version: str, pool: InstancePool, stats: ModelStats,
                 backlog: BacklogLimits = DEFAULT_BACKLOG) -> None:
        assert config.sequence_batching is not None
        super().__init__()
        self.config = config
        self.sequence: SequenceBatchingConfig = config.sequence_batching
        self._version = version
        self._pool = pool
        self._stats = stats
        self.policy = SequencePolicy(config.name, self.sequence, pool.size, config.max_batch_size, backlog)
        self._batching = config.max_batch_size > 0
        self._output_names = [o.name for o in config.outputs]
        self._output_types = {o.name: o.datatype for o in config.outputs}
        self._run_outputs = self._output_names + [s.output_name for s in self.sequence.states]
        self._corrid = self.sequence.control(ControlKind.CORRID)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_ns = 0
        self._acquired: Instance | None = None
        pool.on_release = self._dispatch

    # ------------------------------------------------------------------ requests in

    def enqueue(self, request: InferenceRequest, inputs: dict[str, np.ndarray], received_ns: int = 0,
                on_done: Completion | None = None) -> asyncio.Future[InferenceResponse]:
        """Queue a validated request on its sequence; raises INVALID_ARG at once for a request no live
        sequence can take. Its future's one done-callback accounts it and answers (`on_done`); cancelling it
        releases the sequence (it cannot go on without the request)."""
        name = self.config.name
        if self._batching and next(iter(inputs.values())).shape[0] != 1:
            raise invalid(f"inference request to model '{name}' must specify batch-size 1 due to "
                          "requirements of sequence batcher")
        corrid, start, end = self._flags(request)
        now = time.perf_counter_ns()
        item = _Item(request, inputs, now)
        entry = self.policy.submit(corrid, start, end, item, now, request.owner)
        received = received_ns or now
        future: asyncio.Future[InferenceResponse] = asyncio.get_running_loop().create_future()
        item.future = future
        self._accept(future, entry, request, received, on_done)
        self._dispatch()
        return future

    def _flags(self, request: InferenceRequest) -> tuple[CorrId, bool, bool]:
        params = request.parameters
        name = self.config.name
        corrid = params.get("sequence_id", 0)
        if isinstance(corrid, bool) or not isinstance(corrid, (int, str)) or \
                (isinstance(corrid, int) and not 0 <= corrid <= _UINT64_MAX):
            raise invalid(f"inference request to model '{name}' has sequence_id {corrid!r}: a correlation ID "
                          "must be an unsigned 64-bit integer or a string")
        if self._corrid is not None and corrid not in (0, ""):
            self._check_corrid(corrid)
        flags = []
        for key in ("sequence_start", "sequence_end"):
            value = params.get(key, False)
            if not isinstance(value, bool):
                raise invalid(f"request parameter '{key}' must be a boolean, got {value!r}")
            flags.append(value)
        return corrid, flags[0], flags[1]

    def _check_corrid(self, corrid: CorrId) -> None:
        """The id must suit the CORRID control: a string for TYPE_STRING, an integer for the integer types
        (Triton's words), and within that type's range (an id the control cannot carry would reach the model
        as another id)."""
        control = self._corrid
        assert control is not None
        given = "BYTES" if isinstance(corrid, str) else "UINT64"
        if (control.datatype is DataType.BYTES) != isinstance(corrid, str):
            raise invalid(f"sequence batching control '{control.name}' data-type is '{given}', but model "
                          f"'{self.config.name}' expects '{control.datatype.value}'")
        if isinstance(corrid, int):
            info = np.iinfo(control.datatype.numpy_dtype)
            if not info.min <= corrid <= info.max:
                raise invalid(f"inference request to model '{self.config.name}' has correlation ID {corrid}, "
                              f"which its sequence batching control '{control.name}' "
                              f"({control.datatype.config_name}) cannot hold")

    def _withdraw(self, entry: Entry) -> None:
        queued = entry in entry.sequence.queue
        rest = self.policy.cancel(entry)
        if queued:
            self._done(1)
        error = EngineError(ErrorCode.CANCELLED, f"sequence {entry.sequence.corrid} of model "
                            f"'{self.config.name}' was released: an earlier request of it was cancelled")
        for other in rest:
            fut = other.item.future
            if fut is not None and not fut.done():
                fut.set_exception(error)
        self._done(len(rest))
        self._dispatch()

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self) -> None:
        policy = self.policy
        now = time.perf_counter_ns()
        policy.expire_idle(now)
        wait: int | None = None
        while len(policy):
            batch, wait = policy.next_batch(now, self._acquire)
            if batch is None:
                break
            instance, self._acquired = self._acquired, None
            assert instance is not None
            self._start(instance, batch)
        idle_at = policy.next_idle_ns()
        if idle_at is not None:
            wait = min(wait, idle_at - now) if wait is not None else idle_at - now
        if wait is not None:
            self._arm(now + max(wait, 0))

    def _acquire(self, index: int) -> bool:
        pool = self._pool
        self._acquired = pool.try_acquire() if index < 0 else pool.try_acquire_at(index)
        return self._acquired is not None

    def _arm(self, at_ns: int) -> None:
        if self._timer is not None:
            if self._timer_at_ns <= at_ns:
                return
            self._timer.cancel()
        self._timer_at_ns = at_ns
        delay = max(at_ns - time.perf_counter_ns(), 0) / 1e9
        self._timer = asyncio.get_running_loop().call_later(delay + 0.0005, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _start(self, instance: Instance, batch: Batch) -> None:
        rows = len(batch.rows)
        if self._pool.runs_inline(instance, rows):
            asyncio.get_running_loop().call_soon(self._run_inline, instance, batch)
        else:
            asyncio.get_running_loop().create_task(self._run(instance, batch))

    def _run_inline(self, instance: Instance, batch: Batch) -> None:
        try:
            start, inputs = self._inputs(batch)
            input_ns = time.perf_counter_ns() - start
            outputs, infer_ns = self._pool.execute_inline(instance, inputs, self._run_outputs,
                                                          len(batch.rows))
            results = self._results(batch, outputs, input_ns, infer_ns)
        except Exception as e:  # a backend failure fails this batch only
            results = self._failed(batch, e)
        self._finish(instance, batch, results)

    async def _run(self, instance: Instance, batch: Batch) -> None:
        try:
            start, inputs = self._inputs(batch)
            input_ns = time.perf_counter_ns() - start
            outputs, infer_ns = await self._pool.execute(instance, inputs, self._run_outputs, len(batch.rows))
            results = self._results(batch, outputs, input_ns, infer_ns)
        except Exception as e:  # a backend failure fails this batch only
            results = self._failed(batch, e)
        self._finish(instance, batch, results)

    def _finish(self, instance: Instance, batch: Batch, results: list[tuple[Entry, Result]]) -> None:
        """States are stored (in `_results`) before the sequences may run again; then the instance goes back
        (which dispatches the next batch) and the answers go out."""
        self.policy.finished(batch, time.perf_counter_ns())
        self._pool.release(instance)
        for entry, result in results:
            fut = entry.item.future
            if fut is not None and not fut.done():
                if isinstance(result, EngineError):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)
        self._done(len(results))

    # ------------------------------------------------------------------ tensors

    def _inputs(self, batch: Batch) -> tuple[int, dict[str, np.ndarray]]:
        start = time.perf_counter_ns()
        rows = batch.rows
        real = [e for e in rows if e is not None]
        for e in real:
            self._stats.record_queue(start - e.item.enqueue_ns)
        if observe.STATE.active:  # what the access line and the spans read (engine/observability/observe.py)
            for e in real:
                req = e.item.request
                req.queued_ns, req.dispatched_ns, req.executed_batch = e.item.enqueue_ns, start, len(real)
        first = real[0].item.inputs
        if not self._batching:
            inputs = dict(first)
        else:
            inputs = {}
            for name, arr in first.items():
                parts = [arr if e is None else e.item.inputs[name] for e in rows]
                shapes = {p.shape for p in parts}
                if len(shapes) > 1:
                    raise invalid(f"input '{name}' of model '{self.config.name}' has different shapes "
                                  f"({sorted(shapes)}) in one sequence batch; the sequence batcher batches "
                                  "requests of one shape only")
                inputs[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        for control in self.sequence.controls:
            inputs[control.name] = self._control_array(control, rows)
        for spec in self.sequence.states:
            inputs[spec.input_name] = self._state_array(spec, rows)
        return start, inputs

    def _control_array(self, control: ControlInput, rows: list[Entry | None]) -> np.ndarray:
        """The control input for `rows` in its configured datatype ([rows, 1] when batching, else [1]); a
        filler row (None) is not ready, neither START nor END, and has no correlation id."""
        if control.kind is ControlKind.CORRID:
            values: list[Any] = [0 if e is None else e.sequence.corrid for e in rows]
            if control.datatype is DataType.BYTES:
                values = [self._corrid_text(v) for v in values]
            dtype = np.dtype(np.object_) if control.datatype is DataType.BYTES else \
                control.datatype.numpy_dtype
        else:
            false, true = control.false_true
            flag = _FLAGS[control.kind]
            values = [false if e is None or not flag(e) else true for e in rows]
            dtype = control.datatype.numpy_dtype
        arr = np.array(values, dtype=dtype)
        return arr.reshape(-1, 1) if self._batching else arr

    def _corrid_text(self, corrid: CorrId) -> Any:
        """A string CORRID element as the backend takes it (ONNX Runtime: str)."""
        return "" if corrid == 0 else str(corrid)

    def _state_array(self, spec: StateSpec, rows: list[Entry | None]) -> np.ndarray:
        """The state input for `rows`: the sequence's last state output, or the initial state on START (and
        for filler rows), stacked along a batch dimension when batching."""
        parts = [spec.initial if e is None or e.start or e.sequence.state is None
                 else e.sequence.state[spec.input_name] for e in rows]
        return np.stack(parts) if self._batching else parts[0]

    def _record(self, results: list[tuple[Entry, Result]], input_ns: int, infer_ns: int, out_start_ns: int
                ) -> None:
        """One sequence batch executed, answering `results`' requests."""
        end = time.perf_counter_ns()
        answered = len(results)
        self._stats.record_execution(answered, answered, input_ns, infer_ns, end - out_start_ns)
        if observe.STATE.active:  # what the access line and the spans read (engine/observability/observe.py)
            for entry, _ in results:
                entry.item.request.computed_ns = end
        reasons = self._stats.dispatch_reasons
        reasons["sequence"] = reasons.get("sequence", 0) + 1

    def _results(self, batch: Batch, outputs: dict[str, np.ndarray], input_ns: int, infer_ns: int
                 ) -> list[tuple[Entry, Result]]:
        out_start = time.perf_counter_ns()
        rows = batch.rows
        name = self.config.name
        for spec in self.sequence.states:
            arr = outputs.get(spec.output_name)
            want = ((len(rows),) if self._batching else ()) + spec.dims
            if arr is None or arr.shape != want:
                got = None if arr is None else list(arr.shape)
                raise EngineError(ErrorCode.INTERNAL, f"model '{name}' returned state output "
                                  f"'{spec.output_name}' with shape {got}, "
                                  f"expected {list(want)}")
        results: list[tuple[Entry, Result]] = []
        for i, entry in enumerate(rows):
            if entry is None:
                continue
            seq = entry.sequence
            if self.sequence.states and not seq.released:
                seq.state = {s.input_name: np.array(outputs[s.output_name][i] if self._batching
                                                    else outputs[s.output_name])
                             for s in self.sequence.states}
            req = entry.item.request
            names = [o.name for o in req.outputs] if req.outputs is not None else self._output_names
            tensors = []
            for out in names:
                arr = outputs[out][i:i + 1] if self._batching else outputs[out]
                tensors.append(Tensor(out, self._output_types[out], arr.shape, arr))
            results.append((entry, InferenceResponse(req.model_name, self._version, tensors, req.id)))
        self._record(results, input_ns, infer_ns, out_start)
        return results

    def _failed(self, batch: Batch, error: Exception) -> list[tuple[Entry, Result]]:
        failure = self._execution_error(error)
        return [(e, failure) for e in batch.rows if e is not None]

    # ------------------------------------------------------------------ lifecycle

    @property
    def queued_count(self) -> int:
        """Requests waiting in their sequence's queue, slotted or in the backlog (not the running ones)."""
        return len(self.policy)

    def sequence_counts(self) -> dict[str, int]:
        """For the metrics: sequences started, ended, released idle; live ones holding a slot or waiting."""
        p = self.policy
        return {"started": p.started, "ended": p.ended, "idle_released": p.idle_released,
                "active": len(p.slotted), "backlog": len(p.backlog)}

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
