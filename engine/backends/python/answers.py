"""What a Python model's answers must be, checked on the loop once they are back: shared by both batchers of
Python models (batcher.py `RequestBatcher`, sequence.py `PythonSequenceBatcher`), and what each of them wires
to the instances (`InstanceBinding`: the loop, BLS, the model's readiness).

A Python model answers each request on its own, so each answer is checked on its own, and one bad answer
fails its own request only:
- a response's TritonError becomes that request's error, with its code;
- an output the request named missing (with none named, those the model returned count), or of another
  datatype or shape than the config declares, fails that request, naming the output and both values;
  outputs nobody asked for are dropped, as Triton drops them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from ...config.model_config import ModelConfig, TensorSpec
from ...errors import EngineError, ErrorCode
from ...instances.pool import InstancePool
from ...types import InferenceRequest, InferenceResponse, Tensor
from .bls import Gateway, Router, WaitNode
from .runner import Answer

_CODES = {code.name: code for code in ErrorCode}


class AnswerCheck:
    """Turns one request's `Answer` into its response or error. Pure; called on the loop."""

    def __init__(self, config: ModelConfig, version: str) -> None:
        self.config = config
        self._version = version
        # By output name: its spec, and its dims when none is -1 (then a shape fits when it is that tuple,
        # after the batch dimension where there is one: one comparison, the common case) or None.
        self._specs = {spec.name: (spec, _fixed_dims(spec)) for spec in config.outputs}
        self._batched = config.max_batch_size > 0

    def response(self, request: InferenceRequest, answer: Answer, batch_size: int
                 ) -> InferenceResponse | EngineError:
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
            spec, dims = self._specs[name]
            if datatype is not spec.datatype:
                return EngineError(ErrorCode.INTERNAL, f"model '{self.config.name}' returned output '{name}' "
                                   f"as {datatype.value}; its config declares {spec.datatype.value}")
            shape = array.shape  # numpy's: a tuple of Python ints
            fits = dims is not None and (shape[1:] == dims and shape[:1] == (batch_size,) if self._batched
                                         else shape == dims)
            if not fits:
                problem = self._shape_problem(spec, shape, batch_size)
                if problem:
                    return EngineError(ErrorCode.INTERNAL, f"model '{self.config.name}' returned output "
                                       f"'{name}' with shape {list(shape)}; {problem}")
            tensors.append(Tensor(name, datatype, shape, array))
        return InferenceResponse(request.model_name, self._version, tensors, request.id,
                                 _parameters(answer[2]))

    def _shape_problem(self, spec: TensorSpec, shape: tuple[int, ...], batch_size: int) -> str:
        """"" when `shape` fits; else what the config declares. Runs on the loop for every output of every
        answer: the message is built only for a misfit."""
        dims = spec.reshape if spec.reshape is not None else spec.dims
        batched = self.config.max_batch_size > 0
        want = [batch_size, *dims] if batched else list(dims)
        if len(shape) == len(want) and all(w == -1 or w == g for w, g in zip(want, shape, strict=True)):
            return ""
        if batched:
            return f"its config declares [{batch_size}{''.join(f',{d}' for d in dims)}] (this request's " \
                   f"batch of {batch_size})"
        return f"its config declares {want}"


def _fixed_dims(spec: TensorSpec) -> tuple[int, ...] | None:
    """The output's dims (its reshape's where it has one) as a tuple, or None when one is -1 (any size)."""
    dims = tuple(spec.reshape if spec.reshape is not None else spec.dims)
    return None if -1 in dims else dims


def count_error(instance: str, answers: int, requests: int) -> EngineError | None:
    """A batch whose count of responses is not its count of requests fails whole (Triton's rule)."""
    if answers == requests:
        return None
    return EngineError(ErrorCode.INTERNAL, f"Failed to process the request(s) for model '{instance}', "
                       f"message: execute() returned {answers} responses for {requests} requests; it must "
                       "return one InferenceResponse per request, in order")


def _parameters(text: str) -> dict[str, Any]:
    if not text or text == "{}":
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class InstanceBinding:
    """Wires a version's Python instances to the loop, BLS and readiness (`bind`, from `PythonModel.start`
    before warm-up), and keeps the model's readiness true (`on_health`): while an instance is down (crashed or
    hung, being restarted), the version is not ready and the index says why."""

    def __init__(self, pool: InstancePool, router: Router | None, on_health: Callable[[str], None]) -> None:
        self._pool = pool
        self._router = router
        self._on_health = on_health
        self._down: dict[str, str] = {}
        self.wait_nodes: list[WaitNode] = []  # this version's instances, for BLS deadlock detection

    def bind(self) -> None:
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
