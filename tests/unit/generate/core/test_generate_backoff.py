"""Speculative decoding's back-off (backoff.py): the pure policy, and the proposer wrapper driven by a small
simulated engine loop with a clock the test advances (a proposal step costs what the test says, a plain step
one unit), so what it converges to is exact: plain decoding plus rare probes when nothing is kept, and
proposals at nearly every step when they pay."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from engine.generate.core.backoff import (
    PLAIN_SAMPLES,
    PROBE_OVERHEAD,
    REFRESH_STEPS,
    BackoffPolicy,
    BackoffProposer,
    max_backoff,
    step_clock,
)
from engine.generate.core.proposer import NgramProposer, SpeculativeConfig


def truth(position: int) -> int:
    """The token the target gives at a position (the simulated model)."""
    return (position * 7 + 3) % 250


class SimulatedDraft:
    """Proposes the target's next tokens, each right with the given pattern (`right`: True for all)."""

    def __init__(self, right: bool, k: int = 4) -> None:
        self.right, self.k = right, k
        self.released: list[str] = []

    def release(self, request_id: str) -> None:
        self.released.append(request_id)

    def propose(self, request_id: str, token_ids: Sequence[int], limit: int) -> list[int]:
        n = len(token_ids)
        return [truth(p) + (0 if self.right else 1) for p in range(n, n + min(limit, self.k))]


