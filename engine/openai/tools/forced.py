"""`tool_choice` "required" and a named function, enforced: the answer is constrained by a JSON schema
(generate/core/grammar.py, the same engine as response_format) so that it is a call, and read back as one.

The constrained text is the form vLLM constrains for these choices, not the model's own call format: for a
named function, the call's arguments (a JSON object valid under its `parameters`); for "required", a JSON
array of at least one `{"name": <one of the tools>, "parameters": <its arguments>}` (at most one with
parallel_tool_calls false). Either is written compact (no whitespace between its tokens, llguidance's
`whitespace_flexible` off), so a model cannot wander in whitespace. The tools are still rendered into the
prompt by the model's template, so the model knows them. The readers (calls.py's parser protocol) stream
both as auto's parsers do: a named call opens with the answer's first text, each of "required"'s calls once
its name is read (the schema puts `name` before `parameters`), and the arguments follow as they are
generated, the fragments being the text as written; each call's text is parsed once, when it closes. An
answer cut by max_tokens before any call opened is content, whole, with finish_reason "length"; a call cut
after it opened keeps what the stream sent (the whole answer gives its text as content).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from ...generate.core.grammar import MAX_GRAMMAR_CHARS, GrammarSpec, constraint_for_json_schema
from ..errors import bad_request
from .calls import ARGUMENTS, BROKEN, CLOSE, OPEN, Piece, ToolCall, call_id, closed_call, opened
from .request import ToolChoice, ToolRequest
from .scan import CallScanner

_WHITE = " \t\r\n"


def forced_call_spec(tools: ToolRequest) -> GrammarSpec | None:
    """The constraint a required or named tool_choice puts on the answer; None for none and auto. A 400
    naming `tools` when the schema it makes is past the grammar's bound."""
    if tools.named:
        # a copy: the function's own `parameters` are rendered into the prompt as the request sent them
        schema: dict[str, Any] = dict(parameters_schema(_function(tools, tools.choice)))
    elif tools.choice == ToolChoice.REQUIRED:
        one_of = [{"type": "object",
                   "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                  "parameters": parameters_schema(t["function"])},
                   "required": ["name", "parameters"], "additionalProperties": False} for t in tools.tools]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": one_of}}
        if not tools.parallel:
            schema["maxItems"] = 1
    else:
        return None
    schema["x-guidance"] = {"whitespace_flexible": False}  # no whitespace between its tokens: a call's JSON
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_GRAMMAR_CHARS:
        raise bad_request(f"Invalid 'tools': the schema that enforces tool_choice has {size} characters; at "
                          f"most {MAX_GRAMMAR_CHARS} are taken (send fewer or smaller tools).", "tools",
                          "invalid_value")
    return constraint_for_json_schema(schema, "tools")


def _function(tools: ToolRequest, name: str) -> dict[str, Any]:
    return next(t["function"] for t in tools.tools if t["function"]["name"] == name)


def parameters_schema(function: dict[str, Any]) -> dict[str, Any]:
    """A function's arguments schema: its `parameters`, an object in any case (a call's arguments are)."""
    parameters = function.get("parameters")
    if not parameters:
        return {"type": "object"}
    return {**parameters, "type": "object"} if "type" not in parameters else parameters


class NamedCallParser:
    """The answer is the named function's arguments: the call opens with the answer's first text and every
    piece is a fragment of its arguments, as it comes. At the end it is parsed once: the call closes with
    the text as written (compact, the grammar allows no white space); an answer that does not parse (cut
    by max_tokens) breaks it (ChoiceCalls: streamed, what was sent stands; whole, it is content)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._id = call_id()
        self._text: list[str] = []

    def feed(self, text: str) -> list[Piece]:
        out = [] if self._text else [Piece(call=ToolCall(self._id, self.name, ""), kind=OPEN)]
        self._text.append(text)
        out.append(Piece(text, kind=ARGUMENTS))
        return out

    def finish(self) -> list[Piece]:
        text = "".join(self._text)
        if not self._text:
            return []
        self._text = []
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            return [Piece(text, kind=BROKEN)]
        return [Piece(call=ToolCall(self._id, self.name, text), kind=CLOSE)]


class RequiredCallsParser:
    """The answer is a JSON array of `{"name", "parameters"}`: each element goes through its own scanner
    (scan.py) as it comes, so a call opens once its name is read and its parameters stream as they are
    generated, as a named call's do; it closes when its object does. The array's brackets, commas and white
    space are never content. The answer cut before any call opened (max_tokens) is content as written,
    whole; cut inside a later call, that call is BROKEN (ChoiceCalls: streamed, what was sent stands; whole,
    its text is content) and the calls before it stand. Text that is not the form (which the grammar does not
    let the model write) is content from there on."""

    def __init__(self) -> None:
        self._mode = "open"   # open: before `[`; between: before an element or `]`; element; done; text
        self._read: list[str] = []  # the whole text while nothing has gone out: content if no call comes
        self._sent = False    # a piece went out: what was read before it is not held any more
        self._object: list[str] = []  # the element being read
        self._scanner = CallScanner()
        self._id = ""

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        if not self._sent:
            self._read.append(text)
        i = 0
        while i < len(text) and self._mode != "text":
            if self._mode == "element":
                i = self._element(text, i, out)
                continue
            c = text[i]
            if c in _WHITE:
                i += 1
            elif self._mode == "open" and c == "[":
                self._mode, i = "between", i + 1
            elif self._mode == "between" and c == ",":
                i += 1
            elif self._mode == "between" and c == "]":
                self._mode, i = "done", i + 1
            elif self._mode == "between" and c == "{":
                self._mode, self._object, self._scanner, self._id = "element", [], CallScanner(), call_id()
            else:
                self._mode = "text"
        if self._mode == "text" and i < len(text):
            self._content(text[i:], out)
        return self._went(out)

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if not self._sent:  # no call came (the answer cut before one opened): all of it is content
            text = "".join(self._read)
            out = [Piece(text)] if text else []
        elif self._mode == "element":
            out.append(Piece("".join(self._object), kind=BROKEN))
        self._mode, self._read, self._object = "text", [], []
        return out

    def _element(self, text: str, at: int, out: list[Piece]) -> int:
        """The element's text from `at` through its scanner, closed as a call when its object ends."""
        scanner = self._scanner
        was = scanner.streaming
        used, fragment = scanner.feed(text[at:])
        self._object.append(text[at:at + used])
        opened(scanner, self._id, was, fragment, out)
        if scanner.done:  # (an element starts with `{`: the scanner never finds it opaque)
            body = "".join(self._object)
            call = closed_call(scanner, body, self._id, ("parameters", "arguments"))
            out.append(Piece(call=call, kind=CLOSE) if call is not None else Piece(body, kind=BROKEN))
            self._mode, self._object = "between", []
        return at + used

    def _content(self, text: str, out: list[Piece]) -> None:
        """Text past the form: content, with all that was read before it when nothing has gone out yet."""
        if not (self._sent or out):
            text, self._read = "".join(self._read), []  # the answer so far, this piece included
        out.append(Piece(text))

    def _went(self, out: list[Piece]) -> list[Piece]:
        if out and not self._sent:
            self._sent, self._read = True, []
        return out
