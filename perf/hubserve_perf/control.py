"""The control plane the load tester needs: server metadata, model metadata and config, the statistics
extension and the repository load API — over HTTP (aiohttp) or gRPC (grpc.aio with our generated protos, which
live in a private descriptor pool and so coexist with tritonclient's).

Created once per run by cli.py (or tune.py) on the main process's event loop; never on the hot path.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from typing import Protocol as TypingProtocol

from .types import ExitCode, ModelInfo, PerfError, Protocol, ServerStats, TensorSpec

DEFAULT_PORTS = {Protocol.HTTP: 8000, Protocol.GRPC: 8001}
LOAD_TIMEOUT_S = 300.0  # loading a model may compile it; the server answers when it is ready


def split_url(url: str, protocol: Protocol) -> tuple[str, int]:
    """perf_analyzer's `-u host:port` (a scheme is tolerated) → (host, port)."""
    rest = url.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or "]" in port:
        return rest, DEFAULT_PORTS[protocol]
    if not port.isdigit():
        raise PerfError(f"-u expects HOST:PORT, got '{url}'", ExitCode.USAGE)
    return host.strip("[]"), int(port)


class ControlClient(TypingProtocol):
    """What the measurement and the tuner ask of a server. Implementations raise PerfError."""

    async def server_extensions(self) -> tuple[str, ...]: ...

    async def model_info(self, name: str, version: str) -> ModelInfo: ...

    async def stats(self, name: str, version: str) -> ServerStats: ...

    async def load(self, name: str, config: dict[str, Any] | None) -> None: ...

    async def model_ready(self, name: str, version: str) -> bool: ...

    async def close(self) -> None: ...


def connect(protocol: Protocol, host: str, port: int) -> ControlClient:
    if protocol is Protocol.HTTP:
        return HttpControl(host, port)
    return GrpcControl(host, port)


async def wait_ready(control: ControlClient, name: str, version: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await control.model_ready(name, version):
        if time.monotonic() > deadline:
            raise PerfError(f"model '{name}' is not ready after {timeout_s:.0f} s")
        await asyncio.sleep(0.05)


def model_info_from(metadata: dict[str, Any], config: dict[str, Any], version: str) -> ModelInfo:
    """Combine the metadata and config documents (HTTP JSON shape) into a ModelInfo."""

    def specs(key: str) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(t["name"], t["datatype"], tuple(int(d) for d in t.get("shape", ())))
                     for t in metadata.get(key, ()))

    return ModelInfo(metadata.get("name", ""), version, specs("inputs"), specs("outputs"),
                     int(config.get("max_batch_size", 0) or 0), config)


def stats_from(doc: dict[str, Any]) -> ServerStats:
    """Sum the `model_stats` entries of a statistics answer (one per listed version). Numbers may arrive as
    JSON numbers (HTTP) or as strings (protobuf JSON of 64-bit fields)."""
    def ns(infer: dict[str, Any], key: str) -> int:
        return int(infer.get(key, {}).get("ns", 0))

    total = ServerStats()
    for entry in doc.get("model_stats", ()):
        infer = entry.get("inference_stats", {})
        by_size = tuple(sorted((int(b["batch_size"]), int(b.get("compute_infer", {}).get("count", 0)))
                               for b in entry.get("batch_stats", ())))
        total = total + ServerStats(
            success_count=int(infer.get("success", {}).get("count", 0)),
            success_ns=ns(infer, "success"),
            queue_ns=ns(infer, "queue"),
            compute_input_ns=ns(infer, "compute_input"),
            compute_infer_ns=ns(infer, "compute_infer"),
            compute_output_ns=ns(infer, "compute_output"),
            inference_count=int(entry.get("inference_count", 0)),
            execution_count=int(entry.get("execution_count", 0)),
            executions_by_batch_size=by_size,
        )
    return total


