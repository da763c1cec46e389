"""A Triton generation request's inputs and parameters → the prompt, the flags and `SamplingParams`. Pure.

Where the sampling options come from, in the order Triton's LLM backends read them (later wins):
1. the request's parameters (gRPC `parameters`, the generate extension's `parameters` object and its other
   keys): the known keys only, since a request also carries parameters meant for others
   (`triton_enable_empty_final_response`, a generate request's `id`); this is how vLLM's backend reads them
   when no `sampling_parameters` input is given;
2. the `sampling_parameters` input, a JSON object (vLLM's): every key must be known; 3. the `max_tokens` input
(TensorRT-LLM's ensemble spelling). Known keys: temperature, top_p, top_k (-1 or 0: every token, as vLLM),
max_tokens (default 16, vLLM's), seed, stop (a string or a list of at most 4, each at most 256 characters),
stop_token_ids (at most 128), ignore_eos, presence_penalty, frequency_penalty, repetition_penalty (the bounds:
core/request.py), and the vLLM fields the OpenAI API serves too, which are vLLM's `SamplingParams` fields and
so what Triton's vLLM backend takes in `sampling_parameters`: min_p, min_tokens, include_stop_str_in_output,
skip_special_tokens and truncate_prompt_tokens (≥ 1, or -1: the context's worth; the prompt keeps its last
that many tokens). `add_special_tokens` is not among them: vLLM takes it with the prompt, not in its
sampling parameters. `stream` and `exclude_input_in_output` are inputs, or parameters of those names when the
input is absent. The parameter `lora` (a string) names the LoRA adapter to run with (core/lora.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from ...errors import EngineError, invalid
from ..core.request import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, SamplingParams
from .signature import EXCLUDE_INPUT, MAX_TOKENS, SAMPLING_PARAMETERS, STREAM, TEXT_INPUT

DEFAULT_MAX_TOKENS = 16
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop", "stop_token_ids",
                 "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p",
                 "min_tokens", "include_stop_str_in_output", "skip_special_tokens", "truncate_prompt_tokens")


@dataclass(frozen=True, slots=True)
class RequestOptions:
    prompt: str
    stream: bool
    exclude_input: bool
    sampling: SamplingParams
    truncate_prompt_tokens: int | None = None  # keep the prompt's last this many tokens; -1: the context's


def read_options(inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> RequestOptions:
    """The request's options; INVALID_ARG naming the field for anything malformed."""
    prompt = _text(inputs[TEXT_INPUT], TEXT_INPUT)
    raw: dict[str, Any] = {k: parameters[k] for k in SAMPLING_KEYS if k in parameters}
    if SAMPLING_PARAMETERS in inputs:
        text = _text(inputs[SAMPLING_PARAMETERS], SAMPLING_PARAMETERS)
        try:
            doc = orjson.loads(text) if text.strip() else {}
        except orjson.JSONDecodeError as e:
            raise invalid(f"input '{SAMPLING_PARAMETERS}' is not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise invalid(f"input '{SAMPLING_PARAMETERS}' must be a JSON object, got {type(doc).__name__}")
        unknown = sorted(set(doc) - set(SAMPLING_KEYS))
        if unknown:
            raise invalid(f"unknown sampling parameter(s) {', '.join(repr(k) for k in unknown)} in input "
                          f"'{SAMPLING_PARAMETERS}'; known: {', '.join(SAMPLING_KEYS)}")
        raw.update(doc)
    if MAX_TOKENS in inputs:
        raw["max_tokens"] = int(inputs[MAX_TOKENS].reshape(-1)[0])
    lora = parameters.get("lora")
    if lora is not None and (not isinstance(lora, str) or not lora):
        raise invalid(f"parameter 'lora' must name an adapter (a string), got {lora!r}")
    raw["lora"] = lora
    return RequestOptions(prompt, _flag(inputs, parameters, STREAM), _flag(inputs, parameters, EXCLUDE_INPUT),
                          sampling_params(raw), _truncate(raw))


def sampling_params(raw: Mapping[str, Any]) -> SamplingParams:
    top_k = _number(raw, "top_k", int, 0)
    stop = raw.get("stop", ())
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise invalid("sampling parameter 'stop' must be a non-empty string or a list of them")
    if len(stop) > MAX_STOP_STRINGS:  # the bounds of core/request.py, in this protocol's words
        raise invalid(f"sampling parameter 'stop' has {len(stop)} strings; send at most {MAX_STOP_STRINGS}")
    longest = max(map(len, stop), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        raise invalid(f"sampling parameter 'stop' has a string of {longest} characters; each may have at "
                      f"most {MAX_STOP_STRING_CHARS}")
    ids = raw.get("stop_token_ids", ())
    if isinstance(ids, (list, tuple)) and len(ids) > MAX_STOP_TOKEN_IDS:
        raise invalid(f"sampling parameter 'stop_token_ids' has {len(ids)} token ids; send at most "
                      f"{MAX_STOP_TOKEN_IDS}")
    if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in ids):
        raise invalid("sampling parameter 'stop_token_ids' must be a list of integers")
    seed = raw.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise invalid("sampling parameter 'seed' must be an integer")
    try:
        return SamplingParams(max_tokens=_number(raw, "max_tokens", int, DEFAULT_MAX_TOKENS),
                              temperature=_number(raw, "temperature", float, 0.0),
                              top_p=_number(raw, "top_p", float, 1.0), top_k=0 if top_k == -1 else top_k,
                              seed=None if seed is None else seed % 2**64, stop=tuple(dict.fromkeys(stop)),
                              stop_token_ids=frozenset(ids), lora=raw.get("lora"),
                              min_p=_number(raw, "min_p", float, 0.0),
                              min_tokens=_number(raw, "min_tokens", int, 0),
                              ignore_eos=_bool(raw, "ignore_eos", False),
                              include_stop_str_in_output=_bool(raw, "include_stop_str_in_output", False),
                              skip_special_tokens=_bool(raw, "skip_special_tokens", True),
                              presence_penalty=_number(raw, "presence_penalty", float, 0.0),
                              frequency_penalty=_number(raw, "frequency_penalty", float, 0.0),
                              repetition_penalty=_number(raw, "repetition_penalty", float, 1.0))
    except EngineError as e:
        raise invalid(f"sampling parameters: {e.message}") from None


def _bool(raw: Mapping[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise invalid(f"sampling parameter '{key}' must be a boolean")
    return value


def _truncate(raw: Mapping[str, Any]) -> int | None:
    """`truncate_prompt_tokens`: None (keep the whole prompt), -1 (the context's worth) or at least 1."""
    if raw.get("truncate_prompt_tokens") is None:
        return None
    value = _number(raw, "truncate_prompt_tokens", int, None)
    if value == 0 or value < -1:
        raise invalid(f"sampling parameter 'truncate_prompt_tokens' must be at least 1 (-1: the model's "
                      f"context), got {value}")
    return int(value)


def _number(raw: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and
                                                                          not isinstance(value, int)):
        raise invalid(f"sampling parameter '{key}' must be {'an integer' if kind is int else 'a number'}, "
                      f"got {value!r}")
    return kind(value)


def _text(array: np.ndarray, name: str) -> str:
    flat = array.reshape(-1)
    if flat.size != 1:
        raise invalid(f"input '{name}' must hold exactly one string, got {flat.size} elements")
    value = flat[0]
    try:
        return value.decode() if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        raise invalid(f"input '{name}' is not valid UTF-8") from None


def _flag(inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any], name: str) -> bool:
    if name in inputs:
        return bool(inputs[name].reshape(-1)[0])
    value = parameters.get(name, False)
    if not isinstance(value, bool):
        raise invalid(f"parameter '{name}' must be a boolean, got {value!r}")
    return value
