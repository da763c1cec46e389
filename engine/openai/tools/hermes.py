"""Hermes / Qwen2.5 tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number,
with text around them (vLLM's `hermes` parser reads the same form).

An unterminated call at the end (the model stopped after its JSON) is a call when its JSON is complete, as
vLLM reads it; a call whose JSON is not an object with a name and object arguments stays content, as
written. Incremental (calls.py): outside a call only a tail that may begin `<tool_call>` is held back;
inside one, the end tag is looked for in the new text only (and the few characters before it, held back
from the scanner until they cannot be the tag's beginning), and the rest goes through the call's scanner
(scan.py), which streams the arguments once the name is known.
"""

from __future__ import annotations

from .calls import BROKEN, CLOSE, MAX_CALL_CHARS, TEXT, Piece, call_id, closed_call, opened
from .scan import CallScanner

START = "<tool_call>"
END = "</tool_call>"
KEYS = ("arguments", "parameters")


class HermesParser:
    def __init__(self) -> None:
        self._held = ""     # outside a call: a tail that may be the start of START
        self._call: list[str] | None = None  # inside a call: its text so far (after START), scanned
        self._call_chars = 0
        self._tail = ""     # inside a call: its last few characters, where END may have begun (not scanned)
        self._scanner = CallScanner()
        self._id = ""
        self._given_up = False  # a call grew past MAX_CALL_CHARS: the rest is content

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        while text:
            if self._given_up:
                out.append(Piece(text))
                break
            text = self._in_call(text, out) if self._call is not None else self._outside(text, out)
        return out

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if self._call is not None:
            self._scan(self._tail, out)
            body = "".join(self._call)
            self._call = None
            self._close(body, START + body, out)
        elif self._held:
            out.append(Piece(self._held))
        self._held = ""
        return out

    def _outside(self, text: str, out: list[Piece]) -> str:
        """Content up to a START (then the rest, in the call); without one, all but a tail that may be
        START's beginning."""
        text = self._held + text
        self._held = ""
        at = text.find(START)
        if at >= 0:
            if at:
                out.append(Piece(text[:at]))
            self._call, self._call_chars, self._tail = [], 0, ""
            self._scanner, self._id = CallScanner(), call_id()
            return text[at + len(START):]
        keep = _partial_tail(text, START)
        if len(text) > keep:
            out.append(Piece(text[:len(text) - keep]))
        self._held = text[len(text) - keep:]
        return ""

    def _in_call(self, text: str, out: list[Piece]) -> str:
        assert self._call is not None
        # the end tag may straddle the previous piece: look from the last few characters held
        window = self._tail + text
        at = window.find(END)
        if at < 0:
            keep = _partial_tail(window, END)
            self._tail = window[len(window) - keep:]
            self._scan(window[:len(window) - keep], out)
            self._call_chars += len(text)
            if self._call_chars > MAX_CALL_CHARS:
                written = START + "".join(self._call) + self._tail
                out.append(Piece(written, kind=BROKEN if self._scanner.streaming else TEXT))
                self._call, self._given_up = None, True
            return ""
        self._scan(window[:at], out)
        body = "".join(self._call)
        self._call, self._tail = None, ""
        self._close(body, START + body + END, out)
        return window[at + len(END):]

    def _scan(self, text: str, out: list[Piece]) -> None:
        """The call's text, through its scanner, kept for the parse at its end."""
        if not text:
            return
        assert self._call is not None
        self._call.append(text)
        was = self._scanner.streaming
        _, fragment = self._scanner.feed(text)
        opened(self._scanner, self._id, was, fragment, out)

    def _close(self, body: str, written: str, out: list[Piece]) -> None:
        call = closed_call(self._scanner, body.strip(), self._id, KEYS)
        if call is not None:
            out.append(Piece(call=call, kind=CLOSE))
        else:
            out.append(Piece(written, kind=BROKEN if self._scanner.streaming else TEXT))


def _partial_tail(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper beginning of `tag`."""
    if tag[0] not in text[1 - len(tag):]:
        return 0  # the usual case, inside a call's text or outside one: no `<` near the end
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
