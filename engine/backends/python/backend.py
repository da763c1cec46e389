"""The backend objects of a Python model's instances: what `backends.create` returns for `backend: "python"`.

Python models extend the backend seam (engine/backends/__init__.py): besides the batch `execute(inputs,
output_names)` (used for warm-up), each instance has `execute_requests(requests, inputs, executor)`, an
awaitable giving one `Answer` per request (runner.py), because a Python model answers each request on its
own, errors included. batcher.py's `RequestBatcher` calls it; `bind()` wires the instance to the event loop,
BLS and the model's readiness before anything runs.

- `IsolatedInstance` (the default): the instance runs in a process of its own (process.py). When that
  process crashes or hangs, its requests fail with the reason, the model is not ready with that reason
  (`on_health`), and a new process is started (up to `RESTART_ATTEMPTS` tries, with a pause between);
  requests queued meanwhile wait for it.
- `InProcessInstance` (`in_process: "true"`): the model runs on the instance's thread in the server.

Both are created on the instance's thread (InstancePool.start), where the first process start or the model's
`initialize` may block.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import numpy as np

from ...config.model_config import ModelConfig
from ...errors import EngineError, ErrorCode, unavailable
from ...instances.devices import Device
from ...types import DataType, InferenceRequest, InferenceResponse
from . import pb_utils
from .bls import RESERVED_PARAMETERS, Gateway, WaitNode, engine_request
from .channel import Received
from .decoupled import Relay
from .environment import options
from .messages import Bls, BlsResult, Cancel, Error, Ok, RequestHeader, Resp, Result, SendCredit
from .pb_utils import compact_json
from .process import InstanceProcess, LaunchSpec
from .runner import Answer, ModelError, ModelRunner, convert_response
from .send_credits import CreditedSink

log = logging.getLogger("hubserve.python")
RESTART_ATTEMPTS = 3
RESTART_PAUSE_S = 1.0
Health = Callable[[str, str], None]  # (instance name, reason or "" when healthy)


def create(config: ModelConfig, model_file: Path, device: Device, instance_name: str) -> Any:
    """The instance object for one placement; called on the instance's thread."""
    model_dir = model_file.parent.parent
    where = f"model '{config.name}'"
    opts = options(config.parameters, model_dir, where)
    args = {
        "model_config": json.dumps(config.as_json()),
        "model_instance_kind": "GPU" if device.kind == "gpu" else "CPU",
        "model_instance_device_id": str(device.index),
        "model_instance_name": instance_name,
        "model_repository": str(model_dir),
        "model_version": model_file.parent.name,
        "model_name": config.name,
    }
    spec = LaunchSpec(opts.interpreter, model_file, model_dir, f"{config.name}/", instance_name, args,
                      opts.region_bytes, opts.init_timeout_s, opts.unresponsive_s, opts.execute_timeout_s,
                      logging.getLogger().getEffectiveLevel())
    if opts.in_process:
        return InProcessInstance(config, spec)
    return IsolatedInstance(config, spec)


RequestMeta = tuple[str, int | str, int, str, list[str]]


def request_meta(config: ModelConfig, request: InferenceRequest) -> RequestMeta:
    """What pb_utils.InferenceRequest reports: id, correlation id, flags, parameters (compact JSON, in the
    order sent, without the ones Triton makes request fields), requested outputs (all when none named)."""
    requested = [o.name for o in request.outputs] if request.outputs is not None else \
        [o.name for o in config.outputs]
    params = request.parameters
    if not params:  # most requests: no lookups (this runs on the loop for every request of every batch)
        return request.id, 0, 0, "{}", requested
    correlation = params.get("sequence_id", 0)
    flags = (1 if params.get("sequence_start") else 0) | (2 if params.get("sequence_end") else 0)
    shown = {k: v for k, v in params.items() if k not in RESERVED_PARAMETERS}
    return request.id, correlation, flags, compact_json(shown) if shown else "{}", requested


def _input_types(config: ModelConfig) -> dict[str, DataType]:
    """Every tensor a request may hand the model: its inputs, and a sequence model's control inputs and
    implicit states (backends/python/sequence.py)."""
    types = {spec.name: spec.datatype for spec in config.inputs}
    sequence = config.sequence_batching
    if sequence is not None:
        types.update({c.name: c.datatype for c in sequence.controls})
        types.update({s.input_name: s.datatype for s in sequence.states})
    return types


def _failed_batch(instance: str, message: str) -> EngineError:
    return EngineError(ErrorCode.INTERNAL, f"Failed to process the request(s) for model '{instance}', "
                                           f"message: {message}")


