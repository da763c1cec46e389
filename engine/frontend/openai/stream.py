"""A generation streamed to its HTTP client as server-sent events, in OpenAI's chunk format.

`stream_generation` runs in the route's task (routes.py) once the generation's first event is in, and
writes through the request's `ResponseStream` (http/types.py), the one way a route streams an answer: the
head, then one `data: <chunk>\\n\\n` event per engine event (a token's text for one choice), awaiting `drain`
after each, so a client that reads slowly holds at most a few events in the connection while the rest wait
here, as the engine's small text events; once every choice has finished, the usage chunk (when the client
asked for `stream_options.include_usage`) and `data: [DONE]`. An error after the head went out is sent as an
event carrying OpenAI's error object, then `[DONE]`. The task returning ends the stream (the connection then
writes the body's end and releases the request's admission); the task cancelled (the client left) aborts the
generation, which frees its KV blocks before the engine's next step. A chat read for tool calls (tools with
tool_choice auto) sends each choice's text through its parser (engine/openai/tools/): content deltas as they
come, each call as `tool_calls` deltas: its opening once its name is known, then its arguments' fragments.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from ...generate.serving.driver import TokenEvent
from ...openai import responses
from ...openai.errors import from_engine
from ...openai.generation import Choice, Generation
from ...openai.protocol import ApiRequest
from ...openai.tools.calls import ChoiceCalls
from ..http.types import ResponseStream

CONTENT_TYPE = b"text/event-stream; charset=utf-8"
_DONE = b"data: [DONE]\n\n"
_NO_CACHE = b"Cache-Control: no-cache\r\n"


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


async def stream_generation(gen: Generation, api: ApiRequest, created: int, extra: bytes,
                            stream: ResponseStream) -> None:
    """Write `gen` to `stream` until it is done. The events the engine delivers while we wait on the client
    queue here (one per token, a few bytes each) and are written in order."""
    events: deque[tuple[Choice, TokenEvent]] = deque()
    wake: asyncio.Event = asyncio.Event()

    def listen(choice: Choice, event: TokenEvent) -> None:
        events.append((choice, event))
        wake.set()

    gen.listener = listen
    writer = _Writer(gen, api, created, stream)
    stream.start(200, CONTENT_TYPE, _NO_CACHE + extra)
    try:
        for choice in gen.choices:  # what the engine produced before the listener was set: a chunk per
            pieces = choice.text or [""]  # event (each non-empty), as if it had been listening, each with
            state = writer.state(choice)  # the logprobs that came with it (the last: all the rest)
            for i, text in enumerate(pieces):
                last = i == len(pieces) - 1
                state.reached = len(choice.logprobs) if last else choice.logprob_marks[i]
                if not last:
                    writer.write(choice, text, False)
                elif text or choice.finished or api.chat:
                    writer.write(choice, text, choice.finished and choice.finish_reason != "error")
        await stream.drain()
        while not gen.done.done() or events:
            if not events:
                wake.clear()
                await wake.wait()
                continue
            choice, event = events.popleft()
            if event.error is not None:
                break
            writer.state(choice).reached += len(event.logprobs)
            if event.text or event.finished:
                writer.write(choice, event.text, event.finished)
                await stream.drain()
    finally:
        gen.listener = None
    writer.finish()


@dataclass(slots=True)
class _ChoiceState:
    """How far one choice's chunks have got. The choice holds every event's logprobs as the loop delivers
    them, before the writer reaches those events, so the writer counts what it has reached and sent itself."""
    started: bool = False  # its first chunk (the chat role) went out
    reached: int = 0       # the logprobs of the events taken so far (an index into choice.logprobs)
    sent: int = 0          # of those, how many chunks carried
    text_offset: int = 0   # completions' text_offset: the characters of the tokens those chunks carried
    calls: ChoiceCalls | None = None  # a chat with tools: the reading of its answer for tool calls


class _Writer:
    """OpenAI's chunks for one generation: the chat role first, a finish reason on its own delta."""

    __slots__ = ("api", "created", "gen", "states", "stream")

    def __init__(self, gen: Generation, api: ApiRequest, created: int, stream: ResponseStream) -> None:
        self.gen = gen
        self.api = api
        self.created = created
        self.stream = stream
        self.states = [_ChoiceState(calls=gen.tool_calls()) for _ in gen.choices]

    def state(self, choice: Choice) -> _ChoiceState:
        return self.states[choice.index]

    def write(self, choice: Choice, text: str, finished: bool) -> None:
        chat, send, state = self.api.chat, self.stream.send, self.state(choice)
        first = not state.started
        if not (text or first or finished):
            return
        state.started = True
        if state.calls is not None:
            self._write_read(choice, state, state.calls, text, first, finished)
            return
        if chat and first and text:  # OpenAI's first chunk: the role and empty content
            send(self._chunk(responses.chunk_choice(choice, chat, "", first=True)))
            first = False
        logprobs = self._logprobs(choice, state)  # on the chunk with the text (or the last): what came since
        if chat and finished and text:  # the text, then an empty delta with the finish reason
            send(self._chunk(responses.chunk_choice(choice, chat, text, first=first, logprobs=logprobs)))
            text, first, logprobs = "", False, None
        if finished:
            send(self._chunk(responses.chunk_choice(choice, chat, None if chat else text, first=first,
                                                    finished=True, logprobs=logprobs)))
        else:
            send(self._chunk(responses.chunk_choice(choice, chat, text, first=first, logprobs=logprobs)))

    def _write_read(self, choice: Choice, state: _ChoiceState, calls: ChoiceCalls, text: str, first: bool,
                    finished: bool) -> None:
        """A chat choice read for tool calls: its text through the reading (a call opens with its name once
        that is known, then its arguments go out as they are written), the finish reason on an empty delta
        of its own."""
        send = self.stream.send
        logprobs = self._logprobs(choice, state)
        if first:
            send(self._chunk(responses.chunk_choice(choice, True, "", first=True)))
        for delta in responses.tool_call_deltas(calls.feed(text, finished)):
            send(self._chunk({"index": choice.index, "delta": delta, "logprobs": logprobs,
                              "finish_reason": None}))
            logprobs = None
        if finished:
            send(self._chunk(responses.chunk_choice(choice, True, None, finished=True, logprobs=logprobs,
                                                    calls=calls)))

    def _logprobs(self, choice: Choice, state: _ChoiceState) -> dict[str, Any] | None:
        """The logprobs of the choice's tokens reached and not yet carried. The driver hands a token's out
        with the text that completes it (held back with the text where a stop string may be starting), so
        they go out with the chunk that shows that text."""
        if self.api.logprobs is None:
            return None
        entries = choice.logprobs[state.sent:state.reached]
        state.sent = state.reached
        out, state.text_offset = responses.logprobs_object(entries, self.api.chat, state.text_offset)
        return out

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        return _event(responses.chunk(self.gen, self.api.chat, self.api.model, self.created, [choice],
                                      self.api.include_usage))

    def finish(self) -> None:
        gen, send = self.gen, self.stream.send
        if gen.error is not None:
            send(_event(from_engine(gen.error).body()))
        elif self.api.include_usage:
            send(_event(responses.usage_chunk(gen, self.api.chat, self.api.model, self.created)))
        send(_DONE)
