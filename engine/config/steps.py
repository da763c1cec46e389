"""Model configuration: parse → auto-complete → validate → frozen.

A model folder holds `config.pbtxt` (Triton's text protobuf, read against our `protos/model_config.proto`),
`config.yaml` (the same fields as YAML), or neither (then everything comes from the model file). The steps are
separate functions so each can be tested alone:

1. `read_config_proto(model_dir)`  — file → `model_config_pb2.ModelConfig` (syntax errors name file and line);
2. `autocomplete(proto, io)`       — fill inputs, outputs, batching from what the backend saw in the model;
3. `validate(proto)`               — check every field a user can get wrong, then build the frozen
                                      `ModelConfig` (engine/config/model_config.py).

The completed proto is kept (as bytes) only to answer the protocol's model-config requests (in Triton's JSON
form: engine/config/json_form.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format, text_format

from ..backends import BACKENDS as BACKEND_TABLE
from ..backends import PLATFORMS
from ..errors import invalid
from ..proto import model_config_pb2 as pb
from ..types import DataType
from .model_config import (
    ENSEMBLE_PLATFORM,
    DynamicBatchingConfig,
    ExecutionAccelerator,
    InstanceGroupConfig,
    InstanceKind,
    ModelConfig,
    ModelIO,
    QueuePolicy,
    RateLimiterResource,
    TensorSpec,
    TimeoutAction,
    VersionPolicy,
    WarmupConfig,
    WarmupData,
    WarmupInputConfig,
)
from .sequence import sequence_batching

CONFIG_FILES = ("config.pbtxt", "config.yaml", "config.yml")
DEFAULT_MAX_BATCH_SIZE = 4  # what auto-complete picks for a model that can batch, as Triton does

BACKENDS = tuple(BACKEND_TABLE)  # the backends a config may name (engine/backends/__init__.py)

# Plain YAML keys of ours that are not protocol fields; they become `parameters` entries.
_YAML_PARAMETER_KEYS = ("p95_latency_target_ms", "early_dispatch")


def default_filename(backend: str) -> str:
    entry = BACKEND_TABLE.get(backend)
    return entry.model_filename if entry is not None else "model.onnx"


# --------------------------------------------------------------------------------------------- 1. parse

def read_config_proto(model_dir: Path, shown: str = "") -> pb.ModelConfig:
    """Read the model's config file, or return an empty config when it has none. Messages name the file as
    `<shown>/<file>` (`shown`: the folder as the user knows it, by default its own name), never by its
    absolute path: they reach clients."""
    msg = pb.ModelConfig()
    for filename in CONFIG_FILES:
        path = model_dir / filename
        if path.is_file():
            where = f"{shown or model_dir.name}/{filename}"
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise invalid(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            except OSError as e:
                raise invalid(f"{where}: cannot be read: {e.strerror or type(e).__name__}") from None
            if filename == "config.pbtxt":
                parse_pbtxt(text, msg, where=where)
            else:
                parse_yaml(text, msg, where=where)
            break
    return msg


def parse_pbtxt(text: str, msg: pb.ModelConfig, where: str = "config.pbtxt") -> None:
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as e:
        raise invalid(f"{where}: {e}") from None


def parse_yaml(text: str, msg: pb.ModelConfig, where: str = "config.yaml") -> None:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise invalid(f"{where}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise invalid(f"{where}: expected a mapping of config fields at the top level")
    parse_dict(data, msg, where)


def parse_dict(data: dict[str, Any], msg: pb.ModelConfig, where: str) -> None:
    """A JSON/YAML config (protocol field names); our own plain keys become `parameters`."""
    data = dict(data)
    extra = {k: data.pop(k) for k in _YAML_PARAMETER_KEYS if k in data}
    params = data.get("parameters")
    if isinstance(params, dict):  # allow `parameters: {key: value}` as well as `{key: {string_value: ..}}`
        data["parameters"] = {
            k: v if isinstance(v, dict) else {"string_value": str(v)} for k, v in params.items()
        }
    _check_text(data, where)
    try:
        json_format.ParseDict(data, msg)
    except json_format.ParseError as e:
        raise invalid(f"{where}: {e}") from None
    for key, value in extra.items():
        msg.parameters[key].string_value = str(value)


def _check_text(data: Any, where: str) -> None:
    """Every string of the document must be Unicode text protobuf can encode: a lone surrogate (YAML's
    `"\\ud800"` escape) in a field name, or in a list where a message belongs (whose items protobuf then
    reads as field names), makes its field lookup fail with SystemError, not ParseError."""
    if isinstance(data, str):
        if not data.isascii():
            try:
                data.encode("utf-8")
            except UnicodeEncodeError:
                raise invalid(f"{where}: {data!r} is not valid Unicode text") from None
    elif isinstance(data, dict):
        for key, value in data.items():
            _check_text(key, where)
            _check_text(value, where)
    elif isinstance(data, list):
        for item in data:
            _check_text(item, where)


# --------------------------------------------------------------------------------------------- 2. complete

def backend_of(msg: pb.ModelConfig, where: str) -> str:
    """The backend a config asks for; Triton's `platform` spelling is accepted too."""
    backend = msg.backend
    if msg.platform == ENSEMBLE_PLATFORM:
        return ENSEMBLE_PLATFORM  # no backend: engine/scheduling/ensemble/driver.py runs its steps
    if msg.platform:
        mapped = PLATFORMS.get(msg.platform)
        if mapped is None:
            raise invalid(
                f"{where}: platform '{msg.platform}' is not supported; use one of {', '.join(PLATFORMS)}"
            )
        if backend and backend != mapped:
            raise invalid(f"{where}: platform '{msg.platform}' contradicts backend '{backend}'")
        backend = mapped
    return backend


