"""Speculative decoding's back-off: stop proposing for a request while its proposals do not pay.

A step with proposals costs more than a plain step: the draft's runs (or the lookup), and the target's run
over 1 + k tokens as a small prefill chunk instead of one token in the decode group. It pays only when it
yields more tokens than that cost in plain steps. So, per request, `BackoffPolicy` keeps the tokens its
proposal steps yielded (kept + 1, smoothed) and compares them with `cost_ratio`, the measured cost of a
proposal step over a plain one (`StepCosts`): break-even is tokens per step = cost_ratio, i.e. an
acceptance of (cost_ratio - 1) / k. Below it the request decodes plainly for `backoff` steps, then probes
once more; each probe that fails doubles the wait, up to a cap, and one that pays sets it back. With no
proposal ever kept, that converges to plain decoding plus a probe every `cap` steps: each failed probe costs
cost_ratio - 1 plain steps, and the cap is chosen so that stays within `PROBE_OVERHEAD` of the time. A new
request starts from the back-off the last finished request had reached (it still probes first).

`BackoffProposer` wraps any proposer (proposer.py's `Proposer`) with it; the model folder's loader
(serving/model_folder.py) wraps the one it makes. It learns everything from the calls the scheduler makes
anyway: a request's tokens at one call, against its tokens and proposals at the one before, say how many
were kept, and the time between the two calls is what that step cost (a proposal step, or per token a plain
one; the engine thread's CPU time where the model runs on it alone: `step_clock`). The costs are the
engine's, shared by its requests (medians of recent samples: `StepCosts`); the acceptance is each
request's. Timing decides, so which steps propose varies from run to run: greedy output is the same either
way, and a sampled request keeps the target's distribution, but a seeded sampled request is reproducible
only with the same choices.
Called on the engine's thread.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .proposer import Proposer

PROBE_OVERHEAD = 0.02  # the share of plain decoding's time that failed probes may cost, once backed off fully
TOKENS_WEIGHT = 0.3    # the smoothing of a request's tokens per proposal step (an EWMA's new-sample weight)
COST_WINDOW = 16       # the step costs are the median of the last this many samples of each kind
PLAIN_SAMPLES = 3      # plain steps timed before the ratio is trusted (a median of one is no median)
REFRESH_STEPS = 256    # proposal steps after which one plain step is timed again, so the ratio stays current


@dataclass(slots=True)
class BackoffPolicy:
    """One request's decision to propose or not (the module doc); a plain object, its tests need no model."""

    min_backoff: int = 4    # plain steps after the first failed probe
    tokens_per_step: float | None = None  # smoothed kept + 1 of the proposal steps since the last back-off
    backoff: int = 4        # plain steps the next back-off lasts
    skip_left: int = 0      # plain steps left in this back-off
    backoffs: int = 0       # back-offs so far

    def observe(self, tokens: int) -> None:
        """A proposal step gave `tokens` (the kept proposals and the target's own token)."""
        if self.tokens_per_step is None:
            self.tokens_per_step = float(tokens)
        else:
            self.tokens_per_step += TOKENS_WEIGHT * (tokens - self.tokens_per_step)

    @property
    def backing_off(self) -> bool:
        return self.skip_left > 0

    def decide(self, cost_ratio: Callable[[], float]) -> bool:
        """Whether to propose this step, a proposal step costing `cost_ratio()` plain steps (asked only when
        the decision needs it: while backing off, every step's few microseconds count)."""
        if self.skip_left > 0:
            self.skip_left -= 1
            return False
        if self.tokens_per_step is None:
            return True
        ratio = cost_ratio()
        if self.tokens_per_step > ratio:
            self.backoff = self.min_backoff  # it pays: the next back-off starts short again
            return True
        # does not pay: this step and backoff - 1 more decode plainly; the next probe starts afresh
        self.skip_left = self.backoff - 1
        self.backoff = min(2 * self.backoff, max_backoff(ratio, self.min_backoff))
        self.tokens_per_step = None
        self.backoffs += 1
        return False


def max_backoff(cost_ratio: float, floor: int) -> int:
    """The longest back-off: a failed probe costs cost_ratio - 1 plain steps, one per this many steps keeps
    that within PROBE_OVERHEAD."""
    return max(floor, math.ceil((cost_ratio - 1) / PROBE_OVERHEAD - 1e-9))  # 1e-9: float noise, not a step


