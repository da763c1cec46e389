"""`tool_choice` "required" and a named function, enforced: the answer is constrained by a JSON schema
(generate/core/grammar.py, the same engine as response_format) so that it is a call, and read back as one.

The constrained text is the form vLLM constrains for these choices, not the model's own call format: for a
named function, the call's arguments (a JSON object valid under its `parameters`); for "required", a JSON
array of at least one `{"name": <one of the tools>, "parameters": <its arguments>}` (at most one with
parallel_tool_calls false). Either is written compact (no whitespace between its tokens, llguidance's
`whitespace_flexible` off), so a model cannot wander in whitespace. The tools are still rendered into the
prompt by the model's template, so the model knows them. The readers (calls.py's parser protocol) parse the
text once, at the end: a text that does not parse (the answer stopped at max_tokens) stays content in the
whole answer, with finish_reason "length". A named function's arguments stream as they are generated (the
call opens with the first text); "required"'s list is held and goes out whole at the end.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from ...generate.core.grammar import MAX_GRAMMAR_CHARS, GrammarSpec, constraint_for_json_schema
from ..errors import bad_request
from .calls import ARGUMENTS, BROKEN, CLOSE, OPEN, Piece, ToolCall, call_id, new_call
from .request import ToolChoice, ToolRequest


def forced_call_spec(tools: ToolRequest) -> GrammarSpec | None:
    """The constraint a required or named tool_choice puts on the answer; None for none and auto. A 400
    naming `tools` when the schema it makes is past the grammar's bound."""
    if tools.named:
        # a copy: the function's own `parameters` are rendered into the prompt as the request sent them
        schema: dict[str, Any] = dict(_parameters(_function(tools, tools.choice)))
    elif tools.choice == ToolChoice.REQUIRED:
        one_of = [{"type": "object",
                   "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                  "parameters": _parameters(t["function"])},
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


def _parameters(function: dict[str, Any]) -> dict[str, Any]:
    """A function's arguments schema: its `parameters`, an object in any case (a call's arguments are)."""
    parameters = function.get("parameters")
    if not parameters:
        return {"type": "object"}
    return {**parameters, "type": "object"} if "type" not in parameters else parameters


class _Whole:
    """Holds the answer; `_read` turns the whole of it into calls, or None (then it is content)."""

    def __init__(self) -> None:
        self._text: list[str] = []

    def feed(self, text: str) -> list[Piece]:
        self._text.append(text)
        return []

    def finish(self) -> list[Piece]:
        text = "".join(self._text)
        self._text = []
        try:
            calls = self._read(orjson.loads(text))
        except orjson.JSONDecodeError:
            calls = None
        if calls is None:
            return [Piece(text)] if text else []
        return [Piece(call=call, kind=CLOSE) for call in calls]

    def _read(self, doc: Any) -> list[Any] | None:
        raise NotImplementedError


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


class RequiredCallsParser(_Whole):
    """The answer is a list of {"name", "parameters"}."""

    def _read(self, doc: Any) -> list[Any] | None:
        if not isinstance(doc, list) or not doc:
            return None
        calls = [new_call(c.get("name"), c.get("parameters")) if isinstance(c, dict) else None for c in doc]
        return None if any(c is None for c in calls) else calls
