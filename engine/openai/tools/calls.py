"""What a tool call parser reads from a choice's text, and how one is chosen.

A parser is incremental and owned by one choice: the SSE writer (frontend/openai/stream.py) feeds it each
piece of text as the engine delivers it, and the JSON answer (responses.py) feeds it the whole text once;
`finish()` after the last piece. Each call returns `Piece`s in order: content (text outside any call) or a
complete call. A parser's cost per piece is bounded by the piece and a small held-back tail (it never
re-reads what it has already read), and what it holds while a call is open is at most MAX_CALL_CHARS: past
that, the rest is content and nothing more is parsed.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

MAX_CALL_CHARS = 64 * 1024  # one call's text, held until it is complete


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as OpenAI sends it

    def as_message_part(self) -> dict[str, Any]:
        """OpenAI's `message.tool_calls` entry."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class Piece:
    """Either content (`text`) or one complete call (`call`)."""

    text: str = ""
    call: ToolCall | None = None


class ToolCallParser(Protocol):
    def feed(self, text: str) -> list[Piece]: ...

    def finish(self) -> list[Piece]: ...


def new_call(name: Any, arguments: Any) -> ToolCall | None:
    """A call from a parsed object's name and arguments (a dict, or a string holding a JSON object); None
    when they are not that."""
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ToolCall(f"call_{secrets.token_hex(12)}", name, orjson.dumps(arguments).decode())


class ChoiceCalls:
    """One choice's reading of its answer: its parser, and the calls found so far (their index in the
    stream is their place here). With `parallel` false (the request's parallel_tool_calls) the calls after
    the first are dropped. Content that is only white space is dropped once a call has been found (what
    separates calls)."""

    __slots__ = ("calls", "parallel", "parser")

    def __init__(self, parser: ToolCallParser, parallel: bool = True) -> None:
        self.parser = parser
        self.parallel = parallel
        self.calls: list[ToolCall] = []

    def feed(self, text: str, finished: bool) -> list[Piece]:
        pieces = self.parser.feed(text) if text else []
        if finished:
            pieces += self.parser.finish()
        out = []
        for piece in pieces:
            if piece.call is not None:
                if self.parallel or not self.calls:
                    self.calls.append(piece.call)
                    out.append(piece)
            elif piece.text and not (self.calls and not piece.text.strip()):
                out.append(piece)
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        """OpenAI's "tool_calls" for an answer that stopped by itself with calls."""
        return "tool_calls" if self.calls and reason == "stop" else reason

    def message(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole answer's content (None when nothing but white space is outside the calls) and calls."""
        content = "".join(p.text for p in self.feed(text, True))
        if self.calls:
            return content.strip() or None, self.calls
        return content, self.calls
