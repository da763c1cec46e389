"""The next token of each request from its logits: greedy, or temperature → top-k → top-p → a draw.

Called by the engine once per step with the logits of the requests that sample this step, one row each.
Greedy rows are one vectorised argmax. A sampled row draws from its request's own generator only, so a
seeded request gives the same tokens whatever runs beside it, and a preempted request, which samples nothing
while it is recomputed, continues exactly where it was.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .request import Request, SamplingParams


def sample(logits: np.ndarray, requests: Sequence[Request]) -> list[int]:
    """One token id per row of `logits` ([len(requests), vocab]), in order."""
    if len(requests) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(requests)} requests")
    tokens = logits.argmax(axis=1).tolist()
    for row, request in enumerate(requests):
        if not request.params.greedy:
            tokens[row] = sample_row(logits[row], request.params, request.rng)
    return tokens


def sample_row(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    scaled = logits.astype(np.float64) / params.temperature
    order = np.argsort(-scaled, kind="stable")  # most likely first; ties by token id
    if 0 < params.top_k < len(order):
        order = order[:params.top_k]
    kept = scaled[order]
    probs = np.exp(kept - kept[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        # the smallest prefix whose probability reaches top_p (always at least the most likely token)
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1
        order, probs = order[:cut], probs[:cut] / probs[:cut].sum()
    return int(order[rng.choice(len(order), p=probs)])
