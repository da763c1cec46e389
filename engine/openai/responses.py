"""OpenAI's response objects, as plain dicts: completions, chat completions, their stream chunks, usage and
the model list. Pure: what to say is the caller's (service.py, frontend/openai/stream.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..generate.serving.driver import ShownLogprob
from .generation import Choice, Generation
from .tools.calls import ARGUMENTS, OPEN, ChoiceCalls, Piece

OWNED_BY = "hubserve"


def usage(gen: Generation) -> dict[str, int]:
    prompt, completion = gen.prompt_tokens, gen.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _finish(choice: Choice) -> str | None:
    return choice.finish_reason if choice.finish_reason in ("stop", "length") else None


def _text(token: bytes) -> str:
    return token.decode("utf-8", errors="replace")  # part of a multi-byte character shows as U+FFFD


def logprobs_object(entries: list[ShownLogprob], chat: bool, offset: int = 0) -> tuple[dict[str, Any], int]:
    """OpenAI's `logprobs` of a choice (or of a stream chunk's tokens), and the text offset after them.
    Chat: `content`, one entry per token with its `bytes` and `top_logprobs`. Completions (the legacy
    shape): `tokens`, `token_logprobs`, `top_logprobs` (a dict per token: the most likely, and the sampled
    token's own, so up to logprobs + 1 entries, as OpenAI documents) and `text_offset` (each token's start
    in the completion's text, counting from `offset`)."""
    if chat:
        content = [{"token": _text(e.token), "logprob": e.logprob, "bytes": list(e.token),
                    "top_logprobs": [{"token": _text(t), "logprob": p, "bytes": list(t)} for t, p in e.top]}
                   for e in entries]
        return {"content": content, "refusal": None}, offset
    tokens, offsets, tops = [], [], []
    for e in entries:
        text = _text(e.token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        top: dict[str, float] = {}
        for t, p in e.top:  # two tokens can show as the same text (U+FFFD): the likelier one is kept
            top.setdefault(_text(t), p)
        top.setdefault(text, e.logprob)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": offsets}, offset


def completion(gen: Generation, chat: bool, model: str, created: int) -> dict[str, Any]:
    """The one JSON answer of a request that did not stream."""
    wanted = gen.params.logprobs is not None

    def logprobs(c: Choice) -> dict[str, Any] | None:
        return logprobs_object(c.logprobs, chat)[0] if wanted else None

    if chat:
        choices = [_chat_choice(gen, c, logprobs(c)) for c in gen.choices]
    else:
        choices = [{"index": c.index, "text": "".join(c.text), "logprobs": logprobs(c),
                    "finish_reason": _finish(c)} for c in gen.choices]
    return {"id": gen.request_id, "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": model, "system_fingerprint": None, "choices": choices,
            "usage": usage(gen)}


def _chat_choice(gen: Generation, c: Choice, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    """A chat choice: its message, with the tool calls read from it when the request has tools."""
    text, reason = "".join(c.text), _finish(c)
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    reading = gen.tool_calls()
    if reading is not None:
        content, calls = reading.message(text)
        message["content"] = content
        if calls:
            message["tool_calls"] = [call.as_message_part() for call in calls]
        reason = reading.finish_reason(reason)
    return {"index": c.index, "message": message, "logprobs": logprobs, "finish_reason": reason}


def tool_call_deltas(pieces: Iterable[Piece]) -> list[dict[str, Any]]:
    """A streamed chat's deltas for what a choice's reading found (ChoiceCalls.feed): content, a call's
    opening as OpenAI streams one (its index, id, type and name with empty arguments), then its arguments'
    fragments (index and `function.arguments` only), which a client concatenates."""
    out: list[dict[str, Any]] = []
    for piece in pieces:
        if piece.kind == OPEN:
            assert piece.call is not None
            out.append({"tool_calls": [{"index": piece.index, "id": piece.call.id, "type": "function",
                                        "function": {"name": piece.call.name, "arguments": ""}}]})
        elif piece.kind == ARGUMENTS:
            out.append({"tool_calls": [{"index": piece.index, "function": {"arguments": piece.text}}]})
        else:
            out.append({"content": piece.text})
    return out


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
                 finished: bool = False, logprobs: dict[str, Any] | None = None,
                 calls: ChoiceCalls | None = None) -> dict[str, Any]:
    """One choice's part of a chunk: its new text, the assistant role on a chat's first chunk, the finish
    reason on its last (`calls`: "tool_calls" when its answer made some), and (`logprobs_object`) the
    logprobs of the tokens not yet carried."""
    reason = _finish(choice) if finished else None
    if calls is not None:
        reason = calls.finish_reason(reason)
    if not chat:
        return {"index": choice.index, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
    delta: dict[str, Any] = {}
    if first:
        delta["role"] = "assistant"
    if text is not None:
        delta["content"] = text
    return {"index": choice.index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}


def usage_chunk(gen: Generation, chat: bool, model: str, created: int) -> dict[str, Any]:
    out = chunk(gen, chat, model, created, [], include_usage=False)
    out["usage"] = usage(gen)
    return out


def model_object(name: str, created: int, root: str | None, parent: str | None = None,
                 max_model_len: int | None = None) -> dict[str, Any]:
    """OpenAI's model object, with vLLM's lineage fields: `parent` is the base model's id for a LoRA adapter
    (null for a base), `root` where its weights are (a base: its folder in the repository; an adapter: its
    folder there, `base/adapters/name`), and vLLM's `max_model_len`, the context in tokens (prompt and
    completion together) its engine serves (an adapter runs in its base's)."""
    return {"id": name, "object": "model", "created": created, "owned_by": OWNED_BY, "root": root,
            "parent": parent, "max_model_len": max_model_len}
