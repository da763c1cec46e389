"""Triton's model-configuration endpoint for peers that lack it, so the real perf_analyzer can drive them.

perf_analyzer asks for `GET /v2/models/{m}/config` (HTTP) or the `ModelConfig` RPC (gRPC) once before it
starts and gives up when that fails. KServe's python model server and MLServer implement the v2 inference
protocol but not Triton's model-configuration extension, so their launchers (`kserve_model.py`,
`mlserver_runtime.py`) add exactly that one endpoint with these helpers. The inference path is untouched: the
answers are precomputed from each model's `spec.json` (written by `repos.py`) and served as bytes.

Imported in the peers' own venvs (FastAPI and grpcio are there); never by hubserve.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response

MODEL_CONFIG_RPC = "/inference.GRPCInferenceService/ModelConfig"
REST_PATH = "/v2/models/{model_name}/config"


class ModelConfigs:
    """The precomputed config answers of every model in a peer repository, by model name."""

    def __init__(self, specs: dict[str, dict[str, Any]]) -> None:
        self._json = {name: json.dumps(s["triton_config"]).encode() for name, s in specs.items()}
        self._grpc = {name: base64.b64decode(s["triton_config_response_b64"]) for name, s in specs.items()}

    @classmethod
    def from_repository(cls, repository: Path, models: list[str]) -> ModelConfigs:
        return cls({name: json.loads((repository / name / "spec.json").read_text()) for name in models})

    async def rest_endpoint(self, request: Request) -> Response:
        """A Starlette endpoint for REST_PATH (added with `app.add_route`)."""
        name = request.path_params["model_name"]
        body = self._json.get(name)
        if body is None:
            return Response(json.dumps({"error": f"unknown model '{name}'"}), 404,
                            media_type="application/json")
        return Response(body, media_type="application/json")

    def grpc_handler(self) -> grpc.GenericRpcHandler:
        """Answers only MODEL_CONFIG_RPC; every other method falls through to the peer's own servicer."""
        return _ModelConfigHandler(self._grpc)

    def wrap_add_servicer(self, add_servicer: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        """Wrap a generated `add_GRPCInferenceServiceServicer_to_server` to add our handler to the same
        server."""

        def add(servicer: Any, server: Any) -> None:
            add_servicer(servicer, server)
            server.add_generic_rpc_handlers((self.grpc_handler(),))

        return add


class _ModelConfigHandler(grpc.GenericRpcHandler):
    def __init__(self, responses: dict[str, bytes]) -> None:
        self._responses = responses
        # No (de)serializers: the request arrives as bytes and the precomputed response leaves as bytes.
        self._handler = grpc.unary_unary_rpc_method_handler(self._answer)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handler if handler_call_details.method == MODEL_CONFIG_RPC else None

    async def _answer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        name = _model_name(request)
        response = self._responses.get(name)
        if response is not None:
            return response
        await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model '{name}'")
        raise AssertionError("abort() raises")  # grpc's stubs do not say so


def _model_name(request: bytes) -> str:
    """Field 1 (`name`, a string) of a serialized ModelConfigRequest; its other field is a string too."""
    pos = 0
    while pos < len(request):
        key, pos = _varint(request, pos)
        if key & 7 != 2:  # ModelConfigRequest holds only length-delimited fields
            break
        length, pos = _varint(request, pos)
        if key >> 3 == 1:
            return request[pos:pos + length].decode("utf-8", "replace")
        pos += length
    return ""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
