"""Speculative decoding's proposals: up to k tokens a decoding request will likely produce next.

The scheduler (scheduler.py) asks the model's proposer, once per step and per decoding request, for the
tokens to verify after the request's last one; the runner computes the last token and the proposals in one
run, as a small prefill chunk over the cached context, and the engine keeps the longest prefix the target
model agrees with (verify.py). A proposer never changes what a request outputs, only how many tokens one
step yields.

`NgramProposer` is prompt lookup (vLLM's `ngram` method): the request's last n tokens (n from
`prompt_lookup_max` down to `prompt_lookup_min`) are looked for earlier in its own prompt and output; the
tokens that followed the latest earlier occurrence are the proposal. No model, no state: a repetitive text
(code edits, quoting the prompt, a looping generation) gets long runs accepted, a fresh one gets nothing
proposed and decodes as usual.

`DraftModelProposer` (draft_proposer.py) is the other kind: a small decoder's greedy tokens. The model
folder's loader wraps either in `BackoffProposer` (backoff.py), which stops asking it for a request while
its proposals do not pay. Both are
deterministic given the tokens, so the verifier treats every proposal as a point mass (verify.py); a draft
that sampled would have to hand it its distribution q as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

METHODS = ("ngram", "draft_model")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """A model folder's speculative decoding (model_folder.py's `speculative_*` parameters, vLLM's names)."""

    method: str = "ngram"            # or "draft_model" (draft_proposer.py: the lookup bounds unused)
    num_speculative_tokens: int = 4  # tokens proposed per step at most (k)
    prompt_lookup_min: int = 1       # the shortest suffix looked up
    prompt_lookup_max: int = 3       # the longest suffix looked up (tried first)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method {self.method!r} is not supported; use one of "
                             f"{', '.join(METHODS)}")
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be positive")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min and prompt_lookup_max must satisfy 1 <= min <= max")


class Proposer(Protocol):
    """Called by the scheduler on the engine's thread; owns nothing of the request's."""

    def propose(self, request_id: str, token_ids: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` tokens to follow `token_ids` (the request's prompt and output so far); [] for none.
        The tokens may have lost a tail since the last call (proposals rejected): state kept per request
        must roll back to their common prefix."""

    def release(self, request_id: str) -> None:
        """The request finished: drop what is kept for it (called by the scheduler)."""


class NgramProposer:
    """Prompt lookup over the request's own tokens (the module's docstring)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config

    def release(self, request_id: str) -> None:
        pass  # nothing kept

    def propose(self, request_id: str, token_ids: Sequence[int], limit: int) -> list[int]:
        config = self.config
        limit = min(limit, config.num_speculative_tokens)
        if limit < 1 or len(token_ids) < config.prompt_lookup_min + 1:
            return []
        tokens = np.asarray(token_ids, np.int64)
        for n in range(min(config.prompt_lookup_max, len(tokens) - 1), config.prompt_lookup_min - 1, -1):
            # every earlier window of n tokens (not the suffix itself), compared with the suffix
            windows = sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if hits.size:
                follow = int(hits[-1]) + n  # the latest occurrence: the nearest context predicts best
                return tokens[follow:follow + limit].tolist()
        return []
