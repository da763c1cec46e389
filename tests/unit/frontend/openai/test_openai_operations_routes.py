"""vLLM's /health as the OpenAI router answers it (frontend/openai/routes.py), over real in-process objects
(an empty repository's routing table, the generation registry and the OpenAI service over it): 200 with no
body while the server takes requests, 503 once it is stopping, as vLLM answers while its engine is alive or
not. Pure: no server, no event loop (the endpoints over HTTP: tests/functional/openai/
test_openai_operations.py)."""

from __future__ import annotations

from pathlib import Path

from engine.frontend.http.path import parse_target
from engine.frontend.http.types import HttpRequest
from engine.frontend.openai.routes import OpenAIRoutes
from engine.generate.serving.registry import GenerationRegistry
from engine.openai.service import OpenAIService
from engine.repository.routing import RoutingTable


def health(routes: OpenAIRoutes, method: bytes = b"GET") -> tuple[int, bytes]:
    req = HttpRequest()
    req.method, req.url = method, b"/health"
    target = parse_target(req.url)
    answer = routes.handle(req, target, lambda *_: None)
    assert isinstance(answer, tuple)
    return answer[0], answer[1] if isinstance(answer[1], bytes) else b"".join(answer[1])


def test_health_follows_whether_the_server_takes_requests(tmp_path: Path) -> None:
    accepting = [True]
    service = OpenAIService(GenerationRegistry(RoutingTable(tmp_path)))
    routes = OpenAIRoutes(service, accepting=lambda: accepting[0])
    assert health(routes) == (200, b"")  # no generative model: nothing that could be dead
    accepting[0] = False  # the server is stopping
    assert health(routes) == (503, b"")
    status, body = health(routes, b"POST")
    assert status == 405 and b"use GET" in body
