"""The body of `POST /v1/embeddings`, checked into `EmbeddingRequest`, and its answer.

OpenAI's fields: `model`; `input` a string, a list of strings, a list of token ids or a list of such lists
(at most 2048 inputs, none empty); `encoding_format` "float" (the default) or "base64" (each vector's
little-endian float32 bytes, base64: what the `openai` package asks for by default and decodes); `dimensions`
(a shorter Matryoshka vector, where the model allows it: engine/embed/folder.py); `user` (accepted, unused).
Anything else is refused by name, as protocol.py refuses it for the generation APIs.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import bad_request

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request
_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    base64: bool = False
    dimensions: int | None = None


def parse_embedding(doc: dict[str, Any]) -> EmbeddingRequest:
    """OpenAIError (400, `param` naming the field) for what the client must change."""
    for key in doc:
        if key not in _FIELDS:
            raise bad_request(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")
    model = doc.get("model")
    if model is None:
        raise bad_request("You must provide a model parameter.", "model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a non-empty string.", "model")
    encoding = doc.get("encoding_format")
    if encoding is not None and encoding not in ("float", "base64"):
        raise bad_request(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}.",
                          "encoding_format")
    dimensions = doc.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions <= 0):
        raise bad_request(f"'dimensions' must be a positive integer, got {dimensions!r}.", "dimensions")
    user = doc.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request("'user' must be a string.", "user")
    return EmbeddingRequest(model, _inputs(doc.get("input")), encoding == "base64", dimensions)


def _inputs(value: Any) -> tuple[str | tuple[int, ...], ...]:
    if value is None:
        raise bad_request("You must provide an input parameter.", "input")
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(_is_id(v) for v in value):
        items = [value]  # one input as token ids
    elif isinstance(value, list):
        items = value
    else:
        raise bad_request("'input' must be a string, a list of strings, a list of token ids or a list of "
                          "lists of token ids.", "input")
    if not items:
        raise bad_request("'input' cannot be an empty list.", "input")
    if len(items) > MAX_INPUTS:
        raise bad_request(f"'input' has {len(items)} items; at most {MAX_INPUTS} may be sent at once.",
                          "input")
    out: list[str | tuple[int, ...]] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise bad_request(f"'input[{i}]' is an empty string; each input must have text.", "input")
            out.append(item)
        elif isinstance(item, list) and item and all(_is_id(v) for v in item):
            out.append(tuple(item))
        elif isinstance(item, list) and not item:
            raise bad_request(f"'input[{i}]' is an empty list of token ids.", "input")
        else:
            raise bad_request(f"'input[{i}]' must be a string or a list of non-negative token ids.", "input")
    if len({type(item) for item in out}) > 1:
        raise bad_request("'input' mixes strings and token ids; send one kind per request.", "input")
    return tuple(out)


def _is_id(value: Any) -> bool:
    return type(value) is int and value >= 0


def embedding_answer(model: str, vectors: np.ndarray, as_base64: bool, prompt_tokens: int) -> dict[str, Any]:
    """OpenAI's answer for `vectors` [inputs, dims] float32, in the inputs' order."""
    data = []
    for index, row in enumerate(vectors):
        embedding: Any = (base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") if as_base64
                          else row.tolist())
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


__all__ = ["MAX_INPUTS", "EmbeddingRequest", "embedding_answer", "parse_embedding"]
