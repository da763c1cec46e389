"""The engine's side of a decoupled Python model's request: `Relay` carries its responses from the instance
to the request's stream and future.

A decoupled model (`model_transaction_policy { decoupled: true }`) answers through
`request.get_response_sender()`, from `execute` or from a thread it started, after `execute` returned; the
instance is free again once `execute` returns (as in Triton), so a request outlives its batch. The
`RequestBatcher` makes one `Relay` per request of a batch and hands them to the instance
(`execute_requests(..., relays)`), which numbers them (the stub's senders name that key) and calls
`respond` on the loop, in the order the model sent:
- a response without the final flag goes to `request.stream` (an error response as an EngineError: the
  stream goes on, as Triton's does);
- the final flag resolves the request's future: with the response sent with it, or `EMPTY_FINAL` when it
  came alone; an error response sent with it fails the future. The future's one done-callback
  (engine/scheduling/inflight.py) then accounts the request, once, as for any other model;
- `fail` (execute raised, the process died) fails a request not yet finished;
- a cancelled future (the client left) tells the instance, through the `cancel` it bound, so the model's
  `is_cancelled()` turns true; responses after that are dropped;
- flow control (engine/streaming/window.py): the request's consumer counts what its client took in the
  request's `stream_window`, whose credit goes to the instance through the `grant` it bound, so the model's
  sends wait while RESPONSE_WINDOW of them are not yet taken (send_credits.py). A request with no window
  gets its credit back as each response is delivered.
`on_finished` is called exactly once per relay, however it ends (the batcher counts it answered then).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ...errors import EngineError
from ...observability import observe
from ...observability.stats import ModelStats
from ...scheduling.batching.policy import Pending
from ...streaming.window import Grant
from ...types import EMPTY_FINAL, InferenceResponse
from .runner import Answer

Check = Callable[[Pending, Answer], "InferenceResponse | EngineError"]


class Relay:
    __slots__ = ("_cancel", "_check", "_grant", "_last_ns", "_on_finished", "_sent", "_stats", "finished",
                 "pending")

    def __init__(self, pending: Pending, check: Check, on_finished: Callable[[], None], stats: ModelStats,
                 start_ns: int) -> None:
        self.pending = pending
        self.finished = False
        self._stats = stats
        self._sent = 0
        self._last_ns = start_ns
        self._check = check
        self._on_finished = on_finished
        self._cancel: Callable[[], None] | None = None
        self._grant: Grant | None = None  # set only for a request with no window of its own
        future = pending.future
        if future is not None:
            future.add_done_callback(self._future_done)

    def bind(self, cancel: Callable[[], None], grant: Grant) -> None:
        """Called by the instance once it has numbered this relay: how to tell the model it was cancelled,
        and how to give its sends credit."""
        self._cancel = cancel  # a future cancelled before this still calls it: its callback runs later
        window = self.pending.request.stream_window
        if window is not None:
            window.bind(grant)
        else:
            self._grant = grant

    def respond(self, answer: Answer | None, final: bool) -> None:
        """One send of the model (`answer` None: the final flag alone). On the loop."""
        if self.finished:
            return
        future = self.pending.future
        if future is None or future.done():
            return
        response = None if answer is None else self._check(self.pending, answer)
        now = time.perf_counter_ns()
        kind = "empty_response" if response is None else "fail" if isinstance(response, EngineError) \
            else "success"
        self._stats.record_response(self._sent, now - self._last_ns, kind)
        self._sent += 1
        self._last_ns = now
        if not final:
            stream = self.pending.request.stream
            if response is not None and stream is not None:
                stream(response)
            if self._grant is not None:
                self._grant(1)
            return
        if observe.STATE.active:  # its compute, on its access line and spans, ends with its final response
            self.pending.request.computed_ns = now
        if isinstance(response, EngineError):
            future.set_exception(response)
        else:
            future.set_result(EMPTY_FINAL if response is None else response)

    def fail(self, error: EngineError) -> None:
        future = self.pending.future
        if not self.finished and future is not None and not future.done():
            future.set_exception(error)

    def _future_done(self, future: asyncio.Future[InferenceResponse]) -> None:
        if self.finished:
            return
        self.finished = True
        window = self.pending.request.stream_window
        if window is not None:
            window.close()
        if future.cancelled():  # the client left: Triton counts a cancel at the response it did not get
            self._stats.record_response(self._sent, time.perf_counter_ns() - self._last_ns, "cancel")
            if self._cancel is not None:
                self._cancel()
        self._on_finished()