@dataclass(slots=True)
class StepCosts:
    """The measured seconds of a proposal step and of a plain step (per token); engine-wide. Each is the
    median of its last COST_WINDOW samples, not a mean: on a shared machine a step now and then takes
    several times its cost (another process ran), and one such sample must not make proposals look dear
    for long, least of all when proposal steps, and so their samples, have become rare by backing off."""

    proposals: deque[float] = field(default_factory=lambda: deque(maxlen=COST_WINDOW))
    plains: deque[float] = field(default_factory=lambda: deque(maxlen=COST_WINDOW))
    since_plain: int = 0  # proposal steps timed since the last plain one

    @property
    def proposal_s(self) -> float | None:
        return statistics.median(self.proposals) if self.proposals else None

    @property
    def plain_s(self) -> float | None:
        return statistics.median(self.plains) if self.plains else None

    def add_proposal(self, seconds: float) -> None:
        self.proposals.append(seconds)
        self.since_plain += 1

    def add_plain(self, seconds: float) -> None:
        self.plains.append(seconds)
        self.since_plain = 0

    @property
    def wants_plain(self) -> bool:
        """A plain step should be timed: fewer than PLAIN_SAMPLES have been, or none for REFRESH_STEPS
        proposal steps."""
        return len(self.plains) < PLAIN_SAMPLES or self.since_plain >= REFRESH_STEPS

    @property
    def ratio(self) -> float:
        """A proposal step's cost in plain steps: at least 1, the plain step it contains (a noisy sample,
        such as a plain step timed beside another request's prefill, must not make a proposal step that
        keeps nothing look paying); 1 until both are measured."""
        proposal_s, plain_s = self.proposal_s, self.plain_s
        if proposal_s is None or not plain_s:
            return 1.0
        return max(1.0, proposal_s / plain_s)


def step_clock(providers: Sequence[str], intra_op_threads: int) -> Callable[[], float]:
    """The clock to time steps with: the engine thread's CPU time when the model runs on it alone (the CPU
    provider with one intra-op thread, the served default), so another process's load on the machine does
    not count as the steps' cost; else wall time (a GPU's work, or a thread pool's, is not this thread's
    CPU time)."""
    if intra_op_threads == 1 and all(p == "CPUExecutionProvider" for p in providers):
        return time.thread_time
    return time.perf_counter


@dataclass(slots=True)
class _Track:
    """What the last call for a request saw: when, its token count, its proposals."""

    policy: BackoffPolicy
    called_s: float = 0.0
    num_tokens: int = 0
    proposed: Sequence[int] = field(default_factory=list)


class BackoffProposer:
    """A `Proposer` that asks `inner` only while proposing pays (the module doc). `clock`: seconds, for
    tests; `min_backoff`: plain steps after a first failed probe."""

    def __init__(self, inner: Proposer, clock: Callable[[], float] = time.perf_counter,
                 min_backoff: int = 4) -> None:
        self.inner = inner
        self.clock = clock
        self.min_backoff = min_backoff
        self.costs = StepCosts()
        self._tracks: dict[str, _Track] = {}
        # the back-off a new request starts from: the last finished one's (a draft that never agrees fails
        # every request alike, and each relearning it from min_backoff costs a few probes each)
        self._inherited = min_backoff
        self._finished_backoffs = 0  # the back-offs of the requests released so far

    @property
    def requests_backing_off(self) -> int:
        """Requests decoding plainly now because their proposals did not pay."""
        return sum(1 for t in self._tracks.values() if t.policy.backing_off)

    @property
    def backoffs(self) -> int:
        """Back-offs started since the proposer was made, the finished requests' included (a counter: the
        metrics' hubserve_generation_spec_backoffs_total)."""
        return self._finished_backoffs + sum(t.policy.backoffs for t in self._tracks.values())

    def release(self, request_id: str) -> None:
        track = self._tracks.pop(request_id, None)
        if track is not None:
            self._inherited = track.policy.backoff
            self._finished_backoffs += track.policy.backoffs
        self.inner.release(request_id)

    def propose(self, request_id: str, token_ids: Sequence[int], limit: int) -> list[int]:
        now = self.clock()
        track = self._tracks.get(request_id)
        if track is None:
            policy = BackoffPolicy(self.min_backoff, backoff=self._inherited)
            track = self._tracks[request_id] = _Track(policy)
        else:
            self._learn(track, now, len(token_ids))
        proposals: list[int] = []
        if limit > 0:
            wants_plain = self.costs.wants_plain and self.costs.proposal_s is not None
            if not wants_plain and track.policy.decide(lambda: self.costs.ratio):
                proposals = self.inner.propose(request_id, token_ids, limit)
        track.called_s, track.num_tokens, track.proposed = now, len(token_ids), proposals
        return proposals

    def _learn(self, track: _Track, now: float, num_tokens: int) -> None:
        """What the step since the last call gave: its tokens, and its cost by kind."""
        gained = num_tokens - track.num_tokens
        if gained < 1:
            return
        seconds = now - track.called_s
        if track.proposed:
            self.costs.add_proposal(seconds)
            track.policy.observe(min(gained, len(track.proposed) + 1))
        else:
            self.costs.add_plain(seconds / gained)
