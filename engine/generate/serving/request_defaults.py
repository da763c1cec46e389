"""What a model's folder adds to each of its requests: its end-of-sequence ids beyond the tokenizer's, and its
sampling defaults for the fields a request leaves out.

Made once per version, when its engine is built (registry.py), from its config's parameters (a Hugging Face
folder's are read from its files: hf_folder.py):

- `eos_token_ids` (generation_config.json's eos_token_id, an id or a list): every id ends a generation, as
  transformers' `generate()` and vLLM stop on each. The engine stops on the tokenizer's EOS; the others are
  added to the request's stop tokens unless it asks `ignore_eos`, as vLLM does
  (`SamplingParams.update_from_generation_config`), so they stop, are held under `min_tokens` and leave the
  text alike.
- `default_temperature`, `default_top_p`, `default_top_k`, `default_min_p`, `default_repetition_penalty`
  (generation_config.json's): the value a request gets for a field it does not set, as vLLM's OpenAI server
  with `--generation-config auto` (its default) applies them. Only the OpenAI API passes the fields it left
  out; Triton's requests keep their own defaults (greedy), as Triton's vLLM backend builds its requests.

Applied on the loop, per request, by the API that builds its `SamplingParams` (openai/service.py,
triton/model.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import invalid
from ..core.request import SamplingParams
from ..core.tokenizer import Tokenizer

# a request's field → the parameter that gives its default (and the type of its value)
SAMPLING_DEFAULTS: dict[str, tuple[str, type]] = {
    "temperature": ("default_temperature", float),
    "top_p": ("default_top_p", float),
    "top_k": ("default_top_k", int),
    "min_p": ("default_min_p", float),
    "repetition_penalty": ("default_repetition_penalty", float),
}


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    extra_eos_ids: frozenset[int] = frozenset()  # end-of-sequence ids besides the tokenizer's own
    sampling: tuple[tuple[str, Any], ...] = ()   # (SamplingParams field, default) for the fields given

    @classmethod
    def of(cls, params: Mapping[str, str], tokenizer: Tokenizer, where: str) -> RequestDefaults:
        """From a generative config's parameters; INVALID_ARG naming one that does not parse or is out of
        range (a default is checked as a request's value would be)."""
        eos = _ids(params.get("eos_token_ids", ""), "eos_token_ids", where)
        sampling = []
        for field, (name, kind) in SAMPLING_DEFAULTS.items():
            text = params.get(name)
            if text is None:
                continue
            try:
                number = float(text)
            except ValueError:
                number = float("nan")
            if number != number or (kind is int and not number.is_integer()):
                what = "an integer" if kind is int else "a number"
                raise invalid(f"{where}: parameter {name} must be {what}, got {text!r}")
            value: Any = max(int(number), 0) if kind is int else number  # top_k -1: every token, as vLLM
            sampling.append((field, value))
        defaults = cls(frozenset(eos) - {tokenizer.eos_token_id}, tuple(sampling))
        try:
            defaults.apply(SamplingParams(), frozenset(SAMPLING_DEFAULTS))
        except Exception as e:
            raise invalid(f"{where}: a sampling default of its folder cannot be used: {e}") from None
        return defaults

    def apply(self, params: SamplingParams, unset: Collection[str] = ()) -> SamplingParams:
        """`params` with the model's extra EOS ids as stop tokens (unless `ignore_eos`) and its default for
        each field in `unset` (the request's fields it did not send)."""
        changes: dict[str, Any] = {field: value for field, value in self.sampling if field in unset}
        if self.extra_eos_ids and not params.ignore_eos:
            changes["stop_token_ids"] = params.stop_token_ids | self.extra_eos_ids
        return dataclasses.replace(params, **changes) if changes else params

    def describe(self) -> str:
        """For the load's log line."""
        parts = [f"{field} {value}" for field, value in self.sampling]
        if self.extra_eos_ids:
            parts.append("also stops on " + ", ".join(map(str, sorted(self.extra_eos_ids))))
        return "; ".join(parts)


def _ids(text: str, name: str, where: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ids = [-1]
    if any(i < 0 for i in ids):
        raise invalid(f"{where}: parameter {name} must be token ids separated by commas, got {text!r}")
    return ids
