"""Wire formats only: the protocols' codecs and servers. The only package that knows a transport.

    http/         KServe v2 over our HTTP/1.1: connections, the one parse of a path, routes, codecs, the
                  generate extension and its server-sent events, the metrics port
    openai/       the OpenAI API's HTTP side (/v1): its routes, streamed generations, the Batch API's routes
    grpc/         KServe v2 and grpc.health.v1 over gRPC: calls, the method table, messages, the per-RPC
                  handlers, the codec, Health/Watch, the listener
    h2/           our HTTP/2, and nothing else: a sans-I/O core (shared with the load tester's client) and
                  its asyncio adapter
    endpoints.py  the endpoint table: every HTTP endpoint and gRPC method, its handler, API group, where it
                  runs with --workers N and whether its client leaving cancels it; the matcher of a path
    engine.py     the engine seam: what the frontends call on the engine (the DataPlane, or the workers'
                  engine client), as a Protocol
    options.py    what a process's frontends are built from, one frozen value per component
    build.py      the one place a process's HTTP and gRPC frontends are built, in either layout
    wire.py       tensor bytes on the wire, shared by both protocols, and what one request may hold
    compression.py, connections.py, tls.py
                  what both protocols share: gzip/deflate, connection counts, TLS contexts
"""
