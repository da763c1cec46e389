"""`PythonSequenceBatcher`: the sequence batcher (engine/scheduling/sequence/batcher.py) for Python models.

The slots, strategies, backlog, idle release, flags and errors are the `SequenceBatcher`'s, unchanged; one
step differs, as `RequestBatcher` differs from `Batcher`: a formed sequence batch is handed to the instance
as its requests (`execute_requests`), one per batch row, not as concatenated tensors. What each request
holds is what Triton's Python backend shows a sequence model:
- its own inputs, with batch size 1 (`[1, ...]` when the model batches);
- each control input the config names, as an input tensor of its own (`START`, `END`, `READY`, `CORRID`
  in the configured datatype; a string CORRID as BYTES), and `request.correlation_id()` / `request.flags()`
  (`TRITONSERVER_REQUEST_FLAG_SEQUENCE_START` / `_END`);
- each implicit state as an input tensor named `input_name`: the sequence's state after its previous
  request, or the initial state on START.
The model returns the next state as an output tensor named by the state's `output_name` in each response;
it becomes the sequence's state, and is never answered to the client. Direct-strategy filler rows (slots
below the highest ready one) reach the model too, as requests with READY false, no correlation id and no
flags (Triton's null requests); their answers are dropped.

Each answer is checked on its own (answers.py): a request whose answer is an error, lacks a state output or
returns one of another datatype or shape fails alone, and its sequence keeps its previous state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ...config.model_config import ModelConfig
from ...config.sequence import StateSpec
from ...errors import EngineError, ErrorCode
from ...instances.pool import Instance, InstancePool
from ...observability.stats import ModelStats
from ...scheduling.sequence.batcher import Result, SequenceBatcher
from ...scheduling.sequence.policy import DEFAULT_BACKLOG, BacklogLimits, Batch, CorrId, Entry
from ...types import InferenceRequest
from .answers import AnswerCheck, InstanceBinding, count_error
from .bls import Router
from .runner import Answer


class PythonSequenceBatcher(SequenceBatcher):
    def __init__(self, config: ModelConfig, version: str, pool: InstancePool, stats: ModelStats,
                 router: Router | None, on_health: Callable[[str], None],
                 backlog: BacklogLimits = DEFAULT_BACKLOG) -> None:
        super().__init__(config, version, pool, stats, backlog)
        self._binding = InstanceBinding(pool, router, on_health)
        self.wait_nodes = self._binding.wait_nodes  # this version's instances, for BLS deadlock detection
        self._answers = AnswerCheck(config, version)
        # A filler row's request: no id, no correlation id, no flags, every output.
        self._filler = InferenceRequest(config.name, version, [])

    def bind(self) -> None:
        """Wire every instance to the loop, BLS and readiness. Called once the instances exist."""
        self._binding.bind()

    def _corrid_text(self, corrid: CorrId) -> Any:
        return b"" if corrid == 0 else str(corrid).encode()  # BYTES elements reach Python models as bytes

    # ------------------------------------------------------------------ execution

    def _start(self, instance: Instance, batch: Batch) -> None:
        asyncio.get_running_loop().create_task(self._run_requests(instance, batch))

    async def _run_requests(self, instance: Instance, batch: Batch) -> None:
        try:
            start, requests, inputs = self._row_requests(batch)
            input_ns = time.perf_counter_ns() - start
            answers = await instance.backend.execute_requests(requests, inputs, instance.executor)
            infer_ns = time.perf_counter_ns() - start - input_ns
            results = self._row_results(instance.name, batch, answers, input_ns, infer_ns)
        except Exception as e:  # the instance failed (or died): this batch fails, the next may not
            results = self._failed(batch, e)
        self._finish(instance, batch, results)

    def _row_requests(self, batch: Batch) -> tuple[int, list[InferenceRequest], list[dict[str, np.ndarray]]]:
        """One request per row, with its controls and states; a filler row repeats the first real row's
        inputs, as the ONNX path does."""
        start = time.perf_counter_ns()
        real = [e for e in batch.rows if e is not None]
        for e in real:
            self._stats.queue.add(start - e.item.enqueue_ns)
        first = real[0].item.inputs
        requests: list[InferenceRequest] = []
        inputs: list[dict[str, np.ndarray]] = []
        for entry in batch.rows:
            arrays = dict(first if entry is None else entry.item.inputs)
            row = [entry]
            for control in self.sequence.controls:
                arrays[control.name] = self._control_array(control, row)
            for spec in self.sequence.states:
                arrays[spec.input_name] = self._state_array(spec, row)
            requests.append(self._filler if entry is None else entry.item.request)
            inputs.append(arrays)
        return start, requests, inputs

    def _row_results(self, instance: str, batch: Batch, answers: list[Answer], input_ns: int, infer_ns: int
                     ) -> list[tuple[Entry, Result]]:
        out_start = time.perf_counter_ns()
        error = count_error(instance, len(answers), len(batch.rows))
        if error is not None:
            return [(e, error) for e in batch.rows if e is not None]
        results: list[tuple[Entry, Result]] = []
        for entry, answer in zip(batch.rows, answers, strict=True):
            if entry is not None:
                results.append((entry, self._row_result(entry, answer)))
        self._record(results, input_ns, infer_ns, out_start)
        return results

    def _row_result(self, entry: Entry, answer: Answer) -> Result:
        """The row's response; on success its state outputs become the sequence's state (copies, so no
        block of the instance's shared memory is kept alive)."""
        if answer[0] == "ok" and self.sequence.states:
            given = {name: (datatype, array) for name, datatype, array in answer[1]}
            state = {}
            for spec in self.sequence.states:
                array, problem = self._state_output(spec, given.get(spec.output_name))
                if problem:
                    return EngineError(ErrorCode.INTERNAL, f"model '{self.config.name}' {problem}")
                state[spec.input_name] = array
            if not entry.sequence.released:
                entry.sequence.state = state
        return self._answers.response(entry.item.request, answer, 1)

    def _state_output(self, spec: StateSpec, found: tuple[Any, np.ndarray] | None) -> tuple[Any, str]:
        """The state output's one row as the next state, or why it cannot be (missing, datatype, shape)."""
        if found is None:
            return None, (f"returned no state output '{spec.output_name}'; a sequence model with implicit "
                          "state must return it in every response")
        datatype, array = found
        if datatype is not spec.datatype:
            return None, (f"returned state output '{spec.output_name}' as {datatype.value}; its state "
                          f"declares {spec.datatype.value}")
        want = ((1,) if self._batching else ()) + spec.dims
        if tuple(array.shape) != want:
            return None, (f"returned state output '{spec.output_name}' with shape {list(array.shape)}, "
                          f"expected {list(want)}")
        return np.array(array[0] if self._batching else array), ""
