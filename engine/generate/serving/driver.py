"""A `GenerationEngine` on a thread of its own, driven from the event loop: the API layer's one engine thread.

The engine is plain and synchronous (core/engine.py); this is its asynchronous edge, so neither a step nor
ONNX Runtime ever runs on the loop. Ownership:
- the loop calls `submit` and `abort` (they only queue work and wake the thread) and receives each step's
  results in `_deliver`, through one `call_soon_threadsafe` per step: no task, no future per token;
- the thread alone touches the engine: it takes what was queued, steps while anything is unfinished, posts
  each request's new text (the engine's `RequestOutput.new_text`: stop strings and incomplete UTF-8
  characters are held back there, so streamed text never has to be taken back, and no step decodes more
  than a bounded tail of the output: core/detokenize.py) with the logprobs of the tokens it covers
  (`_TextState`), then sleeps until woken.

A request's id is the one its client's request carries (X-Request-ID, or the id the API layer made), so the
engine's log lines name it. `abort` frees a request's KV blocks before the next step: a client that leaves
mid-stream costs nothing after that step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...errors import EngineError, ErrorCode
from ...observability.generation import GenerationSample, LoraSample
from ..core.engine import EngineStats, GenerationEngine
from ..core.request import Priority, RequestOutput, SamplingParams
from .latency import GenerationMetrics

log = logging.getLogger("hubserve.generate")


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """What one step did for one request, as its client sees it: the text it may now be shown (`text`,
    new since the last event), how many tokens that took, and, the last time, why it ended. `error` ends
    it too."""

    text: str = ""
    num_tokens: int = 0
    finished: bool = False
    finish_reason: str | None = None  # "stop" or "length" (OpenAI's); "abort" is never delivered
    error: EngineError | None = None
    logprobs: tuple[ShownLogprob, ...] = ()  # one per token of this event, when the request asked for them


OnEvent = Callable[[TokenEvent], None]


@dataclass(frozen=True, slots=True)
class ShownLogprob:
    """A generated token's log-probability as its client is shown it (core/request.py `TokenLogprob`, with
    each token id turned into its bytes): the token, and the most likely tokens as (bytes,
    log-probability)."""

    token: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()


@dataclass(slots=True)
class _Client:
    """Loop side: where a request's events go, and its timing for the latency metrics."""

    on_event: OnEvent
    num_prompt_tokens: int
    arrival_s: float
    adapter: str | None
    interactive: bool  # an API request, not an offline batch job's (Priority.BATCH)
    last_token_s: float = 0.0
    num_tokens: int = 0


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    group: str


class _TextState:
    """Thread side: how much of a request's text has been handed out, and the logprobs of its tokens whose
    text has not (with the text's length through each: core/detokenize.py `OutputText`). A token's logprobs
    are handed out once the text handed out covers it, all of them when it finishes."""

    __slots__ = ("held", "sent")

    def __init__(self) -> None:
        self.sent = 0
        self.held: list[tuple[ShownLogprob, int]] = []

    def logprobs(self, new: tuple[ShownLogprob, ...], ends: tuple[int, ...],
                 finished: bool) -> tuple[ShownLogprob, ...]:
        """The logprobs to hand out with this event's text (`sent` counts it already): of the held tokens,
        those whose text it covers (`ends`: the text's length through each new token)."""
        held = self.held
        held.extend(zip(new, ends, strict=False))
        count = len(held) if finished else 0
        while count < len(held) and held[count][1] <= self.sent:
            count += 1
        out = tuple(shown for shown, _ in held[:count])
        del held[:count]
        return out


