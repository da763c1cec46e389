"""The one place a process's HTTP and gRPC frontends are built, whichever the layout: the engine's Server
with one process (engine/server.py `_start_protocols`), or each frontend process of `--workers N`
(engine/workers/frontend.py `serve`). The layouts differ only in what answers the requests, which the caller
passes: HttpRoutes and GrpcHandlers over the DataPlane in the engine's process, the forwarding routes and
handlers over the engine client in a frontend process (engine/workers/forwarding.py); and in how
connections arrive, which the caller starts (listening sockets here, connections handed over there).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from ..access.policy import AccessConfig, policies
from .connections import ConnectionCounter
from .grpc.handlers import GrpcHandlers
from .grpc.server import H2GrpcServer
from .http.app import HttpApp, Routes
from .options import FrontendOptions, TlsOptions
from .tls import ALPN_GRPC, ALPN_HTTP, server_context


@dataclass(frozen=True, slots=True)
class Frontends:
    """A process's two frontends, counting their connections together, and the TLS contexts their
    connections are served with (None: plain)."""

    http: HttpApp
    grpc: H2GrpcServer
    http_ssl: ssl.SSLContext | None
    grpc_ssl: ssl.SSLContext | None
    handshake_timeout_secs: float | None


def tls_contexts(tls: TlsOptions) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """The HTTP and gRPC ports' server contexts, their files read now (TlsConfigError where one cannot be
    loaded): by the process that runs the handshakes."""
    return (server_context(tls.http, ALPN_HTTP) if tls.http else None,
            server_context(tls.grpc, ALPN_GRPC) if tls.grpc else None)


def build_frontends(options: FrontendOptions, access: AccessConfig, routes: Routes, handlers: GrpcHandlers,
                    index: int = 0) -> Frontends:
    """The frontends of process `index` of `options.frontends`, with its share of the server-wide limits
    (connections, access budgets); `access` is the access flags parsed (AccessInputs.config). Raises
    TlsConfigError first, before anything is built, where a certificate or key cannot be loaded."""
    http_ssl, grpc_ssl = tls_contexts(options.tls)
    counter = ConnectionCounter(options.connections, options.frontends)  # HTTP and gRPC together
    http_access, grpc_access = policies(access, options.frontends, index)
    http = HttpApp(routes, options.http, counter=counter, access=http_access,
                   loopback_only=access.loopback_only(grpc=False))
    grpc = H2GrpcServer(handlers, options.grpc.max_message_bytes, options.grpc.h2, ssl_context=grpc_ssl,
                        handshake_timeout_secs=options.tls.handshake_timeout_secs, counter=counter,
                        access=grpc_access, loopback_only=access.loopback_only(grpc=True),
                        call_limits=options.grpc.calls)
    return Frontends(http, grpc, http_ssl, grpc_ssl, options.tls.handshake_timeout_secs)


__all__ = ["Frontends", "build_frontends", "tls_contexts"]
