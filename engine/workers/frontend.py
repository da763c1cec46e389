"""A frontend process of the multi-process server: `python -m engine.workers.frontend SPEC`, started by the
engine (supervisor.py), never by hand. SPEC is JSON: this frontend's index, the fds it inherited (the HTTP
and gRPC listening sockets, its channel to the engine, its request and response arenas) and the limits.

It runs the single-process protocol code, HTTP/1.1 (`HttpApp`) and gRPC (`H2GrpcServer`), with the engine
client (remote.py) standing in for the DataPlane and the forwarding routes and handlers (forwarding.py); it
imports no backend, holds no model and reads no repository.

SIGTERM: stop accepting, drain (the requests in flight are still answered through the engine), exit 0.
SIGINT is ignored: the engine (which a terminal's ^C also reaches) coordinates the drain. When the engine's
end of the channel closes (it died), the frontend drops its connections and exits at once: no orphans.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
from typing import Any

from ..frontend import http as http_frontend
from ..frontend.h2.server import H2GrpcServer
from ..frontend.h2.streams import Limits
from ..frontend.http_types import HttpLimits
from ..shm import Region
from .forwarding import FrontendGrpcHandlers, FrontendRoutes
from .listen import Acceptor
from .remote import EngineClient

log = logging.getLogger("hubserve.workers")

EXIT_ENGINE_GONE = 3


def _sockets(fds: list[int]) -> list[socket.socket]:
    return [socket.socket(fileno=fd) for fd in fds]


async def serve(spec: dict[str, Any]) -> int:
    loop = asyncio.get_running_loop()
    index = spec["index"]
    stop = asyncio.Event()
    engine_gone = False

    def lost() -> None:
        nonlocal engine_gone
        engine_gone = True
        stop.set()

    requests = Region.attach(spec["requests"][0], spec["requests"][1], f"hubserve-requests-{index}")
    responses = Region.attach(spec["responses"][0], spec["responses"][1], f"hubserve-responses-{index}")
    client = EngineClient(requests, responses, lost)
    await loop.connect_accepted_socket(lambda: client, socket.socket(fileno=spec["channel"]))

    h = spec["http"]
    http_limits = HttpLimits(h["max_body_bytes"], h["max_header_bytes"], h["max_header_count"],
                             h["client_timeout_secs"], h["idle_timeout_secs"])
    app = http_frontend.HttpApp(client, http_limits, FrontendRoutes(client, http_limits))  # type: ignore[arg-type]
    g = spec["grpc"]
    limits = Limits(max_header_list_bytes=g["max_header_list_bytes"],
                    max_buffered_request_bytes=g["max_buffered_request_bytes"],
                    max_queued_response_bytes=g["max_queued_response_bytes"],
                    client_timeout_secs=g["client_timeout_secs"], idle_timeout_secs=g["idle_timeout_secs"])
    grpc = H2GrpcServer(client, g["max_message_bytes"], limits,  # type: ignore[arg-type]
                        handlers=FrontendGrpcHandlers(client))
    await grpc.start()  # no sockets of its own: the sweeper only
    app.start_sweeper()
    http_acceptor = Acceptor(_sockets(spec["http_fds"]), app.protocol)
    grpc_acceptor = Acceptor(_sockets(spec["grpc_fds"]), grpc.connection)

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log.info("frontend %d serving (pid %d)", index, os.getpid())
    await stop.wait()
    if engine_gone:
        log.error("frontend %d: the engine process is gone; exiting", index)
        for acceptor in (http_acceptor, grpc_acceptor):
            acceptor.close()
        for conn in list(app.connections):
            conn.abort()
        await grpc.stop(0)
        return EXIT_ENGINE_GONE
    log.info("frontend %d draining: %d HTTP and %d gRPC connections accepted in all", index,
             http_acceptor.accepted, grpc_acceptor.accepted)
    grace = float(spec["exit_timeout_secs"])
    grpc_acceptor.close()
    await asyncio.gather(grpc.stop(grace), http_frontend.shutdown(app, http_acceptor, grace),
                         return_exceptions=True)
    client.close()
    return 0


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    logging.basicConfig(level=logging.DEBUG if spec.get("log_verbose", 0) > 0 else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    run = asyncio.run
    try:
        import uvloop  # as the engine: a faster loop where installed

        run = uvloop.run
    except ImportError:
        pass
    return int(run(serve(spec)))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
