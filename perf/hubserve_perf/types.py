"""The nouns of the load tester: what the server says about a model, what one request carries, what a load
looks like, and what was measured. Wire formats (JSON, protobuf) never reach past control.py and client.py.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class ExitCode(enum.IntEnum):
    """perf_analyzer's exit codes, so scripts written for it keep working."""

    OK = 0
    USAGE = 1  # a flag or input file the user must fix
    UNSTABLE = 2  # no stable measurement within --max-trials windows
    PROTOCOL = 99  # the server refused a request or answered something we cannot read


class PerfError(Exception):
    """A failure the user can act on; `exit_code` is what the command exits with."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.PROTOCOL) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class Protocol(enum.Enum):
    HTTP = "http"
    GRPC = "grpc"


class Distribution(enum.Enum):
    CONSTANT = "constant"
    POISSON = "poisson"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """An input or output as the model metadata declares it; `shape` includes the batch dim (-1) of a
    batching model, and -1 marks every variable dim."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Read once at start from the model metadata and config endpoints."""

    name: str
    version: str  # "" = the server picks
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    config: dict[str, Any] = field(hash=False, compare=False)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0


@dataclass(frozen=True, slots=True)
class InputTensor:
    """One input of one request, already in wire form (little-endian bytes; BYTES length-prefixed)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """One step of a sweep for one load source: either `concurrency` closed-loop requests in flight, or an
    open-loop `request_rate` (requests/s) with the given inter-arrival distribution. `phase` delays the first
    open-loop request by that fraction of the mean gap, so several processes sharing a constant rate
    interleave instead of sending together."""

    concurrency: int = 0
    request_rate: float = 0.0
    distribution: Distribution = Distribution.CONSTANT
    seed: int = 0
    phase: float = 0.0

    @property
    def open_loop(self) -> bool:
        return self.request_rate > 0


@dataclass(frozen=True, slots=True)
class ServerStats:
    """Cumulative counters of the statistics extension for one model (all its listed versions summed).
    Subtract two snapshots to get one window's share."""

    success_count: int = 0
    success_ns: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    inference_count: int = 0
    execution_count: int = 0
    executions_by_batch_size: tuple[tuple[int, int], ...] = ()

    @property
    def avg_batch_size(self) -> float:
        """Inferences per execution: the batch size the server formed on average (0 before any ran)."""
        return self.inference_count / self.execution_count if self.execution_count else 0.0

    def __sub__(self, earlier: ServerStats) -> ServerStats:
        before = dict(earlier.executions_by_batch_size)
        by_size = tuple((size, n - before.get(size, 0)) for size, n in self.executions_by_batch_size
                        if n - before.get(size, 0) > 0)
        return ServerStats(
            self.success_count - earlier.success_count,
            self.success_ns - earlier.success_ns,
            self.queue_ns - earlier.queue_ns,
            self.compute_input_ns - earlier.compute_input_ns,
            self.compute_infer_ns - earlier.compute_infer_ns,
            self.compute_output_ns - earlier.compute_output_ns,
            self.inference_count - earlier.inference_count,
            self.execution_count - earlier.execution_count,
            by_size,
        )

    def __add__(self, other: ServerStats) -> ServerStats:
        sizes = dict(self.executions_by_batch_size)
        for size, n in other.executions_by_batch_size:
            sizes[size] = sizes.get(size, 0) + n
        return ServerStats(
            self.success_count + other.success_count,
            self.success_ns + other.success_ns,
            self.queue_ns + other.queue_ns,
            self.compute_input_ns + other.compute_input_ns,
            self.compute_infer_ns + other.compute_infer_ns,
            self.compute_output_ns + other.compute_output_ns,
            self.inference_count + other.inference_count,
            self.execution_count + other.execution_count,
            tuple(sorted(sizes.items())),
        )


RECORD_FIELDS = ("start_ns", "end_ns", "send_ns", "recv_ns")


@dataclass(slots=True)
class Records:
    """Completed requests, one row each: `start_ns`/`end_ns` on the machine-wide monotonic clock (so records
    from several worker processes can be merged), `send_ns` the time spent encoding and writing the
    request, `recv_ns` the time from the first response byte to a decoded response."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    send_ns: np.ndarray
    recv_ns: np.ndarray

    @classmethod
    def empty(cls) -> Records:
        return cls(*(np.empty(0, np.int64) for _ in RECORD_FIELDS))

    @classmethod
    def concat(cls, parts: list[Records]) -> Records:
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in RECORD_FIELDS))

    def __len__(self) -> int:
        return len(self.start_ns)

    def select(self, mask: np.ndarray) -> Records:
        return Records(self.start_ns[mask], self.end_ns[mask], self.send_ns[mask], self.recv_ns[mask])

    @property
    def latency_ns(self) -> np.ndarray:
        return self.end_ns - self.start_ns


@dataclass(slots=True)
class Drained:
    """What a load source hands over at the end of a window: the records completed since the last drain, how
    many open-loop requests left late, and the CPU time the load process(es) used meanwhile."""

    records: Records
    delayed: int
    cpu_ns: int
