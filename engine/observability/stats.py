"""Per model-version counters: the single source for the statistics extension and the Prometheus metrics.

Recorded at three points only: the data plane (request success/failure, end-to-end time), the batcher
(queue time) and the instance (compute time, execution count, batch sizes). All updates happen on the event
loop thread, so plain integers suffice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .histograms import LatencyHistograms, new_histograms


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass(slots=True)
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ResponseStats:
    """A decoupled model's responses at one index (0 = each request's first, ...), as Triton keeps them:
    each response's time since the previous one (or since its execute began) as compute_infer, and as
    success, fail (an error response) or empty_response (the final flag sent alone); and cancel, where a
    request was cancelled (its client left)."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)


# response_stats keeps an entry per response index up to this one; this one counts it and every later index.
MAX_RESPONSE_INDEX = 1024


@dataclass(slots=True)
class ModelStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    # Requests whose client went away (disconnect, RST_STREAM, deadline) before the answer: not failures of
    # the model, so a client resetting streams cannot inflate `fail` (and the failure metric) at will.
    cancelled: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0  # batch elements inferred
    execution_count: int = 0  # backend executions (batches)
    last_inference_ms: int = 0
    batches: dict[int, BatchStats] = field(default_factory=dict)
    # Why each batch left the queue (full, preferred, window, immediate, early): what the window is doing.
    dispatch_reasons: dict[str, int] = field(default_factory=dict)
    responses: dict[int, ResponseStats] = field(default_factory=dict)  # decoupled models only
    # Generative models: requests of either API between arrival and answer
    # (engine/generate/serving/accounting.py), the model's pending count (a /v1 request is one of its requests
    # too).
    generating: int = 0

    def record_response(self, index: int, ns: int, kind: str) -> None:
        """A decoupled model's response number `index` of its request, `ns` after the one before; `kind` is
        "success", "fail", "empty_response" or "cancel" (the request was cancelled there: `ns` is the
        clean-up's, and it computed nothing, so compute_infer is not counted, as in Triton). Responses from
        MAX_RESPONSE_INDEX on are counted at MAX_RESPONSE_INDEX: a request may ask for millions of responses,
        and an entry per index would keep memory for each, for the model's life."""
        index = min(index, MAX_RESPONSE_INDEX)
        stats = self.responses.get(index)
        if stats is None:
            stats = self.responses[index] = ResponseStats()
        if kind != "cancel":
            stats.compute_infer.add(ns)
        getattr(stats, kind).add(ns)
        if kind == "success":
            stats.compute_output.add(0)

    # Request, queue and compute latency histograms (histograms.py); None when switched off.
    histograms: LatencyHistograms | None = field(default_factory=new_histograms)

    def record_request(self, outcome: Duration, elapsed_ns: int) -> None:
        """An answered request (`outcome` is `success` or `fail`), into the request histogram too. Called for
        every request: `outcome.add` is spelled out."""
        outcome.count += 1
        outcome.ns += elapsed_ns
        if self.histograms is not None:
            self.histograms.request.observe(elapsed_ns)

    def record_successes(self, elapsed_ns: list[int]) -> None:
        """A batch's answered requests, as `record_request(self.success, ...)` each, in one call per batch
        (the batcher's answer pass: engine/scheduling/batching/batcher.py `_resolve`)."""
        self.success.add(sum(elapsed_ns), len(elapsed_ns))
        if self.histograms is not None:
            self.histograms.request.observe_each(elapsed_ns)

    def record_queue(self, wait_ns: int) -> None:
        """One request's time in the queue, into the queue histogram too."""
        self.queue.add(wait_ns)
        if self.histograms is not None:
            self.histograms.queue.observe(wait_ns)

    def record_queue_waits(self, waits_ns: list[int]) -> None:
        """A batch's requests' times in the queue, as `record_queue` each, in one call per batch (the batcher
        runs it for every batch it dispatches)."""
        self.queue.add(sum(waits_ns), len(waits_ns))
        if self.histograms is not None:
            self.histograms.queue.observe_each(waits_ns)

    def record_execution(self, batch_size: int, requests: int, input_ns: int, infer_ns: int,
                         output_ns: int) -> None:
        """One backend execution of `requests` requests totalling `batch_size` elements. Each request is
        charged the whole batch's compute time, as Triton does."""
        self.execution_count += 1
        self.inference_count += batch_size
        self.compute_input.add(input_ns * requests, requests)
        self.compute_infer.add(infer_ns * requests, requests)
        self.compute_output.add(output_ns * requests, requests)
        batch = self.batches.get(batch_size)
        if batch is None:
            batch = self.batches[batch_size] = BatchStats()
        batch.compute_input.add(input_ns)
        batch.compute_infer.add(infer_ns)
        batch.compute_output.add(output_ns)
        if self.histograms is not None:
            self.histograms.compute.observe(input_ns + infer_ns + output_ns, requests)
        self.last_inference_ms = time.time_ns() // 1_000_000
