"""The frozen model config: `ModelConfig` and its parts, as engine/config/steps.py's `validate` builds them.

Every stage after loading reads these, never the proto: they are checked once, typed, and immutable. The
completed proto is kept (as bytes) only to answer the protocol's model-config requests (`proto()`, and
`as_json()` in Triton's JSON form: engine/config/json_form.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..backends import PLATFORMS
from ..proto import model_config_pb2 as pb
from ..types import DataType
from .json_form import message_to_json
from .sequence import SequenceBatchingConfig

# Platform spellings we accept (engine/backends/__init__.py), back from backend names, for the platform the
# metadata reports.
_BACKEND_PLATFORMS = {backend: platform for platform, backend in PLATFORMS.items()}
# Triton's: a pipeline of other models, run by engine/scheduling/ensemble/driver.py
ENSEMBLE_PLATFORM = "ensemble"


class InstanceKind(enum.Enum):
    AUTO = "KIND_AUTO"
    GPU = "KIND_GPU"
    CPU = "KIND_CPU"
    MODEL = "KIND_MODEL"


class TimeoutAction(enum.Enum):
    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """An input or output as configured. `dims` excludes the batch dimension when the model batches."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    label_filename: str = ""  # outputs only: a file of class labels in the model folder (classification)


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    max_queue_size: int = 0  # 0 = unbounded
    default_timeout_us: int = 0  # 0 = no timeout
    allow_timeout_override: bool = False
    timeout_action: TimeoutAction = TimeoutAction.REJECT


@dataclass(frozen=True, slots=True)
class DynamicBatchingConfig:
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0  # 0 = a single level
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policies: Mapping[int, QueuePolicy] = field(default_factory=dict)
    # Ours, not Triton's (model parameter `early_dispatch`): stop waiting out the window once no other
    # request can join it (engine/scheduling/batching/join_forecast.py).
    early_dispatch: bool = True

    def queue_policy(self, level: int) -> QueuePolicy:
        return self.priority_queue_policies.get(level, self.default_queue_policy)


@dataclass(frozen=True, slots=True)
class RateLimiterResource:
    name: str
    count: int
    global_: bool = False


@dataclass(frozen=True, slots=True)
class InstanceGroupConfig:
    name: str
    kind: InstanceKind
    count: int
    gpus: tuple[int, ...] = ()
    resources: tuple[RateLimiterResource, ...] = ()
    priority: int = 0


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """Which version folders to serve: the `latest` N, `all`, or a `specific` list."""

    kind: str = "latest"  # "latest" | "all" | "specific"
    latest_n: int = 1
    specific: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        available = sorted(available)
        if self.kind == "all":
            return available
        if self.kind == "specific":
            return [v for v in available if v in self.specific]
        return available[-self.latest_n:] if self.latest_n > 0 else []


class WarmupData(enum.Enum):
    """Where a warm-up input's values come from (`input_data_type` in the proto)."""

    ZERO = "zero_data"
    RANDOM = "random_data"
    FILE = "input_data_file"


@dataclass(frozen=True, slots=True)
class WarmupInputConfig:
    """One input of a `model_warmup` sample, as written. Checked against the model's inputs only when the
    sample is built (engine/instances/warmup.py), so a mistake here fails the version, as in Triton, not the
    model."""

    name: str
    datatype: DataType | None  # None: no data_type given
    dims: tuple[int, ...]  # without the batch dimension
    data: WarmupData = WarmupData.ZERO  # Triton's default is zeros too
    data_file: str = ""  # for WarmupData.FILE: a file in the model's warmup/ folder


@dataclass(frozen=True, slots=True)
class WarmupConfig:
    """One `model_warmup` sample with Triton's defaults applied: a name (`warmup_<i>` when unnamed), a
    batch size and a count of at least 1. `inputs` are sorted by name, the order random data is drawn in."""

    name: str
    batch_size: int
    count: int
    inputs: tuple[WarmupInputConfig, ...]


@dataclass(frozen=True, slots=True)
class ExecutionAccelerator:
    """An entry of `optimization.execution_accelerators` (e.g. `tensorrt` for ONNX Runtime on a GPU)."""

    name: str
    parameters: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One `ensemble_scheduling.step`: a composing model and how its tensors map to the ensemble's."""

    model_name: str
    model_version: int  # -1: the newest ready version
    input_map: tuple[tuple[str, str], ...]  # (the model's input, the ensemble tensor), in config order
    output_map: tuple[tuple[str, str], ...]  # (the model's output, the ensemble tensor)

    @property
    def version_str(self) -> str:
        """The version a request names ("" = the router picks the newest ready one)."""
        return "" if self.model_version < 0 else str(self.model_version)


@dataclass(frozen=True, slots=True)
class EnsembleScheduling:
    """`ensemble_scheduling` of a `platform: "ensemble"` model (engine/scheduling/ensemble/plan.py checks and
    plans it)."""

    steps: tuple[EnsembleStep, ...]
    max_inflight_requests: int = 0  # 0 = unbounded; else ensemble requests past it wait for a free slot


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    backend: str
    platform: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    instance_groups: tuple[InstanceGroupConfig, ...]
    dynamic_batching: DynamicBatchingConfig | None
    version_policy: VersionPolicy
    default_model_filename: str
    parameters: Mapping[str, str]
    warmup: tuple[WarmupConfig, ...] = ()  # run on every instance before a version is READY
    gpu_execution_accelerators: tuple[ExecutionAccelerator, ...] = ()  # for GPU instances, in order
    proto_bytes: bytes = b""  # the completed config, for the protocol's config endpoints
    ensemble: EnsembleScheduling | None = None  # set for `platform: "ensemble"`, which has no backend
    sequence_batching: SequenceBatchingConfig | None = None  # engine/config/sequence.py
    # model_transaction_policy.decoupled: 0..N responses per request, streamed (Python models only)
    decoupled: bool = False

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    @property
    def platform_name(self) -> str:
        """The platform model metadata reports: Triton's name for the backend (`onnxruntime_onnx`, as Triton
        reports for `backend: "onnxruntime"` and for a model without a config), else the backend's."""
        return self.platform or _BACKEND_PLATFORMS.get(self.backend, self.backend)

    def input(self, name: str) -> TensorSpec | None:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        return None

    def output(self, name: str) -> TensorSpec | None:
        for spec in self.outputs:
            if spec.name == name:
                return spec
        return None

    def proto(self) -> pb.ModelConfig:
        msg = pb.ModelConfig()
        msg.ParseFromString(self.proto_bytes)
        return msg

    def as_json(self) -> dict[str, Any]:
        """Triton's JSON form: proto field names, every primitive field printed, 64-bit ints as numbers."""
        return message_to_json(self.proto())


@dataclass(frozen=True, slots=True)
class ModelIO:
    """What a backend read from a model file, for auto-complete. Dims include any batch dimension (-1 =
    dynamic)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
