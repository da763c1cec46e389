"""The next token of each request from its logits: greedy, or temperature → min-p → top-k → top-p → a draw.

Called by the engine once per step with the logits of the requests that sample this step, one row each.
A penalized request's row is first changed by its penalties (`penalize`), over its tokens so far: the
engine runs such a request one step per schedule, so that its tokens so far are all in `output_token_ids`.
Greedy rows are one vectorised argmax. A sampled row draws from its request's own generator only, so a
seeded request gives the same tokens whatever runs beside it, and a preempted request, which samples nothing
while it is recomputed, continues exactly where it was. A structured request's draw is limited to what
its grammar allows next (grammar.py's bitmask, read in place: no masked copy of the row) and its grammar
takes the token drawn; only such rows pay for it. A grammar that fails (llguidance's per-step limits)
fails its request alone (stopping.py), whatever it drew.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .grammar import AllowedTokens
from .request import Request, SamplingParams, TokenLogprob


def sample(logits: np.ndarray, requests: Sequence[Request], eos_token_id: int | None = None) -> list[int]:
    """One token id per row of `logits` ([len(requests), vocab]), in order. The sampled rows are scaled
    together (one numpy call for the whole step, not one per row); each then draws alone, sorting only what
    its min-p, top-k or top-p keep (`kept_distribution`).
    `eos_token_id`: the model's end-of-sequence token, which a request short of its `min_tokens` may not
    draw."""
    if len(requests) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(requests)} requests")
    if not requests:  # a step in which nobody samples (prefill chunks only): numpy has no argmax of nothing
        return []
    penalized = [row for row, request in enumerate(requests) if request.params.penalized]
    held = [row for row, request in enumerate(requests)
            if request.params.min_tokens and len(request.output_token_ids) < request.params.min_tokens]
    # the changed rows, each a copy (the runner's array is not ours to change; copying only these rows
    # keeps what the others cost as it was: a step's logits are megabytes at a real vocabulary)
    changed: dict[int, np.ndarray] = {}
    for row in penalized:
        penalize(changed.setdefault(row, logits[row].copy()), requests[row])
    for row in held:
        hold_stops(changed.setdefault(row, logits[row].copy()), requests[row], eos_token_id)
    # a constrained row is not copied nor masked: its draw is limited to what its grammar allows next
    allowed = {row: _allowed(request) for row, request in enumerate(requests)
               if request.params.structured is not None}
    tokens = logits.argmax(axis=1).tolist()
    for row, values in changed.items():
        tokens[row] = int(values.argmax())
    for row, allows in allowed.items():
        if requests[row].params.greedy:
            tokens[row] = constrained_argmax(changed.get(row, logits[row]), tokens[row], allows)
    rows = [row for row, request in enumerate(requests) if not request.params.greedy]
    if rows:
        temperatures = np.array([requests[row].params.temperature for row in rows], np.float64)
        scaled = logits[rows].astype(np.float64)
        for i, row in enumerate(rows):
            if row in changed:
                scaled[i] = changed[row]
        scaled /= temperatures[:, None]
        for i, row in enumerate(rows):
            request = requests[row]
            ids = None
            if row in allowed:  # the same draw as over the row masked (-inf elsewhere), sorting nothing more
                ids = allowed[row].ids(scaled.shape[1])
                if not ids.shape[0]:  # a grammar in error: whatever is drawn, the request fails
                    ids = None
                elif row in changed and np.isneginf(scaled[i, ids]).all():  # only its held stops allowed
                    scaled[i, ids] = 0.0
            tokens[row] = _draw(scaled[i], request.params, request.rng, ids)
    for row in allowed:
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


def _allowed(request: Request) -> AllowedTokens:
    """What a structured request's grammar allows next (grammar.py): EOS where the grammar may end, and
    there also the request's stop tokens (a folder's other EOS ids). A request held short of `min_tokens`
    keeps them held (its row's -inf), unless the grammar allows nothing else."""
    assert request.grammar is not None
    return request.grammar.allowed(request.params.stop_token_ids)


def constrained_argmax(values: np.ndarray, best: int, allowed: AllowedTokens) -> int:
    """A greedy constrained row's token: the allowed token of the highest value, the lowest id among ties
    (the argmax of the row masked). `best`, the row's own argmax, is the answer whenever allowed: one bit
    looked up; otherwise the argmax over the allowed ids only. Every allowed value -inf (a held stop the
    only one allowed): the lowest allowed id."""
    if allowed.allows(best):
        return best
    ids = allowed.ids(values.shape[0])
    return int(ids[values[ids].argmax()]) if ids.shape[0] else best


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
    return _draw(logits.astype(np.float64) / params.temperature, params, rng)


def _draw(scaled: np.ndarray, params: SamplingParams, rng: np.random.Generator,
          ids: np.ndarray | None = None) -> int:
    """One draw from `rng` over `kept_distribution`: the inverse of the kept tokens' cumulative distribution
    at one uniform draw, which is what `Generator.choice(n, p=probs)` computes, without its per-call checks
    of `p` (a quarter of a step's Python time at 16 sampled rows; tests/.../test_generate_sampler.py holds
    the draws equal)."""
    kept, probs = kept_distribution(scaled, params, ids)
    cdf = probs.cumsum()
    cdf /= cdf[-1]
    return int(kept[int(cdf.searchsorted(rng.random(), side="right"))])


def kept_distribution(scaled: np.ndarray, params: SamplingParams, ids: np.ndarray | None = None,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """min-p → top-k → top-p over a row's temperature-scaled logits `scaled`: the kept token ids and their
    probabilities (summing to 1). `ids`: the only candidates, ascending (a constrained row's allowed ones:
    the others' values are never read); None: every token id. What a sampled request draws from, and what
    speculative decoding verifies proposals against (verify.py). With none of the three, the candidates in
    id order: no sort at all (a
    stable sort of a 32k vocabulary is milliseconds, more than the rest of a small model's token). With any
    of them, the kept tokens most likely first, ties by token id (the prefix of a stable sort of the whole
    row), sorting only the candidates: min-p's, the k best (one partition), top-p's smallest prefix found
    by partitions of a growing size. min-p keeps the tokens whose probability is at least min_p × the most
    likely one's: whose scaled logit is at least the highest + log(min_p)."""
    if params.min_p <= 0.0 and params.top_k <= 0 and params.top_p >= 1.0:
        values = scaled if ids is None else scaled[ids]
        probs = np.exp(values - values.max())
        return np.arange(scaled.shape[0]) if ids is None else ids, probs / probs.sum()
    peak = scaled.max() if ids is None else scaled[ids].max()
    if params.min_p > 0.0:
        floor = peak + np.log(params.min_p)
        ids = np.flatnonzero(scaled >= floor) if ids is None else ids[scaled[ids] >= floor]
    limit = ids.shape[0] if ids is not None else scaled.shape[0]
    if 0 < params.top_k < limit:
        ids, limit = _best(scaled, ids, params.top_k), params.top_k
    if params.top_p >= 1.0:
        order = _most_likely_first(scaled, ids, limit)
        probs = np.exp(scaled[order] - peak)
        return order, probs / probs.sum()
    # the smallest prefix whose probability reaches top_p (always at least the most likely token): its
    # candidates grow (x 8) until they hold it; the probabilities are of all that min-p and top-k keep
    total = np.exp((scaled if ids is None else scaled[ids]) - peak).sum()
    size = min(limit, 64)
    while True:
        order = _most_likely_first(scaled, ids if size == limit else _best(scaled, ids, size), size)
        probs = np.exp(scaled[order] - peak) / total
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1
        if cut <= size or size == limit:
            cut = min(cut, size)
            return order[:cut], probs[:cut] / probs[:cut].sum()
        size = min(limit, size * 8)


def _best(scaled: np.ndarray, ids: np.ndarray | None, k: int) -> np.ndarray:
    """The `k` most likely of `ids` (None: of every token id), ties at the k-th value by the lower id, in
    no particular order: one partition, then the ties at its edge."""
    values = scaled if ids is None else scaled[ids]
    if k >= values.shape[0]:
        return np.arange(values.shape[0]) if ids is None else ids
    edge = np.partition(values, values.shape[0] - k)[values.shape[0] - k]
    above = np.flatnonzero(values > edge)
    tied = np.flatnonzero(values == edge)[:k - above.shape[0]]
    chosen = np.concatenate((above, tied))
    return chosen if ids is None else ids[chosen]


def _most_likely_first(scaled: np.ndarray, ids: np.ndarray | None, size: int) -> np.ndarray:
    """`ids` (None: every token id), most likely first, ties by token id; `size` of them."""
    if ids is None:
        ids = np.arange(scaled.shape[0])
    ids = np.sort(ids)
    return ids[np.argsort(-scaled[ids], kind="stable")][:size]
