"""The endpoint table (engine/frontend/endpoints.py) against what serves it: every route the HTTP router
serves has a row and every row a handler; every gRPC method the services declare has a row and every row a
handler, in one process and in a frontend of --workers N; every pattern matches what it says. Pure: no
server, no event loop.
"""

from __future__ import annotations

import inspect
import re

import pytest

from engine.access.groups import ApiGroup
from engine.frontend.endpoints import GRPC_METHODS, Endpoint, Kind, Where, match
from engine.frontend.grpc.handlers import GrpcHandlers
from engine.frontend.http.path import parse_target
from engine.frontend.http.routes import HttpRoutes
from engine.proto import grpc_service_pb2, health_pb2
from engine.workers.forwarding import FrontendGrpcHandlers

_HANDLER_PARAMETERS = ["self", "req", "target", "on_done"]


def _http_handlers() -> set[str]:
    """HttpRoutes' methods shaped as a row's handler: handler(req, target, on_done)."""
    return {name for name, fn in inspect.getmembers(HttpRoutes, inspect.isfunction)
            if list(inspect.signature(fn).parameters) == _HANDLER_PARAMETERS}


def test_every_route_has_a_row_and_every_row_a_handler() -> None:
    rows = {endpoint.row.handler for endpoint in Endpoint}
    assert rows == _http_handlers()


@pytest.mark.parametrize("endpoint", list(Endpoint), ids=lambda e: e.name)
def test_each_row_is_whole(endpoint: Endpoint) -> None:
    row = endpoint.row
    assert endpoint.group is row.group
    assert (row.group is None) == (endpoint in (Endpoint.NONE, Endpoint.MALFORMED))
    if row.where is Where.LOCAL:  # a frontend process decides by the row's methods what it answers itself
        assert row.methods
    if row.methods is not None:
        assert all(m in (b"GET", b"HEAD", b"POST") for m in row.methods)


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
    assert match(("v1",))[0] is Endpoint.OPENAI


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
