"""One call object's JSON read a piece at a time, so that its arguments can be streamed as they are written.

A call is `{"name": ..., "arguments": {...}}` (or `"parameters"`; its members in any order). The scanner
keeps only the JSON's structure: its depth, whether it is inside a string (and after a backslash), and at
the object's own level which member it is in. Each character is read once (a run of string text is skipped
with one regex search), so a call costs time linear in its length however finely the engine cuts it. Once
the name is known and the first `arguments`/`parameters` member opens an object, that object's text goes
out as it comes, exactly as written: the fragments concatenate to the call's `arguments` string. Whether the
whole is valid JSON is decided once, when the call closes (the parsers parse it then).
"""

from __future__ import annotations

import re

import orjson

ARGUMENT_KEYS = ("arguments", "parameters")
_STRING_STOP = re.compile(r'["\\]')
_WHITE = " \t\r\n"


class CallScanner:
    __slots__ = ("_expect", "_key", "_token", "args", "args_done", "args_open", "depth", "done", "escaped",
                 "in_string", "name", "opaque", "streaming")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.done = False        # the object closed (its last `}` read)
        self.opaque = False      # it does not start as an object: nothing more is read from it
        self.name: str | None = None
        self.args: list[str] = []  # the arguments object's text so far (from its `{`)
        self.args_open = False   # inside the arguments object
        self.args_done = False   # the arguments object closed
        self.streaming = False   # the name was known when the arguments began: they go out as they come
        self._expect = "open"    # at the object's own level: open, key, colon, value, comma
        self._key = ""           # the member being read
        self._token: list[str] | None = None  # a key, or the name's value, being read (raw, with its quotes)

    def feed(self, text: str) -> tuple[int, str]:
        """Reads `text` up to the object's end; returns how many characters it took and the arguments'
        text among them that goes out now ("" while the call is not streamed)."""
        if self.done or self.opaque:
            return 0, ""
        n, i = len(text), 0
        arg_from = 0 if self.args_open else -1
        token_from = 0 if self._token is not None else -1
        while i < n:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                    i += 1
                    continue
                m = _STRING_STOP.search(text, i)
                if m is None:
                    i = n
                    break
                i = m.end()
                if m.group() == "\\":
                    self.escaped = True
                    continue
                self.in_string = False
                if token_from >= 0:
                    self._end_token(text[token_from:i])
                    token_from = -1
                continue
            c = text[i]
            i += 1
            if c in _WHITE:
                continue
            if c == '"':
                self.in_string = True
                if self.depth == 1:
                    if self._expect == "key" or (self._expect == "value" and self._key == "name"):
                        self._token, token_from = [], i - 1
                    self._expect = "colon" if self._expect == "key" else "comma"
            elif c in "{[":
                self.depth += 1
                if self.depth == 1:
                    if c != "{":
                        self.opaque = True
                        return i, ""
                    self._expect = "key"
                elif self.depth == 2 and self._expect == "value":
                    self._expect = "comma"
                    if c == "{" and self._key in ARGUMENT_KEYS and not self.args and not self.args_open:
                        self.args_open, arg_from = True, i - 1
                        self.streaming = self.name is not None
            elif c in "}]":
                self.depth -= 1
                if self.args_open and self.depth == 1:
                    self.args.append(text[arg_from:i])
                    self.args_open, self.args_done = False, True
                    out = text[arg_from:i] if self.streaming else ""
                    arg_from = -1
                    if out:
                        return self._rest(text, i, out)
                if self.depth <= 0:
                    self.done = True
                    return i, ""
            elif self.depth == 0:
                self.opaque = True
                return i, ""
            elif self.depth == 1:
                if c == ":":
                    self._expect = "value"
                elif c == ",":
                    self._expect = "key"
                elif self._expect == "value":
                    self._expect = "comma"  # a number or a literal
        if token_from >= 0 and self._token is not None:
            self._token.append(text[token_from:])
        if arg_from >= 0:
            self.args.append(text[arg_from:])
            return n, text[arg_from:] if self.streaming else ""
        return n, ""

    def _rest(self, text: str, at: int, out: str) -> tuple[int, str]:
        """The arguments closed at `at` with `out` to send: what follows them in `text` is read too (it
        holds no more arguments)."""
        used, _ = self.feed(text[at:])
        return at + used, out

    def _end_token(self, last: str) -> None:
        assert self._token is not None
        self._token.append(last)
        raw = "".join(self._token)
        self._token = None
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        if self._expect == "colon":
            self._key = value
        elif self.name is None and isinstance(value, str) and value:
            self.name = value
