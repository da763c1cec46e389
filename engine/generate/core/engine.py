"""The generation engine's step: schedule → execute → update, plain and synchronous.

A caller (a test, a benchmark, later the API layer's one engine thread) adds requests and calls `step()`
until `has_unfinished()` is false; each step returns what every advanced request got. Nothing here waits,
sleeps or knows about sockets; the engine owns its requests from `add_request` until they finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import EngineError, ErrorCode, invalid
from .backoff import BackoffProposer
from .detokenize import OutputText, WindowDecoder
from .grammar import GrammarCompiler
from .kv_manager import KVCacheManager
from .lora import AdapterStore
from .proposer import Proposer
from .request import FinishReason, Priority, Request, RequestOutput, SamplingParams, TokenLogprob
from .runner import DecoderRunner
from .sampler import sample, token_logprob
from .scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from .stopping import check_stop
from .tokenizer import Tokenizer
from .verify import verify


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = 16           # tokens per KV block
    num_blocks: int = 1024         # blocks in the pool (block_size * num_blocks token slots)
    max_model_len: int = 512       # prompt + output tokens at most (the model's positions)
    enable_prefix_caching: bool = True
    # where num_blocks came from (generate/serving/kv_budget.py): the memory budget it was cut from (0: the
    # count was given, kv_num_blocks) and which setting gave it; shown at load, in metrics and the config
    budget_bytes: int = 0
    sized_by: str = "kv_num_blocks"

    def __post_init__(self) -> None:
        if min(self.block_size, self.num_blocks, self.max_model_len) < 1:
            raise ValueError("block_size, num_blocks and max_model_len must be positive")


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_free: int
    prefix_cache_hit_rate: float   # prompt tokens found cached / prompt tokens looked up
    preemptions: int
    # the LoRA adapters of the running and of the waiting requests, each once (a model without adapters: ())
    running_adapters: tuple[str, ...] = ()
    waiting_adapters: tuple[str, ...] = ()
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache, since the engine started
    prefix_cache_hits: int = 0     # of those, found cached
    waiting_batch: int = 0  # of `waiting`, offline batch jobs' (Priority.BATCH): autoscaling ignores them
    spec_draft_tokens: int = 0     # tokens proposed by speculative decoding and verified, since the start
    spec_accepted_tokens: int = 0  # of those, kept (verify.py)
    spec_drafts: int = 0           # verifications: a request's steps with proposals (1 + kept / this a step)
    # the back-off (backoff.py), when the proposer has one: requests decoding plainly now because their
    # proposals did not pay, and back-offs started since the start; None: no back-off
    spec_requests_backing_off: int | None = None
    spec_backoffs: int = 0


class GenerationEngine:
    def __init__(self, runner: DecoderRunner, tokenizer: Tokenizer, cache: CacheConfig,
                 scheduler: SchedulerConfig, seed: int = 0, adapters: AdapterStore | None = None,
                 proposer: Proposer | None = None) -> None:
        self.runner = runner
        self.adapters = adapters  # the model's LoRA adapters (lora.py), when its graph takes them
        self.tokenizer = tokenizer
        self.grammars = GrammarCompiler(tokenizer)  # structured output's compiled grammars (grammar.py)
        self.cache_config = cache
        self.kv = KVCacheManager(cache.num_blocks, cache.block_size, cache.enable_prefix_caching)
        # speculative decoding's proposer (proposer.py, draft_proposer.py: the model folder's); None: off
        self.scheduler = Scheduler(scheduler, self.kv, proposer)
        self.spec_draft_tokens = self.spec_accepted_tokens = self.spec_drafts = 0
        self._seeds = np.random.default_rng(seed)  # seeds for requests that bring none
        self._requests: dict[str, Request] = {}

    def add_request(self, request_id: str, prompt: str | Sequence[int], params: SamplingParams,
                    group: str = "") -> Request:
        """Queue a request (WAITING). INVALID_ARG when it could never run: an empty prompt, token ids the
        model does not have, or prompt + max_tokens beyond the context or the whole KV cache, or a
        `structured` spec that does not compile (grammar.py). `group`: the
        API request it is one sequence of (several share one; "": its own), whose sequences the scheduler
        admits in turn with other groups' (waiting.py)."""
        if request_id in self._requests:
            raise EngineError(ErrorCode.ALREADY_EXISTS, f"request id {request_id!r} is already running")
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not token_ids:
            raise invalid("the prompt is empty; send at least one token")
        vocab = self.tokenizer.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise invalid(f"prompt token id {bad} is outside the vocabulary (0 … {vocab - 1})")
        total, limit = len(token_ids) + params.max_tokens, self.cache_config.max_model_len
        if total > limit:
            raise invalid(f"the prompt's {len(token_ids)} tokens plus max_tokens {params.max_tokens} exceed "
                          f"the model's context of {limit} tokens; shorten the prompt or lower max_tokens")
        capacity = self.cache_config.num_blocks * self.cache_config.block_size
        if total > capacity:
            raise invalid(f"the prompt's {len(token_ids)} tokens plus max_tokens {params.max_tokens} exceed "
                          f"the KV cache's {capacity} token slots; lower max_tokens")
        adapter = None
        if params.lora is not None:
            if self.adapters is None:
                raise invalid(f"LoRA adapter '{params.lora}' asked of a model whose graph takes no adapter "
                              "inputs")
            adapter = self.adapters.get(params.lora)  # loads it on first use (LRU)
        grammar = None if params.structured is None else self.grammars.constraint(params.structured)
        seed = params.seed if params.seed is not None else int(self._seeds.integers(2**63))
        tokenizer, tail = self.tokenizer, token_ids[-WindowDecoder.PROMPT_CONTEXT:]
        decoder = tokenizer.stream_decoder(params.skip_special_tokens, tail)
        special = {i: s for s in params.stop if (i := tokenizer.special_token_id(s)) is not None}
        text = OutputText(decoder, params.stop, special)
        request = Request(request_id, token_ids, params, np.random.default_rng(seed), adapter=adapter,
                          group=group, text=text, grammar=grammar)
        self._requests[request_id] = request
        self.scheduler.add(request)
        return request

    def abort_request(self, request_id: str) -> None:
        """Finish a request now (its client left) and free its blocks; unknown ids are ignored."""
        request = self._requests.pop(request_id, None)
        if request is not None:
            self.scheduler.finish(request, FinishReason.ABORT)

    @property
    def speculative(self) -> bool:
        """Whether decoding requests get proposals (speculative decoding: proposer.py, verify.py)."""
        return self.scheduler.proposer is not None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        # 1. schedule: who computes which tokens this step (joins, chunks, preemptions)
        plan = self.scheduler.schedule()
        if not plan.chunks:
            return []
        # 2. execute: the model over the chunks, then the next token of each request that samples (or,
        # in a multi-step decode, `steps` tokens of each, every one fed back but the last)
        samplers = [c.request for c in plan.chunks if c.sample]
        eos = self.tokenizer.eos_token_id
        steps = self._steps(plan)
        sampled: dict[str, Sequence[int]]
        logprobs: dict[str, TokenLogprob] = {}
        if steps > 1:
            tokens = self.runner.execute_steps(plan.chunks, steps,
                                               lambda logits: sample(logits, samplers, eos))
            sampled = dict(zip((r.request_id for r in samplers), tokens.tolist(), strict=True))
        else:
            logits = self.runner.execute(plan.chunks)
            sampled = {}
            if len(logits) > len(samplers):  # some chunks carry proposals: verify them, sample the others
                logits, samplers = self._verify(plan, logits, sampled)
            # no row when no chunk samples: a step of prefill chunks only (a prompt longer than the budget)
            picked = sample(logits, samplers, eos) if samplers else []
            sampled.update(zip((r.request_id for r in samplers), ((t,) for t in picked), strict=True))
            for row, request in enumerate(samplers):  # a plan with such a request runs one step (`_steps`)
                if request.params.logprobs is not None:
                    logprobs[request.request_id] = token_logprob(logits[row], picked[row],
                                                                 request.params.logprobs)
        # 3. update: advance every request, stop the finished ones and free their blocks
        outputs = []
        for request, new in self.scheduler.update(plan, sampled):
            if not new:  # a prefill chunk
                outputs.append(RequestOutput(request.request_id, (), False))
                continue
            reason, new = self._check_stop(request, new)
            finished = reason is not None
            if reason is not None:
                self.scheduler.finish(request, reason)
                del self._requests[request.request_id]
            assert request.text is not None
            text, ends = request.text.release(finished, request.output_text)
            shown = logprobs.get(request.request_id)
            outputs.append(RequestOutput(
                request.request_id, tuple(new), finished, reason,
                tuple(request.output_token_ids) if finished else (), request.output_text,
                () if shown is None else (shown,), text, ends,
                request.grammar.error if reason is FinishReason.ERROR and request.grammar else None))
        return outputs

    def _verify(self, plan: SchedulerOutput, logits: np.ndarray, sampled: dict[str, Sequence[int]],
                ) -> tuple[np.ndarray, list[Request]]:
        """Speculative decoding's verification (verify.py) of each chunk with proposals, its tokens put in
        `sampled`; returns the other sampling chunks' rows of `logits` and their requests, for `sample`."""
        rows: list[int] = []
        plain: list[Request] = []
        row = 0
        for chunk in plan.chunks:
            if not chunk.sample:
                continue
            if chunk.num_draft:
                proposals = chunk.token_ids[1:]
                tokens = verify(logits[row:row + 1 + chunk.num_draft], proposals, chunk.request)
                sampled[chunk.request.request_id] = tokens
                self.spec_draft_tokens += chunk.num_draft
                self.spec_accepted_tokens += len(tokens) - 1
                self.spec_drafts += 1
            else:
                rows.append(row)
                plain.append(chunk.request)
            row += 1 + chunk.num_draft
        return logits[rows], plain

    def _steps(self, plan: SchedulerOutput) -> int:
        """How many decode steps this plan runs before the next schedule (vLLM's multi-step scheduling):
        `num_scheduler_steps` when every chunk is one decode token (so nobody waiting could be admitted
        now: the schedule would have given it a prefill chunk) and the pool has the blocks, but no more
        than any of them has tokens left (max_tokens, the context): a request that ends at a known length
        ends with the steps, computes nothing past it, and its seat is free at the next schedule. It runs
        the scheduler, the stop checks and the outputs, and hands the API layer its events, once for
        several tokens: on a small model that is most of a token's cost (perf/README.md). Its price: a
        request ending inside it on a stop token or string computes up to steps - 1 tokens that are
        dropped, and a request arriving is admitted when the steps end. A plan with a request that has
        penalties or asks for logprobs runs one step: its penalties count the tokens so far, and the runs
        in between record none; its logprobs come from each run's logits."""
        steps = self.scheduler.config.num_scheduler_steps
        if steps == 1:
            return 1
        limit = self.cache_config.max_model_len
        for chunk in plan.chunks:
            request = chunk.request
            if len(chunk.token_ids) != 1 or not chunk.sample or request.params.stepwise:
                return 1  # penalties count the tokens so far, which update() records; logprobs are per run
            steps = min(steps, limit - chunk.start, request.params.max_tokens - len(request.output_token_ids))
        return steps if steps > 1 and self.scheduler.reserve(plan, steps) else 1

    def _check_stop(self, request: Request, new: Sequence[int]) -> tuple[FinishReason | None, Sequence[int]]:
        """check_stop after each of a step's new tokens; tokens after the one that ends the request are
        dropped (a multi-step decode computed them), so what it returns is what one step at a time would."""
        limit = self.cache_config.max_model_len
        if len(new) == 1:
            return check_stop(request, self.tokenizer, limit), new
        tokens = request.output_token_ids
        base = len(tokens) - len(new)
        del tokens[base:]
        for count, token in enumerate(new, 1):
            tokens.append(token)
            reason = check_stop(request, self.tokenizer, limit)
            if reason is not None:
                return reason, new[:count]
        return None, new

    def run_to_completion(self, max_steps: int = 1_000_000) -> dict[str, RequestOutput]:
        """Step until every request finished; the last output of each, by request id."""
        done: dict[str, RequestOutput] = {}
        for _ in range(max_steps):
            if not self.has_unfinished():
                return done
            for output in self.step():
                if output.finished:
                    done[output.request_id] = output
        raise RuntimeError(f"requests still unfinished after {max_steps} steps")

    def stats(self) -> EngineStats:
        pool = self.kv.pool
        queried = self.kv.prefix_queries
        proposer = self.scheduler.proposer
        backoff = proposer if isinstance(proposer, BackoffProposer) else None
        return EngineStats(
            running=len(self.scheduler.running), waiting=self.scheduler.num_waiting,
            kv_blocks_used=pool.num_blocks - pool.num_free, kv_blocks_free=pool.num_free,
            prefix_cache_hit_rate=self.kv.prefix_hits / queried if queried else 0.0,
            preemptions=self.scheduler.num_preemptions,
            prefix_cache_queries=queried, prefix_cache_hits=self.kv.prefix_hits,
            running_adapters=() if self.adapters is None else _adapters(self.scheduler.running),
            waiting_adapters=() if self.adapters is None else _adapters(self.scheduler.waiting),
            waiting_batch=len(self.scheduler.queues[Priority.BATCH]),
            spec_draft_tokens=self.spec_draft_tokens, spec_accepted_tokens=self.spec_accepted_tokens,
            spec_drafts=self.spec_drafts,
            spec_requests_backing_off=None if backoff is None else backoff.requests_backing_off,
            spec_backoffs=0 if backoff is None else backoff.backoffs)


def _adapters(requests: list[Request]) -> tuple[str, ...]:
    """The distinct LoRA adapters of `requests`, in their order."""
    return tuple(dict.fromkeys(r.params.lora for r in requests if r.params.lora is not None))
