"""engine/generate/core/detokenize.py on its own, pure: a request's output text kept a token at a time gives,
after every token, what decoding the whole output gives (the byte tokenizer exactly, invalid bytes and
special tokens included); the stop strings are found where a whole-text search finds them; what the client
is shown is what the whole-text hold-back showed (reference: `reference_events`, the driver's earlier
whole-text rule written out here); and a token's work does not grow with the output's length."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from engine.errors import EngineError
from engine.generate.core.detokenize import OutputText, WindowDecoder
from engine.generate.core.request import FinishReason, Request, SamplingParams
from engine.generate.core.stopping import check_stop
from engine.generate.core.tokenizer import ByteTokenizer

TOKENIZER = ByteTokenizer()
# bytes that make UTF-8 characters of 1-4 bytes, broken ones, stray continuations, and BOS/EOS
ALPHABET = [*b"abc xyz.", 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 0xED, 0xA0, 0xFF, 0xC0,
            256, 257]


def reference_events(tokens: list[int], stop: tuple[str, ...]) -> tuple[list[str], str | None]:
    """The whole-text rules: after each token decode everything; stop at the first stop string found (the
    text cut before it); else show all but the last len(longest stop) - 1 characters, and no U+FFFD just
    before them. (the text shown at each token, the finished text if a stop string ended it)"""
    holdback = max((len(s) for s in stop), default=1) - 1
    sent, shown = 0, []
    for k in range(1, len(tokens) + 1):
        text = TOKENIZER.decode(tokens[:k])
        cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
        if cuts:
            final = text[:min(cuts)]
            shown.append(final[sent:] if len(final) > sent else "")
            return shown, final
        end = len(text) - holdback
        while end > sent and text[end - 1] == "\ufffd":
            end -= 1
        piece = text[sent:max(end, 0)] if max(end, 0) > sent else ""
        sent += len(piece)
        shown.append(piece)
    return shown, None


def run(tokens: list[int], stop: tuple[str, ...]) -> tuple[list[str], str | None, list[str]]:
    """The same through OutputText as check_stop and the engine use it: (shown per token, the finished
    text if a stop string ended it, the whole text after each token)."""
    text = OutputText(TOKENIZER.stream_decoder(), stop)
    shown, texts = [], []
    for token in tokens:
        text.push(token)
        texts.append(text.text())
        found = text.find_stop()
        if found is not None:
            cut = found[0]
            shown.append(text.release(True, text.text()[:cut])[0])
            return shown, text.text()[:cut], texts
        shown.append(text.release(False, "")[0])
    return shown, None, texts


def test_the_text_after_every_token_is_the_whole_outputs_decode():
    rng = random.Random(7)
    for _ in range(400):
        tokens = [rng.choice(ALPHABET) for _ in range(rng.randint(1, 40))]
        texts = run(tokens, ())[2]
        assert texts == [TOKENIZER.decode(tokens[:k]) for k in range(1, len(tokens) + 1)], tokens


def test_stop_strings_and_what_is_shown_match_the_whole_text_rules():
    rng = random.Random(11)
    stops = [("c",), ("é x",), ("\ufffd",), ("€",), ("ab", "b."), ("zz", "a\ufffdb", "x y z"),
             ("€\ufffd", "q")]
    for trial in range(3000):
        stop = stops[trial % len(stops)]
        tokens = [rng.choice(ALPHABET) for _ in range(rng.randint(1, 60))]
        shown, final, _ = run(tokens, stop)
        assert (shown, final) == reference_events(tokens, stop), (tokens, stop)


def test_check_stop_cuts_the_text_before_the_first_stop_string():
    params = SamplingParams(max_tokens=100, stop=("lo w", "d!"), ignore_eos=True)
    request = Request("r", [256], params, np.random.default_rng(0),
                      text=OutputText(TOKENIZER.stream_decoder(), params.stop))
    reasons = []
    for byte in b"hello world!":
        request.output_token_ids.append(byte)
        reasons.append(check_stop(request, TOKENIZER, 512))
        if reasons[-1] is not None:
            break
    assert reasons[-1] is FinishReason.STOP and len(reasons) == len("hello w")
    assert request.output_text == "hel"


def feed(params: SamplingParams, output: bytes) -> tuple[list[FinishReason | None], str]:
    """check_stop after each byte of `output` until it finishes: (its answers, the finished text)."""
    request = Request("r", [256], params, np.random.default_rng(0),
                      text=OutputText(TOKENIZER.stream_decoder(), params.stop))
    reasons: list[FinishReason | None] = []
    for byte in output:
        request.output_token_ids.append(byte)
        reasons.append(check_stop(request, TOKENIZER, 512))
        if reasons[-1] is not None:
            break
    return reasons, request.output_text


def test_include_stop_str_in_output_ends_the_text_after_the_stop_string():
    params = SamplingParams(max_tokens=100, stop=("lo w", "d!"), include_stop_str_in_output=True)
    reasons, text = feed(params, b"hello world!")
    assert reasons[-1] is FinishReason.STOP and text == "hello w"


def test_a_stop_tokens_text_is_left_out_unless_include_stop_str_in_output():
    """vLLM's: a request ended by a stop token (or EOS) does not show that token's text, unless asked."""
    stop_at_l = SamplingParams(max_tokens=100, stop_token_ids=frozenset({ord("l")}))
    assert feed(stop_at_l, b"hello") == ([None, None, FinishReason.STOP], "he")
    kept = SamplingParams(max_tokens=100, stop_token_ids=frozenset({ord("l")}),
                          include_stop_str_in_output=True)
    assert feed(kept, b"hello")[1] == "hel"


def test_no_stop_counts_until_past_min_tokens():
    """vLLM's min_tokens: a stop string (or token) completed within the first min_tokens tokens is passed;
    the first one after them stops."""
    stop_at_e = SamplingParams(max_tokens=100, stop=("e",), stop_token_ids=frozenset({ord("l")}),
                               min_tokens=4)
    reasons, text = feed(stop_at_e, b"hello there")
    assert len(reasons) == len("hello the") and text == "hello th"
    assert feed(SamplingParams(max_tokens=100, stop=("e",), min_tokens=1), b"ee")[1] == "e"
    with pytest.raises(EngineError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_a_tokens_work_does_not_grow_with_the_output():
    """Per token, the stop check over 4 stop strings of 64 characters and the text released, at 64 tokens
    and at 65,536 (CPU time of this thread, the least of a few runs): decoding the whole output every token
    cost hundreds of times more at the end, and even a search of the whole text alone ~10x."""
    params = SamplingParams(max_tokens=1 << 20, ignore_eos=True,
                            stop=tuple(f"\x00never {i} " + "z" * 52 for i in range(4)))
    passage = ("Il était une fois — « naïve » — a story of 42 knights. " * 1200).encode()

    def cost_per_token(length: int) -> float:
        request = Request("r", [256], params, np.random.default_rng(0),
                          text=OutputText(TOKENIZER.stream_decoder(), params.stop))
        spent = 0.0
        for i in range(length):
            start = time.thread_time()
            request.output_token_ids.append(passage[i])
            assert check_stop(request, TOKENIZER, 1 << 30) is None
            request.text.release(False, "")
            if i >= length - 64:
                spent += time.thread_time() - start
        return spent / 64

    early = min(cost_per_token(64) for _ in range(5))
    late = min(cost_per_token(65_536) for _ in range(3))
    assert late < 2.5 * early + 1e-6, (early, late)


class PieceTokenizer:
    """A small SentencePiece-like tokenizer: word pieces that start with "▁" (a space, dropped at the start
    of a text) and byte-fallback tokens whose bytes join into UTF-8 across tokens; its `decode` is the whole
    rule, which WindowDecoder must match a few tokens at a time."""

    PIECES = ["▁the", "▁cat", "s", ".", "▁a", "te", "▁", "▁naïve"]

    def __init__(self) -> None:
        self.calls: list[int] = []  # how many tokens each decode was given

    def decode(self, token_ids) -> str:
        self.calls.append(len(token_ids))
        out, raw = [], bytearray()
        for t in token_ids:
            if t >= 1000:
                raw.append(t - 1000)
                continue
            out.append(raw.decode("utf-8", "replace"))
            raw.clear()
            out.append(self.PIECES[t].replace("▁", " "))
        out.append(raw.decode("utf-8", "replace"))
        text = "".join(out)
        return text[1:] if text.startswith(" ") else text


def test_a_window_decoder_matches_the_whole_decode_of_a_tokenizer_with_context():
    rng = random.Random(3)
    chars = ["é", "€", "😀", "x"]
    for _ in range(500):
        tokens: list[int] = []
        while len(tokens) < 30:
            if rng.random() < 0.3:
                tokens += [1000 + b for b in rng.choice(chars).encode()]
            else:
                tokens.append(rng.randrange(len(PieceTokenizer.PIECES)))
        tok = PieceTokenizer()
        text = OutputText(WindowDecoder(tok.decode), ())
        for k, token in enumerate(tokens, 1):
            text.push(token)
            assert text.text() == tok.decode(tokens[:k]), tokens[:k]


def test_a_window_decoder_decodes_a_few_tokens_at_a_time_even_through_invalid_bytes():
    tok = PieceTokenizer()
    decoder = WindowDecoder(tok.decode)
    tokens = [0, 1, 1000 + 0xFF] * 300 + [1000 + 0xE2] * 100 + [2, 3] * 50
    for token in tokens:
        decoder.push(token)
    assert max(tok.calls) <= 2 * WindowDecoder.MAX_PENDING
