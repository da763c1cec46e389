"""engine/frontend/http/generate.py `stream_responses`: what generate_stream writes for a sequence of
responses, driven by small async generators standing in for the engine's stream (several responses, a
flag-only final one, an error mid-stream: what decoupled models will produce), and a recording
ResponseStream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from engine.errors import EngineError, ErrorCode
from engine.frontend.http.generate import StreamedResponse, stream_responses
from engine.frontend.http.sse import CONTENT_TYPE
from engine.types import DataType, InferenceResponse, Tensor


class Recorder:
    """A ResponseStream that keeps what it was given."""

    def __init__(self) -> None:
        self.head: tuple[int, bytes] | None = None
        self.sent: list[bytes] = []

    def start(self, status: int, content_type: bytes) -> None:
        assert self.head is None, "start twice"
        self.head = (status, content_type)

    def send(self, data: bytes) -> None:
        assert self.head is not None, "send before start"
        self.sent.append(data)

    async def drain(self) -> None:
        await asyncio.sleep(0)


def text(value: str, final: bool = False) -> StreamedResponse:
    out = Tensor("text_output", DataType.BYTES, (1,), np.array([value.encode()], dtype=object))
    return StreamedResponse(InferenceResponse("m", "1", [out]), final)


def run(responses: AsyncIterator[StreamedResponse]) -> Recorder:
    recorder = Recorder()
    asyncio.run(stream_responses(responses, recorder))
    return recorder


def event(value: str) -> bytes:
    return b'data: {"model_name":"m","model_version":"1","text_output":"' + value.encode() + b'"}\n\n'


def test_one_event_per_response_and_nothing_for_a_flag_only_final():
    async def responses():
        yield text("a")
        yield text("b")
        yield StreamedResponse(None, True)

    recorder = run(responses())
    assert recorder.head == (200, CONTENT_TYPE)
    assert recorder.sent == [event("a"), event("b")]


def test_the_final_response_ends_the_stream():
    async def responses():
        yield text("a", final=True)
        raise AssertionError("read past the final response")

    assert run(responses()).sent == [event("a")]


def test_an_error_after_a_response_is_the_last_event():
    async def responses():
        yield text("a")
        raise EngineError(ErrorCode.INTERNAL, "third fails")

    recorder = run(responses())
    assert recorder.head == (200, CONTENT_TYPE)
    assert recorder.sent == [event("a"), b'data: {"error":"third fails"}\n\n']


def test_an_error_response_mid_stream_is_an_event_and_the_stream_goes_on():
    async def responses():
        yield text("a")
        yield StreamedResponse(None, False, EngineError(ErrorCode.INTERNAL, "bad piece"))
        yield text("b")
        yield StreamedResponse(None, True)

    recorder = run(responses())
    assert recorder.sent == [event("a"), b'data: {"error":"bad piece"}\n\n', event("b")]


def test_an_error_response_first_starts_the_stream_and_it_goes_on():
    async def responses():
        yield StreamedResponse(None, False, EngineError(ErrorCode.INTERNAL, "bad piece"))
        yield text("b", final=True)

    recorder = run(responses())
    assert recorder.head == (200, CONTENT_TYPE)
    assert recorder.sent == [b'data: {"error":"bad piece"}\n\n', event("b")]


def test_an_error_before_any_response_is_raised_for_a_json_answer():
    async def responses():
        raise EngineError(ErrorCode.INVALID_ARG, "refused")
        yield  # an async generator

    recorder = Recorder()
    with pytest.raises(EngineError, match="refused"):
        asyncio.run(stream_responses(responses(), recorder))
    assert recorder.head is None


def test_no_response_at_all_is_an_empty_stream():
    async def responses():
        yield StreamedResponse(None, True)

    recorder = run(responses())
    assert recorder.head == (200, CONTENT_TYPE) and recorder.sent == []
