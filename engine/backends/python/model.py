"""`PythonModel`: a version of a Python model, as the repository builds it (kind.py).

An `InstanceModel` (engine/model.py) whose batcher answers each request on its own: batcher.py's
`RequestBatcher`, or sequence.py's `PythonSequenceBatcher` for a sequence model (one request per row). Once
its instances exist and before warm-up, `start()` wires them to the loop, BLS (`router`: where a model's own
requests go, bls.py) and the version's readiness (answers.py `InstanceBinding`).
"""

from __future__ import annotations

from pathlib import Path

from ...config.model_config import ModelConfig
from ...instances.rate_limiter import RateLimiter
from ...model import InstanceModel
from ...scheduling.batching.batcher import Batcher
from ...scheduling.sequence.batcher import SequenceBatcher
from ...scheduling.sequence.policy import DEFAULT_BACKLOG, BacklogLimits
from .batcher import RequestBatcher
from .bls import Router, WaitNode
from .sequence import PythonSequenceBatcher


class PythonModel(InstanceModel):
    def __init__(self, config: ModelConfig, version: int, model_path: Path, gpus: tuple[int, ...],
                 limiter: RateLimiter, router: Router | None,
                 backlog: BacklogLimits = DEFAULT_BACKLOG) -> None:
        self._router = router  # read by _make_batcher, which the base's __init__ calls
        super().__init__(config, version, model_path, gpus, limiter, backlog)

    def _make_batcher(self, backlog: BacklogLimits) -> Batcher | SequenceBatcher:
        if self.config.sequence_batching is not None:
            return PythonSequenceBatcher(self.config, self.version_str, self.pool, self.stats, self._router,
                                         self._instances_health, backlog)
        return RequestBatcher(self.config, self.version_str, self.pool, self.stats, self._router,
                              self._instances_health)

    def _instances_started(self) -> None:
        assert isinstance(self.batcher, (RequestBatcher, PythonSequenceBatcher))
        self.batcher.bind()

    @property
    def wait_nodes(self) -> list[WaitNode]:
        """This version's instances, for BLS deadlock detection (bls.py `WaitGraph`)."""
        assert isinstance(self.batcher, (RequestBatcher, PythonSequenceBatcher))
        return self.batcher.wait_nodes


__all__ = ["PythonModel"]
