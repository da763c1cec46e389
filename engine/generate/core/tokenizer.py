"""Text ↔ token ids: a byte-level tokenizer, or a model folder's `tokenizer.json` through `tokenizers`.

The byte-level tokenizer needs nothing: token `b` is byte `b` (0–255) of the UTF-8 text, then BOS (256) and
EOS (257); the example model (perf/hubserve_models/tiny_decoder.py) has exactly this vocabulary.
`tokenizer.json` (Hugging Face's format, what a real export ships) needs the `tokenizers` package, a
dependency of hubserve's (pyproject.toml); an install without it fails such a folder's load saying so.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ...errors import EngineError, ErrorCode, invalid
from .detokenize import StreamDecoder, Utf8Decoder, WindowDecoder


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The prompt's token ids, with BOS first where the tokenizer has one (and `add_special_tokens`:
        False leaves out what the tokenizer adds, as vLLM's field of that name asks)."""
        ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of generated ids; special tokens are left out (unless not `skip_special_tokens`: then
        written as the tokenizer writes them, vLLM's field of that name)."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """One token's bytes as it adds them to the text (OpenAI's logprobs show them): b"" for a special
        token."""
        ...

    def token_str(self, token_id: int) -> str:
        """One token as its vocabulary names it (transformers' `convert_ids_to_tokens`: "Ġword" for a
        byte-level BPE token, "<s>" for a special one); what vLLM's /tokenize shows as `token_strs`."""
        ...

    def stream_decoder(self, skip_special_tokens: bool = True,
                       prompt_tail: Sequence[int] = ()) -> StreamDecoder:
        """A new decoder for one request's output a token at a time (detokenize.py), whose text after each
        token is the text the tokens so far add after `prompt_tail` (the prompt's last few tokens: a
        SentencePiece word's leading space is kept, as decoding the prompt and its answer together writes
        it)."""
        ...

    def special_token_id(self, text: str) -> int | None:
        """The id of the special token written `text` (a stop string that is one stops on its id:
        stopping.py), or None."""
        ...


class ByteTokenizer:
    """Its special tokens (BOS, EOS) have no text: `skip_special_tokens` changes nothing here."""

    vocab_size = 258
    bos_token_id: int | None = 256
    eos_token_id: int | None = 257

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raw = list(text.encode("utf-8"))
        return [256, *raw] if add_special_tokens else raw

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        # a multi-byte character cut by the end of the output shows as U+FFFD until its last byte arrives
        try:
            raw = bytes(token_ids)  # the usual case, all bytes: one C call (the driver decodes every step)
        except ValueError:  # BOS or EOS among them: dropped
            raw = bytes(t for t in token_ids if 0 <= t < 256)
        return raw.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes((token_id,)) if 0 <= token_id < 256 else b""

    def token_str(self, token_id: int) -> str:
        # a byte as the character of that code point (Latin-1); the special tokens have no names of their own
        if 0 <= token_id < 256:
            return chr(token_id)
        return {256: "<bos>", 257: "<eos>"}.get(token_id, "")

    def stream_decoder(self, skip_special_tokens: bool = True,
                       prompt_tail: Sequence[int] = ()) -> StreamDecoder:
        return Utf8Decoder()  # a byte's text never depends on the bytes before it

    def special_token_id(self, text: str) -> int | None:
        return None  # BOS and EOS have no text


class JsonTokenizer:
    """A `tokenizer.json` through the `tokenizers` package (imported only here, only when asked for)."""

    def __init__(self, path: Path, bos_token: str | None, eos_token: str | None) -> None:
        try:
            from tokenizers import Tokenizer as HfTokenizer  # type: ignore[import-not-found]
        except ImportError:
            raise EngineError(ErrorCode.UNSUPPORTED, "tokenizer 'tokenizer.json' needs the `tokenizers` "
                              "package (pip install tokenizers), or use tokenizer 'bytes'") from None
        self._tok: Any = HfTokenizer.from_file(str(path))
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.bos_token_id = self._tok.token_to_id(bos_token) if bos_token else None
        self.eos_token_id = self._tok.token_to_id(eos_token) if eos_token else None
        self._special_ids = {str(t.content): int(i) for i, t in self._tok.get_added_tokens_decoder().items()
                             if t.special}
        self._byte_tokens = _byte_fallback_tokens(self._tok)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def token_bytes(self, token_id: int) -> bytes:
        # the token decoded alone: exact for a token of whole characters; a byte-level BPE token holding part
        # of a multi-byte character shows as U+FFFD (its raw bytes are not asked of `tokenizers` here)
        return self.decode((token_id,)).encode()

    def token_str(self, token_id: int) -> str:
        return str(self._tok.id_to_token(token_id) or "")

    def stream_decoder(self, skip_special_tokens: bool = True,
                       prompt_tail: Sequence[int] = ()) -> StreamDecoder:
        # a few tokens' decode per token; equal to the whole output's decode after the prompt's wherever a
        # token's text depends only on the tokens just before it (byte-level BPE, SentencePiece)
        return WindowDecoder(functools.partial(self.decode, skip_special_tokens=skip_special_tokens),
                             prompt_tail, self._byte_tokens)

    def special_token_id(self, text: str) -> int | None:
        return self._special_ids.get(text)

    def added_text_token_ids(self) -> tuple[int, ...]:
        """The added tokens that are not special (Qwen's `<tool_call>`, `<think>`: written as text, kept in
        a decode), ascending. llguidance keeps every added token apart from text, so a grammar whose text
        may hold them names them (openai/tools/strict.py)."""
        return tuple(sorted(int(i) for i, t in self._tok.get_added_tokens_decoder().items() if not t.special))

    def json_text(self) -> str:
        """The tokenizer as `tokenizer.json` holds it (what the grammar engine reads: grammar.py)."""
        return str(self._tok.to_str())


def _byte_fallback_tokens(tok: Any) -> frozenset[int]:
    """A byte-fallback BPE's byte tokens ("<0x00>" … "<0xFF>": Llama's and Mistral's SentencePiece
    exports), whose text `tokenizers` writes a run at a time; none for other models."""
    model = json.loads(tok.to_str()).get("model") or {}
    if not model.get("byte_fallback"):
        return frozenset()
    ids = (tok.token_to_id(f"<0x{b:02X}>") for b in range(256))
    return frozenset(i for i in ids if i is not None)


def load_tokenizer(kind: str, folder: Path, params: Mapping[str, str], where: str) -> Tokenizer:
    """The tokenizer a model folder's `tokenizer` parameter names: "bytes", or "tokenizer.json" (the file
    beside the config; `bos_token` / `eos_token` parameters name its special tokens)."""
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "tokenizer.json":
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise invalid(f"{where}: tokenizer 'tokenizer.json' but the folder has no tokenizer.json")
        try:
            return JsonTokenizer(path, params.get("bos_token"), params.get("eos_token"))
        except EngineError:
            raise
        except Exception as e:  # the `tokenizers` package refusing the file (its own words)
            raise invalid(f"{where}: its tokenizer.json cannot be loaded: {e}") from None
    raise invalid(f"{where}: tokenizer must be 'bytes' or 'tokenizer.json', got {kind!r}")
