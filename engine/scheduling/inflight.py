"""What `Batcher` (batching/batcher.py) and `SequenceBatcher` (sequence/batcher.py) share as `Model` sees
them: the count of requests accepted and not yet answered, a wait until there are none (unload drains on it),
a request's one done-callback (accounting, then the frontend's answer), and how a backend failure becomes the
error a failed batch answers with.

A base class rather than a helper object, so the batchers' per-request and per-batch paths call the same
methods as before, with no extra attribute hop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from mypy_extensions import mypyc_attr

from ..config.model_config import ModelConfig
from ..errors import EngineError, ErrorCode
from ..observability.request_life import request_ended
from ..observability.stats import ModelStats
from ..types import Completion, InferenceRequest, InferenceResponse


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed in modules mypyc leaves uncompiled
class InflightBatcher:
    """The subclass adds to `_inflight` (and clears `_idle`) for each request it accepts and calls `_done`
    for each it answers."""

    config: ModelConfig
    _stats: ModelStats
    _version: str

    def __init__(self) -> None:
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def _done(self, n: int) -> None:
        self._inflight -= n
        if self._inflight == 0:
            self._idle.set()

    def _accept(self, future: asyncio.Future[InferenceResponse], token: Any, request: InferenceRequest,
                received_ns: int, on_done: Completion | None) -> Completion:
        """Count an accepted request in flight and give its future the one done-callback (returned): it
        accounts the request (success, failure, or cancelled, timed from `received_ns`; a cancelled one is
        first taken back from the batcher with `_withdraw(token)`) and observes it (its access line and
        spans, while those are on), both in engine/observability/request_life.py, and then calls `on_done`,
        the frontend's answer.

        A subclass that answers a whole batch at once may take the callback off the future before resolving
        it and do the same work itself, in one pass (Batcher._resolve): no loop round per request."""
        if not self._inflight:  # (clear only when the count leaves 0: a Python call per request saved)
            self._idle.clear()
        self._inflight += 1
        stats = self._stats
        version = self._version

        def completed(f: asyncio.Future[InferenceResponse]) -> None:
            end = time.perf_counter_ns()
            cancelled = f.cancelled()
            if cancelled:
                self._withdraw(token)
            request_ended(stats, self.config.name, version, request, None if cancelled else f.exception(),
                          cancelled, received_ns, end)
            if on_done is not None:
                on_done(f)

        future.add_done_callback(completed)
        return completed

    def _withdraw(self, token: Any) -> None:
        """A cancelled request's `token` (what the subclass passed to `_accept`): take it out of the queue, so
        it is never executed, and count it done if it was still queued."""
        raise NotImplementedError

    def _execution_error(self, error: Exception) -> EngineError:
        """The error every request of a failed batch is answered with: an EngineError as raised, any other
        exception as INTERNAL naming the model."""
        if isinstance(error, EngineError):
            return error
        return EngineError(ErrorCode.INTERNAL, f"model '{self.config.name}' failed to execute: {error}")

    @property
    def pending_count(self) -> int:
        """Requests accepted and not yet answered (queued or executing)."""
        return self._inflight

    @property
    def queued_count(self) -> int:
        """Requests accepted and waiting in the queue, not executing (the queued-request gauge, what the
        autoscaler scales on: deploy/kubernetes/hpa.yaml). The subclass's: its policy holds the queues."""
        raise NotImplementedError

    async def drain(self) -> None:
        """Wait until every accepted request has been answered."""
        await self._idle.wait()
