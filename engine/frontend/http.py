"""KServe v2 over HTTP/REST, on aiohttp.

Errors leave as `{"error": "..."}` with the status from `STATUS` — the one table from `ErrorCode` to HTTP.
A client that disconnects cancels its handler (handler_cancellation), which takes its request out of the
batcher's queue.
"""

from __future__ import annotations

import json
import time
from typing import Any, Awaitable, Callable

from aiohttp import web

from ..dataplane import DataPlane
from ..errors import EngineError, ErrorCode, invalid
from .http_codec import HEADER_LENGTH, decode_request, encode_response

STATUS = {
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.RESOURCE_EXHAUSTED: 429,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.ALREADY_EXISTS: 409,
    ErrorCode.CANCELLED: 499,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.INTERNAL: 500,
}

DATAPLANE = web.AppKey("dataplane", DataPlane)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except EngineError as e:
        return error_response(STATUS[e.code], e.message)
    except web.HTTPException as e:
        if e.status >= 400:
            return error_response(e.status, e.reason or "error")
        raise


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data, separators=(",", ":")), status=status,
                        content_type="application/json")


def _model(request: web.Request) -> tuple[str, str]:
    return request.match_info["model"], request.match_info.get("version", "")


async def _json_body(request: web.Request) -> dict[str, Any]:
    body = await request.read()
    if not body.strip():
        return {}  # tritonclient sends some requests with no body
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise invalid(f"malformed JSON in request body: {e}") from None
    if not isinstance(doc, dict):
        raise invalid("request body must be a JSON object")
    return doc


class Routes:
    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.dp.live() else 503)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.dp.ready() else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _json(self.dp.server_metadata())

    async def model_metadata(self, request: web.Request) -> web.Response:
        return _json(self.dp.model_metadata(*_model(request)))

    async def model_ready(self, request: web.Request) -> web.Response:
        name, version = _model(request)
        return web.Response(status=200 if self.dp.model_ready(name, version) else 503)

    async def model_config(self, request: web.Request) -> web.Response:
        return _json(self.dp.model_config(*_model(request)))

    async def model_stats(self, request: web.Request) -> web.Response:
        name = request.match_info.get("model", "")
        version = request.match_info.get("version", "")
        return _json({"model_stats": self.dp.statistics(name, version)})

    async def infer(self, request: web.Request) -> web.Response:
        start = time.perf_counter_ns()
        name, version = _model(request)
        body = await request.read()
        req = decode_request(name, version, body, request.headers.get(HEADER_LENGTH))
        response = await self.dp.infer(req, start)
        payload, header_length = encode_response(response, req)
        if header_length is None:
            return web.Response(body=payload, content_type="application/json")
        return web.Response(body=payload, content_type="application/octet-stream",
                            headers={HEADER_LENGTH: str(header_length)})

    async def repository_index(self, request: web.Request) -> web.Response:
        doc = await _json_body(request)
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid("'ready' must be true or false")
        rows = [{"name": e.name, "version": e.version, "state": e.state.value, "reason": e.reason}
                for e in self.dp.repository_index(ready)]
        return _json(rows)

    async def repository_load(self, request: web.Request) -> web.Response:
        doc = await _json_body(request)
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid("'parameters' must be a JSON object")
        config = params.get("config")
        config_json = None
        if config is not None:
            if not isinstance(config, str):
                raise invalid("parameter 'config' must be a string holding the model config as JSON")
            try:
                config_json = json.loads(config)
            except ValueError as e:
                raise invalid(f"parameter 'config' is not valid JSON: {e}") from None
            if not isinstance(config_json, dict):
                raise invalid("parameter 'config' must be a JSON object")
        if any(k.startswith("file:") for k in params):
            raise EngineError(ErrorCode.UNSUPPORTED, "loading model files through the API is not supported yet")
        await self.dp.load(request.match_info["model"], config_json)
        return web.Response(status=200)

    async def repository_unload(self, request: web.Request) -> web.Response:
        await _json_body(request)
        await self.dp.unload(request.match_info["model"])
        return web.Response(status=200)


def make_app(dataplane: DataPlane, max_body_bytes: int) -> web.Application:
    app = web.Application(middlewares=[errors_middleware], client_max_size=max_body_bytes)
    app[DATAPLANE] = dataplane
    r = Routes(dataplane)
    get, post = app.router.add_get, app.router.add_post
    get("/v2/health/live", r.live)
    get("/v2/health/ready", r.ready)
    get("/v2", r.server_metadata)
    get("/v2/models/stats", r.model_stats)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        get(base, r.model_metadata)
        get(base + "/ready", r.model_ready)
        get(base + "/config", r.model_config)
        get(base + "/stats", r.model_stats)
        post(base + "/infer", r.infer)
    post("/v2/repository/index", r.repository_index)
    post("/v2/repository/models/{model}/load", r.repository_load)
    post("/v2/repository/models/{model}/unload", r.repository_unload)
    return app
