"""What a tool call parser reads from a choice's text, and how one is chosen.

A parser is incremental and owned by one choice: the SSE writer (frontend/openai/stream.py) feeds it each
piece of text as the engine delivers it, and the JSON answer (responses.py) feeds it the whole text once;
`finish()` after the last piece. Each call returns `Piece`s in order: content (text outside any call), and
each call's opening, its arguments' text as it is written and its end (scan.py reads a call's JSON as it
comes). A parser's cost per piece is bounded by the piece and a small held-back tail (it never re-reads
what it has already read; a call's whole text is parsed once, when it closes, to decide it is one), and what
it holds while a call is open is at most MAX_CALL_CHARS: past that, the rest is content and nothing more is
parsed.

A call's `arguments` are the text the model wrote for them (the `{...}` member, its white space and key
order as written), in the streamed fragments and in the whole answer alike, so that what a client
concatenates from the stream is the string the non-streamed answer gives; models write the form vLLM
re-serialises to (`json.dumps`'s `{"k": "v"}`), so the two agree in practice. Arguments sent as a JSON
string, or missing, are not streamed: the call goes out whole when it closes, serialised compact.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from .scan import CallScanner

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


TEXT, OPEN, ARGUMENTS, CLOSE, BROKEN = "text", "open", "arguments", "close", "broken"


@dataclass(frozen=True, slots=True)
class Piece:
    """What a parser read, in order: content (TEXT, `text`); a call opened once its name is known (OPEN,
    `call` with empty arguments), its arguments' text as it comes (ARGUMENTS, `text`) and its end (CLOSE,
    `call` whole: its arguments are the fragments' concatenation); a call read whole at once (CLOSE with no
    OPEN before it); or an opened call that turned out malformed (BROKEN, `text` as written). `index` is
    the call's place in the answer, set by ChoiceCalls for the stream."""

    text: str = ""
    call: ToolCall | None = None
    kind: str = TEXT
    index: int = -1


class ToolCallParser(Protocol):
    def feed(self, text: str) -> list[Piece]: ...

    def finish(self) -> list[Piece]: ...


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def new_call(name: Any, arguments: Any, id_: str | None = None) -> ToolCall | None:
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
    return ToolCall(id_ or call_id(), name, orjson.dumps(arguments).decode())


def closed_call(scanner: CallScanner, body: str, id_: str, keys: tuple[str, str]) -> ToolCall | None:
    """The call an object's text makes, read once now that it is complete; None when it is not one. Its
    arguments are the object's text as written when the scanner saw one (what was streamed), else as
    `new_call` reads the `keys` member (a JSON string, or missing)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    name = doc.get("name")
    if scanner.args_done:
        if not isinstance(name, str) or not name or (scanner.streaming and name != scanner.name):
            return None
        return ToolCall(id_, name, "".join(scanner.args))
    return new_call(name, doc.get(keys[0], doc.get(keys[1])), id_)


def opened(scanner: CallScanner, id_: str, was_streaming: bool, fragment: str, out: list[Piece]) -> None:
    """The pieces a scanner's step makes: the call's OPEN the first time it streams, then its fragment."""
    if scanner.streaming and not was_streaming:
        assert scanner.name is not None
        out.append(Piece(call=ToolCall(id_, scanner.name, ""), kind=OPEN))
    if fragment:
        out.append(Piece(fragment, kind=ARGUMENTS))


class ChoiceCalls:
    """One choice's reading of its answer: its parser, and the calls found so far. For the stream (`feed`)
    each call gets its index when it opens (its OPEN piece, or a whole call's CLOSE), and an opened call
    that turns out malformed stays announced: its fragments went out and cannot be taken back, so it counts
    as a call and what remains of its text is dropped. The whole answer (`message`) has only the calls that
    closed well; a malformed one is content as written. With `parallel` false (the request's
    parallel_tool_calls) the calls after the first are dropped. Once a call has been found, white space
    between calls (or at the end) is dropped; streamed, it is held until other content shows it is not
    (a stream delivers a space as a piece of its own)."""

    __slots__ = ("_open", "_skip", "_space", "announced", "calls", "parallel", "parser")

    def __init__(self, parser: ToolCallParser, parallel: bool = True) -> None:
        self.parser = parser
        self.parallel = parallel
        self.calls: list[ToolCall] = []
        self.announced = 0      # calls the stream has opened
        self._open = False      # a call is open in the stream
        self._skip = False      # the open call is dropped (parallel false)
        self._space = ""        # white space after a call, sent only if more content follows it

    def feed(self, text: str, finished: bool) -> list[Piece]:
        """The stream's pieces: TEXT, OPEN and ARGUMENTS (a whole call as both), each call's with its
        index."""
        pieces = self.parser.feed(text) if text else []
        if finished:
            pieces += self.parser.finish()
        out: list[Piece] = []
        for piece in pieces:
            if piece.kind == OPEN:
                self._open, self._skip = True, not self.parallel and self.announced > 0
                if not self._skip:
                    out.append(Piece(piece.text, piece.call, OPEN, self.announced))
                    self.announced += 1
            elif piece.kind == ARGUMENTS:
                if not self._skip:  # one a token: built directly (dataclasses.replace costs 5x more)
                    out.append(Piece(piece.text, None, ARGUMENTS, self.announced - 1))
            elif piece.kind == CLOSE:
                assert piece.call is not None
                if self._open:
                    if not self._skip:
                        self.calls.append(piece.call)
                elif self.parallel or not self.announced:
                    out.append(replace(piece, call=replace(piece.call, arguments=""), kind=OPEN,
                                       index=self.announced))
                    out.append(Piece(piece.call.arguments, kind=ARGUMENTS, index=self.announced))
                    self.calls.append(piece.call)
                    self.announced += 1
                self._open = self._skip = False
            elif piece.kind == BROKEN:
                self._open = self._skip = False
            elif self.announced and not piece.text.strip():
                self._space += piece.text  # between calls, or before more content: not known yet
            elif piece.text:
                out.append(Piece(self._space + piece.text) if self._space else piece)
                self._space = ""
            if piece.kind != TEXT:
                self._space = ""
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        """OpenAI's "tool_calls" for an answer that stopped by itself with calls."""
        return "tool_calls" if (self.calls or self.announced) and reason == "stop" else reason

    def message(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole answer's content (None when nothing but white space is outside the calls) and calls."""
        pieces = self.parser.feed(text) if text else []
        pieces += self.parser.finish()
        content: list[str] = []
        for piece in pieces:
            if piece.kind == CLOSE:
                assert piece.call is not None
                if self.parallel or not self.calls:
                    self.calls.append(piece.call)
            elif piece.kind in (TEXT, BROKEN) and piece.text and not (self.calls and not piece.text.strip()):
                content.append(piece.text)  # a BROKEN call is content as written
        if self.calls:
            return "".join(content).strip() or None, self.calls
        return "".join(content), self.calls
