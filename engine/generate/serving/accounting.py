"""A generation request's part in its model version's Triton statistics (engine/observability/stats.py
`ModelStats`).

A generative model version is one model to Triton's statistics extension and to the `nv_inference_*` metrics,
whichever API reached its engine: a request through ModelStreamInfer or generate[_stream]
(generate/triton/model.py) and one through /v1 (engine/openai/generation.py) each count once, as a decoupled
model's request does:
- `queue`: from its arrival until it is handed to the engine's driver (the wait for the version's engine to
  be built, on the first request; then the tokenizing and checks, microseconds);
- one execution of batch size 1 (`execution_count`, `inference_count`, `compute_infer` = from the hand-off
  to the end: the whole generation, the engine's own queue and steps; compute_input and compute_output 0)
  for every request that reached the engine, however it ended, as a decoupled Python model's execute
  counts whatever its responses did;
- its outcome once: `success`, `fail` (an error, before or during generation) or `cancelled` (its client
  left), each with the time since its arrival.
While it is open the request counts in `ModelStats.generating`, the version's pending count (the
`nv_inference_pending_request_count` gauge). Per-response statistics (`response_stats`) are the Triton
path's own (generate/triton/model.py): an OpenAI stream's chunks are not Triton responses.

Made and used on the loop only.
"""

from __future__ import annotations

import enum
import time

from ...observability.stats import ModelStats


class Outcome(enum.Enum):
    SUCCESS = "success"
    FAIL = "fail"
    CANCELLED = "cancelled"


class RequestAccount:
    """One request's times; `finish` records it, `drop` forgets one refused before it started (either once;
    later calls do nothing)."""

    __slots__ = ("finished", "received_ns", "stats", "submitted_ns")

    def __init__(self, stats: ModelStats, received_ns: int) -> None:
        self.stats = stats
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

    def finish(self, outcome: Outcome) -> None:
        if self.finished:
            return
        self.finished = True
        stats, now = self.stats, time.perf_counter_ns()
        stats.generating -= 1
        if self.submitted_ns:
            stats.record_execution(1, 1, 0, now - self.submitted_ns, 0)
        elapsed = now - self.received_ns
        if outcome is Outcome.CANCELLED:
            stats.cancelled.add(elapsed)
        else:
            stats.record_request(stats.success if outcome is Outcome.SUCCESS else stats.fail, elapsed)
