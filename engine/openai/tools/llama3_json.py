"""Llama 3.1+ JSON tool calls: the answer is `{"name": ..., "parameters": {...}}` (or `"arguments"`),
optionally after `<|python_tag|>`, several separated by `;` (vLLM's `llama3_json` parser reads the same).

An answer is calls only when it starts so (after white space); any other answer is content, passed on as
it comes. While it is calls, each object goes through a scanner (scan.py: one pass over each piece, its
braces counted outside strings), which streams its arguments once the name is known; it is parsed once,
when complete. Text that follows a call and is not another is content; an object
that is not a call (no name, arguments not an object) makes it and the rest content.
"""

from __future__ import annotations

from .calls import BROKEN, CLOSE, MAX_CALL_CHARS, TEXT, Piece, call_id, closed_call, opened
from .scan import CallScanner

PYTHON_TAG = "<|python_tag|>"
KEYS = ("parameters", "arguments")


class Llama3JsonParser:
    def __init__(self) -> None:
        self._mode = "start"  # start: deciding; calls: reading objects; text: passing content on
        self._held = ""       # start: leading text not yet decided on
        self._object: list[str] | None = None  # calls: the current object's text (None between objects)
        self._scanner = CallScanner()
        self._id = ""
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
        rest = self._held + "".join(self._object or ())
        broken = self._object is not None and self._scanner.streaming
        self._held, self._object = "", None
        if broken:
            out.append(Piece(rest, kind=BROKEN))
        elif rest.strip():
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
        """Objects through the scanner, each closed when its braces balance; between them, `;` and white
        space are skipped."""
        i = 0
        while i < len(text):
            if self._object is None:  # between objects
                rest = text[i:].lstrip("; \t\r\n")
                i = len(text) - len(rest)
                if not rest:
                    return
                if rest[0] != "{":  # not another call: the rest is content
                    self._mode = "text"
                    out.append(Piece(rest))
                    return
                self._object, self._scanner, self._id, self._chars = [], CallScanner(), call_id(), 0
            scanner = self._scanner
            was = scanner.streaming
            used, fragment = scanner.feed(text[i:])
            self._object.append(text[i:i + used])
            self._chars += used
            i += used
            opened(scanner, self._id, was, fragment, out)
            if scanner.done or scanner.opaque:
                self._close(out)
                if self._mode == "text":
                    if i < len(text):
                        out.append(Piece(text[i:]))
                    return
            elif self._chars > MAX_CALL_CHARS:
                self._mode = "text"
                out.append(Piece("".join(self._object), kind=BROKEN if scanner.streaming else TEXT))
                self._object = None
                if i < len(text):
                    out.append(Piece(text[i:]))
                return

    def _close(self, out: list[Piece]) -> None:
        assert self._object is not None
        body = "".join(self._object)
        self._object = None
        call = closed_call(self._scanner, body, self._id, KEYS) if self._scanner.done else None
        if call is None:
            self._mode = "text"
            out.append(Piece(body, kind=BROKEN if self._scanner.streaming else TEXT))
        else:
            out.append(Piece(call=call, kind=CLOSE))
