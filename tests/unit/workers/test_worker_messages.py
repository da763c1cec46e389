"""The typed frames between the engine and its frontend processes (engine/workers/messages.py): each kind
comes back as it was sent through the frame codec (engine/ipc/frames.py), and anything else a peer could
write (a pickle naming a class, the other direction's frame, a field of the wrong type, text that is not
UTF-8) is a FrameError."""

from __future__ import annotations

import os
import pickle

import pytest

from engine.errors import EngineError, ErrorCode
from engine.ipc.frames import HEAD, FrameError, FrameReader, encode_frame
from engine.workers.messages import (
    FAILED,
    HTTP,
    OK,
    Answer,
    Control,
    ControlAnswer,
    Credit,
    EngineFrame,
    Failure,
    FrontendFrame,
    Header,
    InputSpec,
    OutputRequest,
    OutputSpec,
    Response,
    Submit,
    decode_engine_frame,
    decode_frontend_frame,
    encode_message,
    error_from_payload,
    failure,
)


def _wire(frame: object, inline: bytes = b"") -> bytes:
    return b"".join(bytes(part) for part in encode_frame(frame, [inline], encode_message))


def test_a_frontend_frame_comes_back_as_sent() -> None:
    header = Header((InputSpec("INPUT0", "INT32", (1, 16), {}),), (OutputRequest("OUTPUT0", True, {}),),
                    {"priority": 1})
    frame = FrontendFrame(
        [Submit(1, 1, 123, "a", (-1, ((0, 64),)), "simple", "", header, "owner-1"),
         Submit(2, 1, 456, "", (3, ((0, 64), (64, 64))), "simple", "1")],
        [7], [4096], [Control(9, HTTP, b"args")], True, 3, [2], [Credit(9, 5)])
    [(got, inline)] = FrameReader(decode_frontend_frame).feed(_wire(frame, b"tensor"))
    assert got == frame and bytes(inline) == b"tensor"
    assert got.requests[1].header is None and got.requests[1].owner is None
    assert isinstance(got.requests[0].header.inputs[0].shape, tuple)


def test_an_engine_frame_comes_back_as_sent_and_its_output_headers_are_keys() -> None:
    specs = (OutputSpec("OUTPUT0", "INT32", (1, 16)), OutputSpec("OUTPUT1", "INT32", (1, 16)))
    frame = EngineFrame([Answer(1, OK, Response("simple", "1", "", {}, specs, (0, ((0, 64), (64, 64))))),
                         Answer(2, FAILED, failure(EngineError(ErrorCode.NOT_FOUND, "no model 'x'"))),
                         Answer(3, OK, None)],
                        [ControlAnswer(9, True, b"result")])
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
