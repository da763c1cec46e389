"""A frontend process of the multi-process server: `python -m engine.workers.frontend SPEC`, started by the
engine (supervisor.py), never by hand. SPEC is JSON: this frontend's index, the fds it inherited (its
channel to the engine, the hand-off its connections arrive through, its request and response arenas, and
the pipe its secrets come through: `secrets_fd`, read to its end before anything else), the limits and the
TLS settings (the handshakes run here; the engine only accepts). No secret is ever on its command line.

It runs the single-process protocol code, HTTP/1.1 (`HttpApp`) and gRPC (`H2GrpcServer`), with the engine
client (remote.py) standing in for the DataPlane and the forwarding routes and handlers (forwarding.py); it
imports no backend, holds no model and reads no repository.

SIGTERM: take no more connections, drain (requests in flight are still answered through the engine), exit 0.
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
from pathlib import Path
from typing import Any

from ..access.policy import access_config, policies
from ..frontend import wire
from ..frontend.connections import ConnectionCounter, ConnectionLimits
from ..frontend.grpc.app import CallLimits
from ..frontend.grpc.server import H2GrpcServer
from ..frontend.h2.streams import Limits
from ..frontend.http import app as http_frontend
from ..frontend.http.types import HttpLimits
from ..frontend.tls import ALPN_GRPC, ALPN_HTTP, TlsConfigError, TlsSettings, server_context
from ..observability import logs
from ..shm.regions import Region
from .forwarding import FrontendGrpcHandlers, FrontendRoutes
from .listen import ConnectionReceiver
from .remote import EngineClient

log = logging.getLogger("hubserve.workers")

EXIT_ENGINE_GONE = 3
EXIT_TLS = 4  # a certificate or key the engine checked at start can no longer be loaded (changed since)


async def serve(spec: dict[str, Any]) -> int:
    loop = asyncio.get_running_loop()
    index = spec["index"]
    tls = spec["tls"]
    http_tls, grpc_tls = TlsSettings.from_spec(tls["http"]), TlsSettings.from_spec(tls["grpc"])
    try:  # the files are read here, in this process, which runs the handshakes
        http_ssl = server_context(http_tls, ALPN_HTTP) if http_tls else None
        grpc_ssl = server_context(grpc_tls, ALPN_GRPC) if grpc_tls else None
    except TlsConfigError as e:
        log.error("frontend %d cannot serve TLS: %s", index, e)
        return EXIT_TLS
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

    wire.configure(wire.TensorLimits(**spec["tensor_limits"]))
    # This process's share of the server's connection limits, for HTTP and gRPC together.
    counter = ConnectionCounter(ConnectionLimits(**spec["connection_limits"]), spec["frontends"])
    a, secrets = spec["access"], spec["secrets"]
    config = access_config(tuple(secrets.get("http_restricted_apis", ())),
                           tuple(secrets.get("grpc_restricted_protocols", ())),
                           Path(a["api_keys_file"]) if a["api_keys_file"] else None, a["max_inflight_bytes"],
                           tuple(a.get("remote_admin_apis", ())))
    http_access, grpc_access = policies(config, a["workers"], index)  # this process's share of each limit
    h = spec["http"]
    http_limits = HttpLimits(h["max_body_bytes"], h["max_header_bytes"], h["max_header_count"],
                             h["client_timeout_secs"], h["idle_timeout_secs"])
    app = http_frontend.HttpApp(FrontendRoutes(client, http_limits), http_limits, counter=counter,
                                access=http_access,
                                loopback_only=config.loopback_only(grpc=False))
    g = spec["grpc"]
    limits = Limits(max_concurrent_streams=g["max_concurrent_streams"],
                    max_header_list_bytes=g["max_header_list_bytes"],
                    max_buffered_request_bytes=g["max_buffered_request_bytes"],
                    max_queued_response_bytes=g["max_queued_response_bytes"],
                    client_timeout_secs=g["client_timeout_secs"], idle_timeout_secs=g["idle_timeout_secs"])
    grpc = H2GrpcServer(FrontendGrpcHandlers(client), g["max_message_bytes"], limits, counter=counter,
                        access=grpc_access,
                        loopback_only=config.loopback_only(grpc=True),
                        call_limits=CallLimits(**g["call_limits"]))
    await grpc.start()  # no sockets of its own: the sweeper only
    app.start_sweeper()
    receiver = ConnectionReceiver(socket.socket(fileno=spec["handoff"]), app.protocol, grpc.connection,
                                  http_ssl, grpc_ssl, tls["handshake_timeout_secs"])
    client.count_connections_with(lambda: len(app.connections) + grpc.open_connections)

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log.info("frontend %d serving (pid %d)", index, os.getpid())
    await stop.wait()
    if engine_gone:
        log.error("frontend %d: the engine process is gone; exiting", index)
        receiver.close()
        for conn in list(app.connections):
            conn.abort()
        await grpc.stop(0)
        return EXIT_ENGINE_GONE
    log.info("frontend %d draining (%d connections served in all)", index, receiver.received)
    grace = float(spec["exit_timeout_secs"])
    receiver.close()
    await asyncio.gather(grpc.stop(grace), http_frontend.shutdown(app, [receiver], grace),
                         return_exceptions=True)
    client.close()
    return 0


def read_secrets(fd: int) -> dict[str, Any]:
    """The secrets the engine wrote into the inherited pipe `fd` (supervisor.py), read to the end; the fd is
    closed."""
    with os.fdopen(fd, "rb") as pipe:
        data = pipe.read()
    secrets: dict[str, Any] = json.loads(data) if data else {}
    return secrets


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    spec["secrets"] = read_secrets(spec["secrets_fd"])
    log_spec = spec.get("log")
    if log_spec is not None:  # the engine's settings at start (the logging extension changes the engine's)
        logs.configure(**log_spec)
    else:
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
