"""KServe v2 over HTTP/1.1, on our own `asyncio.BufferedProtocol` connection (llhttp parses).

    app.py             `HttpApp`: owns the connections, their one timeout sweeper, memory release, the drain
    connection.py      one HTTP/1.1 connection: dispatch in order, timeouts, flow control, writing answers
    states.py          its two states as tables: the request being read, and our answer
    reader.py          the client's side: llhttp fed, head and body limits, the access check per head
    answers.py         the answers it writes without a route: reason phrases, errors, refusals
    path.py            the one parse of a request's target: which endpoint, and so which API group
    types.py           what the connection and the routes hand each other (`HttpRequest`, `Answer`,
                       `Pending`, `ResponseStream`, `HttpLimits`)
    routes.py          `HttpRoutes`: the endpoints, and the one ErrorCode → status table (`STATUS`)
    codec.py           the v2 JSON body and the binary tensor data extension
    generate.py        the generate extension's endpoints; generate_codec.py its JSON, sse.py its events
    metrics_routes.py  the metrics port: `GET /metrics`, on connections of its own
"""
