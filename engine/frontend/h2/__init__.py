"""gRPC on a lean HTTP/2 implementation of our own: hubserve's one gRPC server.

The request path reads top-down: frames.py (RFC 9113 frames) → connection.py (one connection: streams, flow
control in, SETTINGS, PING) with outbound.py (flow control out), headers.py (HPACK via `hpack`), lifecycle.py
(GOAWAY, errors, timeouts) and guard.py (flood, memory and timeout policies) → grpc.py (gRPC messages, status,
deadlines; answers through grpc_handlers.GrpcHandlers; rpcs.py: methods and wire constants) → server.py
(listener, sweeper).

Nothing is imported here: the load tester (perf/hubserve_perf) takes frames.py and headers.py alone, without
the server behind them.
"""
