"""Business Logic Scripting: a Python model's requests to other models, carried into the engine.

A BLS request enters exactly as a client's does once decoded: the router picks the model version, and
`Model.submit` validates and queues it on that version's batcher (an ensemble runs its steps, each on its
model's batcher), so it is batched, rate-limited and counted with everything else. Its answer (or error)
goes back to the calling instance, which gives the model a response whose `has_error()` says whether it
failed; nothing a called model does can fail the caller's batch on its own. Everything here runs on the
event loop.

Timeouts: a request's `timeout` (microseconds, as Triton) bounds its whole wait; when it passes the request
leaves the queue it is in and the caller gets an UNAVAILABLE error response.

Deadlocks: an instance waiting on a BLS request holds its slot, so a model calling itself, or two Python
models calling each other, can wait forever when the instances that could answer are all waiting too (Triton
hangs there). `WaitGraph` knows, for every Python-model instance, which BLS requests it waits on. When a new
request is made, the graph works out which instances can still finish (one waiting on nothing, or on a
request that some finishing instance, or a non-Python model, can answer) and refuses the new request at
once when none of the target model's instances can: the caller gets an error response and its batch goes
on. A request refused this way could never have been answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ...errors import EngineError, ErrorCode
from ...model import Model
from ...types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor

log = logging.getLogger("hubserve.python")

# Request parameters Triton turns into request fields: they are not the model's `parameters()`.
RESERVED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                 "binary_data_output", "triton_enable_empty_final_response"})


class Router(Protocol):
    """What BLS needs of the repository: the model version a request goes to (routing.RoutingTable)."""

    def get(self, name: str, version: str = "") -> Any: ...


class WaitNode:
    """One Python-model instance, as the wait graph sees it: the BLS requests it is waiting on."""

    __slots__ = ("name", "waiting")

    def __init__(self, name: str) -> None:
        self.name = name
        self.waiting: set[Call] = set()


class Call:
    """One BLS request in flight: who waits on it and which instances could answer it (None: not a
    Python model, which always answers)."""

    __slots__ = ("answerers",)

    def __init__(self, answerers: list[WaitNode] | None) -> None:
        self.answerers = answerers


def can_finish(call: Call, nodes: set[WaitNode]) -> bool:
    """Whether `call` can still be answered, given every instance in `nodes` (all that wait on something)."""
    live: set[WaitNode] = set()
    blocked = set(nodes)

    def answerable(c: Call) -> bool:
        return c.answerers is None or any(n not in blocked or n in live for n in c.answerers)

    changed = True
    while changed:
        changed = False
        for node in list(blocked - live):
            if any(answerable(c) for c in node.waiting):
                live.add(node)
                changed = True
    return answerable(call)


class WaitGraph:
    """The BLS requests every Python-model instance of this server waits on. One per server process."""

    def __init__(self) -> None:
        self._waiting: set[WaitNode] = set()

    def add(self, node: WaitNode, call: Call) -> bool:
        """Record that `node` waits on `call`; False (nothing recorded) when `call` could never finish."""
        node.waiting.add(call)
        self._waiting.add(node)
        if can_finish(call, self._waiting):
            return True
        self.remove(node, call)
        return False

    def remove(self, node: WaitNode, call: Call) -> None:
        node.waiting.discard(call)
        if not node.waiting:
            self._waiting.discard(node)


GRAPH = WaitGraph()


def engine_request(model: str, version: int, request_id: str, correlation_id: int | str, flags: int,
                   parameters: str, requested: list[str], tensors: list[tuple[str, DataType, np.ndarray]]
                   ) -> InferenceRequest:
    """A BLS request as the engine's InferenceRequest (what a frontend codec would have made)."""
    try:
        params = json.loads(parameters) if parameters else {}
    except ValueError:
        params = {}
    if correlation_id:
        params["sequence_id"] = correlation_id
    if flags & 1:
        params["sequence_start"] = True
    if flags & 2:
        params["sequence_end"] = True
    inputs = [Tensor(name, dt, tuple(int(d) for d in array.shape), array) for name, dt, array in tensors]
    outputs = [RequestedOutput(n) for n in requested] if requested else None
    return InferenceRequest(model, "" if version < 0 else str(version), inputs, request_id, outputs, params)


class Gateway:
    """Submits BLS requests for the instances of one server; `submit` answers through `done`."""

    def __init__(self, router: Router, graph: WaitGraph = GRAPH) -> None:
        self._router = router
        self._graph = graph

    def submit(self, caller: WaitNode, request: InferenceRequest, timeout_us: int,
               done: Callable[[InferenceResponse | EngineError], None]) -> None:
        """Route and queue `request` for `caller`; `done` is called once, on the loop, with the response or
        the error (unknown model, bad request, refused as a deadlock, timed out, failed)."""
        loop = asyncio.get_running_loop()
        name = request.model_name
        try:
            model = self._router.get(name, request.model_version)
            answerers = _answerers(model)
            call = Call(answerers)
            if not self._graph.add(caller, call):
                raise EngineError(ErrorCode.UNAVAILABLE, _deadlock_message(caller, name, answerers or []))
            try:
                future = model.submit(request)
            except BaseException:
                self._graph.remove(caller, call)
                raise
        except EngineError as e:
            loop.call_soon(done, e)
            return
        except Exception as e:  # a bug: answered, so the calling instance does not wait forever
            log.error("BLS request to model '%s' failed", name, exc_info=e)
            loop.call_soon(done, EngineError(ErrorCode.INTERNAL,
                                             f"BLS request to model '{name}' failed: {e!r}"))
            return
        timer = None
        if timeout_us > 0:
            def expire() -> None:
                if not future.done():
                    future.cancel()  # leaves the queue, or its answer is dropped
                    finish_with(EngineError(ErrorCode.UNAVAILABLE, f"BLS request to model '{name}' timed out "
                                                                   f"after {timeout_us} us"))

            timer = loop.call_later(timeout_us / 1e6, expire)
        answered = [False]

        def finish_with(result: InferenceResponse | EngineError) -> None:
            if answered[0]:
                return
            answered[0] = True
            self._graph.remove(caller, call)
            if timer is not None:
                timer.cancel()
            done(result)

        def completed(f: asyncio.Future[InferenceResponse]) -> None:
            if f.cancelled():
                finish_with(EngineError(ErrorCode.CANCELLED, f"BLS request to model '{name}' was cancelled"))
            elif f.exception() is not None:
                error = f.exception()
                finish_with(error if isinstance(error, EngineError) else
                            EngineError(ErrorCode.INTERNAL, f"BLS request to model '{name}' failed: {error}"))
            else:
                finish_with(f.result())

        future.add_done_callback(completed)


def _answerers(model: Model) -> list[WaitNode] | None:
    """The Python-model instances that answer a request to `model`, for the wait graph (model.py
    `PythonModel.wait_nodes`); None for any other kind (an ONNX model's instances, an ensemble, a generative
    model), which answers without waiting on BLS."""
    answerers: list[WaitNode] | None = getattr(model, "wait_nodes", None)
    return list(answerers) if answerers else None


def _deadlock_message(caller: WaitNode, name: str, answerers: list[WaitNode]) -> str:
    what = "calls itself" if caller in answerers else "calls a model"
    return (f"BLS request to model '{name}' refused: instance '{caller.name}' {what} while every instance "
            f"of '{name}' ({len(answerers)}) is waiting on BLS requests that cannot finish first; it would "
            "never be answered (add instances, or avoid the cycle)")
