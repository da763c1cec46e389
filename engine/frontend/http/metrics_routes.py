"""The metrics port: `GET /metrics` (Prometheus' text format), served by the same HTTP/1.1 connections as the
KServe port (connection.py, owned by an `HttpApp` of its own), so it has their limits and timeouts: a
request head must arrive within `--client-timeout-secs`, an idle connection is closed after
`--idle-timeout-secs`, and a body larger than `MAX_BODY_BYTES` is refused. Its own `ConnectionCounter`
caps its connections in all and per client address (`--metrics-max-connections`,
`--metrics-max-connections-per-client`), apart from the HTTP and gRPC ports' counts, so neither side can
take the other's connections: a scraper flood cannot use up the descriptors inference needs, and a flood of
inference connections does not blind monitoring.

The page is rendered on the event loop at each scrape (engine/observability/metrics.py), as before.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from .types import Answer, HttpRequest, OnDone

MAX_BODY_BYTES = 4096  # a scrape has no body; anything larger is refused (413) before it is read
METRICS_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text exposition format


def _error(status: int, message: str) -> Answer:
    return status, orjson.dumps({"error": message}), b"application/json", b""


class MetricsRoutes:
    """`handle` for the metrics port's HttpApp: GET /metrics answers `render()`; any other path is 404 and
    any other method 405."""

    def __init__(self, render: Callable[[], bytes]) -> None:
        self._render = render

    def handle(self, req: HttpRequest, on_done: OnDone) -> Answer:
        path = req.url.split(b"?", 1)[0]
        if path != b"/metrics":
            return _error(404, "no endpoint here: the metrics are at /metrics")
        if req.method != b"GET":
            return _error(405, "/metrics needs GET")
        return 200, self._render(), METRICS_CONTENT_TYPE, b""


__all__ = ["MAX_BODY_BYTES", "MetricsRoutes"]
