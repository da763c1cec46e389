"""One exception type for the whole engine, with transport-neutral codes.

The core raises `EngineError(code, message)`; each frontend owns exactly one table that maps
`ErrorCode` to its status codes (HTTP status, gRPC `StatusCode`). Nothing here knows a transport.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    INVALID_ARG = "INVALID_ARG"          # the request is wrong; the client must change it
    NOT_FOUND = "NOT_FOUND"              # no such model, version or endpoint
    UNAVAILABLE = "UNAVAILABLE"          # exists but cannot serve now (loading, unloading, broken)
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # queue full: try again later
    UNSUPPORTED = "UNSUPPORTED"          # a feature this server does not implement
    # A feature asked for through an endpoint that exists, which this server was started without (client
    # shared memory without --allow-client-shm): HTTP 400, gRPC FAILED_PRECONDITION
    # (frontend/grpc/handlers.py STATUS).
    NOT_ENABLED = "NOT_ENABLED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"              # the client went away or a timeout rejected the request
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    INTERNAL = "INTERNAL"                # a bug or a backend failure; the message says which


class EngineError(Exception):
    """An error with a message a user can act on, e.g. "input 'INPUT0' expects INT32, got FP32"."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"EngineError({self.code.name}, {self.message!r})"


def invalid(message: str) -> EngineError:
    return EngineError(ErrorCode.INVALID_ARG, message)


def not_found(message: str) -> EngineError:
    return EngineError(ErrorCode.NOT_FOUND, message)


def unavailable(message: str) -> EngineError:
    return EngineError(ErrorCode.UNAVAILABLE, message)


def unserved_extension(extension: str, operation: str) -> EngineError:
    """The one answer of both protocols to an endpoint or RPC of a KServe v2 / Triton extension hubserve does
    not serve (HTTP 501, gRPC UNIMPLEMENTED): `extension` in Triton's name for it (core src/server.cc),
    `operation` the endpoint or RPC that was called."""
    return EngineError(ErrorCode.UNSUPPORTED, f"hubserve does not implement the {extension} extension "
                                              f"({operation})")


# A request that wants one response, to a decoupled model (which streams 0..N). Triton answers gRPC ModelInfer
# UNIMPLEMENTED "ModelInfer RPC doesn't support ..." and HTTP 501 "HTTP end point doesn't support ..." (server
# src/grpc/infer_handler.cc, src/http_server.cc): the engine says "this request", each frontend puts its
# own endpoint in front (`decoupled_unary_message`).
DECOUPLED_UNARY = "doesn't support models with decoupled transaction policy"
_DECOUPLED_UNARY_DEFAULT = f"this request {DECOUPLED_UNARY}"


def decoupled_unary() -> EngineError:
    return EngineError(ErrorCode.UNSUPPORTED, _DECOUPLED_UNARY_DEFAULT)


def endpoint_message(error: EngineError, endpoint: str) -> str:
    """The message a frontend answers `error` with: the decoupled refusal naming `endpoint` (Triton's words),
    any other error as it is."""
    if error.message == _DECOUPLED_UNARY_DEFAULT:
        return f"{endpoint} {DECOUPLED_UNARY}"
    return error.message
