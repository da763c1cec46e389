"""HTTP/2 (RFC 9113), our own lean implementation, and nothing above it: gRPC is ../grpc/.

The HTTP/2 is a sans-I/O core (bytes in → calls up; commands → bytes out; no sockets, loop or clock), shared
by the server and the load tester's client (perf/hubserve_perf/grpc_h2.py):
    frames.py     RFC 9113 frame numbers, errors, serializers
    states.py     a stream's states and their transition table (§5.1)
    windows.py    flow-control windows, both directions (§6.9)
    headers.py    HPACK via `hpack`: request heads (validated, cached) and response heads; our fixed blocks
    guard.py      flood, memory and timeout policies, time passed in
    streams.py    Role, Limits, H2Stream, and the interfaces up: StreamHandler, CoreEvents
    core.py       H2Core: the receive loop, HEADERS/CONTINUATION/DATA for either role, stream opening, `send`
    control.py    its control frames: SETTINGS, PING, RST_STREAM, GOAWAY, WINDOW_UPDATE; stream errors
    outbound.py   its sending half: windows out, DATA queued for them, the outbox
    lifecycle.py  its ending half: two-step GOAWAY, connection errors, timeouts
Above the core, the server only:
    connection.py the asyncio.Protocol adapter: reads to the core, its outbox out once per loop round; a
                  `StreamApp` (frontend/grpc/call.py `GrpcApp`) opens a handler per request stream

Nothing is imported here: the load tester takes the core alone, without the server behind it.
"""