def _answer(answer: Ok | Error, tensors: list[Received]) -> Answer:
    """An answer as it crossed the channel (`tensors`: its outputs) as runner.py's `Answer`, which the
    batchers check (answers.py) and relays pass on (decoupled.py)."""
    if isinstance(answer, Ok):
        return ("ok", tensors, answer.parameters)
    return ("error", answer.code, answer.message)


def error_tuple(error: EngineError) -> tuple[str, str]:
    code = error.code.name if error.code.name in pb_utils.CODE_NAMES.values() else "INTERNAL"
    return code, error.message


class IsolatedInstance:
    cpu_bound = False

    def __init__(self, config: ModelConfig, spec: LaunchSpec) -> None:
        self.name = spec.instance_name
        self.node = WaitNode(spec.instance_name)
        self._config = config
        self._types = _input_types(config)
        self._spec = spec
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gateway: Gateway | None = None
        self._health: Health = lambda name, reason: None
        self._up: asyncio.Event | None = None  # set while a process serves; cleared during a restart
        self._broken = ""  # why the instance cannot serve (every restart failed)
        self._closing = False
        self._keys = itertools.count(1)
        self._relays: dict[int, Relay] = {}  # a decoupled model's requests not yet finished, by key
        self._proc = self._launch()

    def _launch(self) -> InstanceProcess:
        proc = InstanceProcess(self._spec, self._on_bls, self._on_exit, self._on_response)
        proc.start()
        return proc

    def bind(self, loop: asyncio.AbstractEventLoop, gateway: Gateway, health: Health) -> None:
        """Called on the loop, before warm-up: from now on the loop reads the process's frames."""
        self._loop, self._gateway, self._health = loop, gateway, health
        self._up = asyncio.Event()
        self._up.set()
        self._proc.attach(loop)

    # ------------------------------------------------------------------ execution

    async def execute_requests(self, requests: list[InferenceRequest], inputs: list[dict[str, np.ndarray]],
                               executor: Executor | None = None, relays: list[Relay] | None = None
                               ) -> list[Answer]:
        """Run one batch; `relays` (a decoupled model's, one per request) receive the responses the model
        sends, and then nothing is returned."""
        if self._up is not None and not self._up.is_set():
            await self._up.wait()
        if self._broken:
            raise unavailable(self._broken)
        keys = self._register(relays) if relays is not None else None
        headers, tensors = self._frame(requests, inputs, keys)
        try:
            result, out = await self._proc.call_async(headers, tensors)
            return self._answers(result, out)
        except BaseException:
            for key in keys or ():  # the batcher fails these requests with the batch's error
                self._relays.pop(key, None)
            raise

    def _register(self, relays: list[Relay]) -> list[int]:
        keys = []
        for relay in relays:
            key = next(self._keys)
            self._relays[key] = relay
            relay.bind(functools.partial(self._cancelled, key), functools.partial(self._grant, key))
            keys.append(key)
        return keys

    def _cancelled(self, key: int) -> None:
        """The request's client left: the model's is_cancelled() turns true; what it sends is dropped."""
        if self._relays.pop(key, None) is not None:
            self._proc.send(Cancel(key))

    def _grant(self, key: int, n: int) -> None:
        """The request's client took `n` more responses: its sender may send that many more."""
        if key in self._relays:
            self._proc.send(SendCredit(key, n))

    def _on_response(self, resp: Resp, tensors: list[Received]) -> None:
        """A decoupled model's send, on the loop (which reads the process's frames), in the order the model
        sent."""
        key, final = resp.key, resp.final
        relay = self._relays.pop(key, None) if final else self._relays.get(key)
        if relay is None:
            return
        relay.respond(None if resp.answer is None else _answer(resp.answer, tensors), final)

    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        """One warm-up sample, from the instance's thread."""
        header = RequestHeader("warmup", 0, 0, "{}", list(output_names), len(inputs), 0)
        tensors = [(n, self._types[n], a) for n, a in inputs.items()]
        result, out = self._proc.call([header], tensors).result()
        return _single(self._answers(result, out), self.name)

    def _frame(self, requests: list[InferenceRequest], inputs: list[dict[str, np.ndarray]],
               keys: list[int] | None = None) -> tuple[list[RequestHeader], list[Any]]:
        headers: list[RequestHeader] = []
        tensors: list[Any] = []
        types = self._types
        for i, (request, arrays) in enumerate(zip(requests, inputs, strict=True)):
            key = keys[i] if keys else 0
            headers.append(RequestHeader(*request_meta(self._config, request), len(arrays), key))
            tensors.extend((name, types[name], array) for name, array in arrays.items())
        return headers, tensors

    def _answers(self, result: Result, tensors: list[Received]) -> list[Answer]:
        if result.error:
            raise _failed_batch(self.name, result.error)
        out: list[Answer] = []
        position = 0
        for answer in result.answers:
            if isinstance(answer, Ok):
                count = answer.count
                out.append(_answer(answer, tensors[position:position + count]))
                position += count
            else:
                out.append(_answer(answer, []))
        return out

    # ------------------------------------------------------------------ BLS (on the loop)

    def _on_bls(self, bls: Bls, tensors: list[Received]) -> None:
        """A BLS request of the model, on the loop (which reads the process's frames)."""
        proc = self._proc
        call = bls.call

        def done(result: InferenceResponse | EngineError) -> None:
            if isinstance(result, EngineError):
                proc.send(BlsResult(call, Error(*error_tuple(result)), "{}"))
            else:
                proc.send(BlsResult(call, None, "{}"), [(t.name, t.datatype, t.data) for t in result.outputs])

        if self._gateway is None:
            done(unavailable("BLS requests can be made only once the model is loaded"))
            return
        request = engine_request(bls.model, bls.version, bls.request_id, bls.correlation_id, bls.flags,
                                 bls.parameters, bls.outputs, tensors)
        self._gateway.submit(self.node, request, bls.timeout_us, done)

    # ------------------------------------------------------------------ crashes and restarts

    def _on_exit(self, reason: str) -> None:
        loop = self._loop
        if loop is not None and not self._closing:
            loop.call_soon_threadsafe(self._crashed, reason)

    def _crashed(self, reason: str) -> None:
        if self._closing or self._up is None:
            return
        self._up.clear()
        self._health(self.name, f"instance '{self.name}' {reason}; restarting it")
        relays, self._relays = self._relays, {}
        for relay in relays.values():  # requests whose execute had returned, still streaming
            relay.fail(unavailable(f"Python model instance '{self.name}' {reason} while running this "
                                   "request"))
        asyncio.get_running_loop().create_task(self._restart(reason))

    async def _restart(self, reason: str) -> None:
        loop = asyncio.get_running_loop()
        last = ""
        for attempt in range(RESTART_ATTEMPTS):
            if attempt:
                await asyncio.sleep(RESTART_PAUSE_S * attempt)
            if self._closing:
                return
            try:
                proc = await loop.run_in_executor(None, self._launch)
            except EngineError as e:
                last = e.message
                log.error("instance %s: restart %d of %d failed: %s", self.name, attempt + 1,
                          RESTART_ATTEMPTS, last)
                continue
            proc.attach(loop)
            if self._closing:
                await loop.run_in_executor(None, proc.stop)
                return
            self._proc = proc
            log.info("instance %s restarted (pid %d)", self.name, proc.pid)
            self._health(self.name, "")
            break
        else:
            self._broken = f"instance '{self.name}' {reason}, and could not be restarted: {last}"
            self._health(self.name, self._broken)
        if self._up is not None:
            self._up.set()

    def kill(self, reason: str = "was killed") -> None:
        self._proc.kill(reason)

    def close(self) -> None:
        self._closing = True
        self._proc.stop()


