"""Tests of engine/config/steps.py: each step alone (parse → auto-complete → validate), the version policy,
the typed warm-up and accelerator settings, and the example repository's real configs. Pure functions; no
server. Triton's JSON form: test_config_json.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import EXAMPLES
from engine.config import steps as cfg
from engine.config.model_config import (
    ExecutionAccelerator,
    InstanceKind,
    ModelConfig,
    ModelIO,
    TensorSpec,
    TimeoutAction,
    VersionPolicy,
    WarmupConfig,
    WarmupData,
    WarmupInputConfig,
)
from engine.errors import EngineError, ErrorCode
from engine.proto import model_config_pb2 as pb
from engine.types import DataType

WHERE = "model 'm'"

IO = """
backend: "identity"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }]
"""


def pbtxt(text: str) -> pb.ModelConfig:
    msg = pb.ModelConfig()
    cfg.parse_pbtxt(text, msg)
    return msg


def complete(text: str, io: ModelIO | None = None, name: str = "m") -> pb.ModelConfig:
    msg = pbtxt(text)
    cfg.autocomplete(msg, io, name)
    return msg


def build(text: str, io: ModelIO | None = None, name: str = "m") -> ModelConfig:
    return cfg.validate(complete(text, io, name), f"model '{name}'")


def invalid_config(text: str, *fragments: str) -> str:
    """Validate `text` (after auto-complete), expect INVALID_ARG naming the model and each fragment."""
    with pytest.raises(EngineError) as info:
        build(text)
    assert info.value.code is ErrorCode.INVALID_ARG
    message = info.value.message
    for fragment in (WHERE, *fragments):
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def spec(name: str, datatype: DataType, *dims: int) -> TensorSpec:
    return TensorSpec(name, datatype, dims)


# ------------------------------------------------------------------------------------------------------ parse

def test_pbtxt_fields_reach_the_proto() -> None:
    msg = pbtxt(IO + 'dynamic_batching { preferred_batch_size: [2, 4] max_queue_delay_microseconds: 300 }')
    assert msg.backend == "identity"
    assert msg.max_batch_size == 4
    assert [(t.name, t.data_type, list(t.dims)) for t in msg.input] == [("INPUT0", pb.TYPE_FP32, [2])]
    assert list(msg.dynamic_batching.preferred_batch_size) == [2, 4]
    assert msg.dynamic_batching.max_queue_delay_microseconds == 300


def test_pbtxt_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text('name: "m"\nmax_batch_size: "eight"\n')
    with pytest.raises(EngineError) as info:
        cfg.read_config_proto(tmp_path)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message.startswith(f"{tmp_path.name}/config.pbtxt: ")  # inside the repository
    assert str(tmp_path) not in info.value.message  # never the server's absolute path
    assert "2:" in info.value.message  # the line of the mistake
    assert "max_batch_size" in info.value.message


def test_pbtxt_unknown_field_is_rejected() -> None:
    with pytest.raises(EngineError) as info:
        pbtxt('name: "m"\nmax_batch: 3\n')
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "max_batch" in info.value.message


def test_read_config_proto_reads_pbtxt_from_a_folder(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text(IO)
    msg = cfg.read_config_proto(tmp_path)
    assert msg.backend == "identity"
    assert msg.input[0].name == "INPUT0"


def test_pbtxt_wins_over_yaml_in_the_same_folder(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text('backend: "identity"')
    (tmp_path / "config.yaml").write_text("backend: onnxruntime\n")
    assert cfg.read_config_proto(tmp_path).backend == "identity"


def test_folder_without_config_gives_an_empty_proto(tmp_path: Path) -> None:
    msg = cfg.read_config_proto(tmp_path)
    assert msg == pb.ModelConfig()


YAML = """
name: m
backend: identity
max_batch_size: 8
input:
  - {name: INPUT0, data_type: TYPE_INT32, dims: [16]}
output:
  - {name: OUTPUT0, data_type: TYPE_INT32, dims: [16]}
dynamic_batching:
  max_queue_delay_microseconds: 100
