"""The engine seam: what the frontends call on the engine, whichever process they run in.

With one process the engine is the DataPlane (engine/dataplane.py); in a frontend process of `--workers N`
it is the engine client (engine/workers/remote.py), which sends each request over the channel to the engine
process. Both satisfy `Engine` structurally, and mypy checks it (the assignments at the bottom). The seam is
inference alone: `submit` is the one call a frontend makes on the engine in both layouts. Every other
endpoint (metadata, readiness, statistics, the repository, shared memory, logging and trace settings)
reads state only the engine process holds, so a frontend process forwards it as it came
(workers/forwarding.py) and the engine's own routes answer it over the DataPlane (workers/control.py);
those routes take the DataPlane itself (`HttpRoutes.dp`, `GrpcHandlers.dp`).

The Protocol lives here, with its callers, rather than beside the DataPlane: the frontends own what they
need of the engine, the core imports nothing of the frontends, and the workers' client conforms to it
without either side importing the other.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from ..types import Completion, InferenceRequest, InferenceResponse


class Engine(Protocol):
    """Called by the HTTP routes (infer, generate, generate_stream) and the gRPC handlers (ModelInfer,
    ModelStreamInfer) on the event loop, once per request."""

    def submit(self, request: InferenceRequest, start_ns: int = 0, on_done: Completion | None = None
               ) -> asyncio.Future[InferenceResponse]:
        """Route and queue `request` (received at `start_ns`, perf_counter_ns); the future resolves with its
        response or an EngineError. Raises EngineError at once for a request refused before queueing (an
        unknown model, a bad request, a full queue). `on_done` is the future's one done-callback, called after
        the request is accounted. Cancelling the future cancels the request: the engine owns the request from
        the call on, the caller owns the future."""
        ...


if TYPE_CHECKING:  # mypy proves both layouts' engines fit the seam
    from ..dataplane import DataPlane
    from ..workers.remote import EngineClient

    _IN_PROCESS: type[Engine] = DataPlane
    _FRONTEND_PROCESS: type[Engine] = EngineClient


__all__ = ["Engine"]
