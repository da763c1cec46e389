"""What the engine and a frontend say to each other: one typed message per frame kind, encoded with msgspec.

One frame per loop round and direction carries everything of that round: a `FrontendFrame` from a frontend
to the engine, an `EngineFrame` back (engine/ipc/frames.py puts each in a frame, tensor bytes inline after
it). Each is a `msgspec.Struct` encoded as a MessagePack array (array_like: no field names on the wire) and
tagged with its kind; the items in them are Structs too. Decoding checks every field's type, so a frontend
that is compromised or broken can make the engine run no code by what it sends, only break its own channel
(FrameError, upon which the channel is closed), as the plain-values pickle did before.

The non-inference requests (`Control`) carry one typed call per kind (`HttpCall`, `GrpcCall`, `HealthCall`)
for the engine's own handlers (control.py), and their answers (`ControlAnswer`) one typed result per kind of
answer (`HttpAnswer`, serialized gRPC bytes or a streamed piece, `HealthAnswer`, `Failure`).

Errors keep their code and message (`Failure`; `error_payload` for a control), so both protocols answer them
exactly as a single process does; anything else (a bug) crosses with no code and is raised there as a
RuntimeError with its text (an exception object would need a class, which neither decoder accepts).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..errors import EngineError, ErrorCode
from ..ipc.frames import FrameError
from ..ipc.tensors import Placement
from ..types import DataType, RequestedOutput

OK, FAILED, CANCELLED, STREAMED, STREAMED_ERROR = 0, 1, 2, 3, 4
Address = tuple[str, int]  # engine/access/caller.py's


class InputSpec(msgspec.Struct, array_like=True, frozen=True):
    """A request input's header: where its bytes are is the request's placement."""

    name: str
    datatype: str  # its v2 name
    shape: tuple[int, ...]
    parameters: dict[str, Any]


class OutputRequest(msgspec.Struct, array_like=True, frozen=True):
    """A requested output (engine/types.py RequestedOutput)."""

    name: str
    binary_data: bool | None
    parameters: dict[str, Any]


class Header(msgspec.Struct, array_like=True, frozen=True):
    """A request's inputs, requested outputs (None: all) and parameters: what a codec's plan caches."""

    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputRequest, ...] | None
    parameters: dict[str, Any]


class Submit(msgspec.Struct, array_like=True):
    """One inference request. `header` comes the first time the frontend sends a plan (its codec's cached
    decoding of a repeated request header, engine/types.py RequestPlan), and with every request that has no
    plan (`plan_no` 0); after that the engine has it in its plan table, with the model's validation verdict
    on it. `owner`: the owner id of the API key that sent it (engine/types.py InferenceRequest.owner), only
    on a server with keys: what its generation's tokens_per_minute is charged to, among others.
    `placement`: where the input bytes are (engine/ipc/tensors.py)."""

    rid: int
    plan_no: int
    start_ns: int
    request_id: str
    placement: Placement
    model: str
    version: str
    header: Header | None = None
    owner: str | None = None


class HttpCall(msgspec.Struct, array_like=True, frozen=True, tag=0):
    """An HTTP request for the engine's HttpRoutes, as the frontend's connection read it. `target`: the path
    as the frontend parsed and checked it (frontend/http/path.py `HttpTarget.to_wire`); the engine routes
    that, and `url` serves messages only. `owner`: the API key's owner id ("" without keys); `peer` and
    `local`: the connection's ends (engine/access/caller.py; None where it has none)."""

    method: bytes
    url: bytes
    target: tuple[str, tuple[str, ...], str, str, str, str]
    headers: dict[bytes, bytes]
    body: bytes
    owner: str
    peer: Address | None
    local: Address | None


class GrpcCall(msgspec.Struct, array_like=True, frozen=True, tag=1):
    """A unary gRPC method for the engine's GrpcHandlers: its name, the serialized request and the caller
    (as `HttpCall` has it)."""

    method: str
    request: bytes
    owner: str
    peer: Address | None
    local: Address | None


