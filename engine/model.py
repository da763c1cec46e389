"""A loaded model version: `Model`, what every kind of version shares (config, state and health, statistics,
the checks of a request, metadata), and `InstanceModel`, a version run by instances of a backend.

`prepare()` checks a request against the config before it is queued, so one bad request never spoils a batch.
Every kind is a `Model` and calls its `__init__`: an ensemble (engine/scheduling/ensemble/driver.py
`EnsembleModel`) runs steps on other models, a generative model (engine/generate/triton/model.py) hands its
requests to the generation engine, a Python model (engine/backends/python/model.py) is an `InstanceModel`
whose batcher answers each request alone. Which kind a folder is: engine/repository/kinds.py.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import time
from pathlib import Path

import numpy as np
from mypy_extensions import mypyc_attr

from . import classification
from .config.model_config import ModelConfig, TensorSpec
from .errors import EngineError, ErrorCode, decoupled_unary, invalid
from .instances import canary, warmup
from .instances.canary import CanaryRecord
from .instances.placement import place
from .instances.pool import InstancePool
from .instances.rate_limiter import RateLimiter
from .observability.stats import ModelStats
from .scheduling.batching.batcher import Batcher
from .scheduling.sequence.batcher import SequenceBatcher
from .scheduling.sequence.policy import DEFAULT_BACKLOG, BacklogLimits
from .types import SHARED_MEMORY_PARAMETERS, Completion, DataType, InferenceRequest, InferenceResponse


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


# ABCMeta, not abc.ABC as a base: compiled with mypyc, a Python base gives the class __dict__ and __weakref__
# slots, and its deallocator never clears weak references, so a weakref to a freed version dangled and
# crashed the interpreter (mypyc/mypyc#1102). Same abstract-method check in pure Python.
@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed in modules mypyc leaves uncompiled
class Model(metaclass=abc.ABCMeta):
    """One served version, whatever runs it: created LOADING; `start()` makes it READY; `stop()` drains then
    frees it. What every kind shares lives here: state and health, the checks of a request against the config
    (`prepare`), metadata. How requests run is the kind's (engine/repository/kinds.py): instances and a
    batcher (`InstanceModel` below; a Python model's in engine/backends/python/model.py), steps on other
    models (engine/scheduling/ensemble/driver.py), or the generation engine (engine/generate/triton/model.py).
    """

    def __init__(self, config: ModelConfig, version: int, model_path: Path) -> None:
        """`model_path`: the version's model file (an ensemble's: its version folder, which holds nothing)."""
        self.config = config
        self.name = config.name
        self.version = version
        self.version_str = str(version)
        self.model_path = model_path
        self.state = ModelState.LOADING
        self.reason = ""  # why a version that was READY does not serve now (a Python instance restarting)
        self._unhealthy: dict[str, str] = {}  # health source -> why it says the version cannot serve
        self.canary = CanaryRecord()  # engine/instances/canary.py; read by the metrics
        self.stats = ModelStats()
        self._inputs = {spec.name: spec for spec in config.inputs}
        self._outputs = {spec.name: spec for spec in config.outputs}
        self._required = [spec.name for spec in config.inputs if not spec.optional]
        self.labels: classification.Labels = {}  # read by start(), for the classification extension
        # What request plans hold this version's verdict under (RequestPlan.validated): an object of its own,
        # not the model, so a plan cached by a frontend never keeps a retired version alive.
        self.plan_key = object()

    @abc.abstractmethod
    async def start(self) -> None:
        """Make the version ready to serve, then READY; on a failure free what was made and raise why.
        Called once, by the repository, before routing sends it anything."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """UNLOADING, finish what was accepted, then free what the version holds. Called once, after routing
        has moved away."""

    @abc.abstractmethod
    def submit(self, request: InferenceRequest, received_ns: int = 0, on_done: Completion | None = None
               ) -> asyncio.Future[InferenceResponse]:
        """Validate and start the request; raises at once for a bad request or a full queue. The future
        resolves with the answer; the request is accounted in `stats` when it is done, and then `on_done` is
        called with it."""

    @property
    @abc.abstractmethod
    def pending_count(self) -> int:
        """Requests accepted and not yet answered (the pending-request gauge)."""

    @property
    def queued_count(self) -> int | None:
        """Requests accepted and waiting for the version's scheduler to start them (the queued-request
        gauge); None where the version has no such queue of its own (a generative model's waiting is the
        generation engine's: hubserve_generation_waiting_sequences_by_priority)."""
        return None

    def set_health(self, source: str, reason: str) -> None:
        """A health source (the Python instances' supervision, the canary: engine/instances/canary.py) says
        the version cannot serve (`reason`) or can again (""): readiness tells the truth, with every source's
        reason. Only between READY and UNAVAILABLE: loading and unloading are not changed by it."""
        if reason:
            self._unhealthy[source] = reason
        else:
            self._unhealthy.pop(source, None)
        combined = "; ".join(self._unhealthy[k] for k in sorted(self._unhealthy))
        if self.state is ModelState.READY and combined:
            self.state, self.reason = ModelState.UNAVAILABLE, combined
        elif self.state is ModelState.UNAVAILABLE and self.reason:
            self.state = ModelState.UNAVAILABLE if combined else ModelState.READY
            self.reason = combined

    def canary_due(self) -> bool:
        """Whether the canary should run: READY, or UNAVAILABLE because of the canary alone (to recover)."""
        if self.state is ModelState.READY:
            return True
        return self.state is ModelState.UNAVAILABLE and set(self._unhealthy) == {canary.SOURCE}

    @property
    def model_dir(self) -> Path:
        """The model's folder (`<root>/<model>`, or the override folder of a load that sent files)."""
        return self.model_path.parent.parent

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        return await self.submit(request)

    def prepare(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        """Validate a request and return its inputs by name, in config order, reshaped for the backend.

        A request decoded from a cached plan (`request.plan`, engine/types.py RequestPlan) that this version
        validated before is not validated again: the plan fixes everything checked here (names, datatypes,
        shapes and so the batch size, requested outputs, parameters), so what is left is to pick its arrays
        in config order. The codec has already checked what varies, each tensor's byte size."""
        plan = request.plan
        if plan is not None:
            verdict = plan.validated
            if verdict is not None and verdict[0] is self.plan_key:
                tensors = request.inputs
                return {name: tensors[i].data if shape is None else tensors[i].data.reshape(shape)
                        for name, i, shape in verdict[1]}
        picks = self._validate(request)
        if plan is not None:
            plan.validated = (self.plan_key, picks)
        tensors = request.inputs
        return {name: tensors[i].data if shape is None else tensors[i].data.reshape(shape)
                for name, i, shape in picks}

    def _validate(self, request: InferenceRequest) -> tuple[tuple[str, int, tuple[int, ...] | None], ...]:
        """The full check of a request against the config; raises INVALID_ARG (UNSUPPORTED for extensions we
        lack). Returns, in config order, each given input's name, its position in `request.inputs` and the
        shape the backend wants it in (None: as it came)."""
        cfg = self.config
        given: dict[str, tuple[int, tuple[int, ...] | None]] = {}
        batch = None
        for position, tensor in enumerate(request.inputs):
            if tensor.parameters:
                refuse_unsupported(f"input '{tensor.name}'", tensor.parameters)
            spec = self._inputs.get(tensor.name)
            if spec is None:
                raise invalid(f"unexpected input '{tensor.name}' for model '{self.name}'; it expects "
                              f"{', '.join(repr(n) for n in self._inputs)}")
            if tensor.name in given:
                raise invalid(f"input '{tensor.name}' appears more than once")
            if tensor.datatype is not spec.datatype:
                raise invalid(f"input '{tensor.name}' expects {spec.datatype.value}, "
                              f"got {tensor.datatype.value}")
            self._check_shape(spec, tensor.shape)
            if cfg.max_batch_size > 0:
                if batch is None:
                    batch = tensor.shape[0]
                elif tensor.shape[0] != batch:
                    raise invalid(f"input '{tensor.name}' has batch size {tensor.shape[0]}, "
                                  f"other inputs {batch}")
            reshape = None
            if spec.reshape is not None:
                lead = (tensor.shape[0],) if cfg.max_batch_size > 0 else ()
                reshape = lead + spec.reshape
            given[tensor.name] = (position, reshape)
        missing = [n for n in self._required if n not in given]
        if missing:
            raise self._missing_inputs(list(given), missing)
        if request.outputs is not None:
            seen = set()
            for out in request.outputs:
                spec = self._outputs.get(out.name)
                if spec is None:
                    raise invalid(f"unknown requested output '{out.name}' for model '{self.name}'; it has "
                                  f"{', '.join(repr(o.name) for o in cfg.outputs)}")
                if out.parameters:
                    refuse_unsupported(f"output '{out.name}'", out.parameters)
                    if classification.PARAMETER in out.parameters:
                        classification.check(spec, out.parameters[classification.PARAMETER])
                if out.name in seen:
                    raise invalid(f"output '{out.name}' is requested more than once")
                seen.add(out.name)
        return tuple((name, *given[name]) for name in self._inputs if name in given)

    def _missing_inputs(self, given: list[str], missing: list[str]) -> EngineError:
        """Triton's words for a request without a required input (core src/infer_request.cc)."""
        total = len(self._inputs)
        expected = (f"{total} inputs" if total == len(self._required)
                    else f"number of inputs between {len(self._required)} and {total}")
        return invalid(f"expected {expected} but got {len(given)} inputs for model '{self.name}'. Got "
                       f"input(s) [{','.join(repr(n) for n in given)}], but missing required input(s) "
                       f"[{','.join(repr(n) for n in missing)}]. Please provide all required input(s).")

    def _check_shape(self, spec: TensorSpec, shape: tuple[int, ...]) -> None:
        cfg = self.config
        dims = spec.dims
        if cfg.max_batch_size > 0:
            if len(shape) != len(dims) + 1:
                raise invalid(f"input '{spec.name}' expects shape [-1,{','.join(map(str, dims))}] "
                              f"(batch first), got {list(shape)}")
            if not 1 <= shape[0] <= cfg.max_batch_size:
                raise invalid(f"input '{spec.name}' batch size {shape[0]} is outside 1..{cfg.max_batch_size} "
                              f"(max_batch_size of model '{self.name}')")
            body = shape[1:]
        else:
            if len(shape) != len(dims):
                raise invalid(f"input '{spec.name}' expects shape {list(dims)}, got {list(shape)}")
            body = shape
        for want, got in zip(dims, body, strict=True):
            if want != -1 and want != got:
                expected = ([-1] if cfg.max_batch_size > 0 else []) + list(dims)
                raise invalid(f"input '{spec.name}' expects shape {expected}, got {list(shape)}")

    def metadata(self) -> dict:
        """The protocol's model metadata: a batching model's shapes start with -1."""
        lead = [-1] if self.config.max_batch_size > 0 else []

        def describe(spec: TensorSpec) -> dict:
            return {"name": spec.name, "datatype": spec.datatype.value, "shape": lead + list(spec.dims)}

        return {
            "name": self.name,
            "versions": [self.version_str],
            "platform": self.config.platform_name,
            "inputs": [describe(s) for s in self.config.inputs],
            "outputs": [describe(s) for s in self.config.outputs],
        }


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed in modules mypyc leaves uncompiled
class InstanceModel(Model):
    """A version served by instances of a backend (engine/backends/): an instance pool and the batcher that
    feeds it, dynamic or sequence. The kind every model folder is unless another kind claims it."""

    def __init__(self, config: ModelConfig, version: int, model_path: Path, gpus: tuple[int, ...],
                 limiter: RateLimiter, backlog: BacklogLimits = DEFAULT_BACKLOG) -> None:
        """`backlog`: how many sequences may wait for a slot, for a sequence model
        (engine/scheduling/sequence/policy.py)."""
        super().__init__(config, version, model_path)
        self.instances_back = 0.0  # time.monotonic() when its instances last served again after one went down
        self.pool = InstancePool(config, model_path, place(config, gpus), limiter)
        self.batcher: Batcher | SequenceBatcher = self._make_batcher(backlog)

    def _make_batcher(self, backlog: BacklogLimits) -> Batcher | SequenceBatcher:
        """The scheduler of this kind of version, over `self.pool` (a Python model's answers per request:
        engine/backends/python/model.py)."""
        if self.config.sequence_batching is not None:  # stateful: engine/scheduling/sequence/batcher.py
            return SequenceBatcher(self.config, self.version_str, self.pool, self.stats, backlog)
        return Batcher(self.config, self.version_str, self.pool, self.stats)

    async def start(self) -> None:
        """Create the instances, then warm them up (engine/instances/warmup.py); READY only if both succeed.
        On a failure everything made so far is freed and the error says why."""
        self.labels = await asyncio.to_thread(classification.read_labels, self.config, self.model_dir)
        await self.pool.start()
        self._instances_started()
        try:
            await warmup.run(self.config, self.pool, self.model_path.parent.parent, self.version)
        except BaseException:
            await self.pool.close()
            raise
        self.state = ModelState.READY

    def _instances_started(self) -> None:
        """Called by `start()` once the instances are up, before warm-up (a Python model wires them to its
        batcher)."""

    def _instances_health(self, reason: str) -> None:
        """An instance went down (`reason`) or every instance serves again (""). A canary that failed while it
        was down judged the process that is gone: the canary runner checks again at once (`instances_back`)
        rather than leaving the version UNAVAILABLE until its next round."""
        if not reason and "instances" in self._unhealthy:
            self.instances_back = time.monotonic()
        self.set_health("instances", reason)

    async def stop(self) -> None:
        """Finish what was accepted, then free the backends. Called once, after routing has moved away."""
        self.state = ModelState.UNLOADING
        await self.batcher.drain()
        self.batcher.close()
        await self.pool.close()

    def submit(self, request: InferenceRequest, received_ns: int = 0, on_done: Completion | None = None
               ) -> asyncio.Future[InferenceResponse]:
        """Validate and queue; raises at once for a bad request or a full queue. The request is accounted in
        `stats` when its future is done, and then `on_done` is called with it (Batcher.enqueue). Outputs
        asked for with a class count are classified (engine/classification.py) before `on_done` sees them."""
        if self.config.decoupled and request.stream is None:
            raise decoupled_unary()  # its responses have nowhere to go but a stream
        inputs = self.prepare(request)
        wanted = classification.counts(request.outputs)
        if wanted is not None:
            on_done = classification.classifying(on_done, wanted, self.config.max_batch_size > 0, self.labels)
        return self.batcher.enqueue(request, inputs, received_ns, on_done)

    @property
    def pending_count(self) -> int:
        """Requests accepted and not yet answered (the pending-request gauge)."""
        return self.batcher.pending_count

    @property
    def queued_count(self) -> int:
        """Requests queued in the batcher, waiting for an instance (the queued-request gauge)."""
        return self.batcher.queued_count


def refuse_unsupported(what: str, parameters: dict) -> None:
    """Tensor parameters of extensions hubserve does not implement are refused, never ignored: ignoring them
    would answer something other than what was asked. UNSUPPORTED (HTTP 501, gRPC UNIMPLEMENTED), as Triton
    answers features it does not serve."""
    shm = [key for key in SHARED_MEMORY_PARAMETERS if key in parameters]
    if shm:
        raise EngineError(ErrorCode.UNSUPPORTED,
                          f"{what} has parameter '{shm[0]}': hubserve does not implement the "
                          "system_shared_memory and cuda_shared_memory extensions; send the tensor's data in "
                          "the request instead")


__all__ = ["InstanceModel", "Model", "ModelState", "DataType", "refuse_unsupported"]
