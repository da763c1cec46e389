"""The sampler (engine/generate/core/sampler.py), pure: its draw is `Generator.choice`'s, draw for draw, so a
seeded request gives the tokens it gave before the sampler drew without `choice`; the penalties are OpenAI's
formula and vLLM's repetition penalty, worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import EngineError
from engine.generate.core.request import Request, SamplingParams
from engine.generate.core.sampler import (
    hold_stops,
    kept_distribution,
    penalize,
    sample,
    sample_row,
    token_logprob,
)


def reference_row(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """The sampler as it was: temperature → min-p → top-k → top-p → `rng.choice` over the kept tokens,
    most likely first after a stable sort of the whole row; with none of min-p, top-k and top-p, over
    every token in id order (no sort: perf/README.md, "Structured output")."""
    scaled = logits.astype(np.float64) / params.temperature
    if params.top_k <= 0 and params.top_p >= 1.0 and params.min_p <= 0.0:
        probs = np.exp(scaled - scaled.max())
        return int(rng.choice(len(probs), p=probs / probs.sum()))
    order = np.argsort(-scaled, kind="stable")
    if params.min_p > 0.0:
        order = order[scaled[order] >= scaled[order[0]] + np.log(params.min_p)]
    if 0 < params.top_k < len(order):
        order = order[:params.top_k]
    kept = scaled[order]
    probs = np.exp(kept - kept[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1
        order, probs = order[:cut], probs[:cut] / probs[:cut].sum()
    return int(order[rng.choice(len(order), p=probs)])


class _Req:
    def __init__(self, params: SamplingParams, seed: int) -> None:
        self.params, self.rng = params, np.random.default_rng(seed)


def test_batched_draws_equal_generator_choice() -> None:
    gen = np.random.default_rng(7)
    for _ in range(300):
        rows, vocab = int(gen.integers(1, 12)), int(gen.choice([3, 258, 700]))
        logits = (gen.normal(size=(rows, vocab)) * gen.choice([0.1, 1.0, 10.0])).astype(np.float32)
        logits[:, 1] = logits[:, 0]  # ties: the order is by token id
        params = [SamplingParams(max_tokens=1, temperature=float(gen.choice([0.0, 0.5, 1.0, 2.0])),
                                 top_p=float(gen.choice([1.0, 0.9, 0.3])),
                                 top_k=int(gen.choice([0, 1, 4, 100])),
                                 min_p=float(gen.choice([0.0, 0.0, 0.05])))
                  for _ in range(rows)]
        seeds = [int(s) for s in gen.integers(2**62, size=rows)]
        want = [int(logits[i].argmax()) if p.greedy else reference_row(logits[i], p, np.random.default_rng(s))
                for i, (p, s) in enumerate(zip(params, seeds, strict=True))]
        got = sample(logits, [_Req(p, s) for p, s in zip(params, seeds, strict=True)])  # type: ignore[misc]
        assert got == want


def test_one_row_alone_draws_the_same_as_in_a_batch() -> None:
    logits = np.random.default_rng(3).normal(size=(1, 258)).astype(np.float32)
    params = SamplingParams(max_tokens=1, temperature=0.8, top_p=0.95, seed=11)
    alone = [sample_row(logits[0], params, np.random.default_rng(11)) for _ in range(3)]
    assert alone == [reference_row(logits[0], params, np.random.default_rng(11))] * 3


def penalized_request(prompt: list[int], output: list[int], **penalties: float) -> Request:
    request = Request("r", prompt, SamplingParams(max_tokens=8, **penalties), np.random.default_rng(0))
    request.output_token_ids = list(output)
    return request


def test_penalties_are_openais_formula_after_the_repetition_penalty() -> None:
    logits = np.array([1.0, -1.0, 2.0, 0.5, -0.5, 3.0], np.float32)
    request = penalized_request([0, 1], [2, 3, 3], frequency_penalty=0.5, presence_penalty=0.25,
                                repetition_penalty=2.0)
    row = logits.copy()
    penalize(row, request)
    # seen (prompt or output): 0 1 2 3, a positive logit halved, a negative one doubled; then the output's
    # counts (2: once, 3: twice) times 0.5, plus 0.25 for each of them
    want = [0.5, -2.0, 1.0 - 0.5 - 0.25, 0.25 - 1.0 - 0.25, -0.5, 3.0]
    np.testing.assert_allclose(row, want, rtol=1e-6)
    only_openai = logits.copy()
    penalize(only_openai, penalized_request([0, 1], [2, 3, 3], frequency_penalty=-1.0))
    np.testing.assert_allclose(only_openai, [1.0, -1.0, 3.0, 2.5, -0.5, 3.0])  # the prompt is not counted


def test_a_penalty_moves_greedy_and_leaves_the_runners_logits_alone() -> None:
    logits = np.array([[0.0, 5.0, 4.5], [0.0, 5.0, 4.5]], np.float32)
    kept = logits.copy()
    plain = penalized_request([0], [1, 1])
    plain.params = SamplingParams(max_tokens=8)
    tokens = sample(logits, [penalized_request([0], [1, 1], frequency_penalty=0.5), plain])
    assert tokens == [2, 1]  # 5 - 2 × 0.5 < 4.5; the unpenalized row beside it keeps its argmax
    np.testing.assert_array_equal(logits, kept)


@pytest.mark.parametrize("bad", [{"presence_penalty": 2.5}, {"frequency_penalty": -3.0},
                                 {"repetition_penalty": 0.0}])
def test_the_penalties_are_checked(bad: dict[str, float]) -> None:
    with pytest.raises(EngineError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_a_tokens_logprob_is_the_log_softmax_of_the_raw_logits() -> None:
    logits = np.array([2.0, -1.0, 0.5, 3.0, 0.5], np.float32)
    want = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    got = token_logprob(logits, 2, 3)
    assert got.token_id == 2 and abs(got.logprob - want[2]) < 1e-12
    assert [t for t, _ in got.top] == [3, 0, 2] or [t for t, _ in got.top] == [3, 0, 4]  # 2 and 4 tie
    np.testing.assert_allclose([p for _, p in got.top], [want[3], want[0], want[2]])
    assert token_logprob(logits, 1, 0).top == ()
    assert len(token_logprob(logits, 1, 20).top) == 5  # never more than the vocabulary


def test_a_step_in_which_nobody_samples_picks_nothing() -> None:
    """Prefill chunks only (a prompt longer than the token budget, alone): no rows, no tokens, no error."""
    for width in (258, 0):  # 0: what the runner once returned for such a step
        assert sample(np.empty((0, width), np.float32), []) == []


def test_min_p_keeps_only_tokens_within_its_fraction_of_the_most_likely() -> None:
    """Probabilities 0.5, 0.3, 0.15, 0.05: min_p 0.5 keeps the first two (0.3 ≥ 0.25, 0.15 < 0.25), so a
    thousand draws give only those; min_p 1 is greedy; min_p 0 draws as before."""
    logits = np.log(np.array([0.15, 0.5, 0.05, 0.3]))
    params = SamplingParams(max_tokens=1, temperature=1.0, min_p=0.5)
    rng = np.random.default_rng(0)
    drawn = {sample_row(logits, params, rng) for _ in range(1000)}
    assert drawn == {1, 3}
    greedy = SamplingParams(max_tokens=1, temperature=1.0, min_p=1.0)
    assert {sample_row(logits, greedy, rng) for _ in range(200)} == {1}
    plain = SamplingParams(max_tokens=1, temperature=1.0)
    assert sample_row(logits, plain, np.random.default_rng(5)) == \
        reference_row(logits, plain, np.random.default_rng(5))
    with pytest.raises(EngineError, match="min_p"):
        SamplingParams(max_tokens=1, min_p=1.5)


def test_min_tokens_holds_the_stop_tokens_and_eos_until_reached() -> None:
    logits = np.zeros((1, 8), np.float32)
    logits[0, 7] = 5.0  # EOS, the most likely
    logits[0, 3] = 4.0  # a stop token, next
    params = SamplingParams(max_tokens=8, min_tokens=2, stop_token_ids=frozenset({3}))
    request = Request("r", [1], params, np.random.default_rng(0))
    assert sample(logits, [request], eos_token_id=7) != [7] and sample(logits, [request], 7) != [3]
    assert sample(logits, [request], 7) == [0] and logits[0, 7] == 5.0  # the runner's logits untouched
    request.output_token_ids = [0, 0]
    assert sample(logits, [request], eos_token_id=7) == [7]
    row = logits[0].copy()
    hold_stops(row, Request("i", [1], SamplingParams(max_tokens=8, min_tokens=2, ignore_eos=True),
                            np.random.default_rng(0)), 7)
    assert row[7] == 5.0 and np.isfinite(row).all()


def test_a_masked_rows_draw_among_its_finite_tokens_is_the_draw_over_the_whole_row() -> None:
    """What the sampler does for a constrained row (its grammar's tokens only) keeps what the whole row,
    -inf elsewhere, would give: the same tokens with the same probabilities, in the same order."""
    gen = np.random.default_rng(5)
    for top_k, top_p, min_p in [(0, 1.0, 0.0), (4, 1.0, 0.0), (0, 0.9, 0.0), (0, 1.0, 0.05), (50, 0.7, 0.01)]:
        params = SamplingParams(max_tokens=1, temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p)
        for _ in range(20):
            scaled = gen.normal(size=700) * 3.0
            scaled[gen.random(700) < 0.9] = -np.inf
            ids = np.flatnonzero(np.isfinite(scaled))
            whole, whole_probs = kept_distribution(scaled, params)
            some, some_probs = kept_distribution(scaled, params, ids)
            nonzero = whole_probs > 0
            assert whole[nonzero].tolist() == some.tolist()
            np.testing.assert_allclose(whole_probs[nonzero], some_probs, rtol=1e-12)


def test_a_constrained_draw_reads_only_its_candidates() -> None:
    """A constrained row is not masked: its values outside `ids` are whatever the model gave (higher ones
    too), and the kept tokens and probabilities are those of the row with -inf there."""
    gen = np.random.default_rng(6)
    for top_k, top_p, min_p in [(0, 1.0, 0.0), (4, 1.0, 0.0), (0, 0.9, 0.0), (0, 1.0, 0.05), (50, 0.7, 0.01)]:
        params = SamplingParams(max_tokens=1, temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p)
        for _ in range(20):
            scaled = gen.normal(size=700) * 3.0
            ids = np.flatnonzero(gen.random(700) < 0.1)
            masked = np.full_like(scaled, -np.inf)
            masked[ids] = scaled[ids]
            refused = np.setdiff1d(np.arange(700), ids)
            scaled[gen.choice(refused, 5)] += 20.0  # refused tokens far above the allowed
            want, want_probs = kept_distribution(masked, params, ids)
            got, got_probs = kept_distribution(scaled, params, ids)
            assert got.tolist() == want.tolist()
            np.testing.assert_allclose(got_probs, want_probs, rtol=1e-12)