class HttpControl:
    def __init__(self, host: str, port: int) -> None:
        import aiohttp

        self._base = f"http://{host}:{port}"
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=LOAD_TIMEOUT_S))

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        import aiohttp

        try:
            async with self._session.request(method, self._base + path, json=body) as r:
                text = await r.text()
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise PerfError(f"cannot reach {self._base}{path}: {e or type(e).__name__}") from None
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            doc = {"error": text[:200]}
        return r.status, doc

    async def _get_ok(self, path: str) -> Any:
        status, doc = await self._call("GET", path)
        if status != 200:
            raise PerfError(f"GET {path} answered {status}: {_message(doc)}")
        return doc

    async def server_extensions(self) -> tuple[str, ...]:
        return tuple((await self._get_ok("/v2")).get("extensions", ()))

    async def model_info(self, name: str, version: str) -> ModelInfo:
        prefix = _model_path(name, version)
        return model_info_from(await self._get_ok(prefix), await self._get_ok(prefix + "/config"), version)

    async def stats(self, name: str, version: str) -> ServerStats:
        return stats_from(await self._get_ok(_model_path(name, version) + "/stats"))

    async def load(self, name: str, config: dict[str, Any] | None) -> None:
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        status, doc = await self._call("POST", f"/v2/repository/models/{name}/load", body)
        if status != 200:
            raise PerfError(f"loading model '{name}' failed ({status}): {_message(doc)}")

    async def model_ready(self, name: str, version: str) -> bool:
        status, _ = await self._call("GET", _model_path(name, version) + "/ready")
        return status == 200

    async def close(self) -> None:
        await self._session.close()


class GrpcControl:
    def __init__(self, host: str, port: int) -> None:
        import grpc

        from engine.proto import grpc_service_pb2, grpc_service_pb2_grpc

        self._pb: Any = grpc_service_pb2  # generated classes: mypy cannot see them
        pb_grpc: Any = grpc_service_pb2_grpc
        self._channel = grpc.aio.insecure_channel(f"{host}:{port}", options=_GRPC_OPTIONS)
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self._target = f"{host}:{port}"

    async def _call(self, method: str, request: Any, timeout_s: float = 30.0) -> Any:
        import grpc

        try:
            return await getattr(self._stub, method)(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            raise PerfError(f"{method} on {self._target} failed ({e.code().name}): {e.details()}") from None

    async def server_extensions(self) -> tuple[str, ...]:
        return tuple((await self._call("ServerMetadata", self._pb.ServerMetadataRequest())).extensions)

    async def model_info(self, name: str, version: str) -> ModelInfo:
        meta = await self._call("ModelMetadata", self._pb.ModelMetadataRequest(name=name, version=version))
        config = await self._call("ModelConfig", self._pb.ModelConfigRequest(name=name, version=version))
        return model_info_from(_to_dict(meta), _to_dict(config.config), version)

    async def stats(self, name: str, version: str) -> ServerStats:
        request = self._pb.ModelStatisticsRequest(name=name, version=version)
        answer = await self._call("ModelStatistics", request)
        return stats_from(_to_dict(answer))

    async def load(self, name: str, config: dict[str, Any] | None) -> None:
        request = self._pb.RepositoryModelLoadRequest(model_name=name)
        if config is not None:
            request.parameters["config"].string_param = json.dumps(config)
        await self._call("RepositoryModelLoad", request, LOAD_TIMEOUT_S)

    async def model_ready(self, name: str, version: str) -> bool:
        answer = await self._call("ModelReady", self._pb.ModelReadyRequest(name=name, version=version))
        return bool(answer.ready)

    async def close(self) -> None:
        await self._channel.close()


_GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def _to_dict(message: Any) -> dict[str, Any]:
    from google.protobuf import json_format

    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _model_path(name: str, version: str) -> str:
    return f"/v2/models/{name}" + (f"/versions/{version}" if version else "")


def _message(doc: Any) -> str:
    return str(doc.get("error", doc)) if isinstance(doc, dict) else str(doc)
