"""Which requests compute which tokens this step: continuous batching within a token budget.

`schedule()` is called once per engine step and returns the step's work; `update()` is called with what the
model produced and advances every request. Pure bookkeeping over the KV cache manager: no model, no I/O, so
its tests are plain functions (tests/unit/generate/core/test_generate_scheduler.py).

Each step (vLLM v1's order):
1. Running requests first, oldest first. Each computes what it lacks: one token when decoding, the rest of
   its prompt (or a chunk of it, within what is left of the budget) when prefilling. When the pool has no
   block for it, the newest running request is preempted (its blocks freed, its output kept, back to the
   front of the waiting queue) until there is room — possibly the request itself.
2. Then waiting requests, preempted ones first, then the API requests in turn, one sequence each
   (waiting.py: a request arriving behind a large fan-out is not stuck behind all of its sequences), while
   the budget, `max_num_seqs` and the free blocks allow: admission by free blocks, never by preempting. A
   prompt's cached prefix is shared, not computed; a prompt longer than the remaining budget is admitted
   with a first chunk (chunked prefill), so a long prompt never stalls the running streams for a whole step.

Speculative decoding (proposer.py): a decoding request the model's proposer has tokens for computes its
last token and up to k proposed ones in one chunk (`num_draft`), within the budget the running requests
after it leave (a proposal never takes another's decode) and the blocks it can get without preempting
anyone (else it decodes as usual); `update` advances it by the tokens the engine kept (verify.py), so the
keys and values written for rejected proposals lie past `num_computed_tokens`, in blocks it still holds,
and are overwritten by the next step's tokens.

Priorities (`SamplingParams.priority`): steps 1 and 2 run once per class, interactive first, so interactive
requests are scheduled and admitted before any batch-job request takes budget. `running` is kept ordered by
class, then admission, so "the newest running" (the preemption victim) is the newest batch-job request while
there is one; and an interactive request waiting for a seat or blocks preempts running batch-job requests to
get them (the job's work is kept and recomputed later, as any preemption).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from .kv_manager import KVCacheManager
from .proposer import Proposer
from .request import FinishReason, Priority, Request, RequestState
from .waiting import WaitingQueue


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 32              # running requests at most
    max_num_batched_tokens: int = 256   # tokens computed per step at most (the budget)
    enable_chunked_prefill: bool = True  # False: a prompt is admitted only when all of it fits the budget
    num_scheduler_steps: int = 1        # decode steps per schedule when a step is decodes only (engine.py)

    def __post_init__(self) -> None:
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.num_scheduler_steps) < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and num_scheduler_steps must be positive")


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """One request's work this step: compute `token_ids` at positions `start` … `start + len - 1`, with
    the block table given. `sample`: these are its last known tokens, so the step samples its next token."""

    request: Request
    start: int
    token_ids: tuple[int, ...]
    block_table: tuple[int, ...]
    sample: bool
    num_draft: int = 0  # of `token_ids`, the last ones are proposals to verify (speculative decoding)


@dataclass(slots=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)


class Scheduler:
    """Owns the requests' states and, through the KV cache manager, their blocks."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, proposer: Proposer | None = None) -> None:
        self.config = config
        self.kv = kv
        self.proposer = proposer  # speculative decoding's (proposer.py); None: every decode is one token
        self.queues: dict[Priority, WaitingQueue] = {p: WaitingQueue() for p in Priority}  # waiting, by class
        self.running: list[Request] = []  # ordered by class, then admission
        self.num_preemptions = 0
        self._arrivals = 0

    def add(self, request: Request) -> None:
        request.arrival = self._arrivals
        self._arrivals += 1
        self.queues[request.params.priority].append(request)

    @property
    def waiting(self) -> list[Request]:
        """Every waiting request, in the order admission looks at them (a copy: for tests and inspection)."""
        return [r for p in Priority for r in self.queues[p]]

    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def has_unfinished(self) -> bool:
        return bool(self.running) or any(self.queues.values())

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        for priority in Priority:
            budget = self._schedule_running(out, budget, priority)
            budget = self._admit(out, budget, priority)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int, priority: Priority) -> int:
        """1. the running requests of this class, oldest first; preempt the newest when blocks run out
        (the list is ordered, so the victim is never one already scheduled this step)."""
        index = sum(1 for r in self.running if r.params.priority < priority)
        while index < len(self.running) and budget > 0 and self.running[index].params.priority == priority:
            request = self.running[index]
            count = min(request.num_tokens - request.num_computed_tokens, budget)
            # proposals take only the budget the running requests after it leave: never another's decode
            draft = self._propose(request, budget - (len(self.running) - index - 1)) if count == 1 else []
            if draft and self.kv.allocate(request.request_id, request.num_computed_tokens, 1 + len(draft)):
                out.chunks.append(self._chunk(request, 1, draft))
                budget -= 1 + len(draft)
                index += 1
                continue
            while not self.kv.allocate(request.request_id, request.num_computed_tokens, count):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim.request_id)
                if victim is request:
                    break
            else:
                out.chunks.append(self._chunk(request, count))
                budget -= count
                index += 1
        return budget

    def _admit(self, out: SchedulerOutput, budget: int, priority: Priority) -> int:
        """2. the waiting requests of this class, in order, while budget, seats and free blocks allow; a
        seat or blocks held by a lower class (not yet scheduled this step) are taken by preempting it."""
        waiting = self.queues[priority]
        while waiting and budget > 0:
            if len(self.running) >= self.config.max_num_seqs:
                if not self._preempt_lower(out, priority):
                    break
                continue
            request = waiting.peek()
            prefix, cached = self.kv.computed_prefix(request.request_id, request.all_token_ids,
                                                     request.prefix_salt)
            count = request.num_tokens - cached
            if count > budget:
                if not self.config.enable_chunked_prefill:
                    break
                count = budget
            if not self.kv.allocate(request.request_id, cached, count, prefix):
                if not self._preempt_lower(out, priority):
                    break
                continue
            waiting.popleft()
            self.kv.count_prefix(request.num_tokens, cached)
            request.state = RequestState.RUNNING
            request.num_computed_tokens = request.num_cached_tokens = cached
            at = sum(1 for r in self.running if r.params.priority <= priority)
            self.running.insert(at, request)
            out.chunks.append(self._chunk(request, count))
            budget -= count
        return budget

    def _preempt_lower(self, out: SchedulerOutput, priority: Priority) -> bool:
        """Preempt the newest running request of a lower class than `priority`, if there is one."""
        if not self.running or self.running[-1].params.priority <= priority:
            return False
        victim = self.running.pop()
        self._preempt(victim)
        out.preempted.append(victim.request_id)
        return True

    def _propose(self, request: Request, budget: int) -> list[int]:
        """A decoding request's proposals (speculative decoding): none without a proposer, for a stepwise
        request (verify.py), or beyond `budget` (what this request may spend) or its max_tokens (the
        engine's add_request keeps prompt + max_tokens within the context, so that bounds the positions
        too)."""
        if self.proposer is None or request.params.stepwise:
            return []
        limit = min(budget - 1, request.params.max_tokens - len(request.output_token_ids) - 1)
        return self.proposer.propose(request.request_id, request.all_token_ids, limit) if limit > 0 else []

    def _chunk(self, request: Request, count: int, draft: Sequence[int] = ()) -> ScheduledChunk:
        start, prompt = request.num_computed_tokens, len(request.prompt_token_ids)
        if start >= prompt:  # decoding, or recomputing output: no need to join prompt and output
            tokens = request.output_token_ids[start - prompt:start - prompt + count]
        else:
            tokens = request.all_token_ids[start:start + count]
        table = tuple(self.kv.block_table(request.request_id))
        return ScheduledChunk(request, start, (*tokens, *draft), table,
                              sample=start + count == request.num_tokens, num_draft=len(draft))

    def _preempt(self, request: Request) -> None:
        """Free its blocks and send it back to the front of the line; its generated tokens stay, and are
        recomputed with its prompt when it is admitted again."""
        self.kv.free(request.request_id)
        request.state = RequestState.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.queues[request.params.priority].appendleft(request)

    def reserve(self, out: SchedulerOutput, steps: int) -> bool:
        """Room for `steps` tokens for each chunk of a plan of decodes (the engine's multi-step decode: each
        chunk's sampled token is fed back `steps - 1` times before the next schedule). On success the
        chunks carry their grown block tables; False when the pool lacks the blocks (then the plan runs one
        step, as scheduled: what was taken is the blocks those requests need next anyway)."""
        for chunk in out.chunks:
            request = chunk.request
            if not self.kv.allocate(request.request_id, request.num_computed_tokens, steps):
                return False
        out.chunks = [replace(c, block_table=tuple(self.kv.block_table(c.request.request_id)))
                      for c in out.chunks]
        return True

    def update(self, out: SchedulerOutput, sampled: dict[str, Sequence[int]],
               ) -> Iterator[tuple[Request, Sequence[int]]]:
        """Advance each scheduled request by its computed tokens and append its sampled tokens (`sampled`,
        by request id, for the chunks with `sample`: one token, or one per step of a multi-step decode,
        where every token but the last was also fed back and computed; or, for a chunk with proposals, the
        kept ones and the target's next: the chunk's first token and the kept ones are computed). Yields
        (request, new tokens)."""
        for chunk in out.chunks:
            request = chunk.request
            if request.finished:  # aborted between schedule and update
                continue
            tokens = sampled.get(request.request_id, ()) if chunk.sample else ()
            request.num_computed_tokens += len(tokens) if chunk.num_draft else \
                len(chunk.token_ids) + max(len(tokens) - 1, 0)
            request.output_token_ids.extend(tokens)
            if self.kv.fills_a_block(request.request_id, request.num_computed_tokens):
                self.kv.cache_computed(request.request_id, request.all_token_ids,
                                       request.num_computed_tokens, request.prefix_salt)
            yield request, tokens

    def finish(self, request: Request, reason: FinishReason) -> None:
        """End a request (stopped, at its length, or aborted) and free its blocks at once."""
        if request.finished:
            return
        if request.state is RequestState.RUNNING:
            self.running.remove(request)
        else:
            self.queues[request.params.priority].remove(request)
        self.kv.free(request.request_id)
        if self.proposer is not None:
            self.proposer.release(request.request_id)
        request.state = RequestState.FINISHED
        request.finish_reason = reason
