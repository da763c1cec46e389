"""Structured output: what a request's text must match (`GrammarSpec`), compiled once per tokenizer
(`GrammarCompiler`), followed a token at a time (`Constraint`).

The grammar engine is llguidance (PyPI `llguidance`, a Rust core with a numpy API and no torch): it turns a
JSON schema, a regular expression, a list of choices or a Lark / GBNF grammar into a matcher that says, for
the tokens so far, which tokens may come next (a bitmask over the vocabulary), takes each sampled token,
and says when the text may end (EOS allowed) and when it must (nothing can follow). docs/generative.md says
why llguidance and not xgrammar (xgrammar imports torch).

Who calls what: the API layer checks a request's spec once (`GrammarCompiler.check`, a 400 naming its
field when it does not compile); the engine makes each request's `Constraint` when it adds the request
(`GrammarCompiler.constraint`); the sampler limits a constrained row's draw to `Constraint.allowed`
and hands the drawn token to `Constraint.advance`; stopping.py finishes the request when
`Constraint.complete`. Compiled grammars are kept per (kind, text) in a bounded cache; each request gets a
copy of the compiled matcher (cheap), so nothing a request does changes another's.
"""

from __future__ import annotations

import enum
import json
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...bounded_cache import BoundedCache
from ...errors import EngineError, ErrorCode, invalid
from .tokenizer import ByteTokenizer, JsonTokenizer, Tokenizer

MAX_GRAMMAR_CHARS = 100_000   # a spec's text (schema, regex, grammar) at most: it is compiled on a request
COMPILED_GRAMMARS = 256       # compiled grammars kept per model (a bounded cache: cleared when full)
KNOWN_MASKS = 32              # masks whose allowed ids are kept per model: at most 32 × vocabulary × 4 bytes


class GrammarKind(enum.Enum):
    JSON_SCHEMA = "json_schema"  # text: a JSON schema (OpenAI's response_format json_schema, vLLM's json)
    REGEX = "regex"              # text: a regular expression the whole output matches (Rust regex syntax)
    CHOICE = "choice"            # text: a JSON array of strings, the output exactly one of them
    GRAMMAR = "grammar"          # text: a context-free grammar, Lark or GBNF/EBNF (`root ::= ...`)


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """What a request's output must match: a value (hashable, compared by its text), kept in its
    SamplingParams. `param` is the request field it came from, named in the error when it does not
    compile ("response_format.json_schema.schema", "structured_outputs.regex", ...)."""

    kind: GrammarKind
    text: str
    param: str = ""

    def __post_init__(self) -> None:
        if len(self.text) > MAX_GRAMMAR_CHARS:
            raise invalid(f"{self.param or self.kind.value}: {len(self.text)} characters; a structured "
                          f"output constraint may have at most {MAX_GRAMMAR_CHARS}")


def constraint_for_json_schema(schema: dict[str, Any] | bool, param: str = "") -> GrammarSpec:
    """The spec for "the output is one JSON value valid under `schema`": what a caller outside the API's
    fields sets as `SamplingParams.structured` (a required or named tool call's arguments, for one)."""
    return GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema, separators=(",", ":")), param)


ANY_JSON_OBJECT = constraint_for_json_schema({"type": "object"}, "response_format")  # OpenAI's json_object