"""


@pytest.mark.parametrize("filename", ["config.yaml", "config.yml"])
def test_yaml_config_reaches_the_proto(tmp_path: Path, filename: str) -> None:
    (tmp_path / filename).write_text(YAML)
    msg = cfg.read_config_proto(tmp_path)
    assert msg.name == "m"
    assert msg.max_batch_size == 8
    assert [(t.name, t.data_type, list(t.dims)) for t in msg.input] == [("INPUT0", pb.TYPE_INT32, [16])]
    assert msg.dynamic_batching.max_queue_delay_microseconds == 100


def test_yaml_parameters_shorthand_and_long_form() -> None:
    msg = pb.ModelConfig()
    cfg.parse_yaml(YAML + "parameters:\n  threads: 2\n  mode: fast\n  full: {string_value: kept}\n", msg)
    params = {k: v.string_value for k, v in msg.parameters.items()}
    assert params == {"threads": "2", "mode": "fast", "full": "kept"}


def test_yaml_p95_latency_target_becomes_a_parameter() -> None:
    msg = pb.ModelConfig()
    cfg.parse_yaml(YAML + "p95_latency_target_ms: 50\nparameters: {threads: 1}\n", msg)
    assert msg.parameters["p95_latency_target_ms"].string_value == "50"
    assert msg.parameters["threads"].string_value == "1"
    config = cfg.validate(msg, WHERE)
    assert config.parameters == {"p95_latency_target_ms": "50", "threads": "1"}


@pytest.mark.parametrize("text, problem", [
    ("name: [unclosed\n", "not valid YAML"),
    ("- just\n- a list\n", "mapping"),
    ("name: m\nmax_batch: 3\n", "max_batch"),
])
def test_yaml_mistakes_name_the_file_and_problem(text: str, problem: str) -> None:
    with pytest.raises(EngineError) as info:
        cfg.parse_yaml(text, pb.ModelConfig(), where="m/config.yaml")
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "m/config.yaml" in info.value.message
    assert problem in info.value.message


def test_empty_yaml_file_is_an_empty_config() -> None:
    msg = pb.ModelConfig()
    cfg.parse_yaml("", msg)
    assert msg == pb.ModelConfig()


# ---------------------------------------------------------------------------------------------- auto-complete

def test_autocomplete_detects_batching_when_every_tensor_has_a_dynamic_first_dim() -> None:
    io = ModelIO(inputs=(spec("IN", DataType.FP32, -1, 3, 4),),
                 outputs=(spec("OUT", DataType.INT64, -1, 2), spec("OUT2", DataType.BYTES, -1, 1)))
    msg = complete('backend: "identity"', io)
    assert msg.max_batch_size == cfg.DEFAULT_MAX_BATCH_SIZE == 4
    assert msg.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert [(t.name, t.data_type, list(t.dims)) for t in msg.input] == [("IN", pb.TYPE_FP32, [3, 4])]
    assert [(t.name, t.data_type, list(t.dims)) for t in msg.output] == [
        ("OUT", pb.TYPE_INT64, [2]), ("OUT2", pb.TYPE_STRING, [1])]
    config = cfg.validate(msg, WHERE)
    assert config.batching
    assert config.dynamic_batching is not None


def test_autocomplete_leaves_a_model_unbatched_when_one_first_dim_is_fixed() -> None:
    io = ModelIO(inputs=(spec("IN", DataType.FP32, -1, 4), spec("FIXED", DataType.FP32, 1, 4)),
                 outputs=(spec("OUT", DataType.FP32, -1, 4),))
    msg = complete('backend: "identity"', io)
    assert msg.max_batch_size == 0
    assert msg.WhichOneof("scheduling_choice") is None
    assert [list(t.dims) for t in msg.input] == [[-1, 4], [1, 4]]  # nothing stripped: no batch dim
    assert [list(t.dims) for t in msg.output] == [[-1, 4]]
    config = cfg.validate(msg, WHERE)
    assert not config.batching
    assert config.dynamic_batching is None


def test_autocomplete_leaves_a_batch_dim_only_tensor_unbatched() -> None:
    io = ModelIO(inputs=(spec("TEXT", DataType.BYTES, -1),), outputs=(spec("UPPER", DataType.BYTES, -1),))
    msg = complete('backend: "identity"', io)
    assert msg.max_batch_size == 0
    assert list(msg.input[0].dims) == [-1]
    cfg.validate(msg, WHERE)  # a valid, unbatched config


def test_autocomplete_keeps_an_existing_scheduling_choice() -> None:
    io = ModelIO(inputs=(spec("IN", DataType.FP32, -1, 4),), outputs=(spec("OUT", DataType.FP32, -1, 4),))
    msg = complete('backend: "identity"\nsequence_batching { }', io)
    assert msg.max_batch_size == 4
    assert msg.WhichOneof("scheduling_choice") == "sequence_batching"


def test_autocomplete_does_not_batch_a_config_that_lists_its_tensors() -> None:
    io = ModelIO(inputs=(spec("IN", DataType.FP32, -1, 4),), outputs=(spec("OUT", DataType.FP32, -1, 4),))
    msg = complete('backend: "identity"\ninput [{ name: "IN" }]', io)
    assert msg.max_batch_size == 0
    assert list(msg.input[0].dims) == [-1, 4]


def test_autocomplete_fills_missing_data_type_and_dims_of_listed_tensors() -> None:
    io = ModelIO(inputs=(spec("IN", DataType.INT32, -1, 16), spec("OTHER", DataType.FP16, -1, 2)),
                 outputs=(spec("OUT", DataType.FP64, -1, 8),))
    msg = complete('backend: "identity"\nmax_batch_size: 8\n'
                   'input [{ name: "IN" }, { name: "OTHER" data_type: TYPE_FP16 dims: [ 5 ] }]', io)
    assert [(t.name, t.data_type, list(t.dims)) for t in msg.input] == [
        ("IN", pb.TYPE_INT32, [16]),  # filled, batch dim stripped
        ("OTHER", pb.TYPE_FP16, [5]),  # configured values are kept
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in msg.output] == [("OUT", pb.TYPE_FP64, [8])]


def test_autocomplete_leaves_dims_alone_when_a_reshape_is_given() -> None:
    io = ModelIO(inputs=(spec("IN", DataType.FP32, -1, 4),), outputs=(spec("OUT", DataType.FP32, -1, 4),))
    msg = complete('backend: "identity"\nmax_batch_size: 2\n'
                   'input [{ name: "IN" reshape { shape: [4] } }]', io)
    assert list(msg.input[0].dims) == []
    assert msg.input[0].data_type == pb.TYPE_FP32


def test_autocomplete_instance_group_defaults() -> None:
    msg = complete(IO)
    assert len(msg.instance_group) == 1
    group = msg.instance_group[0]
    assert (group.name, group.count, group.kind) == ("m_0", 1, pb.ModelInstanceGroup.KIND_CPU)


def test_autocomplete_names_groups_and_picks_gpu_kind_when_gpus_are_listed() -> None:
    msg = complete(IO + 'instance_group [{ gpus: [0] }, { name: "mine" count: 3 }]', name="net")
    assert [(g.name, g.count, g.kind) for g in msg.instance_group] == [
        ("net_0", 1, pb.ModelInstanceGroup.KIND_GPU),
        ("mine", 3, pb.ModelInstanceGroup.KIND_CPU),
    ]
    groups = cfg.validate(msg, WHERE).instance_groups
    assert [(g.name, g.kind, g.count, g.gpus) for g in groups] == [
        ("net_0", InstanceKind.GPU, 1, (0,)), ("mine", InstanceKind.CPU, 3, ())]


def test_autocomplete_sets_the_name_only_when_missing() -> None:
    assert complete(IO, name="folder").name == "folder"
    assert complete('name: "given"\n' + IO, name="folder").name == "given"


def test_autocomplete_version_policy_defaults_to_latest_one() -> None:
    msg = complete(IO)
    assert msg.version_policy.WhichOneof("policy_choice") == "latest"
    assert msg.version_policy.latest.num_versions == 1
    zero = complete(IO + "version_policy { latest { num_versions: 0 } }")
    assert zero.version_policy.latest.num_versions == 1
    kept = complete(IO + "version_policy { all { } }")
    assert kept.version_policy.WhichOneof("policy_choice") == "all"


# --------------------------------------------------------------------------------------------------- validate

def test_valid_config_is_frozen_with_every_field() -> None:
    config = build(IO + """
        instance_group [{
          name: "g" kind: KIND_CPU count: 2
          rate_limiter { resources [{ name: "R" count: 3 }] priority: 2 }
        }]
        dynamic_batching {
          preferred_batch_size: [4, 2, 4] max_queue_delay_microseconds: 500 preserve_ordering: true
          priority_levels: 3 default_priority_level: 2
          default_queue_policy { max_queue_size: 7 default_timeout_microseconds: 1000 }
          priority_queue_policy { key: 1 value: { timeout_action: DELAY allow_timeout_override: true } }
        }
        parameters { key: "k" value: { string_value: "v" } }
    """)
    assert config.name == "m"
    assert config.backend == "identity"
    assert config.max_batch_size == 4 and config.batching
    assert config.inputs == (TensorSpec("INPUT0", DataType.FP32, (2,)),)
    assert config.output("OUTPUT0") == TensorSpec("OUTPUT0", DataType.FP32, (2,))
    assert config.input("nope") is None
    group = config.instance_groups[0]
    assert (group.name, group.kind, group.count, group.priority) == ("g", InstanceKind.CPU, 2, 2)
    assert [(r.name, r.count) for r in group.resources] == [("R", 3)]
    db = config.dynamic_batching
    assert db is not None
    assert db.preferred_batch_sizes == (2, 4)
    assert db.max_queue_delay_us == 500
    assert db.preserve_ordering
    assert (db.priority_levels, db.default_priority_level) == (3, 2)
    assert db.default_queue_policy.max_queue_size == 7
    assert db.default_queue_policy.default_timeout_us == 1000
    assert db.queue_policy(1).timeout_action is TimeoutAction.DELAY
    assert db.queue_policy(1).allow_timeout_override
    assert db.queue_policy(3) == db.default_queue_policy
    assert config.parameters == {"k": "v"}
    assert config.default_model_filename == "model.txt"
    assert config.proto().name == "m"


@pytest.mark.parametrize("platform, backend, filename", [
    ("onnxruntime_onnx", "onnxruntime", "model.onnx"),
    ("tensorrt_plan", "tensorrt", "model.plan"),
])
def test_platform_maps_to_backend(platform: str, backend: str, filename: str) -> None:
    config = build(IO.replace('backend: "identity"', f'platform: "{platform}"'))
    assert config.backend == backend
    assert config.platform == platform
    assert config.default_model_filename == filename
    assert config.proto().backend == backend  # the served config says which backend runs it


def test_configured_default_model_filename_is_kept() -> None:
    assert build(IO + 'default_model_filename: "net.bin"').default_model_filename == "net.bin"


def test_unknown_platform() -> None:
    invalid_config(IO.replace('backend: "identity"', 'platform: "pytorch_libtorch"'),
                   "platform 'pytorch_libtorch' is not supported", "onnxruntime_onnx")


def test_platform_contradicting_backend() -> None:
    invalid_config(IO + 'platform: "onnxruntime_onnx"', "platform 'onnxruntime_onnx'", "backend 'identity'")


def test_backend_missing() -> None:
    invalid_config(IO.replace('backend: "identity"', ""), "no backend")


def test_unknown_backend() -> None:
    invalid_config(IO.replace('"identity"', '"pytorch"'), "backend 'pytorch' is not supported")


def test_negative_max_batch_size() -> None:
    invalid_config(IO.replace("max_batch_size: 4", "max_batch_size: -1"), "max_batch_size", "-1")


def test_no_inputs() -> None:
    invalid_config('backend: "identity"\noutput [{ name: "O" data_type: TYPE_FP32 dims: [1] }]',
                   "no inputs", "`input`")


def test_no_outputs() -> None:
    invalid_config('backend: "identity"\ninput [{ name: "I" data_type: TYPE_FP32 dims: [1] }]',
                   "no outputs", "`output`")


def test_input_without_data_type() -> None:
    invalid_config(IO.replace("data_type: TYPE_FP32 dims: [2] }]\noutput", "dims: [2] }]\noutput"),
                   "input 'INPUT0'", "no data_type")


def test_input_without_name() -> None:
    invalid_config(IO.replace('name: "INPUT0" ', ""), "input has no name")


def test_input_without_dims() -> None:
    invalid_config(IO.replace("data_type: TYPE_FP32 dims: [2] }]\noutput", "data_type: TYPE_FP32 }]\noutput"),
                   "input 'INPUT0'", "no dims")


@pytest.mark.parametrize("dims, bad", [("0", 0), ("-2", -2), ("3, 0", 0), ("-5, 4", -5)])
def test_bad_input_dims(dims: str, bad: int) -> None:
    invalid_config(IO.replace("dims: [2] }]\noutput", f"dims: [{dims}] }}]\noutput"),
                   "input 'INPUT0'", f"dim {bad}", "positive or -1")


def test_bad_output_dims() -> None:
    bad = IO.replace('"OUTPUT0" data_type: TYPE_FP32 dims: [2]', '"OUTPUT0" data_type: TYPE_FP32 dims: [0]')
    invalid_config(bad, "output 'OUTPUT0'", "dim 0")


def test_dynamic_dim_is_accepted() -> None:
    assert build(IO.replace("dims: [2] }]\noutput", "dims: [-1, 3] }]\noutput")).inputs[0].dims == (-1, 3)


def test_duplicate_input_names() -> None:
    invalid_config(IO + 'input [{ name: "INPUT0" data_type: TYPE_INT8 dims: [1] }]',
                   "input name 'INPUT0' appears more than once")


def test_duplicate_output_names() -> None:
    invalid_config(IO + 'output [{ name: "OUTPUT0" data_type: TYPE_INT8 dims: [1] }]',
                   "output name 'OUTPUT0' appears more than once")


def test_preferred_batch_size_above_max_batch_size() -> None:
    invalid_config(IO + "dynamic_batching { preferred_batch_size: [2, 8] }",
                   "preferred_batch_size 8", "max_batch_size (4)")


def test_dynamic_batching_without_max_batch_size() -> None:
    invalid_config(IO.replace("max_batch_size: 4", "") + "dynamic_batching { }",
                   "dynamic_batching", "max_batch_size > 0")


@pytest.mark.parametrize("level", [0, 4])
def test_default_priority_level_outside_levels(level: int) -> None:
    invalid_config(IO + f"dynamic_batching {{ priority_levels: 3 default_priority_level: {level} }}",
                   f"default_priority_level {level}", "priority_levels (3)")


def test_priority_queue_policy_for_an_unknown_level() -> None:
    invalid_config(IO + "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
                        "priority_queue_policy { key: 5 value: { } } }",
                   "priority_queue_policy", "level 5", "1..2")


def test_early_dispatch_is_on_by_default_and_a_parameter_turns_it_off() -> None:
    on = build(IO + "dynamic_batching { }").dynamic_batching
    assert on is not None and on.early_dispatch
    for text, value in (("false", False), ("FALSE", False), ("0", False), ("true", True), ("1", True)):
        db = build(IO + 'dynamic_batching { } parameters { key: "early_dispatch" value: { string_value: "'
                   + text + '" } }').dynamic_batching
        assert db is not None and db.early_dispatch is value, text


def test_yaml_early_dispatch_becomes_a_parameter() -> None:
    msg = pb.ModelConfig()
    cfg.parse_yaml(YAML + "early_dispatch: false\n", msg)
    db = cfg.validate(msg, WHERE).dynamic_batching
    assert db is not None and not db.early_dispatch


def test_early_dispatch_must_be_a_boolean_and_needs_dynamic_batching() -> None:
    param = 'parameters { key: "early_dispatch" value: { string_value: "%s" } }'
    invalid_config(IO + "dynamic_batching { } " + param % "soon", "early_dispatch", "true or false", "'soon'")
    invalid_config(IO + param % "true", "early_dispatch", "add dynamic_batching")


def test_cpu_group_with_gpus() -> None:
    invalid_config(IO + 'instance_group [{ name: "g" kind: KIND_CPU gpus: [0] }]',
                   "instance_group 'g'", "KIND_CPU", "gpus")


def test_negative_instance_count() -> None:
    invalid_config(IO + 'instance_group [{ name: "g" count: -2 }]', "instance_group 'g'", "count", "-2")


def test_kind_model_unsupported() -> None:
    invalid_config(IO + 'instance_group [{ name: "g" kind: KIND_MODEL }]', "instance_group 'g'", "KIND_MODEL")


def test_ensemble_scheduling_needs_the_ensemble_platform() -> None:
    # Triton's words (core model_config_utils.cc); ensembles themselves: test_ensemble_plan.py
    invalid_config(IO + "ensemble_scheduling { }", "ensemble scheduling cannot be set",
                   "platform is not ensemble")


# --------------------------------------------------------------------------------------------- version policy

@pytest.mark.parametrize("policy, available, selected", [
    (VersionPolicy(), [3, 1, 2], [3]),
    (VersionPolicy(kind="latest", latest_n=2), [3, 1, 2], [2, 3]),
    (VersionPolicy(kind="latest", latest_n=5), [2, 1], [1, 2]),
    (VersionPolicy(kind="latest", latest_n=0), [1, 2], []),
    (VersionPolicy(kind="all"), [10, 2, 1], [1, 2, 10]),
    (VersionPolicy(kind="specific", specific=(1, 3, 7)), [1, 2, 3], [1, 3]),
    (VersionPolicy(kind="specific", specific=(9,)), [1, 2], []),
    (VersionPolicy(), [], []),
])
def test_version_policy_select(policy: VersionPolicy, available: list[int], selected: list[int]) -> None:
    assert policy.select(available) == selected


def test_version_policy_from_config() -> None:
    assert build(IO).version_policy == VersionPolicy(kind="latest", latest_n=1)
    latest = build(IO + "version_policy { latest { num_versions: 3 } }").version_policy
    assert latest == VersionPolicy(kind="latest", latest_n=3)
    assert build(IO + "version_policy { all { } }").version_policy.kind == "all"
    specific = build(IO + "version_policy { specific { versions: [4, 2] } }").version_policy
    assert specific == VersionPolicy(kind="specific", specific=(4, 2))
    assert specific.select([1, 2, 3, 4]) == [2, 4]


# ------------------------------------------------------------------------------- warm-up and accelerators

def test_warmup_samples_are_typed_with_tritons_defaults() -> None:
    config = build(IO + """
        model_warmup { batch_size: 2 count: 3 inputs { key: "INPUT0" value: {
            data_type: TYPE_FP32 dims: [2] random_data: true } } }
        model_warmup { name: "from_file" inputs [
            { key: "B" value: { data_type: TYPE_STRING dims: [1] input_data_file: "b.bin" } },
            { key: "A" value: { dims: [1] } } ] }
    """)
    first, second = config.warmup
    assert first == WarmupConfig("warmup_0", 2, 3, (
        WarmupInputConfig("INPUT0", DataType.FP32, (2,), WarmupData.RANDOM),))
    assert (second.name, second.batch_size, second.count) == ("from_file", 1, 1)  # 0 means 1
    assert second.inputs == (  # sorted by name; no data kind means zeros; no data_type is left to warm-up
        WarmupInputConfig("A", None, (1,), WarmupData.ZERO),
        WarmupInputConfig("B", DataType.BYTES, (1,), WarmupData.FILE, "b.bin"),
    )


def test_no_warmup_and_no_accelerators_by_default() -> None:
    config = build(IO)
    assert config.warmup == () and config.gpu_execution_accelerators == ()


def test_a_warmup_input_with_a_data_type_number_no_type_has_is_refused() -> None:
    warmup = 'model_warmup { name: "w" inputs { key: "INPUT0" value: { data_type: 99 dims: [2] } } }'
    invalid_config(IO + warmup, "warm-up 'w'", "'INPUT0'", "unknown data_type 99")


def test_gpu_execution_accelerators_are_typed_in_order() -> None:
    config = build(IO + """
        optimization { execution_accelerators {
            gpu_execution_accelerator [
              { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } },
              { name: "cuda_graphs" } ] } }
    """)
    assert config.gpu_execution_accelerators == (
        ExecutionAccelerator("tensorrt", {"precision_mode": "FP16"}), ExecutionAccelerator("cuda_graphs"))


# --------------------------------------------------------------------------------------------------- examples

EXAMPLE_CONFIGS = sorted(p for p in EXAMPLES.glob("*/config.*"))


def test_the_example_repository_has_configs() -> None:
    assert {p.parent.name for p in EXAMPLE_CONFIGS} >= {"simple", "mlp", "mlp_large", "image"}


@pytest.mark.parametrize("path", EXAMPLE_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example_config_parses_and_validates(path: Path) -> None:
    name = path.parent.name
    msg = cfg.read_config_proto(path.parent)
    assert msg.name == name
    cfg.autocomplete(msg, None, name)
    config = cfg.validate(msg, f"model '{name}'")
    assert config.name == name
    assert config.inputs and config.outputs
    if config.decoupled:  # streams the pieces of one vector per request: nothing to batch
        # a Python model, or a generative one (its engine batches token by token)
        assert config.backend == "python" or "generation" in config.parameters
    elif config.ensemble is None:
        assert config.batching and config.backend in cfg.BACKENDS
        assert (config.dynamic_batching or config.sequence_batching) is not None
    else:  # an ensemble batches through its steps' batchers
        assert config.batching and config.platform == "ensemble" and config.ensemble.steps
    json.dumps(config.as_json())  # servable as the protocol's config endpoint


def test_example_simple_uses_the_triton_platform_spelling() -> None:
    msg = cfg.read_config_proto(EXAMPLES / "simple")
    cfg.autocomplete(msg, None, "simple")
    config = cfg.validate(msg, "model 'simple'")
    assert (config.platform, config.backend) == ("onnxruntime_onnx", "onnxruntime")
    assert [s.name for s in config.inputs] == ["INPUT0", "INPUT1"]
    assert all(s.datatype is DataType.INT32 and s.dims == (16,) for s in config.inputs + config.outputs)


@pytest.mark.parametrize("text", ['"\\ud800": 1', 'input: [{"\\udc00": 1}]',
                                  'version_policy: ["\\ud800\\udc00"]'],
                         ids=["top level", "nested", "a list for a message"])
def test_yaml_field_names_that_are_not_unicode_text_are_refused(text: str) -> None:
    """Found by test_fuzz.py: a lone surrogate in a field name (YAML's escape gives one; protobuf also
    reads the items of a list given for a message as names) made protobuf's field lookup raise SystemError,
    which no caller expects."""
    with pytest.raises(EngineError) as info:
        cfg.parse_yaml(text, pb.ModelConfig())
    assert info.value.code is ErrorCode.INVALID_ARG and "not valid Unicode text" in info.value.message


def test_a_model_folder_whose_yaml_has_such_a_field_name_is_refused_not_raised(tmp_path: Path) -> None:
    """The same through the repository's reader: before, the SystemError escaped the start-up scan and the
    server exited."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text('backend: identity\n"\\ud800": 1\n')
    with pytest.raises(EngineError) as info:
        cfg.read_config_proto(tmp_path / "m")
    assert info.value.message == "m/config.yaml: '\\ud800' is not valid Unicode text"
