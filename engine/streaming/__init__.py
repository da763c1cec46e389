"""A request's responses as a stream, for every model: what the streaming frontends build on.

    responses.py  `infer_stream(submit, request)`: one request in, its responses out as an async iterator
    window.py     `StreamWindow`: flow control between the stream's consumer and a decoupled model's sends
"""
