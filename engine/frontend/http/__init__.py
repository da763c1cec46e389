"""KServe v2 over HTTP/1.1, on our own `asyncio.Protocol` connection (llhttp parses).

    app.py             `HttpApp`: owns the connections, their one timeout sweeper, memory release, the drain
    connection.py      one HTTP/1.1 connection: parsing, limits, timeouts, flow control, writing answers
    path.py            the one parse of a request's target: which endpoint, and so which API group
    types.py           what the connection and the routes hand each other (`HttpRequest`, `Answer`,
                       `Pending`, `ResponseStream`, `HttpLimits`)
    routes.py          `HttpRoutes`: the endpoints, and the one ErrorCode → status table (`STATUS`)
    codec.py           the v2 JSON body and the binary tensor data extension
    generate.py        the generate extension's endpoints; generate_codec.py its JSON, sse.py its events
    metrics_routes.py  the metrics port: `GET /metrics`, on connections of its own
"""
