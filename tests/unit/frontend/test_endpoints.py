"""The endpoint table (engine/frontend/endpoints.py) against what serves it: every route the HTTP router
serves has a row and every row a handler, the OpenAI API's in its own routers; every gRPC method the
services declare has a row and every row a handler, in one process and in a frontend of --workers N; every
pattern matches what it says. Pure: no server, no event loop.
"""

from __future__ import annotations

import inspect
import re

import pytest

from engine.access.groups import ApiGroup
from engine.frontend.endpoints import GRPC_METHODS, Api, Endpoint, Kind, Where, WrongMethod, match
from engine.frontend.grpc.handlers import GrpcHandlers
from engine.frontend.http.path import parse_target
from engine.frontend.http.routes import HttpRoutes
from engine.frontend.openai.batch_routes import BatchRoutes
from engine.frontend.openai.routes import OpenAIRoutes
from engine.proto import grpc_service_pb2, health_pb2
from engine.workers.forwarding import FrontendGrpcHandlers

_HANDLER_PARAMETERS = ["self", "req", "target", "on_done"]
_BATCH_HANDLER_PARAMETERS = ["self", "req", "target", "owner"]
# which class answers each API's rows, and how its handlers are called
_ROUTERS = {Api.KSERVE: (HttpRoutes, _HANDLER_PARAMETERS), Api.OPENAI: (OpenAIRoutes, _HANDLER_PARAMETERS),
            Api.BATCH: (BatchRoutes, _BATCH_HANDLER_PARAMETERS)}


def _handlers(routes: type, parameters: list[str]) -> set[str]:
    """A router's methods shaped as a row's handler: handler(req, target, on_done), or a BatchRoutes one
    handler(req, target, owner). Routines, not functions: compiled with mypyc, a method is a method
    descriptor; dunders (mypyc adds some without a signature) are never a handler."""
    return {name for name, fn in inspect.getmembers(routes, inspect.isroutine)
            if not name.startswith("__") and list(inspect.signature(fn).parameters) == parameters}


@pytest.mark.parametrize("api", list(Api), ids=lambda a: a.name)
def test_every_route_has_a_row_and_every_row_a_handler(api: Api) -> None:
    routes, parameters = _ROUTERS[api]
    rows = {endpoint.row.handler for endpoint in Endpoint if endpoint.row.api is api}
    if api is Api.KSERVE:
        rows.add("openai_api")  # HttpRoutes hands the OpenAI API's rows to their router...
    if api is Api.OPENAI:
        rows |= {"handle", "_route"}  # ... whose entry checks them (and reads the row) before their handler
    assert rows == _handlers(routes, parameters)


# vLLM's operational endpoints: (group, cancelled when its client leaves)
_VLLM = {Endpoint.VLLM_HEALTH: (ApiGroup.HEALTH, False), Endpoint.VLLM_VERSION: (ApiGroup.METADATA, False),
         Endpoint.VLLM_TOKENIZE: (ApiGroup.INFERENCE, True),
         Endpoint.VLLM_DETOKENIZE: (ApiGroup.INFERENCE, True),
         Endpoint.VLLM_METRICS: (ApiGroup.STATISTICS, False)}


@pytest.mark.parametrize("endpoint", list(Endpoint), ids=lambda e: e.name)
def test_each_row_is_whole(endpoint: Endpoint) -> None:
    row = endpoint.row
    assert endpoint.group is row.group
    assert (row.group is None) == (endpoint in (Endpoint.NONE, Endpoint.MALFORMED))
    if row.where is Where.LOCAL:  # a frontend process decides by the row's methods what it answers itself
        assert row.methods
    if row.methods is not None:
        assert all(m in (b"GET", b"HEAD", b"POST", b"DELETE") for m in row.methods)
        assert len(set(row.methods)) == len(row.methods)
    # the OpenAI API's rows: all of /v1, each answering a wrong method in OpenAI's words (naming its first
    # method); inference, answered in the engine and cancelled there when its client leaves, as a generation
    openai = row.api is not Api.KSERVE
    assert openai == (row.pattern.startswith("/v1") or endpoint in _VLLM)
    assert openai == (row.wrong_method is WrongMethod.OPENAI)
    if endpoint in _VLLM:  # vLLM's beside /v1, each in its kind's group, answered in the engine
        assert (row.group, row.cancellable) == _VLLM[endpoint] and row.where is Where.FORWARDED
        assert row.action == row.pattern and row.api is Api.OPENAI
    elif openai:
        assert (row.group, row.where, row.cancellable) == (ApiGroup.INFERENCE, Where.FORWARDED, True)
        assert row.action in ("", "/v1/models")
    if row.wrong_method is WrongMethod.NEEDS:
        assert row.action and row.methods