def autocomplete(msg: pb.ModelConfig, io: ModelIO | None, model_name: str) -> None:
    """Fill what the config leaves out from the model itself, in place (Triton's auto-complete rules)."""
    if not msg.name:
        msg.name = model_name
    if io is not None:
        if msg.max_batch_size == 0 and not msg.input and not msg.output:
            every = list(io.inputs) + list(io.outputs)
            # Batch only when every tensor has a dim besides the leading -1: a tensor that is nothing but the
            # batch dim (e.g. a 1-D string list) would be left with no dims, so such a model is served
            # unbatched.
            if every and all(len(spec.dims) > 1 and spec.dims[0] == -1 for spec in every):
                msg.max_batch_size = DEFAULT_MAX_BATCH_SIZE
                if msg.WhichOneof("scheduling_choice") is None:
                    msg.dynamic_batching.SetInParent()
        skip = 1 if msg.max_batch_size > 0 else 0
        # Control and state tensors are the sequence batcher's to feed, never the client's.
        sb = msg.sequence_batching
        fed = {c.name for c in sb.control_input} | {s.input_name for s in sb.state} | \
            {s.output_name for s in sb.state}
        _complete_tensors(msg.input, tuple(t for t in io.inputs if t.name not in fed), skip)
        _complete_tensors(msg.output, tuple(t for t in io.outputs if t.name not in fed), skip)
    if msg.platform == ENSEMBLE_PLATFORM:
        pass  # an ensemble has no instances of its own (Triton refuses instance_group on one)
    elif not msg.instance_group:
        msg.instance_group.add()
    for i, group in enumerate(msg.instance_group):
        if not group.name:
            group.name = f"{msg.name}_{i}"
        if group.count == 0:
            group.count = 1
        if group.kind == pb.ModelInstanceGroup.KIND_AUTO:
            group.kind = pb.ModelInstanceGroup.KIND_GPU if group.gpus else pb.ModelInstanceGroup.KIND_CPU
    if not msg.HasField("version_policy"):
        msg.version_policy.latest.num_versions = 1
    if msg.version_policy.HasField("latest") and msg.version_policy.latest.num_versions == 0:
        msg.version_policy.latest.num_versions = 1


