"""Shared memory: how tensors cross between hubserve's processes, and the clients' regions (Triton's system
shared memory extension).

    regions.py       `Region` (a sealed memfd, or a client's POSIX object) with bounds-checked views, and
                     `Arena`, the ring allocator its writer carves it with: the transport under engine/ipc/
    client.py        the system shared memory extension's registry of clients' regions, by owner, then name
    requests.py      a request's tensors in clients' regions: inputs read before it queues, outputs after
    socket_owner.py  which local user owns the client's end of a TCP connection (the owner rule)
"""
