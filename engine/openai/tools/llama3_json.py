"""Llama 3.1+ JSON tool calls: the answer is `{"name": ..., "parameters": {...}}` (or `"arguments"`),
optionally after `<|python_tag|>`, several separated by `;` (vLLM's `llama3_json` parser reads the same).

An answer is calls only when it starts so (after white space); any other answer is content, passed on as
it comes. While it is calls, each object is closed by counting braces outside strings (one pass over each
piece), and parsed once, when complete. Text that follows a call and is not another is content; an object
that is not a call (no name, arguments not an object) makes it and the rest content.
"""

from __future__ import annotations

import orjson

from .calls import MAX_CALL_CHARS, Piece, new_call

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser:
    def __init__(self) -> None:
        self._mode = "start"  # start: deciding; calls: reading objects; text: passing content on
        self._held = ""       # start: leading text not yet decided on
        self._object: list[str] = []  # calls: the current object's text
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._chars = 0

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        if self._mode == "start":
            text = self._decide(text, out)
        if self._mode == "calls" and text:
            self._read(text, out)
        elif self._mode == "text" and text:
            out.append(Piece(text))
        return out

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        rest = self._held + "".join(self._object)
        self._held, self._object = "", []
        if rest.strip():
            out.append(Piece(rest))
        self._mode = "text"
        return out

    def _decide(self, text: str, out: list[Piece]) -> str:
        held = self._held + text
        start = held.lstrip()
        if not start or (PYTHON_TAG.startswith(start) and len(start) < len(PYTHON_TAG)):
            self._held = held  # white space, or the tag's beginning: not yet known
            return ""
        self._held = ""
        if start.startswith(PYTHON_TAG):
            start = start[len(PYTHON_TAG):].lstrip()
        elif not start.startswith("{"):
            self._mode = "text"
            return held
        self._mode = "calls"
        return start

    def _read(self, text: str, out: list[Piece]) -> None:
        """Objects closed by brace counting; between them, `;` and white space are skipped."""
        i = 0
        while i < len(text):
            if self._depth == 0:  # between objects
                skip = len(text[i:]) - len(text[i:].lstrip("; \t\r\n"))
                i += skip
                if i >= len(text):
                    return
                if text[i] != "{":  # not another call: the rest is content
                    self._mode = "text"
                    out.append(Piece(text[i:]))
                    return
            c = text[i]
            self._object.append(c)
            self._chars += 1
            i += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c == "{":
                self._depth += 1
            elif c == "}":
                self._depth -= 1
                if self._depth == 0:
                    self._close(out)
                    if self._mode == "text":
                        if i < len(text):
                            out.append(Piece(text[i:]))
                        return
            if self._chars > MAX_CALL_CHARS:
                self._mode = "text"
                out.append(Piece("".join(self._object) + text[i:]))
                self._object = []
                return

    def _close(self, out: list[Piece]) -> None:
        body = "".join(self._object)
        self._object, self._chars = [], 0
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
        call = new_call(doc.get("name"), doc.get("parameters", doc.get("arguments"))) \
            if isinstance(doc, dict) else None
        if call is None:
            self._mode = "text"
            out.append(Piece(body))
        else:
            out.append(Piece(call=call))
