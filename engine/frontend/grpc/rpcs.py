"""The gRPC side of the wire (grpc/doc/PROTOCOL-HTTP2.md): the methods we serve, by `:path`, built from the
endpoint table (frontend/endpoints.py); the fixed
response header blocks; status trailers and a refusal's message; `grpc-timeout`. Used by call.py's Call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...access.policy import Refusal
from ...proto import grpc_service_pb2, health_pb2
from ..endpoints import GRPC_BY_PATH, Kind
from ..h2.headers import indexed, literal
from .handlers import GrpcHandlers

# RFC 7541 Appendix A: static index 8 is ":status: 200", 31 the name "content-type".
RESPONSE_HEAD = indexed(8) + literal(31, b"application/grpc")
OK_TRAILERS = literal(b"grpc-status", b"0")
TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0,
                 ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}


@dataclass(frozen=True, slots=True)
class Rpc:
    kind: Kind
    request_type: Any  # the generated message class
    handler: Callable[..., Any]
    caller: bool = False  # a unary handler that takes the call's Caller too (client shared memory)


def rpc_table(handlers: GrpcHandlers) -> dict[bytes, Rpc]:
    """`:path` → Rpc for every method the services declare, each as its row in the endpoint table says. A
    method without a row, a row without a method, or a streaming method its row calls unary fails here, at
    start."""
    table = {}
    for module in (grpc_service_pb2, health_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():  # type: ignore[attr-defined]
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}".encode()
                row = GRPC_BY_PATH.get(path)
                if row is None:
                    raise TypeError(f"no row in the endpoint table for RPC {method.full_name}")
                if row.kind is Kind.UNARY and (method.client_streaming or method.server_streaming):
                    raise TypeError(f"streaming RPC {method.full_name} has a unary row")
                request_type = getattr(module, method.input_type.name)
                table[path] = Rpc(row.kind, request_type, getattr(handlers, row.handler), row.caller)
    if missing := GRPC_BY_PATH.keys() - table.keys():
        raise TypeError(f"rows for RPCs no service declares: {sorted(missing)}")
    return table


def percent_encode(message: str) -> bytes:
    """grpc-message is percent-encoded UTF-8: bytes outside 0x20-0x7E, and '%', become %XX."""
    return b"".join(b"%%%02X" % b if b < 0x20 or b > 0x7E or b == 0x25 else bytes((b,))
                    for b in message.encode("utf-8"))


def status_block(status: int, message: str, trailers_only: bool, http_status: int = 200) -> bytes:
    block = literal(b"grpc-status", b"%d" % status)
    if message:
        block += literal(b"grpc-message", percent_encode(message))
    if not trailers_only:
        return block
    head = (RESPONSE_HEAD if http_status == 200
            else literal(8, b"%d" % http_status) + literal(31, b"application/grpc"))
    return head + block


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout: at most 8 digits and a unit (H M S m u n), in seconds; None if malformed."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit() or value[-1] not in TIMEOUT_UNITS:
        return None
    return int(value[:-1]) * TIMEOUT_UNITS[value[-1]]


def with_retry(refusal: Refusal) -> str:
    """A refusal's message; a quota's says when to retry (gRPC has no Retry-After)."""
    if refusal.retry_after_secs:
        return f"{refusal.message} (retry after {refusal.retry_after_secs} s)"
    return refusal.message
