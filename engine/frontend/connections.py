"""How many connections the server holds, in all and from one client address: a flood of connections that
send nothing costs file descriptors, buffers and sweeper work, and the limits keep one client from taking
what every other client needs.

One `ConnectionCounter` per process serves both protocols (HTTP/1.1 and gRPC count together); the metrics
port has one of its own, with its own limits (frontend/http/metrics_routes.py). A connection over a limit is
answered at once in its protocol's form, then closed: HTTP 503 with the JSON error, gRPC a GOAWAY with
ENHANCE_YOUR_CALM and the message (tritonclient reports it as UNAVAILABLE). With `--workers N` each frontend
process enforces its share of each limit (the limit divided by N, rounded up): the engine hands connections
to the frontend with the fewest, so one client's connections spread over all of them.

The counter is a pure policy object (no sockets, no event loop); `close_refused` is how both protocols end
a refused connection.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
from dataclasses import dataclass
from typing import Any

# A refused connection is half-closed (our answer, then FIN) and kept this long before the close, reading and
# discarding: closed at once with the client's first bytes unread, the kernel would reset the connection,
# and a reset can destroy the answer before the client reads it. At most MAX_LINGERING linger at once; past
# that, a flood's connections are closed at once.
REFUSED_LINGER_SECS = 1.0
MAX_LINGERING = 256


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 4096  # --max-connections (0 = no limit)
    max_per_client: int = 1024  # --max-connections-per-client (0 = no limit)
    flag: str = "--max-connections"  # the flags a refusal names: this, and this with "-per-client"

    def share(self, processes: int) -> ConnectionLimits:
        """One of `processes` frontends' part of these limits."""
        def part(limit: int) -> int:
            return math.ceil(limit / processes) if limit else 0

        return ConnectionLimits(part(self.max_connections), part(self.max_per_client), self.flag)


class ConnectionCounter:
    def __init__(self, limits: ConnectionLimits, processes: int = 1,
                 max_lingering: int = MAX_LINGERING) -> None:
        """`max_lingering`: how many refused connections may linger at once (each holds a descriptor for
        up to REFUSED_LINGER_SECS); past it they are closed at once."""
        self.limits = limits
        self._processes = processes
        self._own = limits.share(processes) if processes > 1 else limits
        self._open = 0
        self._by_client: dict[str, int] = {}
        self.lingering = 0  # refused connections half-closed, not yet closed (close_refused)
        self.max_lingering = max_lingering

    @property
    def open(self) -> int:
        return self._open

    def admit(self, client: str) -> str:
        """Count a new connection from `client` (its address, without the port) and return "", or return
        why it is refused (it is then not counted)."""
        own = self._own
        if own.max_connections and self._open >= own.max_connections:
            return (f"too many connections: the server holds {self.limits.max_connections} at most "
                    f"({self.limits.flag})")
        held = self._by_client.get(client, 0)
        if own.max_per_client and held >= own.max_per_client:
            return (f"too many connections from {client}: {self.limits.max_per_client} at most per client "
                    f"address ({self.limits.flag}-per-client)")
        self._open += 1
        self._by_client[client] = held + 1
        return ""

    def release(self, client: str) -> None:
        """A connection `admit` counted has closed."""
        self._open -= 1
        held = self._by_client.get(client, 0) - 1
        if held > 0:
            self._by_client[client] = held
        else:
            self._by_client.pop(client, None)


def close_refused(transport: Any, counter: ConnectionCounter) -> None:
    """End a refused connection whose answer is written: half-close and linger (see REFUSED_LINGER_SECS), or
    close at once while the counter's `max_lingering` already linger or the transport cannot half-close
    (TLS)."""
    if counter.lingering >= counter.max_lingering or not transport.can_write_eof():
        transport.close()
        return
    counter.lingering += 1
    transport.write_eof()

    def close() -> None:
        counter.lingering -= 1
        transport.close()

    asyncio.get_running_loop().call_later(REFUSED_LINGER_SECS, close)


def client_of(peername: object) -> str:
    """The client address a transport's peername names ("" for a peer that has none, e.g. a Unix socket)."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return ""


def is_loopback(peername: object) -> bool:
    """Whether a transport's peer is on this machine's loopback (127.0.0.0/8, ::1, or 127.x mapped into IPv6):
    who may call the admin groups by default (engine/access/policy.py LoopbackOnly). A peer with no address (a
    Unix socket) or one that does not parse is not: the default errs on the closed side. Asked once per
    connection. With --workers N the frontend process asks it of the client's own socket, handed over by the
    engine, so it is the real peer."""
    host = client_of(peername)
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 zone id ("fe80::1%eth0") aside
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # Python 3.11 does not count ::ffff:127.0.0.1 as loopback
    return address.is_loopback


__all__ = ["MAX_LINGERING", "ConnectionCounter", "ConnectionLimits", "client_of", "close_refused",
           "is_loopback"]