class Constraint:
    """One request's position in its grammar. Made by `GrammarCompiler.constraint`; used by the engine's
    thread only (the sampler and the stop check), after the request was added.

    A grammar that fails while it is followed (llguidance's per-step limits: a row of more than 2,000
    Earley items, more lexer or parser work than a step may take) sets `error`, and its request ends with
    it alone (stopping.py), in llguidance's words."""

    __slots__ = ("_matcher", "_mask", "_mask_address", "_vocab", "_allowed", "_tokens", "error")

    def __init__(self, matcher: Any, vocab_size: int, known: BoundedCache[bytes, np.ndarray]) -> None:
        self._matcher = matcher
        self._vocab = vocab_size
        self._mask = np.empty((vocab_size + 31) // 32, np.int32)
        self._mask_address = self._mask.ctypes.data  # once: numpy makes a ctypes object at each .ctypes
        # a view of the bitmask, refilled in place at each `allowed`; `known`: its compiler's masks' ids
        self._allowed = AllowedTokens(self._mask, vocab_size, known)
        self._tokens = 0  # taken so far (named in an error)
        self.error: EngineError | None = None

    def allowed(self, also: frozenset[int] = frozenset()) -> AllowedTokens:
        """The tokens that may come next, until the next `advance`. EOS may come only where the grammar may
        end, and so may each of `also` (stop tokens that end the request as EOS does: the folder's other EOS
        ids). llguidance fills the bitmask (1: allowed) kept for this request; the sampler reads it without
        making a masked copy of the row (sampler.py `sample`). A grammar that fails here sets `error` (the
        mask is then what llguidance left: EOS only)."""
        matcher = self._matcher
        try:
            matcher.unsafe_compute_mask_ptr(self._mask_address, self._mask.nbytes)
        except Exception as e:  # llguidance raises only on misuse (a wrong size): this request fails alone
            self.error = EngineError(ErrorCode.INTERNAL, f"structured output: the grammar's mask failed: {e}")
            self._mask.fill(0)
            return self._allowed
        if matcher.is_error():
            self.error = self._failed(self._tokens + 1)
        elif also and matcher.is_accepting():
            words = self._mask.view(np.uint32)
            for token in also:
                if token < self._vocab:
                    words[token >> 5] |= np.uint32(1 << (token & 31))
        return self._allowed

    def advance(self, token: int) -> None:
        """The sampled `token` taken (after each draw). Only a token `allowed` allowed is drawn, so it is
        taken unless the grammar failed (`error`): llguidance computes its next parser row as it takes a
        token, where a limit may be passed."""
        if self.error is not None:
            return
        self._tokens += 1
        if not self._matcher.consume_token(token):
            self.error = self._failed(self._tokens)

    @property
    def complete(self) -> bool:
        """Nothing can follow: the grammar is matched in full (or EOS was taken)."""
        return self.error is None and bool(self._matcher.is_stopped())

    def _failed(self, at_token: int) -> EngineError:
        """INVALID_ARG in llguidance's words: a grammar fails while followed only at its per-step limits,
        which the client's grammar reached; its message says how to avoid it ("consider making your grammar
        left-recursive")."""
        return invalid(f"structured output: the grammar failed at output token {at_token}: "
                       f"{_first_line(self._matcher.get_error())}")


def _first_line(message: str) -> str:
    """llguidance's error, without the parser state it appends (a dump of every token so far)."""
    return message.strip().split("\n", 1)[0]


@dataclass(frozen=True, slots=True)
class AllowedTokens:
    """What a grammar allows next: a view of its request's bitmask (bit t of word t // 32: token t may
    come), valid until that request's grammar advances. Greedy rows ask about one token (`allows`: the
    row's argmax, mostly allowed on a model that follows its grammar), sampled rows for the ids
    (`ids`)."""

    bitmask: np.ndarray  # int32 words
    vocab_size: int      # the tokenizer's: ids past it are never allowed
    # the ids of masks seen before, by the mask's bytes (one per compiler, so per tokenizer): a grammar
    # comes back to the same few states (inside a string, after a key, in a number), whose masks are equal,
    # and unpacking a mask costs more than its bytes' hash (~50 µs against ~2 µs at 32k)
    known: BoundedCache[bytes, np.ndarray]

    def allows(self, token: int) -> bool:
        return token < self.vocab_size and bool((int(self.bitmask[token >> 5]) >> (token & 31)) & 1)

    def ids(self, width: int) -> np.ndarray:
        """The allowed ids below `width` (a row's length), ascending, read-only (shared with every request
        whose grammar was in the same state)."""
        key = self.bitmask.tobytes()
        ids = self.known.get(key)
        if ids is None:
            ids = self.known.put(key, _unpacked(self.bitmask))
        limit = min(width, self.vocab_size)
        return ids if not ids.shape[0] or ids[-1] < limit else ids[:np.searchsorted(ids, limit)]


def _unpacked(bitmask: np.ndarray) -> np.ndarray:
    """A bitmask's set bits, ascending, as a read-only int32 array. A grammar mostly allows a few tokens (a
    JSON key's next characters, a number's digits) or nearly all (a string's content): the set words are
    unpacked alone while they are fewer than half, else the whole bitmask (fewer numpy calls)."""
    words = np.flatnonzero(bitmask)
    if 2 * words.shape[0] < bitmask.shape[0]:
        bits = np.flatnonzero(np.unpackbits(bitmask[words].view(np.uint8), bitorder="little"))
        ids = (words[bits >> 5] * 32 + (bits & 31)).astype(np.int32)
    else:
        ids = np.flatnonzero(np.unpackbits(bitmask.view(np.uint8), bitorder="little")).astype(np.int32)
    ids.flags.writeable = False
    return ids


class GrammarCompiler:
    """The grammars of one tokenizer (one engine's): compiled on first use, kept in a bounded cache by
    (kind, text). Called from the API layer's executor threads (`check`) and the engine's (`constraint`): a
    lock guards the cache and the matchers' copying, not the compiles. The llguidance tokenizer is built on
    first use (about a second for a vocabulary of 128k tokens), so a model nobody asks structured output of
    never pays it."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        self._ll_tokenizer: Any = None
        self._compiled: BoundedCache[tuple[GrammarKind, str], Any] = BoundedCache(COMPILED_GRAMMARS)
        # the allowed ids of masks seen (`AllowedTokens.ids`): read and filled by the engine's thread only
        self._known_masks: BoundedCache[bytes, np.ndarray] = BoundedCache(KNOWN_MASKS)

    def check(self, spec: GrammarSpec) -> None:
        """INVALID_ARG naming `spec.param` when the spec does not compile (its engine's own words)."""
        self._compiled_matcher(spec)

    def constraint(self, spec: GrammarSpec) -> Constraint:
        """A fresh position at the start of `spec`'s grammar, for one request."""
        matcher = self._compiled_matcher(spec)
        with self._lock:
            copy = matcher.deep_copy()
        return Constraint(copy, self.tokenizer.vocab_size, self._known_masks)

    def _compiled_matcher(self, spec: GrammarSpec) -> Any:
        key = (spec.kind, spec.text)
        with self._lock:
            found = self._compiled.get(key)
            if found is not None:
                return found
            tokenizer = self._llg_tokenizer()
        # compiled outside the lock, so the engine's thread, adding a request whose grammar is cached, never
        # waits for another request's compile (llguidance releases the GIL while it compiles)
        import llguidance
        try:
            grammar = llguidance.grammar_from(spec.kind.value, spec.text)
        except ValueError as e:  # a choice list that is not a list of strings, a GBNF that won't convert
            raise invalid(f"{spec.param or spec.kind.value}: {e}") from None
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise invalid(f"{spec.param or spec.kind.value}: {matcher.get_error().strip()}")
        with self._lock:
            return self._compiled.put(key, matcher)

    def _llg_tokenizer(self) -> Any:
        if self._ll_tokenizer is None:
            self._ll_tokenizer = _llg_tokenizer(self.tokenizer)
        return self._ll_tokenizer


def _llg_tokenizer(tokenizer: Tokenizer) -> Any:
    """llguidance's view of our tokenizer: every token's bytes, and EOS."""
    import llguidance
    if isinstance(tokenizer, JsonTokenizer):
        return llguidance.LLTokenizer(tokenizer.json_text(), n_vocab=tokenizer.vocab_size,
                                      eos_token=tokenizer.eos_token_id)
    if isinstance(tokenizer, ByteTokenizer):
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocabulary(tokenizer)),
                                      n_vocab=tokenizer.vocab_size, eos_token=tokenizer.eos_token_id)
    raise EngineError(ErrorCode.UNSUPPORTED,
                      f"structured output is not served for a {type(tokenizer).__name__}")


class _ByteVocabulary:
    """The byte tokenizer as llguidance's TokenizerWrapper reads a tokenizer."""

    def __init__(self, tokenizer: ByteTokenizer) -> None:
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        # a special token (no bytes of text) by its name, which llguidance keeps apart from text
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if not tokenizer.token_bytes(i)]
        self.tokens = [tokenizer.token_bytes(i) or tokenizer.token_str(i).encode()
                       for i in range(tokenizer.vocab_size)]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)
