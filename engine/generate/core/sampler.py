"""The next token of each request from its logits: greedy, or temperature → min-p → top-k → top-p → a draw.

Called by the engine once per step with the logits of the requests that sample this step, one row each.
A penalized request's row is first changed by its penalties (`penalize`), over its tokens so far: the
engine runs such a request one step per schedule, so that its tokens so far are all in `output_token_ids`.
Greedy rows are one vectorised argmax. A sampled row draws from its request's own generator only, so a
seeded request gives the same tokens whatever runs beside it, and a preempted request, which samples nothing
while it is recomputed, continues exactly where it was. A structured request's row is limited to what its
grammar allows next (`constrain`, grammar.py) and its grammar takes the token drawn; only such rows pay for
it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .request import Request, SamplingParams, TokenLogprob


def sample(logits: np.ndarray, requests: Sequence[Request], eos_token_id: int | None = None) -> list[int]:
    """One token id per row of `logits` ([len(requests), vocab]), in order. The sampled rows are scaled and
    sorted together (one numpy call each for the whole step, not one per row); each then draws alone.
    `eos_token_id`: the model's end-of-sequence token, which a request short of its `min_tokens` may not
    draw."""
    if len(requests) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(requests)} requests")
    if not requests:  # a step in which nobody samples (prefill chunks only): numpy has no argmax of nothing
        return []
    penalized = [row for row, request in enumerate(requests) if request.params.penalized]
    held = [row for row, request in enumerate(requests)
            if request.params.min_tokens and len(request.output_token_ids) < request.params.min_tokens]
    constrained = [row for row, request in enumerate(requests) if request.params.structured is not None]
    # the changed rows, each a copy (the runner's array is not ours to change; copying only these rows
    # keeps what the others cost as it was: a step's logits are megabytes at a real vocabulary)
    changed: dict[int, np.ndarray] = {}
    for row in penalized:
        penalize(changed.setdefault(row, logits[row].copy()), requests[row])
    for row in held:
        hold_stops(changed.setdefault(row, logits[row].copy()), requests[row], eos_token_id)
    for row in constrained:  # last: a grammar's mask is never loosened by what comes after it
        changed[row] = constrain(changed.get(row, logits[row]), requests[row])
    tokens = logits.argmax(axis=1).tolist()
    for row, values in changed.items():
        tokens[row] = int(values.argmax())
    rows = [row for row, request in enumerate(requests) if not request.params.greedy]
    if rows:
        temperatures = np.array([requests[row].params.temperature for row in rows], np.float64)
        scaled = logits[rows].astype(np.float64)
        for i, row in enumerate(rows):
            if row in changed:
                scaled[i] = changed[row]
        scaled /= temperatures[:, None]
        orders = np.argsort(-scaled, axis=1, kind="stable")  # most likely first; ties by token id
        for i, row in enumerate(rows):
            request = requests[row]
            tokens[row] = _draw(scaled[i], orders[i], request.params, request.rng)
    for row in constrained:
        grammar, stops = requests[row].grammar, requests[row].params.stop_token_ids
        assert grammar is not None
        if tokens[row] not in stops:  # a stop token beside EOS ends the request, outside the grammar
            grammar.advance(tokens[row])
    return tokens


def penalize(row: np.ndarray, request: Request) -> None:
    """The request's penalties applied to its logits `row` in place, in vLLM's order. First the repetition
    penalty (CTRL's, as vLLM serves it) over every token of the prompt and the output: a positive logit is
    divided by it, a negative one multiplied, so > 1 makes a seen token less likely either way. Then
    OpenAI's formula over the generated tokens only: logit[j] -= count[j] × frequency_penalty +
    (count[j] > 0) × presence_penalty. Token ids the logits do not have (a tokenizer's added tokens) are
    left out."""
    params, vocab = request.params, row.shape[0]
    if params.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(request.all_token_ids, np.int64))
        seen = seen[seen < vocab]
        values = row[seen]
        factor = params.repetition_penalty
        row[seen] = np.where(values > 0, values / factor, values * factor)
    if (params.frequency_penalty or params.presence_penalty) and request.output_token_ids:
        counts = np.bincount(np.asarray(request.output_token_ids, np.int64), minlength=vocab)[:vocab]
        row -= (params.frequency_penalty * counts + params.presence_penalty * (counts > 0)).astype(row.dtype)


def hold_stops(row: np.ndarray, request: Request, eos_token_id: int | None) -> None:
    """A request short of its `min_tokens` may not draw a token that would stop it (vLLM's min_tokens): its
    stop tokens and, unless it ignores it, the end-of-sequence token get -inf in `row`, in place. The
    engine runs such a request one step per schedule (`SamplingParams.stepwise`), so its count is current."""
    params, vocab = request.params, row.shape[0]
    stops = set(params.stop_token_ids)
    if eos_token_id is not None and not params.ignore_eos:
        stops.add(eos_token_id)
    ids = np.fromiter((t for t in stops if t < vocab), np.int64)
    row[ids] = -np.inf


def constrain(row: np.ndarray, request: Request) -> np.ndarray:
    """A structured request's logits `row` limited to the tokens its grammar allows next (grammar.py), as a
    new row: the others get -inf. Where the grammar may end, EOS is allowed and so are the request's stop
    tokens (a folder's other EOS ids); a request held short of `min_tokens` keeps them held, unless the
    grammar allows nothing else."""
    grammar = request.grammar
    assert grammar is not None
    allowed = grammar.allowed(row.shape[0], request.params.stop_token_ids)
    masked = np.where(allowed, row, -np.inf)
    if request.params.min_tokens and not np.isfinite(masked).any():  # only the stops min_tokens held: allowed
        masked = np.where(allowed, 0.0, -np.inf).astype(row.dtype)
    return masked


def token_logprob(row: np.ndarray, token: int, top: int) -> TokenLogprob:
    """`token`'s log-probability under the raw logits `row`, and the `top` most likely tokens', most likely
    first, in float64 (one partition, not a sort of the whole vocabulary)."""
    x = row.astype(np.float64)
    peak = x.max()
    logz = peak + np.log(np.exp(x - peak).sum())
    best: tuple[tuple[int, float], ...] = ()
    if top:
        k = min(top, x.shape[0])
        ids = np.argpartition(-x, k - 1)[:k] if k < x.shape[0] else np.arange(x.shape[0])
        ids = ids[np.lexsort((ids, -x[ids]))]
        best = tuple((int(j), float(x[j] - logz)) for j in ids)
    return TokenLogprob(token, float(x[token] - logz), best)


def sample_row(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One row alone (what `sample` does for each sampled row)."""
    scaled = logits.astype(np.float64) / params.temperature
    return _draw(scaled, np.argsort(-scaled, kind="stable"), params, rng)


def _draw(scaled: np.ndarray, order: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One draw from `rng` over `kept_distribution`: the inverse of the kept tokens' cumulative distribution
    at one uniform draw, which is what `Generator.choice(n, p=probs)` computes, without its per-call checks
    of `p` (a quarter of a step's Python time at 16 sampled rows; tests/.../test_generate_sampler.py holds
    the draws equal)."""
    order, probs = kept_distribution(scaled, order, params)
    cdf = probs.cumsum()
    cdf /= cdf[-1]
    return int(order[int(cdf.searchsorted(rng.random(), side="right"))])


def kept_distribution(scaled: np.ndarray, order: np.ndarray, params: SamplingParams,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """min-p → top-k → top-p over a row's temperature-scaled logits `scaled` (`order`: its token ids, most
    likely first): the kept token ids, most likely first, and their probabilities (summing to 1). What a
    sampled request draws from, and what speculative decoding verifies proposals against (verify.py).
    min-p keeps the tokens whose probability is at least min_p × the most likely one's: whose scaled logit
    is at least the highest + log(min_p)."""
    if params.min_p > 0.0:
        floor = scaled[order[0]] + np.log(params.min_p)
        order = order[:int(np.searchsorted(-scaled[order], -floor, side="right"))]
    if 0 < params.top_k < len(order):
        order = order[:params.top_k]
    kept = scaled[order]
    probs = np.exp(kept - kept[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        # the smallest prefix whose probability reaches top_p (always at least the most likely token)
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1
        order, probs = order[:cut], probs[:cut] / probs[:cut].sum()
    return order, probs
