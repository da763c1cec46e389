"""OpenAI's response objects, as plain dicts: completions, chat completions, their stream chunks, usage and
the model list. Pure: what to say is the caller's (service.py, frontend/openai_stream.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .generation import Choice, Generation

OWNED_BY = "hubserve"


def usage(gen: Generation) -> dict[str, int]:
    prompt, completion = gen.prompt_tokens, gen.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _finish(choice: Choice) -> str | None:
    return choice.finish_reason if choice.finish_reason in ("stop", "length") else None


def completion(gen: Generation, chat: bool, model: str, created: int) -> dict[str, Any]:
    """The one JSON answer of a request that did not stream."""
    if chat:
        choices = [{"index": c.index, "message": {"role": "assistant", "content": "".join(c.text),
                                                  "refusal": None},
                    "logprobs": None, "finish_reason": _finish(c)} for c in gen.choices]
    else:
        choices = [{"index": c.index, "text": "".join(c.text), "logprobs": None, "finish_reason": _finish(c)}
                   for c in gen.choices]
    return {"id": gen.request_id, "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": model, "system_fingerprint": None, "choices": choices,
            "usage": usage(gen)}


def chunk(gen: Generation, chat: bool, model: str, created: int, choices: Iterable[dict[str, Any]],
          include_usage: bool) -> dict[str, Any]:
    """A stream chunk carrying `choices` (made by `chunk_choice`); with include_usage every chunk has
    `usage: null` but the last, usage-only one (`usage_chunk`), as OpenAI streams it."""
    out: dict[str, Any] = {"id": gen.request_id, "object": "chat.completion.chunk" if chat else
                           "text_completion", "created": created, "model": model, "system_fingerprint": None,
                           "choices": list(choices)}
    if include_usage:
        out["usage"] = None
    return out


def chunk_choice(choice: Choice, chat: bool, text: str | None, first: bool = False,
                 finished: bool = False) -> dict[str, Any]:
    """One choice's part of a chunk: its new text, the assistant role on a chat's first chunk, the finish
    reason on its last."""
    reason = _finish(choice) if finished else None
    if not chat:
        return {"index": choice.index, "text": text or "", "logprobs": None, "finish_reason": reason}
    delta: dict[str, Any] = {}
    if first:
        delta["role"] = "assistant"
    if text is not None:
        delta["content"] = text
    return {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": reason}


def usage_chunk(gen: Generation, chat: bool, model: str, created: int) -> dict[str, Any]:
    out = chunk(gen, chat, model, created, [], include_usage=False)
    out["usage"] = usage(gen)
    return out


def model_object(name: str, created: int, root: str | None, parent: str | None = None) -> dict[str, Any]:
    """OpenAI's model object, with vLLM's lineage fields: `parent` is the base model's id for a LoRA adapter
    (null for a base), `root` where its weights are (a base: its folder in the repository; an adapter: its
    folder there, `base/adapters/name`)."""
    return {"id": name, "object": "model", "created": created, "owned_by": OWNED_BY, "root": root,
            "parent": parent}
