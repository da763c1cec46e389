"""A request's output as text, kept a token at a time on the engine's thread: what its stop strings are
checked against (stopping.py) and what its client may be shown so far (the driver's events). Decoding the
whole output after every token made each token cost O(output length), a long generation quadratic; here a
token costs work bounded by the longest stop string and the characters it adds.

- A `StreamDecoder` (the tokenizer's `stream_decoder()`, tokenizer.py) turns each token into final text (it
  never changes again) and pending text (what a later token may still change: an incomplete UTF-8
  character). `Utf8Decoder` is the byte tokenizer's: its final + pending text after each token is exactly
  `ByteTokenizer.decode` of the tokens so far. `WindowDecoder` serves any tokenizer through its `decode`
  of a few tokens at a time, starting from the prompt's last tokens as context: a SentencePiece tokenizer
  writes a word's leading space ("▁up" → " up") only after other text, so the first generated word keeps
  its space, as transformers' and vLLM's text of the answer has it.
- `OutputText` (one per request, made by the engine, fed by `check_stop`) keeps the final text, the pending
  text and a tail of the last characters; looks for the stop strings only where the last token can have
  completed one; and `release`s what the client may be shown: nothing the longest stop string could still
  cut (its length - 1 characters), nor trailing U+FFFD (a character not complete yet), nor pending text (a
  later token may still change it).
"""

from __future__ import annotations

import codecs
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

_REPLACEMENT = "\ufffd"


class StreamDecoder(Protocol):
    def push(self, token_id: int) -> tuple[str, str]:
        """Add the next generated token: (its final text, appended to what came before; the pending text
        after it, which replaces the pending text before it)."""
        ...


class Utf8Decoder:
    """Byte tokens (0-255; any other id is special and adds nothing) as UTF-8, invalid bytes replaced as
    `bytes.decode(errors="replace")` replaces them. The incremental decoder keeps at most the 3 bytes of an
    incomplete character; their text (one U+FFFD) is pending."""

    __slots__ = ("_decoder", "_pending")

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""

    def push(self, token_id: int) -> tuple[str, str]:
        if not 0 <= token_id < 256:
            return "", self._pending
        final = self._decoder.decode(bytes((token_id,)))
        held = self._decoder.getstate()[0]
        self._pending = held.decode("utf-8", "replace") if held else ""
        return final, self._pending


class WindowDecoder:
    """A tokenizer's `decode` over a few tokens (vLLM's incremental detokenization): a token's text is the
    decode of the tokens since the start of the last final piece, minus the decode of those before it, so a
    tokenizer that writes a token differently at the start of a text (a SentencePiece "▁word") or joins
    bytes across tokens decodes it in context. Text that ends in U+FFFD stays pending until a later token
    completes the character; past MAX_PENDING pending tokens (invalid bytes, which never complete) all but
    the last 3 are taken as final, so a token never costs more than a few tokens' decode. `context`: the
    prompt's last tokens (at most PROMPT_CONTEXT are kept, vLLM's read offset), the first final piece: their
    text is never output, only what the generated tokens add after it. `held`: tokens whose text a later
    token may still change even when it is valid: a byte-fallback tokenizer's byte tokens ("<0x65>"), which
    `tokenizers` decodes as one run (a run that is not UTF-8 is one U+FFFD per byte, its ASCII bytes
    included); they stay pending until a token of another kind ends the run."""

    MAX_PENDING = 8
    PROMPT_CONTEXT = 5

    __slots__ = ("_decode", "_held", "_prefix", "_read", "_tokens")

    def __init__(self, decode: Callable[[Sequence[int]], str], context: Sequence[int] = (),
                 held: frozenset[int] = frozenset()) -> None:
        self._decode = decode
        self._held = held
        self._tokens: list[int] = list(context[-self.PROMPT_CONTEXT:]) if context else []
        self._prefix = 0  # tokens[_prefix:_read]: the last final piece, context for what follows
        self._read = len(self._tokens)  # tokens[_read:]: pending

    def push(self, token_id: int) -> tuple[str, str]:
        tokens = self._tokens
        tokens.append(token_id)
        decode, prefix = self._decode, self._prefix
        context = len(decode(tokens[prefix:self._read]))
        text = decode(tokens[prefix:])
        if len(text) > context and not text.endswith(_REPLACEMENT) and token_id not in self._held:
            self._advance(len(tokens))
            return text[context:], ""
        if len(tokens) - self._read <= self.MAX_PENDING:
            return "", text[context:]
        cut = len(tokens) - 3
        final = decode(tokens[prefix:cut])[context:]
        self._advance(cut)
        tokens, prefix, read = self._tokens, self._prefix, self._read
        return final, decode(tokens[prefix:])[len(decode(tokens[prefix:read])):]

    def _advance(self, read: int) -> None:
        self._prefix, self._read = self._read, read
        if self._prefix > 64:  # the tokens before the context are never decoded again
            del self._tokens[:self._prefix]
            self._read -= self._prefix
            self._prefix = 0


