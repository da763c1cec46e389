"""OpenAI's error object and statuses: `{"error": {"message", "type", "param", "code"}}`.

The API layer raises `OpenAIError` for what it checks itself (a field's type, the context length), and maps
the engine's `EngineError`s once, here (`from_engine`), the way each frontend maps codes once.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import EngineError, ErrorCode

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER = "server_error"
UNAVAILABLE = "service_unavailable_error"
RATE_LIMIT = "rate_limit_error"
NOT_IMPLEMENTED = "not_implemented_error"


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, type_: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None, retry_after_secs: int = 0) -> None:
        super().__init__(message)
        self.retry_after_secs = retry_after_secs  # > 0: answered with a Retry-After header
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def json(self) -> bytes:
        return orjson.dumps(self.body())


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, INVALID_REQUEST, param, code)


def model_not_found(name: str, detail: str = "") -> OpenAIError:
    message = f"The model '{name}' does not exist" + (f": {detail}" if detail else "")
    return OpenAIError(404, message, INVALID_REQUEST, "model", "model_not_found")


# ErrorCode → (status, type, code)
_ENGINE = {
    ErrorCode.INVALID_ARG: (400, INVALID_REQUEST, None),
    ErrorCode.NOT_FOUND: (404, INVALID_REQUEST, "model_not_found"),
    ErrorCode.UNAVAILABLE: (503, UNAVAILABLE, "model_not_ready"),
    ErrorCode.RESOURCE_EXHAUSTED: (429, RATE_LIMIT, "rate_limit_exceeded"),
    ErrorCode.UNSUPPORTED: (501, NOT_IMPLEMENTED, None),
    ErrorCode.ALREADY_EXISTS: (409, INVALID_REQUEST, "request_id_in_use"),
    ErrorCode.CANCELLED: (499, INVALID_REQUEST, "cancelled"),
    ErrorCode.DEADLINE_EXCEEDED: (504, SERVER, "timeout"),
    ErrorCode.INTERNAL: (500, SERVER, None),
}


def from_engine(error: EngineError, param: str | None = None) -> OpenAIError:
    status, type_, code = _ENGINE[error.code]
    if error.code is ErrorCode.NOT_FOUND:
        param = "model"
    return OpenAIError(status, error.message, type_, param, code)
