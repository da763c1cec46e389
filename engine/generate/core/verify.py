"""Speculative decoding's verification: which proposed tokens the target model keeps, and its own next one.

A request with proposals ran its last token and its k proposals x1 … xk as one chunk (proposer.py), so the
runner returns k + 1 rows of logits: row i is the target's distribution p_i for the token after the chunk's
token i, so row 0 judges x1, row k follows the last proposal. Called by the engine (engine.py) once per such
request and step; returns at least one token, so every step advances the request.

- **Greedy** requests keep the longest prefix of proposals equal to each row's argmax, then the argmax of the
  row after it: exactly the tokens plain greedy decoding gives.
- **Sampled** requests use rejection sampling (Leviathan et al., Chen et al.): proposal x_i, drawn by a
  proposer with distribution q_i, is kept with probability min(1, p_i(x_i) / q_i(x_i)); at the first
  rejection the token is drawn from max(0, p_i - q_i) renormalised, and after k kept proposals one more is
  drawn from p_k. An n-gram proposal is a point mass (q_i(x_i) = 1), so x_i is kept with probability
  p_i(x_i) and a rejection draws from p_i with x_i removed. Each output token is then distributed as the
  target's p (temperature, min-p, top-k and top-p applied: sampler.py's `kept_distribution`), whatever was
  proposed; the draws come from the request's own generator, so a seed reproduces a request whose steps
  propose the same way (behind backoff.py's timing, not guaranteed), though not the same tokens as
  without speculation.

Requests whose logits depend on the tokens so far (penalties, a structured output's grammar), that report
logprobs or hold their stops until `min_tokens` (`SamplingParams.stepwise`) get no proposals: the
scheduler never gives them any.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .request import Request
from .sampler import kept_distribution, sample_row


def verify(logits: np.ndarray, proposals: Sequence[int], request: Request) -> list[int]:
    """The tokens `request` gets this step: the kept prefix of `proposals`, then one token of the target's
    (`logits`: [len(proposals) + 1, vocab], row i following the chunk's token i)."""
    if logits.shape[0] != len(proposals) + 1:
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(proposals)} proposals")
    params = request.params
    if params.greedy:
        best = logits.argmax(axis=1).tolist()
        kept = 0
        while kept < len(proposals) and best[kept] == proposals[kept]:
            kept += 1
        return [*proposals[:kept], int(best[kept])]
    out: list[int] = []
    for row, proposal in enumerate(proposals):
        scaled = logits[row].astype(np.float64) / params.temperature
        order, probs = kept_distribution(scaled, params)
        where = np.flatnonzero(order == proposal)
        p = float(probs[where[0]]) if where.size else 0.0
        if request.rng.random() < p:  # kept with probability p(x) (q is a point mass at x)
            out.append(int(proposal))
            continue
        # rejected: draw from p with x removed, renormalised (p - q clipped at 0, for a point mass q)
        rest = probs.copy()
        if where.size:
            rest[where[0]] = 0.0
        cdf = rest.cumsum()
        cdf /= cdf[-1]
        out.append(int(order[int(cdf.searchsorted(request.rng.random(), side="right"))]))
        return out
    out.append(sample_row(logits[len(proposals)], params, request.rng))
    return out