class OutputText:
    """One request's output text: the decoder's final text (written to `_final`; its last characters also
    in `_tail`, from `_tail_start`) and its pending text. Only the engine's thread touches it.
    `special_stops`: the stop strings that are a special token's text, by its id (tokenizer.py
    `special_token_id`): such a token may write no text (skip_special_tokens), so it stops by its id
    (`special_stop`), not by the text."""

    __slots__ = ("_decoder", "_ends", "_final", "_final_len", "_pending", "_scan_from", "_special_stops",
                 "_stop", "_tail", "_tail_start", "holdback", "shown")

    def __init__(self, decoder: StreamDecoder, stop: Sequence[str],
                 special_stops: Mapping[int, str] | None = None) -> None:
        self._decoder = decoder
        self._stop = tuple(stop)
        self._special_stops = dict(special_stops or {})
        self.holdback = max((len(s) for s in self._stop), default=1) - 1
        self._final = io.StringIO()
        self._final_len = 0
        self._tail = ""
        self._tail_start = 0
        self._pending = ""
        self._scan_from = 0
        self._ends: list[int] = []  # the text's length through each token pushed since the last release
        self.shown = 0  # characters released

    def __len__(self) -> int:
        return self._final_len + len(self._pending)

    def push(self, token_id: int) -> None:
        """The request's next token (check_stop, once per token, in order)."""
        before = self._final_len
        final, self._pending = self._decoder.push(token_id)
        if final:
            self._final.write(final)
            self._final_len += len(final)
            self._tail += final
        # every earlier token was checked: a stop string found now ends past the final text it had
        self._scan_from = max(0, before - self.holdback)
        self._ends.append(len(self))

    def special_stop(self, token_id: int) -> str | None:
        """The stop string `token_id` is the special token of, if it is one."""
        return self._special_stops.get(token_id) if self._special_stops else None

    def find_stop(self) -> tuple[int, int] | None:
        """If the last token completed a stop string: where the first one found starts and ends."""
        if not self._stop:
            return None
        window, start = self._tail + self._pending, self._tail_start
        at = self._scan_from - start
        found = [(i, i + len(s)) for i, s in ((window.find(s, at), s) for s in self._stop) if i >= 0]
        if not found:
            return None
        cut, end = min(found)
        return start + cut, start + end

    def text(self) -> str:
        """All of it (once, when the request finishes)."""
        return self._final.getvalue() + self._pending

    def release(self, finished: bool, output_text: str) -> tuple[str, tuple[int, ...]]:
        """(the text the client may be shown now, past what it was shown: to the end of `output_text` (the
        text cut before a stop string) when finished, else all but the last `holdback` characters and any
        U+FFFD just before them, and never pending text; the text's length through each token since the last
        release). Called once
        per step for each request that got tokens."""
        ends, self._ends = tuple(self._ends), []
        if finished:
            out = output_text[self.shown:] if len(output_text) > self.shown else ""
            self.shown = max(self.shown, len(output_text))
            return out, ends
        shown, start = self.shown, self._tail_start
        window = self._tail + self._pending  # the text from `start`; before it, from `shown`, only U+FFFD
        # never pending text, which a later token may still change
        low, end = max(shown, start), min(len(self) - self.holdback, self._final_len)
        while end > low and window[end - 1 - start] == _REPLACEMENT:
            end -= 1
        out = ""
        if end > low:
            out = _REPLACEMENT * (low - shown) + window[low - start:end - start]
            self.shown = end
        # keep what the next stop check and release read: from `holdback` before the final text's end (what
        # lies between `shown` and there is U+FFFD, held back, and final)
        keep_from = max(start, self._final_len - self.holdback)
        if keep_from > start:
            self._tail = self._tail[keep_from - start:]
            self._tail_start = keep_from
        return out, ends