def _complete_tensors(configured: Any, found: tuple[TensorSpec, ...], skip: int) -> None:
    by_name = {spec.name: spec for spec in found}
    if len(configured) == 0:
        for spec in found:
            entry = configured.add()
            entry.name = spec.name
            entry.data_type = pb.DataType.Value(spec.datatype.config_name)
            entry.dims.extend(spec.dims[skip:])
        return
    for entry in configured:
        known = by_name.get(entry.name)
        if known is None:
            continue  # validation against the model happens in the backend, with a better message
        if entry.data_type == pb.TYPE_INVALID:
            entry.data_type = pb.DataType.Value(known.datatype.config_name)
        if len(entry.dims) == 0 and not entry.HasField("reshape"):
            entry.dims.extend(known.dims[skip:])


# --------------------------------------------------------------------------------------------- 3. validate

def validate(msg: pb.ModelConfig, where: str, model_dir: Path | None = None) -> ModelConfig:
    """Check the completed config and freeze it. Every message names the model and the field. `model_dir`
    is where files the config names are read from (a sequence state's initial_state data_file)."""
    name = msg.name
    if msg.platform == ENSEMBLE_PLATFORM or msg.HasField("ensemble_scheduling"):
        from .ensemble import validate_ensemble  # it builds on this module's steps

        return validate_ensemble(msg, where)
    backend = backend_of(msg, where)
    if not backend:
        raise invalid(f"{where}: no backend: set `backend: \"onnxruntime\"` "
                      "or `platform: \"onnxruntime_onnx\"`")
    if backend not in BACKENDS:
        raise invalid(f"{where}: backend '{backend}' is not supported; use one of {', '.join(BACKENDS)}")
    inputs, outputs = tensor_specs(msg, where, "model")

    scheduling = msg.WhichOneof("scheduling_choice")
    decoupled = msg.model_transaction_policy.decoupled
    # Only a Python model can send responses apart from execute, or a generative model's engine (its
    # requests never reach the backend: engine/generate/triton/model.py).
    generative = "generation" in msg.parameters
    if decoupled and backend != "python" and not generative:
        raise invalid(f"{where}: model_transaction_policy {{ decoupled: true }} is not supported by the "
                      f"{backend} backend, which answers each request with exactly one response; decoupled "
                      "models must be Python models (`backend: \"python\"`)")
    if decoupled and scheduling == "sequence_batching":
        raise invalid(f"{where}: model_transaction_policy {{ decoupled: true }} with sequence_batching is "
                      "not supported yet")
    batching = _dynamic_batching(msg, where) if scheduling == "dynamic_batching" else None
    sequence = sequence_batching(msg, where, model_dir) if scheduling == "sequence_batching" else None
    batching = _batching_parameters(msg, batching, where)
    groups = tuple(_instance_group(g, where) for g in msg.instance_group)
    policy = version_policy_of(msg)
    filename = msg.default_model_filename or default_filename(backend)
    params = {k: v.string_value for k, v in msg.parameters.items()}
    if not msg.default_model_filename:
        msg.default_model_filename = filename
    if not msg.backend:
        msg.backend = backend
    return ModelConfig(
        name=name,
        backend=backend,
        platform=msg.platform,
        max_batch_size=msg.max_batch_size,
        inputs=inputs,
        outputs=outputs,
        instance_groups=groups,
        dynamic_batching=batching,
        sequence_batching=sequence,
        version_policy=policy,
        default_model_filename=filename,
        parameters=params,
        warmup=tuple(_warmup(w, i, where) for i, w in enumerate(msg.model_warmup)),
        gpu_execution_accelerators=tuple(
            ExecutionAccelerator(a.name, dict(a.parameters))
            for a in msg.optimization.execution_accelerators.gpu_execution_accelerator
        ),
        proto_bytes=msg.SerializeToString(deterministic=True),
        decoupled=decoupled,
    )


