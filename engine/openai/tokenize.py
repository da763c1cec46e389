"""vLLM's `POST /tokenize` and `POST /detokenize` request bodies, checked, and their answers. Pure: the
tokenizing itself is the service's (service.py `tokenize`), through the same prompt path a generation takes.

/tokenize has vLLM's two forms, told apart by `messages`:
- completion: `model`, `prompt` (a string), `add_special_tokens` (default true);
- chat: `model`, `messages`, `add_generation_prompt`, `continue_final_message`, `add_special_tokens`,
  `chat_template`, `chat_template_kwargs`, `tools`, `mm_processor_kwargs`;
both with `return_token_strs` (default false). The fields a generation request also has are checked by
protocol.py `parse_request`, so a chat-template field is served or refused here exactly as chat completions
serve or refuse it; a field of neither form is refused by name. The answer is vLLM's
`{"count", "max_model_len", "tokens", "token_strs"}`.

/detokenize: `model` and `tokens` (token ids) → `{"prompt": text}`, special tokens written as the tokenizer
writes them (vLLM decodes so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import bad_request
from .protocol import ApiRequest, parse_request

_COMPLETION_FIELDS = frozenset({"model", "prompt", "add_special_tokens", "return_token_strs"})
_CHAT_FIELDS = frozenset({"model", "messages", "add_generation_prompt", "continue_final_message",
                          "add_special_tokens", "chat_template", "chat_template_kwargs", "tools",
                          "mm_processor_kwargs", "return_token_strs"})
_DETOKENIZE_FIELDS = frozenset({"model", "tokens"})
# The tokens are decoded on the loop: at most this many (a long context's worth, a few ms to decode), as a
# text prompt is bounded before it is tokenized (generate/serving/prompt.py)
MAX_DETOKENIZE_TOKENS = 1 << 17


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    """A checked /tokenize: the prompt as a generation request would carry it, and whether to name each
    token."""

    api: ApiRequest
    return_token_strs: bool


@dataclass(frozen=True, slots=True)
class DetokenizeRequest:
    model: str
    tokens: tuple[int, ...]


def parse_tokenize(doc: dict[str, Any]) -> TokenizeRequest:
    chat = "messages" in doc
    _known(doc, _CHAT_FIELDS if chat else _COMPLETION_FIELDS, "chat" if chat else "completion")
    strs = doc.get("return_token_strs")
    if strs is not None and not isinstance(strs, bool):
        raise bad_request(f"{strs!r} is not of type 'boolean' - 'return_token_strs'", "return_token_strs",
                          "invalid_type")
    rest = {k: v for k, v in doc.items() if k not in ("return_token_strs", "mm_processor_kwargs")}
    mm = doc.get("mm_processor_kwargs")
    if mm not in (None, {}):  # the prompt is text only here
        raise bad_request("'mm_processor_kwargs' is not supported by this server; leave it out.",
                          "mm_processor_kwargs", "unsupported_parameter")
    if not chat and not isinstance(doc.get("prompt"), str | None):
        raise bad_request("'prompt' must be a string - 'prompt'", "prompt", "invalid_type")
    return TokenizeRequest(parse_request(rest, chat), bool(strs))


def parse_detokenize(doc: dict[str, Any]) -> DetokenizeRequest:
    _known(doc, _DETOKENIZE_FIELDS, "detokenize")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("You must provide a model parameter.", "model")
    tokens = doc.get("tokens")
    if tokens is None:
        raise bad_request("Missing required parameter: 'tokens'.", "tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                               for t in tokens):
        raise bad_request("'tokens' must be a list of token ids (integers, 0 or more) - 'tokens'", "tokens",
                          "invalid_type")
    if len(tokens) > MAX_DETOKENIZE_TOKENS:
        raise bad_request(f"'tokens' has {len(tokens)} ids; send at most {MAX_DETOKENIZE_TOKENS}.", "tokens")
    return DetokenizeRequest(model, tuple(tokens))


def tokenize_answer(ids: list[int], max_model_len: int, token_strs: list[str] | None) -> dict[str, Any]:
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": token_strs}


def _known(doc: dict[str, Any], fields: frozenset[str], form: str) -> None:
    for key in doc:
        if key not in fields:
            raise bad_request(f"Unrecognized request argument supplied: {key} (the {form} form takes "
                              f"{', '.join(sorted(fields))})", key, "unknown_parameter")
