"""sequence_batching in config.pbtxt (engine/config/sequence.py), through engine/config/steps.py's steps."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import steps as cfg
from engine.config.sequence import ControlKind, Strategy
from engine.errors import EngineError
from engine.proto import model_config_pb2 as pb
from engine.types import DataType

BASE = '''name: "s" backend: "onnxruntime" max_batch_size: 4
input [{ name: "INPUT" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [1] }]
'''


def load(text: str, model_dir=None):
    msg = pb.ModelConfig()
    cfg.parse_pbtxt(BASE + text, msg)
    cfg.autocomplete(msg, None, "s")
    return cfg.validate(msg, "model 's'", model_dir)


def test_defaults_are_tritons():
    sb = load("sequence_batching { }").sequence_batching
    assert sb.strategy is Strategy.DIRECT and sb.max_sequence_idle_us == 1_000_000
    assert sb.controls == () and sb.states == ()


def test_controls_states_and_oldest():
    sb = load('''sequence_batching {
      oldest { max_candidate_sequences: 8 preferred_batch_size: [2, 4] max_queue_delay_microseconds: 100 }
      control_input [{ name: "S" control [{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }] },
                     { name: "C" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING }] }]
      state [{ input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [2]
               initial_state [{ dims: [2] zero_data: true name: "z" }] }]
    }''').sequence_batching
    assert sb.strategy is Strategy.OLDEST and sb.max_candidate_sequences == 8
    assert sb.preferred_batch_sizes == (2, 4) and sb.max_queue_delay_us == 100
    assert sb.control(ControlKind.START).datatype is DataType.FP32
    assert sb.control(ControlKind.CORRID).datatype is DataType.BYTES
    assert sb.states[0].initial.dtype == np.float32 and sb.states[0].initial.shape == (2,)


def test_initial_state_from_a_file(tmp_path):
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "acc").write_bytes(np.array([7], dtype=np.int32).tobytes())
    sb = load('''sequence_batching { state [{ input_name: "I" output_name: "O" data_type: TYPE_INT32 dims: [1]
               initial_state [{ dims: [1] data_file: "acc" }] }] }''', tmp_path).sequence_batching
    assert sb.states[0].initial.tolist() == [7]


@pytest.mark.parametrize("body, words", [
    ('control_input [{ name: "S" control [{ kind: CONTROL_SEQUENCE_START }] }]', "exactly one of"),
    ('control_input [{ name: "INPUT" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] }]',
     "must not also be listed"),
    ('control_input [{ name: "C" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 }] }]',
     "CORRID"),
    ('state [{ input_name: "I" output_name: "O" data_type: TYPE_INT32 dims: [-1] }]', "growable"),
    ('oldest { preferred_batch_size: [9] }', "preferred_batch_size 9"),
    ('state [{ input_name: "I" output_name: "O" data_type: TYPE_INT32 dims: [1] '
     'initial_state [{ dims: [1] data_file: "../x" }] }]', "initial_state/ folder"),
])
def test_mistakes_are_named(body, words):
    with pytest.raises(EngineError, match=words):
        load(f"sequence_batching {{ {body} }}")
