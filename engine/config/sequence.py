"""`sequence_batching` in a model config: the frozen types the sequence batcher reads, and their validation.

Called by engine/config/steps.py `validate()` for a config whose scheduling choice is `sequence_batching`;
kept apart so the config steps stay short. Defaults are Triton's: the `direct` strategy, one second of allowed
idleness, state initialised to zeros unless `initial_state` says otherwise.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import invalid
from ..proto import model_config_pb2 as pb
from ..types import DataType

DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds
_CORRID_TYPES = (DataType.UINT64, DataType.INT64, DataType.UINT32, DataType.INT32, DataType.BYTES)


class Strategy(enum.Enum):
    DIRECT = "direct"
    OLDEST = "oldest"


class ControlKind(enum.Enum):
    START = "CONTROL_SEQUENCE_START"
    READY = "CONTROL_SEQUENCE_READY"
    END = "CONTROL_SEQUENCE_END"
    CORRID = "CONTROL_SEQUENCE_CORRID"


@dataclass(frozen=True, slots=True)
class ControlInput:
    """A model input the server fills for every batch row. Flags use `(false, true)`; CORRID carries the
    row's correlation id in `datatype` (BYTES for string ids)."""

    name: str
    kind: ControlKind
    datatype: DataType
    false_true: tuple[Any, Any] = (0, 1)


@dataclass(frozen=True, slots=True)
class StateSpec:
    """An implicit state: the server feeds `input_name` with what `output_name` held after the sequence's
    previous request, and `initial` (zeros unless configured) on its START request. Dims exclude the batch
    dimension."""

    input_name: str
    output_name: str
    datatype: DataType
    dims: tuple[int, ...]
    initial: np.ndarray


@dataclass(frozen=True, slots=True)
class SequenceBatchingConfig:
    strategy: Strategy = Strategy.DIRECT
    max_sequence_idle_us: int = DEFAULT_IDLE_US
    controls: tuple[ControlInput, ...] = ()
    states: tuple[StateSpec, ...] = ()
    max_queue_delay_us: int = 0  # direct: only with minimum_slot_utilization; oldest: the batching window
    minimum_slot_utilization: float = 0.0  # direct only
    max_candidate_sequences: int = 0  # oldest only; 0 = one per batch row per instance
    preferred_batch_sizes: tuple[int, ...] = ()  # oldest only
    preserve_ordering: bool = False  # oldest only

    def control(self, kind: ControlKind) -> ControlInput | None:
        for c in self.controls:
            if c.kind is kind:
                return c
        return None


def sequence_batching(msg: pb.ModelConfig, where: str, model_dir: Path | None = None
                      ) -> SequenceBatchingConfig:
    """Validate `msg.sequence_batching`; every message names the field. `model_dir` is where an
    `initial_state { data_file }` is read from (`<model>/initial_state/<file>`, as Triton)."""
    sb = msg.sequence_batching
    if msg.HasField("dynamic_batching"):
        raise invalid(f"{where}: sequence_batching and dynamic_batching exclude each other")
    if sb.iterative_sequence:
        raise invalid(f"{where}: sequence_batching iterative_sequence is not supported")
    controls = tuple(_control(ci, where) for ci in sb.control_input)
    names = [c.name for c in controls]
    kinds = [c.kind.value for c in controls]
    for items, what in ((names, "control input name"), (kinds, "control kind")):
        dupes = {k for k in items if items.count(k) > 1}
        if dupes:
            raise invalid(f"{where}: sequence_batching {what} {sorted(dupes)[0]} appears more than once")
    declared = {t.name for t in msg.input} | {t.name for t in msg.output}
    for name in names:
        if name in declared:
            raise invalid(f"{where}: control input '{name}' must not also be listed as a model input")
    states = tuple(_state(s, where, model_dir) for s in sb.state)
    for s in states:
        if s.input_name in declared or s.output_name in declared:
            raise invalid(f"{where}: state '{s.input_name}'/'{s.output_name}' must not also be listed as a "
                          "model input or output")
    choice = sb.WhichOneof("strategy_choice")
    common: dict[str, Any] = dict(max_sequence_idle_us=sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US,
                                  controls=controls, states=states)
    if choice == "oldest":
        o = sb.oldest
        if o.max_candidate_sequences < 0:
            raise invalid(f"{where}: sequence_batching oldest max_candidate_sequences must be >= 0")
        for size in o.preferred_batch_size:
            if not 1 <= size <= max(1, msg.max_batch_size):
                raise invalid(f"{where}: sequence_batching oldest preferred_batch_size {size} must be "
                              f"between 1 and max_batch_size ({msg.max_batch_size})")
        return SequenceBatchingConfig(Strategy.OLDEST, max_queue_delay_us=o.max_queue_delay_microseconds,
                                      max_candidate_sequences=o.max_candidate_sequences,
                                      preferred_batch_sizes=tuple(sorted(set(o.preferred_batch_size))),
                                      preserve_ordering=o.preserve_ordering, **common)
    d = sb.direct
    if not 0.0 <= d.minimum_slot_utilization <= 1.0:
        raise invalid(f"{where}: sequence_batching direct minimum_slot_utilization must be between 0 and 1")
    return SequenceBatchingConfig(Strategy.DIRECT, max_queue_delay_us=d.max_queue_delay_microseconds,
                                  minimum_slot_utilization=d.minimum_slot_utilization, **common)


