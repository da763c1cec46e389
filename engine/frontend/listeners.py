"""The server's ports, bound before any model loads, so a port that is taken, or one port given to two flags,
fails the start at once with one line that names the flag (not a traceback after every model has loaded).

Called by engine/server.py (`Server.start`, first thing, in either process layout); the frontends then serve
on these sockets. They listen from the start: a port bound but not listening could be bound a second time
(SO_REUSEADDR lets two sockets bind one port until one listens), so a second server starting beside the first
would pass this check and fail only after its models had loaded. A client that connects while the models load
waits in the kernel's queue and is answered once the frontends serve.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from .grpc.server import bind_listeners


class PortError(Exception):
    """A port the server cannot listen on. The message is the whole line to print: it names the flag, the
    port and what to do. For EADDRINUSE it says "address already in use" (the test harness starts the
    server again on other ports when it reads that)."""


@dataclass(frozen=True, slots=True)
class Listeners:
    """Each port's listening sockets, one per address the host resolves to; `metrics` is empty when
    --metrics-port is 0 (metrics off). The frontends take them over; whoever serves a socket closes it."""

    http: list[socket.socket]
    grpc: list[socket.socket]
    metrics: list[socket.socket]

    @property
    def http_port(self) -> int:
        return _port_of(self.http)

    @property
    def grpc_port(self) -> int:
        return _port_of(self.grpc)

    @property
    def metrics_port(self) -> int:
        return _port_of(self.metrics) if self.metrics else 0


def bind_ports(host: str, http_port: int, grpc_port: int, metrics_port: int) -> Listeners:
    """Bind the HTTP, gRPC and metrics ports (metrics only when `metrics_port` is not 0; port 0 for HTTP or
    gRPC = any free one). Raises PortError, holding nothing, when two flags give the same port or a bind
    fails."""
    flags = [("--http-port", http_port), ("--grpc-port", grpc_port)]
    if metrics_port:
        flags.append(("--metrics-port", metrics_port))
    first: dict[int, str] = {}
    for flag, port in flags:
        if port and port in first:
            raise PortError(f"{flag} {port} is also {first[port]}: each port serves one protocol, so give "
                            f"{flag} a port of its own")
        first.setdefault(port, flag)
    bound: list[list[socket.socket]] = []
    try:
        for flag, port in flags:
            try:
                bound.append(bind_listeners(host, port))
            except OSError as e:
                raise PortError(_why(flag, port, host, e)) from None
    except PortError:
        for sockets in bound:
            for sock in sockets:
                sock.close()
        raise
    return Listeners(bound[0], bound[1], bound[2] if metrics_port else [])


def _port_of(sockets: list[socket.socket]) -> int:
    return int(sockets[0].getsockname()[1])


def _why(flag: str, port: int, host: str, error: OSError) -> str:
    if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
        return f"--host {host}: cannot listen on this address ({error.strerror}); --host 0.0.0.0 listens " \
               "on every IPv4 address of this machine"
    where = f"{flag} {port} (on {host})"
    if error.errno == errno.EADDRINUSE:
        return f"{where}: address already in use by another process; stop it, or give {flag} another " \
               "port (0: any free one)"
    if error.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need privileges); give {flag} a port of 1024 " \
               "or more"
    return f"{where}: {error.strerror or error}"


__all__ = ["Listeners", "PortError", "bind_ports"]
