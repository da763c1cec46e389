"""The typed frames between the engine and its frontend processes (engine/workers/messages.py): each kind
comes back as it was sent through the frame codec (engine/ipc/frames.py), and anything else a peer could
write (a pickle naming a class, the other direction's frame, a field of the wrong type, text that is not
UTF-8) is a FrameError. A control's answer comes back as the engine's handler gave it."""

from __future__ import annotations

import os
import pickle

import pytest

from engine.errors import EngineError, ErrorCode
from engine.ipc.frames import HEAD, FrameError, FrameReader, encode_frame
from engine.workers.messages import (
    FAILED,
    OK,
    Answer,
    Control,
    ControlAnswer,
    Credit,
    EngineFrame,
    Failure,
    FrontendFrame,
    GrpcCall,
    Header,
    HealthAnswer,
    HealthCall,
    HttpAnswer,
    HttpCall,
    InputSpec,
    OutputRequest,
    OutputSpec,
    Response,
    Submit,
    control_result,
    control_value,
    decode_engine_frame,
    decode_frontend_frame,
    encode_message,
    error_from_payload,
    error_payload,
    failure,
)

METADATA_TARGET = ("MODEL_METADATA", ("v2", "models", "simple"), "", "simple", "", "")


def _wire(frame: object, inline: bytes = b"") -> bytes:
    return b"".join(bytes(part) for part in encode_frame(frame, [inline], encode_message))


def test_a_frontend_frame_comes_back_as_sent() -> None:
    header = Header((InputSpec("INPUT0", "INT32", (1, 16), {}),), (OutputRequest("OUTPUT0", True, {}),),
                    {"priority": 1})
    frame = FrontendFrame(
        [Submit(1, 1, 123, "a", (-1, ((0, 64),)), "simple", "", header, "owner-1"),
         Submit(2, 1, 456, "", (3, ((0, 64), (64, 64))), "simple", "1")],
        [7], [4096], [Control(9, HttpCall(b"GET", b"/v2/models/simple", METADATA_TARGET, {b"host": b"x"}, b"",
                                          "owner-1", ("127.0.0.1", 5000), None)),
                      Control(10, GrpcCall("ServerLive", b"\x01", "", None, ("::1", 8001))),
                      Control(11, HealthCall(["", "inference"]))],
        True, 3, [2], [Credit(9, 5)])
    [(got, inline)] = FrameReader(decode_frontend_frame).feed(_wire(frame, b"tensor"))
    assert got == frame and bytes(inline) == b"tensor"
    assert got.requests[1].header is None and got.requests[1].owner is None
    assert isinstance(got.requests[0].header.inputs[0].shape, tuple)


def test_an_engine_frame_comes_back_as_sent_and_its_output_headers_are_keys() -> None:
    specs = (OutputSpec("OUTPUT0", "INT32", (1, 16)), OutputSpec("OUTPUT1", "INT32", (1, 16)))
    frame = EngineFrame([Answer(1, OK, Response("simple", "1", "", {}, specs, (0, ((0, 64), (64, 64))))),
                         Answer(2, FAILED, failure(EngineError(ErrorCode.NOT_FOUND, "no model 'x'"))),
                         Answer(3, OK, None)],
                        [ControlAnswer(9, True, HttpAnswer(200, b"{}", b"application/json", b"")),
                         ControlAnswer(10, True, b"serialized"),
                         ControlAnswer(11, True, HealthAnswer([1, 2])),
                         ControlAnswer(12, False, Failure("NOT_FOUND", "no")), ControlAnswer(13, True, None)])
    [(got, _)] = FrameReader(decode_engine_frame).feed(_wire(frame))
    assert got == frame
    response = got.answers[0].payload
    assert isinstance(response, Response) and {response.outputs: 1}[specs] == 1  # the reads' cache key
    error = error_from_payload(got.answers[1].payload)
    assert isinstance(error, EngineError) and error.code is ErrorCode.NOT_FOUND
    assert isinstance(error_from_payload(Failure(None, "a bug")), RuntimeError)
    placed = OutputSpec("OUTPUT0", "INT32", (1, 16), {"shared_memory_region": "r"})
    with pytest.raises(TypeError):  # an output in a client's region: never a cache key
        hash(placed)


class _RunsCode:
    def __reduce__(self) -> tuple[object, ...]:
        return os.mkdir, ("/nonexistent/never-made",)


@pytest.mark.parametrize("meta", [
    pickle.dumps(((_RunsCode(),), [], [], [], False, -1)),  # what a pickle-speaking peer could send
    encode_message(EngineFrame([], [])),  # the other direction's frame
    encode_message(FrontendFrame([], [], [], [], False, "three", [], [])),  # type: ignore[arg-type]
    b"\xc1",  # not MessagePack
    # a request id whose text is not UTF-8 (msgspec raises UnicodeDecodeError, not its DecodeError, for it)
    encode_message(FrontendFrame([Submit(1, 0, 0, "request-7", (-1, ()), "simple", "")], [], [], [], False,
                                 -1, [], [])).replace(b"request-7", b"\xffequest-7"),
])
def test_anything_but_a_frontend_frame_is_a_frame_error(meta: bytes) -> None:
    with pytest.raises(FrameError, match="unreadable frame metadata"):
        FrameReader(decode_frontend_frame).feed(HEAD.pack(len(meta), len(meta)) + meta)


@pytest.mark.parametrize(("ok", "result"), [
    (True, (200, b"{}", b"application/json", b"")),  # an HTTP route's answer, its body flat
    (True, (200, None, b"text/event-stream", b"cache-control: no-cache\r\n")),  # a stream's head
    (True, b"data: {}\n\n"),  # a piece of it, or a gRPC response
    (True, None),  # a stream's end
    (True, [1, 2, 0]),  # health statuses
])
def test_a_control_answer_comes_back_as_the_handler_gave_it(ok: bool, result: object) -> None:
    frame = EngineFrame([], [ControlAnswer(5, ok, control_result(ok, result))])
    [(got, _)] = FrameReader(decode_engine_frame).feed(_wire(frame))
    [answer] = got.control_answers
    assert answer.ok is ok and control_value(answer.result) == result


def test_a_control_error_comes_back_as_its_exception() -> None:
    payload = error_payload(EngineError(ErrorCode.UNAVAILABLE, "not ready"))
    frame = EngineFrame([], [ControlAnswer(5, False, control_result(False, payload))])
    [(got, _)] = FrameReader(decode_engine_frame).feed(_wire(frame))
    error = error_from_payload(control_value(got.control_answers[0].result))
    assert isinstance(error, EngineError)
    assert (error.code, error.message) == (ErrorCode.UNAVAILABLE, "not ready")