class HealthCall(msgspec.Struct, array_like=True, frozen=True, tag=2):
    """What gRPC's Health/Watch reads once per tick for every stream of the frontend
    (frontend/grpc/health_watch.py): these services' statuses."""

    services: list[str]


class Control(msgspec.Struct, array_like=True):
    """Everything that is not inference, run by the engine's own handlers (control.py)."""

    cid: int
    call: HttpCall | GrpcCall | HealthCall


class Credit(msgspec.Struct, array_like=True):
    """`(cid, pieces)` for a streamed answer (streams.py): that many more of the stream's pieces were
    written to its client's connection and the connection took them (credit.py); the engine sends a stream
    at most a window of pieces ahead of its credit. Or `(rid, responses)` for a streaming request: its client
    took that many more of the decoupled model's responses (engine/streaming/window.py), so the model may
    send that many more. (rids and cids are numbered from one counter, so the two never meet.)"""

    id: int
    count: int


class FrontendFrame(msgspec.Struct, array_like=True, tag=0):
    """Frontend → engine, one per round. `cancels`: rids (or cids) whose client left; `freed`: offsets of
    response-arena blocks the frontend is done with; `plans_reset`: the frontend dropped its plan numbers
    (its table is bounded), so the engine drops its table; `connections`: how many client connections the
    frontend has open (-1: not counted in this frame), what the engine hands new connections by (listen.py);
    `streaming`: rids of this frame's requests whose responses are streamed (`InferenceRequest.stream`): a
    decoupled model's responses before its last come back as they are sent."""

    requests: list[Submit]
    cancels: list[int]
    freed: list[int]
    controls: list[Control]
    plans_reset: bool
    connections: int
    streaming: list[int]
    credits: list[Credit]


class OutputSpec(msgspec.Struct, array_like=True, frozen=True):
    """An answer's output. `parameters` only for an output written to a client's shared-memory region,
    which crosses with no bytes (its parameters say where); such a spec cannot be hashed (a dict in it)."""

    name: str
    datatype: str  # its v2 name
    shape: tuple[int, ...]
    parameters: dict[str, Any] | None = None


class Response(msgspec.Struct, array_like=True, tag=0):
    """An inference response; its output bytes are at `placement` (engine/ipc/tensors.py)."""

    model_name: str
    model_version: str
    response_id: str
    parameters: dict[str, Any]
    outputs: tuple[OutputSpec, ...]
    placement: Placement


class Failure(msgspec.Struct, array_like=True, tag=1):
    """An error as it crosses: an EngineError's code and message, or no code and the text of a bug."""

    code: str | None
    message: str


class Answer(msgspec.Struct, array_like=True):
    """A request's answer: `(rid, OK, Response)`, `(rid, FAILED, Failure)`, `(rid, CANCELLED, None)`. Every
    request gets exactly one, a cancelled one too: only then does the frontend reuse its input block. A
    decoupled model's final flag sent alone is `(rid, OK, None)` (engine/types.py EMPTY_FINAL). Before it,
    for a streaming request, any number of `(rid, STREAMED, Response)` and `(rid, STREAMED_ERROR,
    Failure)`, in the order the model sent them."""

    rid: int
    status: int
    payload: Response | Failure | None


class HttpAnswer(msgspec.Struct, array_like=True, frozen=True, tag=2):
    """An HTTP route's answer (frontend/http/types.py `Answer`, its body in one piece), or with `body` None
    the head of an answer whose body follows in pieces (streams.py `StreamHead`)."""

    status: int
    body: bytes | None
    content_type: bytes
    extra: bytes  # more header lines, as the route wrote them


class HealthAnswer(msgspec.Struct, array_like=True, frozen=True, tag=3):
    """A `HealthCall`'s statuses, one per service in order."""

    statuses: list[int]