class InProcessTransport(pb_utils.Transport):
    """BLS from an in-process instance's thread: handed to the loop, answered through a future."""

    def __init__(self, instance: InProcessInstance) -> None:
        self._instance = instance

    def submit(self, request: pb_utils.InferenceRequest) -> Future[pb_utils.InferenceResponse]:
        future: Future[pb_utils.InferenceResponse] = Future()
        instance = self._instance
        if instance.loop is None or instance.gateway is None:
            future.set_result(_error_response("BLS requests can be made only once the model is loaded"))
            return future
        try:
            tensors = [(t.name(), DataType.from_v2(t.datatype()), t.as_numpy()) for t in request.inputs()]
        except (AttributeError, EngineError) as e:
            future.set_result(_error_response(f"BLS inputs must be pb_utils.Tensor: {e}"))
            return future
        engine = engine_request(request.model_name, request.model_version, request.request_id(),
                                request.correlation_id(), request.flags(), request.parameters(),
                                request.requested_output_names(), tensors)

        def done(result: InferenceResponse | EngineError) -> None:
            if isinstance(result, EngineError):
                code, message = error_tuple(result)
                future.set_result(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))))
            else:
                future.set_result(pb_utils.InferenceResponse(
                    [pb_utils.Tensor(t.name, t.data, t.datatype.value) for t in result.outputs]))

        gateway = instance.gateway
        instance.loop.call_soon_threadsafe(lambda: gateway.submit(instance.node, engine, request.timeout(),
                                                                  done))
        return future