class Clock:
    """Seconds as the test says they passed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Run:
    seconds: float = 0.0
    tokens: int = 0
    proposal_steps: int = 0
    steps: int = 0


def simulate(proposer: BackoffProposer, clock: Clock, tokens: int, proposal_cost: float,
             request_id: str = "r", spikes: dict[int, float] | None = None) -> Run:
    """One request decoded to `tokens` new tokens as the engine would: verified proposals keep their agreeing
    prefix plus the target's token; a proposal step costs `proposal_cost`, a plain one 1.0, and step i
    `spikes[i]` when given (another process took the machine)."""
    ids = [1, 2, 3]
    run = Run()
    start = len(ids)
    while len(ids) - start < tokens:
        proposals = proposer.propose(request_id, ids, 4)
        kept = 0
        while kept < len(proposals) and proposals[kept] == truth(len(ids) + kept):
            kept += 1
        ids.extend(truth(len(ids) + i) for i in range(kept + 1))
        cost = (spikes or {}).get(run.steps, proposal_cost if proposals else 1.0)
        clock.now += cost
        run.seconds += cost
        run.proposal_steps += bool(proposals)
        run.steps += 1
    run.tokens = len(ids) - start
    return run


def test_a_policy_that_keeps_nothing_backs_off_exponentially_up_to_its_cap():
    policy = BackoffPolicy(min_backoff=4, backoff=4)
    ratio = 2.0
    probes = []
    for step in range(600):
        if policy.decide(lambda: ratio):
            probes.append(step)
            policy.observe(1)  # nothing kept: the target's own token only
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps[:5] == [5, 9, 17, 33, 51]  # a probe, then the back-off's plain steps
    assert max_backoff(ratio, 4) == 50 == round((ratio - 1) / PROBE_OVERHEAD)
    assert set(gaps[4:]) == {51}


def test_a_policy_that_pays_keeps_proposing_and_a_paying_probe_shortens_the_next_backoff():
    policy = BackoffPolicy(min_backoff=4, backoff=4)
    for _ in range(50):
        assert policy.decide(lambda: 2.0)
        policy.observe(4)
    for _ in range(3):
        policy.observe(1)
    assert policy.decide(lambda: 2.0)  # smoothed: three bad steps in a row are not enough (4 → 2.03)
    policy.observe(1)
    assert not policy.decide(lambda: 2.0) and policy.backing_off
    while policy.backing_off:
        assert not policy.decide(lambda: 2.0)
    assert policy.decide(lambda: 2.0)  # the probe
    policy.observe(5)
    assert policy.decide(lambda: 2.0)  # it paid
    assert policy.backoff == 4
    assert policy.backoffs == 1


@pytest.mark.parametrize("proposal_cost", [1.5, 2.5])
def test_a_draft_that_never_agrees_costs_at_most_ten_percent_over_plain_decoding(proposal_cost):
    clock = Clock()
    proposer = BackoffProposer(SimulatedDraft(right=False), clock=clock)
    run = simulate(proposer, clock, 1000, proposal_cost)
    assert run.tokens == run.steps  # nothing kept
    assert run.seconds <= 1.10 * run.tokens
    assert proposer.costs.ratio == pytest.approx(proposal_cost)
    assert proposer.requests_backing_off == 1


def test_short_requests_that_never_agree_stay_within_five_percent():
    """Each request probes first, then waits as long as the last finished one had come to: a probe costs
    1.2 plain steps more here, so relearning the back-off from 4 steps in every 128-token request would
    cost 5 %."""
    clock = Clock()
    proposer = BackoffProposer(SimulatedDraft(right=False), clock=clock)
    total = Run()
    for i in range(10):
        run = simulate(proposer, clock, 128, 2.2, f"r{i}")
        proposer.release(f"r{i}")
        total.seconds, total.tokens = total.seconds + run.seconds, total.tokens + run.tokens
    assert total.seconds <= 1.05 * total.tokens


def test_a_draft_that_agrees_proposes_at_nearly_every_step():
    clock = Clock()
    proposer = BackoffProposer(SimulatedDraft(right=True), clock=clock)
    run = simulate(proposer, clock, 2000, 2.0)
    plain_steps = run.steps - run.proposal_steps
    assert plain_steps <= PLAIN_SAMPLES + run.steps // REFRESH_STEPS  # the cost measurements only
    assert run.tokens / run.seconds > 2.0
    assert proposer.backoffs == 0


def test_a_draft_that_mostly_agrees_is_not_stopped_by_its_misses():
    """A quarter of its tokens wrong, scattered (some proposal steps keep nothing): it pays on the whole at
    a ratio of 2.8, so it keeps proposing at nearly every step, and beats plain decoding."""

    class MostlyRight(SimulatedDraft):
        def propose(self, request_id: str, token_ids: Sequence[int], limit: int) -> list[int]:
            n = len(token_ids)
            return [truth(p) + (1 if (p * 7919) % 100 < 25 else 0) for p in range(n, n + min(limit, self.k))]

    clock = Clock()
    proposer = BackoffProposer(MostlyRight(right=True), clock=clock)
    run = simulate(proposer, clock, 2000, 2.8)
    assert run.proposal_steps > 0.9 * run.steps
    assert run.tokens / run.seconds > 1.1


def test_a_few_slow_steps_do_not_stop_a_draft_that_pays():
    """Proposal steps timed at 20 × their cost (the machine busy), two of the first among them: the costs
    are medians, so the request backs off once at most and then proposes at nearly every step again."""
    clock = Clock()
    proposer = BackoffProposer(SimulatedDraft(right=True), clock=clock)
    run = simulate(proposer, clock, 1000, 2.0, spikes={5: 40.0, 6: 40.0, 40: 40.0})
    assert run.proposal_steps > 0.95 * run.steps
    assert proposer.costs.ratio == pytest.approx(2.0)


def test_proposals_that_pay_less_than_they_cost_back_off_and_those_that_pay_more_do_not():
    """Break-even is tokens per proposal step = the cost ratio: a proposer keeping one of four proposals
    (2 tokens a step) pays at a ratio of 1.5 and not at 3."""

    class OneRight(SimulatedDraft):
        def propose(self, request_id: str, token_ids: Sequence[int], limit: int) -> list[int]:
            n = len(token_ids)
            return [truth(n), truth(n + 1) + 1, truth(n + 2), truth(n + 3)][:min(limit, self.k)]

    for cost, pays in ((1.5, True), (3.0, False)):
        clock = Clock()
        proposer = BackoffProposer(OneRight(right=True), clock=clock)
        run = simulate(proposer, clock, 1000, cost)
        assert (run.proposal_steps > 0.9 * run.steps) is pays
        assert run.seconds <= 1.10 * run.tokens  # never much worse than plain


def test_steps_are_timed_in_cpu_time_when_the_model_runs_on_the_engine_thread_alone():
    assert step_clock(["CPUExecutionProvider"], 1) is time.thread_time
    assert step_clock(["CPUExecutionProvider"], 0) is time.perf_counter  # 0: a pool of all cores
    assert step_clock(["CUDAExecutionProvider", "CPUExecutionProvider"], 1) is time.perf_counter


def test_release_forgets_the_request_and_tells_the_inner_proposer():
    clock = Clock()
    inner = SimulatedDraft(right=False)
    proposer = BackoffProposer(inner, clock=clock)
    simulate(proposer, clock, 40, 2.0)
    assert proposer.requests_backing_off == 1
    started = proposer.backoffs
    assert started >= 1
    proposer.release("r")
    assert proposer.requests_backing_off == 0 and inner.released == ["r"]
    assert proposer.backoffs == started  # a counter (backoffs_total): the released request's stay


def test_no_lookup_match_is_a_plain_step_not_a_failed_probe():
    """An n-gram proposer that finds nothing proposes nothing: the step is timed as plain, and the policy
    does not count it against the request."""
    clock = Clock()
    proposer = BackoffProposer(NgramProposer(SpeculativeConfig()), clock=clock)
    ids = list(range(10, 60))  # no repeats: no suffix occurs earlier
    for _ in range(5):
        assert proposer.propose("r", ids, 4) == []
        ids.append(len(ids) + 100)
        clock.now += 1.0
    assert proposer.costs.plain_s == pytest.approx(1.0)
    assert proposer.backoffs == 0
