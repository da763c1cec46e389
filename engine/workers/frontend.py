"""A frontend process of the multi-process server: `python -m engine.workers.frontend SPEC`, started by the
engine (supervisor.py), never by hand. SPEC is JSON (`FrontendSpec`): this frontend's index, the fds it
inherited (its channel to the engine, the hand-off its connections arrive through, its request and response
arenas, and the pipe its secrets come through: `secrets_fd`, read to its end before anything else), and the
`FrontendOptions` its frontends are built from, limits and TLS settings among them (the handshakes run
here; the engine only accepts). No secret is ever on its command line.

It builds the single-process protocol code, HTTP/1.1 (`HttpApp`) and gRPC (`H2GrpcServer`), with the one
builder the engine uses for its own (frontend/build.py), over the engine client (remote.py) in the
DataPlane's place and the forwarding routes and handlers (forwarding.py); it imports no backend, holds no
model and reads no repository.

SIGTERM: take no more connections, drain (requests in flight are still answered through the engine), exit 0.
SIGINT is ignored: the engine (which a terminal's ^C also reaches) coordinates the drain. When the engine's
end of the channel closes (it died), the frontend drops its connections and exits at once: no orphans.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass

from .. import heap
from ..frontend import wire
from ..frontend.build import build_frontends
from ..frontend.http import app as http_frontend
from ..frontend.options import FrontendOptions, RestrictionSecrets
from ..frontend.tls import TlsConfigError
from ..memory import keep_heap_while_serving
from ..observability import logs
from ..shm.regions import Region
from .forwarding import FrontendGrpcHandlers, FrontendRoutes
from .listen import ConnectionReceiver
from .remote import EngineClient

log = logging.getLogger("hubserve.workers")

EXIT_ENGINE_GONE = 3
EXIT_TLS = 4  # a certificate or key the engine checked at start can no longer be loaded (changed since)


@dataclass(frozen=True, slots=True)
class FrontendSpec:
    """What one frontend process is started with (its command line, as JSON): its index, the fds it
    inherits (supervisor.py: its channel, its hand-off, its request and response arenas as (fd, size), and
    the pipe its secrets come through), and the options its frontends are built from."""

    index: int
    channel: int  # the fds: of its channel to the engine, of its hand-off
    handoff: int
    requests: tuple[int, int]
    responses: tuple[int, int]
    secrets_fd: int
    options: FrontendOptions

    def to_json(self) -> str:
        return json.dumps({"index": self.index, "channel": self.channel, "handoff": self.handoff,
                           "requests": self.requests, "responses": self.responses,
                           "secrets_fd": self.secrets_fd, "options": self.options.to_dict()})

    @classmethod
    def from_json(cls, text: str) -> FrontendSpec:
        doc = json.loads(text)
        (requests_fd, requests_size), (responses_fd, responses_size) = doc["requests"], doc["responses"]
        return cls(doc["index"], doc["channel"], doc["handoff"], (requests_fd, requests_size),
                   (responses_fd, responses_size), doc["secrets_fd"],
                   FrontendOptions.from_dict(doc["options"]))


async def serve(spec: FrontendSpec, secrets: RestrictionSecrets) -> int:
    loop = asyncio.get_running_loop()
    index, options = spec.index, spec.options
    stop = asyncio.Event()
    engine_gone = False

    def lost() -> None:
        nonlocal engine_gone
        engine_gone = True
        stop.set()

    requests = Region.attach(*spec.requests, f"hubserve-requests-{index}")
    responses = Region.attach(*spec.responses, f"hubserve-responses-{index}")
    client = EngineClient(requests, responses, lost)
    wire.configure(options.tensors)
    config = options.access.config(secrets)
    try:  # the files are read here, in this process, which runs the handshakes
        frontends = build_frontends(options, config, FrontendRoutes(client, options.http),
                                    FrontendGrpcHandlers(client), index)  # this process's share of each limit
    except TlsConfigError as e:
        log.error("frontend %d cannot serve TLS: %s", index, e)
        return EXIT_TLS
    await loop.connect_accepted_socket(lambda: client, socket.socket(fileno=spec.channel))
    app, grpc = frontends.http, frontends.grpc
    await grpc.start()  # no sockets of its own: the sweeper only
    app.start_sweeper()
    receiver = ConnectionReceiver(socket.socket(fileno=spec.handoff), app.protocol, grpc.connection,
                                  frontends.http_ssl, frontends.grpc_ssl, frontends.handshake_timeout_secs)
    client.count_connections_with(lambda: len(app.connections) + grpc.open_connections)

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log.info("frontend %d serving (pid %d)", index, os.getpid())
    heap.settle_after_load()
    await stop.wait()
    if engine_gone:
        log.error("frontend %d: the engine process is gone; exiting", index)
        receiver.close()
        for conn in list(app.connections):
            conn.abort()
        await grpc.stop(0)
        return EXIT_ENGINE_GONE
    log.info("frontend %d draining (%d connections served in all)", index, receiver.received)
    grace = float(options.exit_timeout_secs)
    receiver.close()
    await asyncio.gather(grpc.stop(grace), http_frontend.shutdown(app, [receiver], grace),
                         return_exceptions=True)
    client.close()
    return 0


def read_secrets(fd: int) -> RestrictionSecrets:
    """The secrets the engine wrote into the inherited pipe `fd` (supervisor.py), read to the end; the fd is
    closed."""
    with os.fdopen(fd, "rb") as pipe:
        return RestrictionSecrets.from_json(pipe.read())


def main(argv: list[str]) -> int:
    spec = FrontendSpec.from_json(argv[1])
    secrets = read_secrets(spec.secrets_fd)
    # the engine's settings at start (the logging extension changes the engine's)
    logs.configure(**dataclasses.asdict(spec.options.log))
    keep_heap_while_serving()  # as the engine (engine/memory.py)
    run = asyncio.run
    try:
        import uvloop  # as the engine: a faster loop where installed

        run = uvloop.run
    except ImportError:
        pass
    return int(run(serve(spec, secrets)))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