def _error_response(message: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class InProcessSink(CreditedSink):
    """A decoupled in-process model's sends: converted on the model's thread, handed to the loop in order; a
    send before the last waits for its request's credit (send_credits.py), granted from the loop."""

    def __init__(self, instance: InProcessInstance) -> None:
        super().__init__()
        self._instance = instance

    def deliver(self, key: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        answer = None if response is None else convert_response(response, 0)
        loop = self._instance.loop
        if loop is not None:
            loop.call_soon_threadsafe(self._instance.respond, key, answer, final)


class InProcessInstance:
    cpu_bound = False

    def __init__(self, config: ModelConfig, spec: LaunchSpec) -> None:
        self.name = spec.instance_name
        self.node = WaitNode(spec.instance_name)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.gateway: Gateway | None = None
        self._config = config
        self._types = _input_types(config)
        self._keys = itertools.count(1)
        self._relays: dict[int, Relay] = {}
        self._sink = InProcessSink(self)
        pb_utils.set_transport(InProcessTransport(self), thread_only=True)  # this thread runs the model
        try:
            self._runner = ModelRunner(spec.model_file, spec.args, spec.model_dir, spec.shown)
        except ModelError as e:
            raise EngineError(ErrorCode.INTERNAL, f"instance '{self.name}': {e}") from None

    def bind(self, loop: asyncio.AbstractEventLoop, gateway: Gateway, health: Health) -> None:
        self.loop, self.gateway = loop, gateway

    async def execute_requests(self, requests: list[InferenceRequest], inputs: list[dict[str, np.ndarray]],
                               executor: Executor | None = None, relays: list[Relay] | None = None
                               ) -> list[Answer]:
        batch = []
        types = self._types
        for i, (request, arrays) in enumerate(zip(requests, inputs, strict=True)):
            request_id, correlation, flags, params, requested = request_meta(self._config, request)
            # A model may write into its inputs (in Triton they are its shared memory): copy read-only ones.
            tensors = [pb_utils.Tensor(n, a if a.flags.writeable else a.copy(), types[n].value)
                       for n, a in arrays.items()]
            sender = self._sender(relays[i]) if relays is not None else None
            batch.append(pb_utils.make_request(tensors, requested, request_id, correlation, flags, params,
                                               sender))
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, self._run, batch)
        except BaseException:
            for made in batch:
                sender = getattr(made, "_sender", None)
                if sender is not None:
                    sender.close()
                    self._relays.pop(sender._key, None)
                    self._sink.credits.finished(sender._key)
            raise

    def _sender(self, relay: Relay) -> pb_utils.InferenceResponseSender:
        key = next(self._keys)
        self._relays[key] = relay
        relay.bind(functools.partial(self._cancelled, key), functools.partial(self._grant, key))
        return pb_utils.InferenceResponseSender(key, self._sink)

    def _cancelled(self, key: int) -> None:
        if self._relays.pop(key, None) is not None:
            self._sink.cancelled.add(key)
            self._sink.credits.cancel(key)

    def _grant(self, key: int, n: int) -> None:
        if key in self._relays:
            self._sink.credits.grant(key, n)

    def respond(self, key: int, answer: Answer | None, final: bool) -> None:
        """A decoupled model's send, on the loop, in order."""
        relay = self._relays.pop(key, None) if final else self._relays.get(key)
        if relay is not None:
            relay.respond(answer, final)

    def _run(self, batch: list[pb_utils.InferenceRequest]) -> list[Answer]:
        try:
            return self._runner.execute(batch)
        except ModelError as e:
            raise _failed_batch(self.name, str(e)) from None

    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        tensors = [pb_utils.Tensor(n, a, self._types[n].value) for n, a in inputs.items()]
        return _single(self._run([pb_utils.make_request(tensors, list(output_names), "warmup", 0, 0, "{}")]),
                       self.name)

    def close(self) -> None:
        failure = self._runner.finalize()
        if failure:
            log.error("instance %s: finalize failed: %s", self.name, failure)


def _single(answers: list[Answer], name: str) -> dict[str, np.ndarray]:
    """A warm-up run's outputs, or its error."""
    if len(answers) != 1:
        raise _failed_batch(name, f"execute returned {len(answers)} responses for 1 request")
    answer = answers[0]
    if answer[0] != "ok":
        raise EngineError(ErrorCode.INTERNAL, f"instance '{name}': {answer[2]}")
    return {n: a for n, _, a in answer[1]}
