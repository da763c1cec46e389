"""What `Batcher` (batching.py) and `SequenceBatcher` (sequence_batcher.py) share as `Model` sees them: the
count of requests accepted and not yet answered, a wait until there are none (unload drains on it), and how a
backend failure becomes the error a failed batch answers with.

A base class rather than a helper object, so the batchers' per-request and per-batch paths call the same
methods as before, with no extra attribute hop.
"""

from __future__ import annotations

import asyncio

from .config_types import ModelConfig
from .errors import EngineError, ErrorCode


class InflightBatcher:
    """The subclass adds to `_inflight` (and clears `_idle`) for each request it accepts and calls `_done`
    for each it answers."""

    config: ModelConfig

    def __init__(self) -> None:
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def _done(self, n: int) -> None:
        self._inflight -= n
        if self._inflight == 0:
            self._idle.set()

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

    async def drain(self) -> None:
        """Wait until every accepted request has been answered."""
        await self._idle.wait()