def _concrete(pattern: str, optional: bool) -> tuple[tuple[str, ...], dict[str, str]]:
    """A path a pattern matches, with or without its optional part, and what it captures."""
    pattern = re.sub(r"\[(.*)\]", r"\1" if optional else "", pattern)
    segments, captured = [], {}
    for segment in pattern.strip("/").split("/"):
        if segment == "{rest*}":
            segments += ["some", "thing"]
        elif segment.startswith("{"):
            slot, _, choices = segment[1:-1].partition(":")
            value = choices.split("|")[-1] if choices else f"my-{slot}"
            segments.append(value)
            captured[slot] = value
        else:
            segments.append(segment)
    return tuple(segments), captured


@pytest.mark.parametrize("endpoint", [e for e in Endpoint if e.row.pattern], ids=lambda e: e.name)
@pytest.mark.parametrize("optional", [False, True])
def test_each_pattern_matches_its_row(endpoint: Endpoint, optional: bool) -> None:
    segments, captured = _concrete(endpoint.row.pattern, optional)
    assert match(segments) == (endpoint, captured)
    target = parse_target(("/" + "/".join(segments)).encode())  # the one parse reads it the same
    assert target.endpoint is endpoint
    assert (target.name, target.version, target.action) == (
        captured.get("name", ""), captured.get("version", ""), captured.get("action", ""))


def test_a_literal_wins_over_a_capture_only_where_it_matches() -> None:
    assert match(("v2", "models", "stats"))[0] is Endpoint.MODELS_STATS
    assert match(("v2", "models", "stats", "ready")) == (Endpoint.MODEL_READY, {"name": "stats"})
    assert match(("v2", "models", "m", "versions")) == (Endpoint.NONE, {})
    assert match(("v1",))[0] is Endpoint.OPENAI_UNKNOWN
    assert match(("v1", "models", "m")) == (Endpoint.OPENAI_MODEL, {"name": "m"})
    assert match(("v1", "models", "files")) == (Endpoint.OPENAI_MODEL, {"name": "files"})
    assert match(("v1", "files", "content")) == (Endpoint.OPENAI_FILE, {"name": "content"})
    assert match(("v1", "files", "content", "content")) == (Endpoint.OPENAI_FILE_CONTENT, {"name": "content"})


@pytest.mark.parametrize("path, endpoint", [
    ("v1/chat", Endpoint.OPENAI_UNKNOWN),
    ("v1/models/m/x", Endpoint.OPENAI_UNKNOWN),
    ("v1/completions/x", Endpoint.OPENAI_UNKNOWN),
    ("v1/embeddings/x", Endpoint.OPENAI_UNKNOWN),
    ("v1/files/f/x", Endpoint.OPENAI_FILES_UNKNOWN),
    ("v1/files/f/content/x", Endpoint.OPENAI_FILES_UNKNOWN),
    ("v1/batches/b/x", Endpoint.OPENAI_BATCHES_UNKNOWN),
    ("v1/batches/b/cancel/x", Endpoint.OPENAI_BATCHES_UNKNOWN),
])
def test_a_path_under_v1_that_no_row_names_is_the_openai_apis_unknown_url(path: str,
                                                                          endpoint: Endpoint) -> None:
    """Answered in OpenAI's words (404 "Unknown request URL"), under /v1/files and /v1/batches only after
    the Batch API's 501 while it is off: so those two have their own rows, of the Batch API."""
    assert match(tuple(path.split("/"))) == (endpoint, {})
    assert endpoint.row.api is (Api.BATCH if "/files" in path or "/batches" in path else Api.OPENAI)


def _declared_methods() -> set[bytes]:
    paths = set()
    for module in (grpc_service_pb2, health_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            paths |= {f"/{service.full_name}/{method.name}".encode() for method in service.methods}
    return paths


def test_every_grpc_method_has_a_row_and_every_row_a_handler() -> None:
    assert {row.path for row in GRPC_METHODS} == _declared_methods()
    assert len({row.method for row in GRPC_METHODS}) == len(GRPC_METHODS)  # names alone tell them apart
    for row in GRPC_METHODS:
        assert isinstance(row.group, ApiGroup)
        assert callable(getattr(GrpcHandlers, row.handler)), row
        assert callable(getattr(FrontendGrpcHandlers, row.handler)), row


def test_a_frontend_forwards_exactly_the_forwarded_rows() -> None:
    """With --workers N, a forwarded row's handler in a frontend is a forwarder, not the engine's own; a
    local row's is the single-process handler (inference) or the frontend's own (Health/Watch's statuses)."""
    for row in GRPC_METHODS:
        mine, engines = getattr(FrontendGrpcHandlers, row.handler), getattr(GrpcHandlers, row.handler)
        if row.where is Where.FORWARDED:
            assert row.kind is Kind.UNARY and mine is not engines, row
        else:
            assert row.kind is not Kind.UNARY, row