class ControlAnswer(msgspec.Struct, array_like=True):
    """A control's answer: an HTTP route's (`HttpAnswer`), a gRPC method's serialized response (bytes), a
    `HealthAnswer`, or the error (`Failure`). A streamed HTTP answer comes as its head (`HttpAnswer`, body
    None), its pieces (bytes) and then None, its end. `ok` is false for a `Failure` alone."""

    cid: int
    ok: bool
    result: HttpAnswer | HealthAnswer | Failure | bytes | None


class EngineFrame(msgspec.Struct, array_like=True, tag=1):
    """Engine → frontend, one per round: the round's answers and control answers."""

    answers: list[Answer]
    control_answers: list[ControlAnswer]


_encoder = msgspec.msgpack.Encoder()
_frontend_frames = msgspec.msgpack.Decoder(FrontendFrame)
_engine_frames = msgspec.msgpack.Decoder(EngineFrame)
encode_message = _encoder.encode


def decode_frontend_frame(data: memoryview) -> FrontendFrame:
    """A frontend's frame, as the engine's FrameReader decodes it; FrameError for anything else."""
    try:
        return _frontend_frames.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:  # text that is not UTF-8 raises the latter
        raise FrameError(f"unreadable frame metadata: {e}") from None


def decode_engine_frame(data: memoryview) -> EngineFrame:
    """The engine's frame, as a frontend's FrameReader decodes it; FrameError for anything else."""
    try:
        return _engine_frames.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise FrameError(f"unreadable frame metadata: {e}") from None


def control_result(ok: bool, result: Any) -> HttpAnswer | HealthAnswer | Failure | bytes | None:
    """A control's answer as control.py replies it (`Reply`), typed for the frame: called by the engine's
    session for each answer and each piece of a streamed one."""
    if not ok:
        return Failure(*result)  # error_payload's
    if result is None or isinstance(result, bytes):
        return result  # a gRPC response, a streamed piece, a stream's end
    if isinstance(result, list):
        return HealthAnswer(result)
    status, body, content_type, extra = result  # an HTTP Answer (its body flat) or a StreamHead
    return HttpAnswer(status, body, content_type, extra)


def control_value(result: HttpAnswer | HealthAnswer | Failure | bytes | None) -> Any:
    """A control's answer as the frontend's callers take it (forwarding.py): an HTTP answer or stream head as
    the route's tuple, health statuses as their list; the rest as it came."""
    if isinstance(result, HttpAnswer):
        return result.status, result.body, result.content_type, result.extra
    if isinstance(result, HealthAnswer):
        return result.statuses
    return result


def error_payload(error: BaseException) -> tuple[str | None, str]:
    """An exception as it crosses in a control answer, in plain values: EngineError as (code, message);
    anything else as (None, its text), which the frontend answers as the internal error a single process
    gives."""
    if isinstance(error, EngineError):
        return error.code.value, error.message
    return None, str(error)


def failure(error: BaseException) -> Failure:
    """An exception as it crosses in an answer (`error_payload`'s values)."""
    return Failure(*error_payload(error))


def error_from_payload(payload: Failure | Any) -> BaseException:
    """The exception a frontend raises for an answer's `Failure` (or `error_payload`'s pair)."""
    code, message = (payload.code, payload.message) if isinstance(payload, Failure) else payload
    if code is None:
        return RuntimeError(message)
    return EngineError(ErrorCode(code), message)


def outputs_header(outputs: list[RequestedOutput] | None) -> tuple[OutputRequest, ...] | None:
    if outputs is None:
        return None
    return tuple(OutputRequest(o.name, o.binary_data, o.parameters) for o in outputs)


def outputs_from_header(outputs: tuple[OutputRequest, ...] | None) -> list[RequestedOutput] | None:
    if outputs is None:
        return None
    return [RequestedOutput(o.name, o.binary_data, o.parameters) for o in outputs]


def datatype(name: str) -> DataType:
    """A datatype's v2 name from a frame (always one the frontend's codec accepted)."""
    return DataType.from_v2(name)
