"""Tests of engine/scheduling/ensemble/plan.py, the pure planner, and of engine/config/ensemble.py, the config
step: plain functions, no server, no event loop. The data-flow checks, the checks against composing models (in
Triton's words), and the order in which a request's steps become ready."""

from __future__ import annotations

import pytest

from engine.config import steps as cfg
from engine.config.model_config import EnsembleStep, ModelConfig
from engine.errors import EngineError, ErrorCode
from engine.proto import model_config_pb2 as pb
from engine.scheduling.ensemble.plan import EnsemblePlan, check_data_flow

ADD = """name: "add"
backend: "identity"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Z" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def model(text: str) -> ModelConfig:
    msg = pb.ModelConfig()
    cfg.parse_pbtxt(text, msg)
    cfg.autocomplete(msg, None, msg.name)
    return cfg.validate(msg, f"model '{msg.name}'")


def step(name: str, inputs: dict[str, str], outputs: dict[str, str]) -> EnsembleStep:
    return EnsembleStep(name, -1, tuple(inputs.items()), tuple(outputs.items()))


def refused(fn, *fragments: str) -> str:
    with pytest.raises(EngineError) as info:
        fn()
    assert info.value.code is ErrorCode.INVALID_ARG
    for fragment in fragments:
        assert fragment in info.value.message, f"{fragment!r} not in {info.value.message!r}"
    return info.value.message


def flow(inputs: tuple[str, ...], outputs: tuple[str, ...], *steps: EnsembleStep):
    return lambda: check_data_flow("e", inputs, outputs, steps)


def ensemble_text(steps: str, inputs: str = '{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }',
                  outputs: str = '{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }', extra: str = "") -> str:
    return (f'name: "e"\nplatform: "ensemble"\nmax_batch_size: 8\ninput [ {inputs} ]\noutput [ {outputs} ]\n'
            f"{extra}ensemble_scheduling {{ step [ {steps} ] }}\n")


ONE_STEP = ('{ model_name: "add" model_version: -1 input_map { key: "X" value: "A" } '
            'input_map { key: "Y" value: "A" } output_map { key: "Z" value: "OUT" } }')

# ------------------------------------------------------------------------------------------ 1. data flow


def test_a_chain_and_a_diamond_pass() -> None:
    check_data_flow("e", ("A",), ("OUT",), (step("add", {"X": "A", "Y": "A"}, {"Z": "t"}),
                                            step("add", {"X": "t", "Y": "A"}, {"Z": "OUT"})))
    check_data_flow("e", ("A",), ("P", "Q"), (step("add", {"X": "A", "Y": "A"}, {"Z": "t"}),
                                              step("add", {"X": "t", "Y": "t"}, {"Z": "P"}),
                                              step("add", {"X": "t", "Y": "A"}, {"Z": "Q"})))


def test_a_tensor_written_twice() -> None:
    refused(flow(("A",), ("OUT",), step("add", {"X": "A", "Y": "A"}, {"Z": "OUT"}),
                 step("add", {"X": "A", "Y": "A"}, {"Z": "OUT"})),
            "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'e' step 1")


def test_a_step_writing_an_ensemble_input() -> None:
    refused(flow(("A",), ("OUT",), step("add", {"X": "A", "Y": "A"}, {"Z": "A"})),
            "ensemble tensor 'A' is an input of ensemble 'e'", "step 0 (model 'add')")


def test_an_unused_input() -> None:
    refused(flow(("A", "B"), ("OUT",), step("add", {"X": "A", "Y": "A"}, {"Z": "OUT"})),
            "ensemble input 'B' for ensemble 'e' is not used")


def test_an_output_no_step_writes() -> None:
    refused(flow(("A",), ("OUT", "MORE"), step("add", {"X": "A", "Y": "A"}, {"Z": "OUT"})),
            "ensemble output 'MORE' for ensemble 'e' is not used: no step writes it")


def test_an_output_behind_an_unconnected_tensor() -> None:
    refused(flow(("A",), ("OUT",), step("add", {"X": "A", "Y": "nowhere"}, {"Z": "OUT"})),
            "output 'OUT' for ensemble 'e' is not written: at least one of its depending tensors, 'nowhere', "
            "is not connected")


def test_a_cycle_is_named_with_its_steps() -> None:
    message = refused(flow(("A",), ("OUT",), step("add", {"X": "A", "Y": "back"}, {"Z": "fwd"}),
                           step("add", {"X": "fwd", "Y": "A"}, {"Z": "back"}),
                           step("add", {"X": "fwd", "Y": "back"}, {"Z": "OUT"})),
                      "output 'OUT' for ensemble 'e' is not written: its steps form a cycle")
    assert "'fwd' is written by step 0" in message and "'back' is written by step 1" in message, message


def test_a_computed_tensor_nobody_reads() -> None:
    refused(flow(("A",), ("OUT",), step("add", {"X": "A", "Y": "A"}, {"Z": "OUT"}),
                 step("add", {"X": "A", "Y": "A"}, {"Z": "waste"})),
            "ensemble tensor 'waste' is unused in ensemble 'e'")


# ------------------------------------------------------------------------------------- the config step


def test_an_ensemble_config_freezes_with_no_backend_and_no_instances() -> None:
    config = model(ensemble_text(ONE_STEP))
    assert config.platform == "ensemble" and config.instance_groups == ()
    assert config.ensemble is not None and config.ensemble.steps[0].version_str == ""
    assert config.ensemble.steps[0].input_map == (("X", "A"), ("Y", "A"))
    assert config.as_json()["backend"] == ""


@pytest.mark.parametrize("extra, words", [
    ('instance_group [ { count: 1 } ]\n', "instance group should not be specified for ensemble 'e'"),
    ('model_warmup [ { name: "w" batch_size: 1 } ]\n', "model_warmup can not be specified for ensemble 'e'"),
    ('backend: "onnxruntime"\n', "ensemble 'e' has backend 'onnxruntime'"),
])
def test_what_an_ensemble_may_not_have(extra: str, words: str) -> None:
    refused(lambda: model(ensemble_text(ONE_STEP, extra=extra)), words)


@pytest.mark.parametrize("text, words", [
    ('{ model_name: "" input_map { key: "X" value: "A" } output_map { key: "Z" value: "OUT" } }',
     "must specify 'model_name' in step 0 of ensemble 'e'"),
    ('{ model_name: "add" output_map { key: "Z" value: "OUT" } }', "must specify 'input_map' in step 0"),
    ('{ model_name: "add" input_map { key: "X" value: "A" } }', "must specify 'output_map' in step 0"),
])
def test_every_step_is_named_and_mapped(text: str, words: str) -> None:
    refused(lambda: model(ensemble_text(text)), words)


def test_no_steps() -> None:
    refused(lambda: model(ensemble_text("")), "must specify 'step' for ensemble 'e'")


# --------------------------------------------------------------------------- 2. against composing models

def plan(text: str, *composing: str) -> EnsemblePlan:
    return EnsemblePlan.build(model(text), [model(c) for c in composing])


def test_mapping_to_an_input_the_model_lacks() -> None:
    steps = ONE_STEP.replace('key: "Y"', 'key: "W"')
    refused(lambda: plan(ensemble_text(steps), ADD),
            "in ensemble e, ensemble tensor A is mapping to non-existing input W in model add")


def test_an_output_the_model_lacks() -> None:
    steps = ONE_STEP.replace('key: "Z"', 'key: "V"')
    refused(lambda: plan(ensemble_text(steps), ADD),
            "in ensemble e, ensemble tensor OUT is mapped from non-existing output V in model add")


def test_datatype_and_shape_must_agree() -> None:
    refused(lambda: plan(ensemble_text(ONE_STEP, inputs='{ name: "A" data_type: TYPE_INT32 dims: [ 4 ] }'),
                         ADD),
            "in ensemble e, ensemble tensor A: inconsistent data type: TYPE_INT32 is inferred from model e "
            "while TYPE_FP32 is inferred from model add")
    refused(lambda: plan(ensemble_text(ONE_STEP, outputs='{ name: "OUT" data_type: TYPE_FP32 dims: [ 5 ] }'),
                         ADD),
            "ensemble tensor OUT: inconsistent shape: [-1,5] is inferred from model e while [-1,4] is "
            "inferred from model add")


def test_variable_dims_agree_with_fixed_ones_and_a_non_batching_model_with_its_batch_dim() -> None:
    plan(ensemble_text(ONE_STEP, inputs='{ name: "A" data_type: TYPE_FP32 dims: [ -1 ] }'), ADD)
    unbatched = ADD.replace("max_batch_size: 8", "max_batch_size: 0")
    unbatched = unbatched.replace("dims: [ 4 ]", "dims: [ -1, 4 ]")
    plan(ensemble_text(ONE_STEP), unbatched)


def test_a_composing_model_with_a_smaller_batch() -> None:
    refused(lambda: plan(ensemble_text(ONE_STEP), ADD.replace("max_batch_size: 8", "max_batch_size: 2")),
            "ensemble e allows maximum batch size 8, but it contains model add which only allows maximum "
            "batch size to be 2")


# ------------------------------------------------------------------------------------- 3. one request

DIAMOND = ensemble_text(", ".join([
    '{ model_name: "add" input_map { key: "X" value: "A" } input_map { key: "Y" value: "A" } '
    'output_map { key: "Z" value: "t" } }',
    '{ model_name: "add" input_map { key: "X" value: "t" } input_map { key: "Y" value: "t" } '
    'output_map { key: "Z" value: "P" } }',
    '{ model_name: "add" input_map { key: "X" value: "t" } input_map { key: "Y" value: "A" } '
    'output_map { key: "Z" value: "Q" } }',
    '{ model_name: "add" input_map { key: "X" value: "P" } input_map { key: "Y" value: "Q" } '
    'output_map { key: "Z" value: "OUT" } }',
]))


def test_steps_become_ready_as_their_tensors_exist() -> None:
    diamond = plan(DIAMOND, ADD, ADD, ADD, ADD)
    progress = diamond.progress()
    assert progress.start() == (0,)
    assert progress.completed(0) == [1, 2]  # independent: handed out together
    assert not progress.finished
    assert progress.completed(2) == []  # step 3 still waits for P
    assert progress.completed(1) == [3]
    assert progress.completed(3) == [] and progress.finished
    again = diamond.progress()  # each request has its own progress; the plan is shared
    assert again.start() == (0,) and not again.finished


def test_a_step_reading_one_tensor_twice_waits_for_it_once() -> None:
    chain = plan(ensemble_text(", ".join([ONE_STEP.replace('"OUT"', '"t"'), ONE_STEP.replace(
        'value: "A" } input_map', 'value: "t" } input_map').replace('"Y" value: "A"', '"Y" value: "t"')])),
        ADD, ADD)
    progress = chain.progress()
    assert progress.start() == (0,) and progress.completed(0) == [1] and progress.completed(1) == []
    assert progress.finished
    assert chain.steps[1].inputs == (("X", "t"), ("Y", "t")) and chain.steps[1].outputs == (("Z", "OUT"),)
