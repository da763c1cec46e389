"""gRPC on a lean HTTP/2 implementation of our own (`--grpc-frontend h2`, the default).

The request path reads top-down: frames.py (RFC 9113 frames) → connection.py (one connection: streams, flow
control in, SETTINGS, PING, GOAWAY) with outbound.py (flow control out) and headers.py (HPACK via `hpack`) →
grpc.py (gRPC messages, status, deadlines; answers through grpc_handlers.GrpcHandlers) → server.py (listener).
"""

from .server import H2GrpcServer
from .streams import Limits

__all__ = ["H2GrpcServer", "Limits"]
