"""The multi-process server (`hubserve serve --workers N`, N >= 2): one engine process, N frontend processes.

    supervisor.py  the engine's frontends: spawn (fresh interpreters, fds passed), restart, drain
    frontend.py    a frontend process: its spec, and HTTP/1.1 and gRPC (frontend/build.py) on the connections
                   the engine hands it
    listen.py      the engine accepts and hands each connection to the frontend with the fewest open
    remote.py      the frontend's engine (frontend/engine.py's Engine): requests out, answers in, a frame per
                   round
    forwarding.py  the frontend's routes and gRPC handlers: inference here, everything else to the engine
    session.py     the engine's end of one frontend's channel: requests into the DataPlane, answers out
    control.py     the engine's answers to forwarded non-inference requests (the single-process handlers)
    messages.py    what the two sides say to each other (in the frames and tensor placement of engine/ipc/)
    streams.py     a forwarded HTTP answer that streams (the OpenAI API's events): made in the engine
    credit.py      a streamed answer's window of pieces, and the credit the frontend gives back as it reads

docs/architecture.md ("Processes") has the layout and the message flow; perf/history/workers.md the
measurements.
"""
