"""A generation streamed to its HTTP client as server-sent events, in OpenAI's chunk format.

`SseStream` is a `Streaming` answer (http_types.py): the connection writes its head and calls `start`; the
stream then writes one `data: <chunk>\\n\\n` event per engine event (a token's text for one choice) as the
engine thread delivers it, and, once every choice has finished, the usage chunk (when the client asked for
`stream_options.include_usage`) and `data: [DONE]`. An error after the head went out is sent as an event
carrying OpenAI's error object, then `[DONE]`. `cancel` (the client left) aborts the generation, which frees
its KV blocks before the engine's next step.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..generate.driver import TokenEvent
from ..openai import responses
from ..openai.errors import from_engine
from ..openai.generation import Choice, Generation
from ..openai.protocol import ApiRequest
from .http_types import StreamSink

_DONE = b"data: [DONE]\n\n"


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


class SseStream:
    status = 200
    content_type = b"text/event-stream; charset=utf-8"

    def __init__(self, gen: Generation, api: ApiRequest, created: int, extra: bytes) -> None:
        self.gen = gen
        self.api = api
        self.created = created
        self.extra = extra
        self._sink: StreamSink | None = None
        self._started: set[int] = set()  # choices whose first chunk (the chat role) went out

    def start(self, sink: StreamSink) -> None:
        """Write what the engine produced while the head was being written, then follow the generation."""
        self._sink = sink
        gen = self.gen
        for choice in gen.choices:
            text = "".join(choice.text)
            if text or choice.finished or self.api.chat:
                self._write(choice, text, choice.finished and choice.finish_reason != "error")
        gen.listener = self._on_event
        if gen.done.done():
            self._finish()

    def cancel(self) -> None:
        self.gen.listener = None
        self.gen.abort()

    def _on_event(self, choice: Choice, event: TokenEvent) -> None:
        if event.error is not None:
            self._finish()
            return
        if event.text or event.finished:
            self._write(choice, event.text, event.finished)
        if self.gen.done.done():
            self._finish()

    def _write(self, choice: Choice, text: str, finished: bool) -> None:
        chat, sink = self.api.chat, self._sink
        assert sink is not None
        first = choice.index not in self._started
        self._started.add(choice.index)
        if chat and first and text:  # OpenAI's first chunk: the role and empty content
            sink.send(self._chunk(responses.chunk_choice(choice, chat, "", first=True)))
            first = False
        if chat and finished and text:  # the text, then an empty delta with the finish reason
            sink.send(self._chunk(responses.chunk_choice(choice, chat, text, first=first)))
            text, first = "", False
        if finished:
            sink.send(self._chunk(responses.chunk_choice(choice, chat, None if chat else text, first=first,
                                                         finished=True)))
        elif text or first:
            sink.send(self._chunk(responses.chunk_choice(choice, chat, text, first=first)))

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        return _event(responses.chunk(self.gen, self.api.chat, self.api.model, self.created, [choice],
                                      self.api.include_usage))

    def _finish(self) -> None:
        sink, self._sink = self._sink, None
        self.gen.listener = None
        if sink is None:
            return
        gen = self.gen
        if gen.error is not None:
            sink.send(_event(from_engine(gen.error).body()))
        elif self.api.include_usage:
            sink.send(_event(responses.usage_chunk(gen, self.api.chat, self.api.model, self.created)))
        sink.send(_DONE)
        sink.end()
