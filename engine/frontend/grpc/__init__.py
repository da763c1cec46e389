"""KServe v2 (inference.GRPCInferenceService) and grpc.health.v1 over gRPC, on our own HTTP/2 (../h2/).

    server.py        `H2GrpcServer`: the listener, driven by engine/server.py as a grpc server is, and its
                     sweeper
    call.py          `GrpcApp` and `Call`: one call per HTTP/2 stream: its head, messages, deadline and status
    rpcs.py          the method table (by `:path`), the fixed response header blocks, status trailers
    messages.py      gRPC's length-prefixed messages and their compression
    handlers.py      `GrpcHandlers`: each RPC's logic, message in, message out; ErrorCode → status (`STATUS`)
    codec.py         ModelInferRequest / ModelInferResponse ↔ engine types
    health_watch.py  Health/Watch: one notifier per process for every stream watched
    api_groups.py    which API group each method is in, by `:path`, from the endpoint table (../endpoints.py)

gRPC lives here rather than in h2/ so that h2/ stays HTTP/2 only: the load tester's client takes the HTTP/2
core without any of the server's gRPC, and a second protocol on HTTP/2 would sit beside this one.
"""
