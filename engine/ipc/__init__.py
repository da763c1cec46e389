"""The frames and tensor placement that both process channels speak: engine ↔ frontend processes
(engine/workers/) and engine ↔ Python-model instance processes (engine/backends/python/).

    frames.py      the frame codec: head, metadata in the channel's own typed codec, inline bytes, and the
                   sans-I/O FrameReader
    tensors.py     where a message's tensor bytes go (one shared-memory arena block, or inline) and the numpy
                   views a receiver makes of them, with the peer's blocks freed when the last view dies

Only the codec lives here: each channel keeps its own I/O (asyncio protocols for the frontends, blocking
sockets with reader and writer threads for the Python instances) and its own message shapes.
engine/shm/regions.py is the memory underneath (regions, arenas); this package is the wire format over it.
"""