def _control(ci: Any, where: str) -> ControlInput:
    if not ci.name:
        raise invalid(f"{where}: a sequence_batching control_input has no name")
    if len(ci.control) != 1:
        raise invalid(f"{where}: control input '{ci.name}' must have exactly one control, "
                      f"has {len(ci.control)}")
    c = ci.control[0]
    kind = ControlKind(pb.ModelSequenceBatching.Control.Kind.Name(c.kind))
    if kind is ControlKind.CORRID:
        if c.data_type == pb.TYPE_INVALID:
            raise invalid(f"{where}: control input '{ci.name}' (CONTROL_SEQUENCE_CORRID) needs a data_type")
        datatype = DataType.from_config(pb.DataType.Name(c.data_type))
        if datatype not in _CORRID_TYPES:
            raise invalid(f"{where}: control input '{ci.name}' (CONTROL_SEQUENCE_CORRID) data_type must be "
                          "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING")
        return ControlInput(ci.name, kind, datatype, (0, 0))
    given = [(DataType.INT32, list(c.int32_false_true)), (DataType.FP32, list(c.fp32_false_true)),
             (DataType.BOOL, list(c.bool_false_true))]
    set_ = [(dt, values) for dt, values in given if values]
    if len(set_) != 1 or len(set_[0][1]) != 2:
        raise invalid(f"{where}: control input '{ci.name}' ({kind.value}) must set exactly one of "
                      "int32_false_true, fp32_false_true, bool_false_true, with two values")
    datatype, values = set_[0]
    return ControlInput(ci.name, kind, datatype, (values[0], values[1]))


def _state(s: Any, where: str, model_dir: Path | None) -> StateSpec:
    if not s.input_name or not s.output_name:
        raise invalid(f"{where}: a sequence_batching state needs input_name and output_name")
    if s.data_type == pb.TYPE_INVALID:
        raise invalid(f"{where}: state '{s.input_name}' has no data_type")
    datatype = DataType.from_config(pb.DataType.Name(s.data_type))
    if datatype is DataType.BYTES:
        raise invalid(f"{where}: state '{s.input_name}' of TYPE_STRING is not supported")
    dims = tuple(int(d) for d in s.dims)
    if not dims or any(d <= 0 for d in dims):
        raise invalid(f"{where}: state '{s.input_name}' dims must be fixed positive sizes, got {list(dims)} "
                      "(growable state is not supported)")
    if s.use_growable_memory:
        raise invalid(f"{where}: state '{s.input_name}' use_growable_memory is not supported")
    if len(s.initial_state) > 1:
        raise invalid(f"{where}: state '{s.input_name}' may have at most one initial_state")
    initial = np.zeros(dims, dtype=datatype.numpy_dtype)
    if s.initial_state:
        init = s.initial_state[0]
        if tuple(init.dims) != dims:
            raise invalid(f"{where}: state '{s.input_name}' initial_state dims {list(init.dims)} differ from "
                          f"its dims {list(dims)}")
        if init.data_type not in (pb.TYPE_INVALID, s.data_type):
            raise invalid(f"{where}: state '{s.input_name}' initial_state data_type differs from the state's")
        if init.WhichOneof("state_data") == "data_file":
            initial = _initial_from_file(init.data_file, datatype, dims, s.input_name, where, model_dir)
    initial.setflags(write=False)
    return StateSpec(s.input_name, s.output_name, datatype, dims, initial)


def _initial_from_file(name: str, datatype: DataType, dims: tuple[int, ...], state: str, where: str,
                       model_dir: Path | None) -> np.ndarray:
    if model_dir is None or not name or "/" in name or name in (".", ".."):
        raise invalid(f"{where}: state '{state}' initial_state data_file '{name}' must name a file in the "
                      "model's initial_state/ folder")
    folder = model_dir / "initial_state"
    path = folder / name
    try:
        if not path.resolve().is_relative_to(folder.resolve()):  # a link out of the model's folder
            raise OSError
        raw = path.read_bytes()
    except OSError:
        raise invalid(f"{where}: state '{state}' initial_state data_file 'initial_state/{name}' cannot be "
                      "read") from None
    want = int(np.prod(dims)) * datatype.itemsize
    if len(raw) != want:
        raise invalid(f"{where}: state '{state}' initial_state data_file holds {len(raw)} bytes, "
                      f"expected {want}")
    return np.frombuffer(raw, dtype=datatype.numpy_dtype).reshape(dims).copy()
