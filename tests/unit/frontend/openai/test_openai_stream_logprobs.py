"""The SSE writer's logprobs (engine/frontend/openai/stream.py), on an event loop with no sockets: when the
loop has delivered several events before the stream's task reaches them (a client reading slowly, or a busy
loop), each chunk still carries the logprobs of its own events, not of every event delivered so far."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from engine.frontend.openai.stream import stream_generation
from engine.generate.core.request import SamplingParams
from engine.generate.serving.driver import ShownLogprob, TokenEvent
from engine.openai.generation import Generation
from engine.openai.protocol import parse_request


class Collected:
    """A ResponseStream that keeps what it is sent, and never makes the writer wait."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def start(self, status: int, content_type: bytes, extra: bytes = b"") -> None:
        assert status == 200

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    async def drain(self) -> None:
        return None


def event(text: str, finished: bool = False) -> TokenEvent:
    return TokenEvent(text, 1, finished, "length" if finished else None,
                      logprobs=(ShownLogprob(text.encode(), -0.5),))


def chunks(stream: Collected) -> list[dict]:
    docs = [piece.removeprefix(b"data: ").strip() for piece in stream.sent]
    assert docs[-1] == b"[DONE]"
    return [orjson.loads(d) for d in docs[:-1]]


def run(chat: bool, body: dict, before: bool = False) -> list[dict]:
    async def main() -> list[dict]:
        api = parse_request({"model": "m", "stream": True, **body}, chat=chat)
        gen = Generation(None, "r", [[1, 2]], 1, SamplingParams(logprobs=api.logprobs))  # type: ignore[arg-type]
        choice = gen.choices[0]
        stream = Collected()

        def deliver() -> None:  # four events in one loop callback: the writer sees them after
            for e in (event("a"), event("b"), event("c"), event("d", finished=True)):
                gen._on_event(choice, e)

        if before:  # all of them in before the stream starts (the route waits for the first event)
            deliver()
        task = asyncio.create_task(stream_generation(gen, api, 0, b"", stream))
        if not before:
            asyncio.get_running_loop().call_soon(deliver)  # after the task's first step set its listener
        await task
        return chunks(stream)

    return asyncio.run(main())


@pytest.mark.parametrize("before", [False, True])
def test_each_chat_chunk_carries_its_own_tokens_logprobs(before: bool) -> None:
    got = run(True, {"messages": [{"role": "user", "content": "x"}], "logprobs": True}, before)
    parts = [c["choices"][0] for c in got]
    shown = [(p["delta"].get("content"), [e["token"] for e in p["logprobs"]["content"]])
             for p in parts if p["logprobs"] is not None]
    assert shown == ([] if before else [("", [])]) + [("a", ["a"]), ("b", ["b"]), ("c", ["c"]), ("d", ["d"])]


@pytest.mark.parametrize("before", [False, True])
def test_each_completion_chunk_carries_its_own_tokens_and_offsets(before: bool) -> None:
    got = run(False, {"prompt": "x", "logprobs": 1}, before)
    shown = [(c["choices"][0]["text"], c["choices"][0]["logprobs"]["tokens"],
              c["choices"][0]["logprobs"]["text_offset"]) for c in got]
    assert shown == [("a", ["a"], [0]), ("b", ["b"], [1]), ("c", ["c"], [2]), ("d", ["d"], [3])]