def tensor_specs(msg: pb.ModelConfig, where: str, owner: str
                 ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The checks a model's and an ensemble's config share (max_batch_size, at least one input and output,
    no name twice), and their inputs and outputs as specs. `owner` ("model", "ensemble") names it in the
    messages."""
    if msg.max_batch_size < 0:
        raise invalid(f"{where}: max_batch_size must be >= 0, got {msg.max_batch_size}")
    if not msg.input:
        raise invalid(f"{where}: the {owner} has no inputs; list them under `input`")
    if not msg.output:
        raise invalid(f"{where}: the {owner} has no outputs; list them under `output`")
    inputs = tuple(_tensor_spec(t, "input", where) for t in msg.input)
    outputs = tuple(_tensor_spec(t, "output", where) for t in msg.output)
    for kind, specs in (("input", inputs), ("output", outputs)):
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise invalid(f"{where}: {kind} name '{dupes[0]}' appears more than once")
    return inputs, outputs


def _tensor_spec(t: Any, kind: str, where: str) -> TensorSpec:
    if not t.name:
        raise invalid(f"{where}: an {kind} has no name")
    if t.data_type == pb.TYPE_INVALID:
        raise invalid(f"{where}: {kind} '{t.name}' has no data_type (e.g. TYPE_FP32)")
    datatype = DataType.from_config(pb.DataType.Name(t.data_type))
    dims = tuple(int(d) for d in t.dims)
    if not dims and not t.HasField("reshape"):
        raise invalid(f"{where}: {kind} '{t.name}' has no dims; give its shape without the batch dimension")
    for d in dims:
        if d < -1 or d == 0:
            raise invalid(f"{where}: {kind} '{t.name}' has dim {d}; dims must be positive or -1 (any size)")
    reshape = tuple(int(d) for d in t.reshape.shape) if t.HasField("reshape") else None
    return TensorSpec(t.name, datatype, dims, optional=bool(getattr(t, "optional", False)), reshape=reshape,
                      label_filename=getattr(t, "label_filename", ""))


def _warmup(w: Any, index: int, where: str) -> WarmupConfig:
    """A `model_warmup` entry, typed, with Triton's defaults. Only the types are checked here; what must match
    the model is checked when the sample is built (engine/instances/warmup.py)."""
    name = w.name or f"warmup_{index}"
    inputs = []
    for input_name, spec in sorted(w.inputs.items()):
        datatype = None
        if spec.data_type != pb.TYPE_INVALID:
            try:
                datatype = DataType.from_config(pb.DataType.Name(spec.data_type))
            except ValueError:  # a number no TYPE_* has (text format accepts any)
                raise invalid(f"{where}: warm-up '{name}' input '{input_name}' has an unknown data_type "
                              f"{spec.data_type}") from None
        kind = spec.WhichOneof("input_data_type")
        inputs.append(WarmupInputConfig(input_name, datatype, tuple(int(d) for d in spec.dims),
                                        WarmupData(kind) if kind else WarmupData.ZERO,
                                        spec.input_data_file))
    return WarmupConfig(name, w.batch_size or 1, max(1, w.count), tuple(inputs))


def _queue_policy(q: pb.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        max_queue_size=q.max_queue_size,
        default_timeout_us=q.default_timeout_microseconds,
        allow_timeout_override=q.allow_timeout_override,
        timeout_action=TimeoutAction(pb.ModelQueuePolicy.TimeoutAction.Name(q.timeout_action)),
    )


def _dynamic_batching(msg: pb.ModelConfig, where: str) -> DynamicBatchingConfig:
    db = msg.dynamic_batching
    if msg.max_batch_size == 0:
        raise invalid(f"{where}: dynamic_batching needs max_batch_size > 0")
    for size in db.preferred_batch_size:
        if size <= 0 or size > msg.max_batch_size:
            raise invalid(
                f"{where}: preferred_batch_size {size} must be between 1 and "
                f"max_batch_size ({msg.max_batch_size})"
            )
    if db.priority_levels and not 1 <= db.default_priority_level <= db.priority_levels:
        raise invalid(
            f"{where}: default_priority_level {db.default_priority_level} must be between 1 and "
            f"priority_levels ({db.priority_levels})"
        )
    for level in db.priority_queue_policy:
        if not 1 <= level <= db.priority_levels:
            raise invalid(f"{where}: priority_queue_policy names level {level}, "
                          f"outside 1..{db.priority_levels}")
    return DynamicBatchingConfig(
        preferred_batch_sizes=tuple(sorted(set(db.preferred_batch_size))),
        max_queue_delay_us=db.max_queue_delay_microseconds,
        preserve_ordering=db.preserve_ordering,
        priority_levels=db.priority_levels,
        default_priority_level=db.default_priority_level,
        default_queue_policy=_queue_policy(db.default_queue_policy),
        priority_queue_policies={k: _queue_policy(v) for k, v in db.priority_queue_policy.items()},
    )


def _batching_parameters(msg: pb.ModelConfig, batching: DynamicBatchingConfig | None, where: str
                         ) -> DynamicBatchingConfig | None:
    """Our batching parameters (not Triton's fields): `p95_latency_target_ms` (the SLO window) and
    `early_dispatch` (true | false); both need dynamic_batching."""
    params = msg.parameters
    # `in` first: indexing a proto map would add the key.
    target = params["p95_latency_target_ms"].string_value if "p95_latency_target_ms" in params else None
    if target is not None:
        try:
            ok = float(target) > 0
        except ValueError:
            ok = False
        if not ok:
            raise invalid(f"{where}: p95_latency_target_ms must be a positive number of milliseconds, "
                          f"got {target!r}")
        if batching is None:
            raise invalid(f"{where}: p95_latency_target_ms adapts the dynamic batching window; "
                          "add dynamic_batching")
    early = params["early_dispatch"].string_value if "early_dispatch" in params else None
    if early is None:
        return batching
    value = _BOOLEANS.get(early.strip().lower())
    if value is None:
        raise invalid(f"{where}: early_dispatch must be true or false, got {early!r}")
    if batching is None:
        raise invalid(f"{where}: early_dispatch applies to the dynamic batching window; add dynamic_batching")
    return dataclasses.replace(batching, early_dispatch=value)


_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


def _instance_group(g: Any, where: str) -> InstanceGroupConfig:
    if g.count < 1:
        raise invalid(f"{where}: instance_group '{g.name}' count must be >= 1, got {g.count}")
    kind = InstanceKind(pb.ModelInstanceGroup.Kind.Name(g.kind))
    if kind is InstanceKind.MODEL:
        raise invalid(f"{where}: instance_group '{g.name}' kind KIND_MODEL is not supported; "
                      "use KIND_CPU or KIND_GPU")
    if kind is InstanceKind.CPU and g.gpus:
        raise invalid(f"{where}: instance_group '{g.name}' is KIND_CPU but lists gpus")
    resources = tuple(
        RateLimiterResource(r.name, r.count, getattr(r, "global")) for r in g.rate_limiter.resources
    )
    return InstanceGroupConfig(g.name, kind, g.count, tuple(g.gpus), resources, g.rate_limiter.priority)


def version_policy_of(msg: pb.ModelConfig) -> VersionPolicy:
    vp = msg.version_policy
    choice = vp.WhichOneof("policy_choice")
    if choice == "all":
        return VersionPolicy(kind="all")
    if choice == "specific":
        return VersionPolicy(kind="specific", specific=tuple(int(v) for v in vp.specific.versions))
    return VersionPolicy(kind="latest", latest_n=vp.latest.num_versions or 1)
