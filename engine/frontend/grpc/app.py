"""The gRPC server's `StreamApp`: `GrpcApp` opens a `Call` (call.py) per HTTP/2 stream and holds what the
calls of one server share: the method table and what a call's head is checked against (head.py), the
access policy, the limits (`CallLimits`), the calls whose partial message may stall (reset by `sweep`), the
streams waiting for the in-flight budget, and the process's one Health/Watch notifier with the counts its
caps read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...access.policy import AccessPolicy, LoopbackOnly
from ...memory import MemoryReturn
from ..h2.connection import H2Connection
from ..h2.frames import H2Error
from ..h2.headers import RequestHead
from ..h2.streams import H2Stream, Limits
from .api_groups import grpc_group
from .call import Call
from .handlers import GrpcHandlers
from .head import HeadRules
from .health_watch import HealthWatch
from .rpcs import rpc_table
from .stream_infer import StreamInfer


@dataclass(frozen=True, slots=True)
class CallLimits:
    """What gRPC calls may hold beyond their messages (ServerOptions; with --workers N each frontend process
    gets its share of the server-wide ones)."""

    # A ModelStreamInfer stream's requests in flight; at it, the stream is not read until one is answered.
    # Sequence clients send many sequences' requests interleaved on one stream, and a request held back
    # here can wait behind a sequence backlog: the cap is generous, and memory is bounded by the byte budget.
    max_stream_requests: int = 1024
    # grpc.health.v1 Health/Watch streams open at once (server-wide: each process holds its share), and on
    # one connection. A client's health checking watches one service per channel (gRPC's client-side
    # health checking, Envoy): a handful per connection.
    max_watches: int = 1024
    max_watches_per_connection: int = 16


class GrpcApp:
    """The StreamApp of a gRPC server: one per server, shared by its connections."""

    def __init__(self, handlers: GrpcHandlers, max_message_bytes: int, limits: Limits,
                 access: AccessPolicy | None = None, loopback_only: LoopbackOnly | None = None,
                 call_limits: CallLimits | None = None) -> None:
        self.handlers = handlers
        self.rpcs = rpc_table(handlers)
        self.access = access
        # what every call's head is checked against (head.py); loopback_only: the admin groups a peer off
        # loopback may not call (access/policy.py)
        self.head_rules = HeadRules(self.rpcs, {path: grpc_group(path) for path in self.rpcs},
                                    limits.max_header_list_bytes, loopback_only, access)
        self.max_message_bytes = max_message_bytes
        self.client_timeout_secs = limits.client_timeout_secs
        self.call_limits = call_limits or CallLimits()
        self.partial: set[Call] = set()  # calls holding part of a message: `sweep` resets those that stall
        # streams whose next message waits for room in the in-flight budget, oldest first (`budget_freed`)
        self.budget_waiting: dict[StreamInfer, None] = {}
        self.memory = MemoryReturn()  # large request buffers let go, for the server's sweeper to trim after
        # every Health/Watch stream of this process, served by one notifier; and how many are open, in all
        # and per connection (CallLimits caps both)
        self.health = HealthWatch(handlers.watch_statuses)
        self.watches = 0
        self.connection_watches: dict[H2Connection, int] = {}

    def open_stream(self, conn: H2Connection, stream: H2Stream, head: RequestHead) -> Call:
        return Call(self, conn, stream, head)

    def sweep(self, now: float) -> None:
        """Called by the server's sweeper about once a second: a call whose partial message got no DATA for
        the client timeout is reset (RST_STREAM CANCEL), which drops its buffer."""
        timeout = self.client_timeout_secs
        for call in list(self.partial):
            if call.fed:
                call.fed = False
                call.fed_at = now
            elif now - call.fed_at >= timeout > 0:
                call.conn.reset_stream(call.stream, H2Error.CANCEL, "no DATA within the client timeout")
                call.reset()  # (already done through the connection unless the stream was closed)
        self.budget_freed()  # bytes an HTTP request gave back, too

    def open_watch(self, conn: H2Connection) -> str:
        """Count a new Health/Watch stream on `conn`; why not, when it is over a cap ("" when counted)."""
        limits = self.call_limits
        on_conn = self.connection_watches.get(conn, 0)
        if on_conn >= limits.max_watches_per_connection:
            return (f"this connection has {on_conn} Health/Watch streams open, the most one may have: "
                    "watch each service once")
        if self.watches >= limits.max_watches:
            return ("the server holds as many Health/Watch streams as it may (--grpc-max-health-watches): "
                    "retry later, or use Health/Check")
        self.watches += 1
        self.connection_watches[conn] = on_conn + 1
        return ""

    def close_watch(self, conn: H2Connection) -> None:
        self.watches -= 1
        left = self.connection_watches.get(conn, 1) - 1
        if left > 0:
            self.connection_watches[conn] = left
        else:
            self.connection_watches.pop(conn, None)

    def budget_freed(self) -> None:
        """Bytes of the in-flight budget came back: streams waiting to reserve their next message read on,
        oldest first, while it fits."""
        if not self.budget_waiting or self.access is None or self.access.budget is None:
            return
        budget = self.access.budget
        for call in list(self.budget_waiting):
            if budget.used + call.streaming.waiting_bytes > budget.limit:
                return
            call.read_on()
