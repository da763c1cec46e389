"""A generation request's part in its model version's Triton statistics (engine/observability/stats.py
`ModelStats`).

A generative model version is one model to Triton's statistics extension and to the `nv_inference_*` metrics,
whichever API reached its engine: a request through ModelStreamInfer or generate[_stream]
(generate/triton/model.py) and one through /v1 (engine/openai/generation.py) each count once, as a decoupled
model's request does:
- `queue`: from its arrival until it is handed to the engine's driver (the tokenizing and checks,
  microseconds: the version's engine was built when it loaded);
- one execution of batch size 1 (`execution_count`, `inference_count`, `compute_infer` = from the hand-off
  to the end: the whole generation, the engine's own queue and steps; compute_input and compute_output 0)
  for every request that reached the engine, however it ended, as a decoupled Python model's execute
  counts whatever its responses did;
- its outcome once: `success`, `fail` (an error, before or during generation) or `cancelled` (its client
  left), each with the time since its arrival;
- then, as every request's end (engine/observability/request_life.py), its access line and, when sampled,
  its spans, from the same times: queue until the hand-off, compute the whole generation, batch size 1.
While it is open the request counts in `ModelStats.generating`, the version's pending count (the
`nv_inference_pending_request_count` gauge). Per-response statistics (`response_stats`) are the Triton
path's own (generate/triton/model.py): an OpenAI stream's chunks are not Triton responses.

Made and used on the loop only.
"""

from __future__ import annotations

import time

from ...observability import observe
from ...observability.request_life import request_ended
from ...observability.stats import ModelStats
from ...types import InferenceRequest


class RequestAccount:
    """One request's times; `finish` records it, `drop` forgets one refused before it started (either once;
    later calls do nothing). `request` carries the times its access line and spans read (engine/observability/
    request_life.py): Triton's request as decoded, or one made for a /v1 request (its id the API's)."""

    __slots__ = ("finished", "model", "received_ns", "request", "stats", "submitted_ns", "version")

    def __init__(self, stats: ModelStats, model: str, version: str, request: InferenceRequest,
                 received_ns: int) -> None:
        self.stats = stats
        self.model = model
        self.version = version
        self.request = request
        self.received_ns = received_ns
        self.submitted_ns = 0  # 0: not (yet) in the engine
        self.finished = False
        stats.generating += 1

    def submitted(self) -> int:
        """The request was handed to the engine's driver: its queue time ends. Returns the time (ns)."""
        now = self.submitted_ns = time.perf_counter_ns()
        self.stats.record_queue(now - self.received_ns)
        return now

    def drop(self) -> None:
        """The request was refused before it started (a /v1 request id still running): it counts nowhere."""
        if not self.finished:
            self.finished = True
            self.stats.generating -= 1

    def finish(self, error: BaseException | None, cancelled: bool = False) -> None:
        """It ended: success (`error` None), fail (`error`, before or during generation) or cancelled (its
        client left). Counted, then its access line and spans."""
        if self.finished:
            return
        self.finished = True
        stats, now = self.stats, time.perf_counter_ns()
        stats.generating -= 1
        submitted = self.submitted_ns
        if submitted:
            stats.record_execution(1, 1, 0, now - submitted, 0)
        request = self.request
        if observe.STATE.active:  # its queue: arrival to hand-off; its compute: the whole generation
            request.queued_ns = self.received_ns
            if submitted:
                request.dispatched_ns, request.computed_ns, request.executed_batch = submitted, now, 1
        request_ended(stats, self.model, self.version, request, None if cancelled else error, cancelled,
                      self.received_ns, now)