class EngineDriver:
    """One generative model version's engine and its thread. Made on the loop (registry.py), which alone
    calls `submit`, `abort` and `close`."""

    def __init__(self, engine: GenerationEngine, model_name: str, version: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.version = version
        self.metrics = GenerationMetrics()
        self.stats: EngineStats = engine.stats()  # replaced by the thread after each step: read any time
        self.stats_time_s = time.time()  # when `stats` was taken (the lora_requests_info gauge's value)
        self._loop = asyncio.get_running_loop()
        self._clients: dict[str, _Client] = {}  # loop side
        self._lock = threading.Lock()
        self._adds: list[_Add] = []
        self._aborts: list[str] = []
        self._closing = False
        self._wake = threading.Event()
        self._texts: dict[str, _TextState] = {}  # thread side
        # proposed, kept, verifications, when: at the last acceptance log line
        self._spec_logged = (0, 0, 0, time.monotonic())
        self._thread = threading.Thread(target=self._run, name=f"generate-{model_name}", daemon=True)
        self._thread.start()

    @property
    def in_flight(self) -> int:
        return len(self._clients)

    @property
    def alive(self) -> bool:
        """Whether the engine thread runs (a step's failure fails its requests, not the thread: only a bug
        outside a step, or `close`, ends it). vLLM's /health asks the same of its engine."""
        return self._thread.is_alive()

    def sample(self) -> GenerationSample:
        """This version's numbers for the metrics (engine/observability/generation.py), on the loop (a
        scrape): the loop's counters and the engine's statistics of its last step."""
        metrics, stats, adapters = self.metrics, self.stats, self.engine.adapters
        lora = None if adapters is None else LoraSample(
            metrics.lora_requests, metrics.lora_tokens, adapters.num_loaded, adapters.max_loaded,
            self.adapters_in_flight(), adapters.loads, adapters.evictions, stats.running_adapters,
            stats.waiting_adapters)
        cache = self.engine.cache_config
        return GenerationSample(
            self.model_name, self.version, metrics.generation_tokens, metrics.prompt_tokens, stats.running,
            stats.waiting, stats.kv_blocks_used, stats.kv_blocks_free, stats.prefix_cache_hit_rate,
            stats.preemptions, metrics.finished, metrics.time_to_first_token, metrics.inter_token_latency,
            lora, self.stats_time_s, stats.prefix_cache_queries, stats.prefix_cache_hits,
            waiting_batch=stats.waiting_batch,
            interactive_time_to_first_token=metrics.interactive_time_to_first_token,
            kv_num_blocks=cache.num_blocks, kv_block_size=cache.block_size,
            kv_cache_bytes=self.engine.runner.blocks.nbytes,
            spec_draft_tokens=stats.spec_draft_tokens if self.engine.speculative else None,
            spec_accepted_tokens=stats.spec_accepted_tokens, spec_drafts=stats.spec_drafts,
            spec_requests_backing_off=stats.spec_requests_backing_off, spec_backoffs=stats.spec_backoffs)

    def adapters_in_flight(self) -> int:
        """Distinct LoRA adapters among the requests in flight (queued or running): beside `max_loras`, how
        many adapters the work needs resident at once. On the loop (a scrape)."""
        return len({c.adapter for c in self._clients.values() if c.adapter is not None})

    # ------------------------------------------------------------------ the loop's side

    def submit(self, request_id: str, token_ids: Sequence[int], params: SamplingParams,
               on_event: OnEvent, group: str = "") -> None:
        """Queue a request; `on_event` is called on the loop with each of its events until one is finished
        (or carries an error). ALREADY_EXISTS at once when a request with this id is still running. `group`:
        the API request it is one sequence of (core/engine.py `add_request`)."""
        if self._closing:
            raise EngineError(ErrorCode.UNAVAILABLE, f"model '{self.model_name}' is unloading; retry")
        if request_id in self._clients:
            raise EngineError(ErrorCode.ALREADY_EXISTS, f"a request with id '{request_id}' is still running; "
                                                        "request ids (X-Request-ID) must be unique")
        now = time.perf_counter()
        adapter = params.lora
        self._clients[request_id] = _Client(on_event, len(token_ids), now, adapter,
                                            params.priority == Priority.INTERACTIVE)
        self.metrics.prompt_tokens += len(token_ids)
        if adapter is not None:
            counts = self.metrics.lora_requests
            counts[adapter] = counts.get(adapter, 0) + 1
        log.debug("request %s: queued for model '%s' (%d prompt tokens, max_tokens %d)", request_id,
                  self.model_name, len(token_ids), params.max_tokens)
        with self._lock:
            self._adds.append(_Add(request_id, list(token_ids), params, group))
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """The request's client left: it gets no more events; its blocks are freed before the next step."""
        client = self._clients.pop(request_id, None)
        if client is None:
            return
        self._count_finish("abort")
        log.info("request %s: aborted by its client after %d tokens", request_id, client.num_tokens)
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    async def close(self) -> None:
        """Stop taking requests, let the thread finish those it has, then end it. Called once, by the
        registry, when the version is unloaded or the server stops (after the frontends drained)."""
        with self._lock:
            self._closing = True
        self._wake.set()
        await asyncio.to_thread(self._thread.join)
        for request_id in list(self._clients):  # queued after the thread's last look: never to run
            self._deliver([(request_id, TokenEvent(finished=True, error=EngineError(
                ErrorCode.UNAVAILABLE, f"model '{self.model_name}' was unloaded")))])

    def _deliver(self, events: list[tuple[str, TokenEvent]]) -> None:
        """One step's events, on the loop: the latency metrics, then each request's client."""
        now = time.perf_counter()
        metrics = self.metrics
        for request_id, event in events:
            client = self._clients.get(request_id)
            if client is None:
                continue  # aborted meanwhile
            if event.num_tokens:
                if client.num_tokens == 0:
                    metrics.time_to_first_token.observe(now - client.arrival_s)
                    if client.interactive:
                        metrics.interactive_time_to_first_token.observe(now - client.arrival_s)
                else:
                    gap = (now - client.last_token_s) / event.num_tokens
                    for _ in range(event.num_tokens):
                        metrics.inter_token_latency.observe(gap)
                client.num_tokens += event.num_tokens
                client.last_token_s = now
                metrics.generation_tokens += event.num_tokens
                if client.adapter is not None:
                    tokens = metrics.lora_tokens
                    tokens[client.adapter] = tokens.get(client.adapter, 0) + event.num_tokens
            if event.finished:
                del self._clients[request_id]
                self._count_finish("error" if event.error is not None else event.finish_reason or "stop")
                if event.error is None:
                    log.info("request %s: finished (%s): %d prompt + %d generated tokens in %.1f ms",
                             request_id, event.finish_reason, client.num_prompt_tokens, client.num_tokens,
                             (now - client.arrival_s) * 1000)
                else:
                    log.warning("request %s: failed: %s", request_id, event.error.message)
            client.on_event(event)

    def _count_finish(self, reason: str) -> None:
        finished = self.metrics.finished
        finished[reason] = finished.get(reason, 0) + 1

    # ------------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        engine = self.engine
        while True:
            self._wake.wait()
            with self._lock:
                self._wake.clear()
                adds, self._adds = self._adds, []
                aborts, self._aborts = self._aborts, []
                closing = self._closing
            events: list[tuple[str, TokenEvent]] = []
            for add in adds:  # before the aborts: a request may be aborted in the round it was added
                try:
                    engine.add_request(add.request_id, add.token_ids, add.params, add.group)
                    self._texts[add.request_id] = _TextState()
                except EngineError as e:
                    events.append((add.request_id, TokenEvent(finished=True, error=e)))
                except Exception as e:  # a bug: this request fails, the thread lives on
                    log.exception("request %s: could not be added", add.request_id)
                    error = EngineError(ErrorCode.INTERNAL, f"request could not be added: {e}")
                    events.append((add.request_id, TokenEvent(finished=True, error=error)))
            for request_id in aborts:
                engine.abort_request(request_id)
                self._texts.pop(request_id, None)
            if aborts:
                self._take_stats()  # blocks freed: the gauges say so even if no step follows
            while engine.has_unfinished() and not self._wake.is_set():
                events.extend(self._step())
                self._post(events)
                events = []
            self._post(events)
            if closing and not engine.has_unfinished():
                return
            if engine.has_unfinished():
                self._wake.set()  # woken mid-run: take the new work, then go on stepping

    def _step(self) -> list[tuple[str, TokenEvent]]:
        try:
            outputs = self.engine.step()
        except Exception as e:  # a backend failure or a bug: every request in flight fails, the thread lives
            log.exception("model '%s': generation step failed", self.model_name)
            error = EngineError(ErrorCode.INTERNAL, f"generation failed in model '{self.model_name}': {e}")
            failed = list(self._texts)
            for request_id in failed:
                self.engine.abort_request(request_id)
            self._texts.clear()
            return [(request_id, TokenEvent(finished=True, error=error)) for request_id in failed]
        finally:
            self._take_stats()
        return [event for out in outputs if (event := self._event(out)) is not None]

    def _take_stats(self) -> None:
        self.stats, self.stats_time_s = self.engine.stats(), time.time()
        if self.engine.speculative:
            self._log_acceptance()

    def _log_acceptance(self, every_s: float = 10.0) -> None:
        """Speculative decoding's acceptance since the last such line, at most one line per `every_s` (as
        vLLM logs its SpecDecoding metrics); nothing when nothing was proposed."""
        proposed, kept, drafts, since = self._spec_logged
        now = time.monotonic()
        stats = self.stats
        if now - since < every_s or stats.spec_draft_tokens == proposed:
            return
        log.info("%s", acceptance_line(self.model_name, stats.spec_draft_tokens - proposed,
                                       stats.spec_accepted_tokens - kept, stats.spec_drafts - drafts,
                                       now - since))
        self._spec_logged = (stats.spec_draft_tokens, stats.spec_accepted_tokens, stats.spec_drafts, now)

    def _event(self, out: RequestOutput) -> tuple[str, TokenEvent] | None:
        state = self._texts.get(out.request_id)
        if state is None:
            return None
        if not out.new_token_ids and not out.finished:
            return None  # a prefill chunk: nothing to show yet
        if out.finished:
            del self._texts[out.request_id]
        if out.error is not None:  # it failed alone (its grammar): the rest of its text is never shown
            return out.request_id, TokenEvent(finished=True, error=out.error)
        reason = out.finish_reason.value if out.finish_reason is not None else None
        state.sent += len(out.new_text)
        shown: tuple[ShownLogprob, ...] = ()
        if out.logprobs or state.held:
            piece = self.engine.tokenizer.token_bytes
            shown = state.logprobs(tuple(ShownLogprob(piece(lp.token_id), lp.logprob,
                                                      tuple((piece(t), p) for t, p in lp.top))
                                         for lp in out.logprobs), out.text_ends, out.finished)
        return out.request_id, TokenEvent(out.new_text, len(out.new_token_ids), out.finished, reason,
                                          logprobs=shown)

    def _post(self, events: list[tuple[str, TokenEvent]]) -> None:
        if not events:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone, nobody listens
            self._loop.call_soon_threadsafe(self._deliver, events)


def acceptance_line(model: str, proposed: int, kept: int, drafts: int, seconds: float) -> str:
    """The driver's speculative decoding log line over a period: the kept share of the proposed tokens and
    the tokens each verification gave (the kept ones and the model's own next token: vLLM's "Mean
    acceptance length", 1 + kept / drafts), which says the speed-up a step's cost allows."""
    per_step = f"{1 + kept / drafts:.2f}" if drafts else "-"
    return (f"model '{model}': speculative decoding kept {kept} of {proposed} proposed tokens "
            f"({100 * kept / max(proposed, 1):.1f}%), {per_step} tokens per verification (mean acceptance "
            f"length), in the last {seconds:.0f} s")
