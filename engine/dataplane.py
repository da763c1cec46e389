"""The transport-neutral data plane: every protocol operation, once. The HTTP and gRPC frontends are thin
conversions around this object; the answers here are plain dicts and dataclasses, never wire types.

Model names are checked here, once for every protocol (engine/names.py): a name that is not one folder name
of the repository is INVALID_ARG on every endpoint. Loaded models only ever have valid names (load and
unload check before they act; the repository skips folders with bad names), so a lookup that finds its model
needs no check: the name is checked only when the lookup fails, and the request path pays nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NoReturn

from . import __version__
from .access.caller import NOBODY, Caller
from .errors import EngineError, ErrorCode, invalid, not_found, unavailable
from .model import Model
from .names import check_model_name
from .observability import logs, observe
from .observability.stats import Duration, ModelStats
from .repository.lifecycle import ModelRepository
from .repository.routing import IndexEntry
from .shm import requests as shm_requests
from .shm.client import DEFAULT_LIMITS, ShmLimits, SystemSharedMemory
from .shm.cuda import CudaRegisterRequest, CudaSharedMemory
from .streaming.responses import StreamedResponse, infer_stream
from .types import Completion, InferenceRequest, InferenceResponse

log = logging.getLogger("hubserve")

# What we serve, in Triton's names (core src/server.cc; server docs/protocol/extension_*.md). Left out until
# built: cuda_shared_memory (its endpoints answer, but a register is refused UNAVAILABLE until its GPU
# path has passed a device run: engine/shm/cuda_ipc.py), parameters (custom request
# parameters reach no model: no backend reads them). schedule_policy: the request parameters `priority` and
# `timeout` of the dynamic batcher. system_shared_memory is added when the server was started with
# --allow-client-shm (`SHM_EXTENSION`).
EXTENSIONS = ("classification", "binary_tensor_data", "model_repository",
              "model_repository(unload_dependents)", "schedule_policy", "model_configuration", "statistics",
              "sequence", "logging", "trace")
SHM_EXTENSION = "system_shared_memory"

# Triton's answer to a repository load or unload in the `none` and `poll` model-control modes (core
# src/model_repository_manager/model_repository_manager.cc LoadUnloadModel: UNAVAILABLE, whatever the mode),
# then what to do about it.
MODEL_CONTROL_OFF = ("explicit model load / unload is not allowed if polling is enabled: this server runs in "
                     "'{mode}' model-control mode; start it with --model-control-mode explicit (and "
                     "--load-model NAME for the models to serve at start) to load and unload models through "
                     "the repository API")


@dataclass(slots=True)
class ServerInfo:
    name: str = "hubserve"
    version: str = __version__
    extensions: tuple[str, ...] = EXTENSIONS


class DataPlane:
    def __init__(self, repository: ModelRepository, strict_readiness: bool = True,
                 allow_client_shm: bool = False, max_tensor_bytes: int = 64 << 20,
                 model_control_mode: str = "none", shm_limits: ShmLimits = DEFAULT_LIMITS) -> None:
        self.repository = repository
        # Only `explicit` lets the repository API load and unload (`_require_model_control`): in `none` and
        # `poll` the repository folder alone decides what serves, as in Triton.
        self.model_control_mode = model_control_mode
        extensions = EXTENSIONS + ((SHM_EXTENSION,) if allow_client_shm else ())
        self.info = ServerInfo(extensions=extensions)
        self.strict_readiness = strict_readiness
        self.accepting = True  # False while draining: ready turns false, live stays true
        # Clients' shared-memory regions (engine/shm/client.py); in the engine process with --workers N.
        self.shm = SystemSharedMemory(allow_client_shm, shm_limits)
        self.cuda_shm = CudaSharedMemory(self.shm)  # requests find regions of both kinds through it
        self.max_tensor_bytes = max_tensor_bytes  # the largest BYTES input read from a region

    # ------------------------------------------------------------------ health & metadata

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Strict readiness: every model ready, and, in none and poll mode, at least one model serving. A
        repository that serves nothing there was meant to hold models (an empty or mis-laid folder, a mount
        that failed), so a Service must not route to it. In explicit mode models come through the repository
        API, and an empty server is ready, as Triton's is."""
        if not self.accepting:
            return False
        if not self.strict_readiness:
            return True
        if self.model_control_mode != "explicit" and not self.repository.loaded_models():
            return False
        return self.repository.all_ready()

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.info.name, "version": self.info.version,
                "extensions": list(self.info.extensions)}

    def model(self, name: str, version: str = "") -> Model:
        try:
            return self.repository.get(name, version)
        except EngineError:
            check_model_name(name)  # a bad name says so rather than "unknown model"
            raise

    def model_ready(self, name: str, version: str = "") -> bool:
        if self.repository.is_ready(name, version):
            return True
        check_model_name(name)
        return False

    def require_model_ready(self, name: str, version: str = "") -> bool:
        """True when the model (version) is ready, else the EngineError saying why: HTTP answers readiness
        with the error's status (an unknown model or version is 404, a bad version string 400, a model that
        exists but cannot serve 503), as Triton does (server src/http_server.cc HandleModelReady)."""
        self.model(name, version)
        return True

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        meta = self.model(name, version).metadata()
        if not version:
            meta["versions"] = [str(v) for v in self.repository.versions(name)]
        return meta

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        return self.model(name, version).config.as_json()

    # ------------------------------------------------------------------ inference

    def submit(self, request: InferenceRequest, start_ns: int = 0, on_done: Completion | None = None
               ) -> asyncio.Future[InferenceResponse]:
        """Route and queue one request; the future resolves with its response. Raises at once for an unknown
        model, a bad request or a full queue (accounted as a failure of the model found). `start_ns` is when
        the frontend received the request. When the future is done, the request is accounted (success,
        failure, or cancelled: the frontend cancels it when the client is gone or its deadline passed) and
        then `on_done` is called with it, the frontend's answer: by the batch's answer pass or the future's
        one done-callback (Batcher.enqueue)."""
        start = start_ns or time.perf_counter_ns()
        if not request.id and logs.SETTINGS.access:  # the access line names it: the answer echoes it
            request.id = logs.new_request_id()
        try:
            model = self.repository.get(request.model_name, request.model_version)
        except EngineError as e:
            self._unrouted(request, e, start)  # raises
        try:
            if shm_requests.uses_shared_memory(request):
                return self._submit_shm(model, request, start, on_done)
            return model.submit(request, start, on_done)
        except EngineError as e:
            model.stats.fail.add(time.perf_counter_ns() - start)
            if logs.SETTINGS.access:
                observe.refused(model.name, model.version_str, request.id, e, start)
            raise

    def _unrouted(self, request: InferenceRequest, error: EngineError, start_ns: int) -> NoReturn:
        """A request whose model version is not served: raise why (a name that cannot be a model's says so,
        INVALID_ARG), after its access line while those are on (engine/observability/observe.py)."""
        try:
            check_model_name(request.model_name)
        except EngineError as bad_name:
            error = bad_name
        if logs.SETTINGS.access:
            observe.refused(request.model_name, request.model_version, request.id, error, start_ns)
        raise error

    def _submit_shm(self, model: Model, request: InferenceRequest, start: int, on_done: Completion | None
                    ) -> asyncio.Future[InferenceResponse]:
        """A request with tensors in clients' regions: inputs read now; with outputs in regions, the future
        returned is resolved once they are written (or with the error that kept them from it), and
        cancelling it cancels the request."""
        resolved, places = shm_requests.resolve(request, self.cuda_shm, self.max_tensor_bytes)
        if not places:
            return model.submit(resolved, start, on_done)
        outer: asyncio.Future[InferenceResponse] = asyncio.get_running_loop().create_future()

        def written(inner: asyncio.Future[InferenceResponse]) -> None:
            if outer.done():
                return  # cancelled by the frontend
            if inner.cancelled():
                outer.cancel()
            elif (exc := inner.exception()) is not None:
                outer.set_exception(exc)
            else:
                try:
                    outer.set_result(shm_requests.write_outputs(inner.result(), places))
                except EngineError as refused:
                    outer.set_exception(refused)
                except Exception as bug:  # a bug: the request fails, the server goes on
                    log.exception("writing outputs to shared memory failed")
                    outer.set_exception(EngineError(ErrorCode.INTERNAL, f"writing outputs to shared "
                                                                        f"memory failed: {bug}"))

        inner = model.submit(resolved, start, written)
        outer.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
        if on_done is not None:
            outer.add_done_callback(on_done)
        return outer

    async def infer(self, request: InferenceRequest, start_ns: int = 0) -> InferenceResponse:
        return await self.submit(request, start_ns)

    # ------------------------------------------------------------------ shared memory

    def shm_status(self, cuda: bool, name: str = "", caller: Caller = NOBODY) -> list[dict[str, Any]]:
        """The caller's registered regions of one kind, Triton's status form (system: name, key, offset,
        byte_size; CUDA: name, device_id, byte_size)."""
        return self.cuda_shm.status(name, caller) if cuda else self.shm.status(name, caller)

    def shm_register(self, name: str, key: Any, offset: Any, byte_size: Any, caller: Caller = NOBODY) -> None:
        # key, offset, byte_size: a client's JSON values, checked by register (compiled, an annotation here is
        # a check of its own: `key: str` answered a key of 5 with a 500, not the 400 register gives)
        self.shm.register(name, key, offset, byte_size, caller)

    def cuda_shm_register(self, request: CudaRegisterRequest, caller: Caller = NOBODY) -> None:
        """A request each frontend has parsed and checked (engine/shm/cuda.py `from_json`, `checked`)."""
        self.cuda_shm.register(request, caller)

    def shm_unregister(self, cuda: bool, name: str = "", caller: Caller = NOBODY) -> None:
        """One of the caller's regions by name, or every one of them of that kind when `name` is empty."""
        if cuda:
            self.cuda_shm.unregister(name, caller)
        else:
            self.shm.unregister(name, caller)

    def infer_stream(self, request: InferenceRequest, start_ns: int = 0) -> AsyncIterator[StreamedResponse]:
        """The request's responses as they come: one for a non-decoupled model, 0..N and a final one for a
        decoupled model; leaving early cancels the request (engine/streaming/responses.py)."""
        return infer_stream(self.submit, request, start_ns)

    # ------------------------------------------------------------------ logging and trace extensions

    def log_settings(self, changes: dict[str, Any] | None = None, http: bool = True) -> dict[str, Any]:
        """Triton's logging extension: apply `changes` (Python values, each protocol's types already checked
        by its frontend; engine/observability/logs.py `update`), then answer every setting."""
        if changes:
            logs.update(changes, http)
            observe.refresh()
        return logs.SETTINGS.as_json()

    def trace_setting(self, model: str = "", changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Triton's trace extension: the server-wide setting, or a model's (`model`, which must be ready, in
        Triton's words); `changes` parsed by engine/observability/tracing/settings.py (None: only read)."""
        trace = observe.STATE.trace
        if trace is None:
            trace = observe.STATE.trace = observe.default_tracing()
        if model and not self.repository.is_ready(model, ""):
            check_model_name(model)
            raise invalid(f"Request for unknown model : {model}")
        if changes:
            trace.update(model, changes)
            observe.refresh()
        return trace.as_json(model)

    # ------------------------------------------------------------------ statistics

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        if name:
            if version:
                models = [self.model(name, version)]
            else:
                models = [m for m in self.repository.loaded_models() if m.name == name]
                if not models:
                    self.model(name)  # raises the precise NOT_FOUND / UNAVAILABLE
        else:
            models = self.repository.loaded_models()
        return [stats_json(m.name, m.version_str, m.stats) for m in models]

    # ------------------------------------------------------------------ repository

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        return self.repository.index(ready_only)

    async def load(self, name: str, config: Any = None, files: dict[str, bytes] | None = None) -> None:
        """A repository load. `config` is the request's `config` parameter as it came (None when absent):
        the model config override as a JSON string, parsed here, once for both protocols."""
        self._require_model_control()
        check_model_name(name)
        await self.repository.load(name, None if config is None else config_override(name, config), files)
        failure = self.repository.load_failure(name)  # a failed load (or reload) is an error to the caller
        if failure is not None:
            raise failure

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """A repository unload; `unload_dependents` (the request's parameter of that name) also unloads an
        ensemble's composing models that no other loaded ensemble uses."""
        self._require_model_control()
        check_model_name(name)
        if name not in {e.name for e in self.repository.index()}:
            raise not_found(f"unknown model '{name}'")
        await self.repository.unload(name, unload_dependents=unload_dependents)

    def _require_model_control(self) -> None:
        """Loads and unloads are an admin API, opt-in as in Triton: allowed only in explicit model-control
        mode; in `none` and `poll` they are UNAVAILABLE (HTTP 503), checked before anything else about the
        request (the name included), as Triton's core does. Here, so that both protocols and every process
        layout (with --workers N the engine answers forwarded loads through this object) refuse alike."""
        if self.model_control_mode != "explicit":
            raise unavailable(MODEL_CONTROL_OFF.format(mode=self.model_control_mode))


def config_override(name: str, config: Any) -> dict[str, Any]:
    """The `config` parameter of a load, parsed. A malformed one fails the load in Triton's words and code:
    its core logs "Invalid config override: ..." and answers INTERNAL "failed to load '<name>', failed to poll
    from model repository" (core src/model_repository_manager/model_repository_manager.cc Poll and
    InitializeModelInfo), which clients match on (client src/python/examples/simple_http_model_control.py:
    "failed to load"); the precise reason follows."""
    def failed(reason: str) -> EngineError:
        return EngineError(ErrorCode.INTERNAL, f"failed to load '{name}', failed to poll from model "
                                               f"repository: Invalid config override: {reason}")

    if not isinstance(config, str):
        raise failed("parameter 'config' must be a string holding the model config as JSON")
    try:
        parsed = json.loads(config)
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise failed(f"parameter 'config' is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise failed("parameter 'config' must be a JSON object")
    return parsed


def _duration(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def stats_json(name: str, version: str, s: ModelStats) -> dict[str, Any]:
    """Triton's statistics-extension form of one model version (counts as JSON numbers)."""
    zero = {"count": 0, "ns": 0}
    return {
        "name": name,
        "version": version,
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": _duration(s.success),
            "fail": _duration(s.fail),
            "queue": _duration(s.queue),
            "compute_input": _duration(s.compute_input),
            "compute_infer": _duration(s.compute_infer),
            "compute_output": _duration(s.compute_output),
            "cache_hit": dict(zero),
            "cache_miss": dict(zero),
        },
        "response_stats": {
            str(index): {key: _duration(getattr(r, key)) for key in
                         ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")}
            for index, r in sorted(s.responses.items())
        },
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _duration(b.compute_input),
                "compute_infer": _duration(b.compute_infer),
                "compute_output": _duration(b.compute_output),
            }
            for size, b in sorted(s.batches.items())
        ],
        "memory_usage": [],
    }
