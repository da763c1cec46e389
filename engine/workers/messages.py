"""What the engine and a frontend say to each other: plain tuples, pickled as a frame's metadata
(engine/ipc/frames.py), whose reader refuses every class: plain values only. One frame per loop round and
direction carries everything of that round.

Frontend → engine: `(requests, cancels, freed, controls, plans_reset, connections, streaming, credits)`
- a request: `(rid, plan_no, start_ns, request_id, placement, model, version[, header[, owner]])`. `header`
  (the request's inputs, requested outputs and parameters: `Header`) comes the first time the frontend sends
  a plan (its codec's cached decoding of a repeated request header, engine/types.py RequestPlan), and with
  every request that has no plan (`plan_no` 0); after that the engine has it in its plan table, and the
  model's validation verdict on it with it (None in its place when an `owner` follows: the owner id of the
  API key that sent the request, engine/types.py InferenceRequest.owner, only on a server with keys: what
  its generation's tokens_per_minute is charged to, among others). `placement` is where the input bytes are
  (engine/ipc/tensors.py).
- cancels: rids whose client left; freed: offsets of response-arena blocks the frontend is done with;
  plans_reset: the frontend dropped its plan numbers (its table is bounded), so the engine drops its table;
  connections: how many client connections the frontend has open (-1: not counted in this frame), what the
  engine hands new connections by (listen.py).
- streaming: rids of this frame's requests whose responses are streamed (`InferenceRequest.stream`): a
  decoupled model's responses before its last come back as they are sent.
- a control: `(cid, kind, args)`, everything that is not inference, run by the engine's own handlers:
  HTTP `(method, url, target, headers, body, owner, (peer, local))` (`target`: the path as the frontend parsed
  and checked it, frontend/http/path.py `HttpTarget.to_wire`; the engine routes that, and `url` serves
  messages only), gRPC `(method name, serialized request, caller)` (the API key's owner id and the
  connection's ends: engine/access/caller.py), HEALTH `[service, ...]` (what gRPC's Health/Watch reads once
  per tick for every stream of the frontend: frontend/grpc/health_watch.py).
- credits: `(cid, pieces)` for streamed answers (streams.py): that many more of the stream's pieces were
  written to its client's connection and the connection took them (credit.py); the engine sends a stream at
  most a window of pieces ahead of its credit. And `(rid, responses)` for a streaming request: its client
  took that many more of the decoupled model's responses (engine/streaming/window.py), so the model may send
  that many more. (rids and cids are numbered from one counter, so the two never meet.)

Engine → frontend: `(answers, control_answers)`
- an answer: `(rid, OK, (model_name, model_version, response_id, parameters, outputs, placement))` with
  `outputs` as `((name, datatype, shape), ...)` (`(name, datatype, shape, parameters)` for an output written
  to a client's shared-memory region, which crosses with no bytes); `(rid, FAILED, error)`;
  `(rid, CANCELLED, None)`. Every request gets exactly one answer, a cancelled one too: only then does the
  frontend reuse its input block. A decoupled model's final flag sent alone is `(rid, OK, None)`
  (engine/types.py EMPTY_FINAL).
- before it, for a streaming request, any number of `(rid, STREAMED, response)` (the OK payload) and
  `(rid, STREAMED_ERROR, error)`, in the order the model sent them.
- a control answer: `(cid, True, result)` (HTTP: the route's answer; gRPC: serialized response bytes;
  HEALTH: the status numbers, in order) or `(cid, False, error)`.

An error is `(code, message)` for an EngineError, so both protocols answer it exactly as a single process
does; anything else (a bug) crosses as `(None, its text)` and is raised there as a RuntimeError with that
text (an exception object would need a class, which the frame reader refuses).
"""

from __future__ import annotations

from typing import Any

from ..errors import EngineError, ErrorCode
from ..types import DataType, RequestedOutput

OK, FAILED, CANCELLED, STREAMED, STREAMED_ERROR = 0, 1, 2, 3, 4
HTTP, GRPC, HEALTH = 0, 1, 2

# (inputs ((name, datatype, shape, parameters), ...), outputs ((name, binary_data, parameters), ...) | None,
# parameters)
Header = tuple[tuple[tuple[str, str, tuple[int, ...], dict[str, Any]], ...],
               tuple[tuple[str, bool | None, dict[str, Any]], ...] | None, dict[str, Any]]


def error_payload(error: BaseException) -> tuple[str | None, str]:
    """An exception as it crosses, in plain values: EngineError as (code, message); anything else as (None,
    its text), which the frontend answers as the internal error a single process gives."""
    if isinstance(error, EngineError):
        return error.code.value, error.message
    return None, str(error)


def error_from_payload(payload: Any) -> BaseException:
    code, message = payload
    if code is None:
        return RuntimeError(message)
    return EngineError(ErrorCode(code), message)


def outputs_header(outputs: list[RequestedOutput] | None) -> Any:
    if outputs is None:
        return None
    return tuple((o.name, o.binary_data, o.parameters) for o in outputs)


def outputs_from_header(outputs: Any) -> list[RequestedOutput] | None:
    if outputs is None:
        return None
    return [RequestedOutput(name, binary, params) for name, binary, params in outputs]


def datatype(name: str) -> DataType:
    """A datatype's v2 name from a frame (always one the frontend's codec accepted)."""
    return DataType.from_v2(name)
