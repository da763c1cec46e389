"""Tests of engine/config/json_form.py: Triton's JSON form of a completed config (`ModelConfig.as_json`), with
64-bit integers as numbers and every primitive field printed. Pure functions; no server."""

from __future__ import annotations

import json

from conftest import config_from_pbtxt

IO = """
backend: "identity"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }]
"""


def test_as_json_prints_int64_fields_as_numbers_and_enums_as_names() -> None:
    config = config_from_pbtxt(IO + """
        version_policy { specific { versions: [1, 3] } }
        dynamic_batching {
          max_queue_delay_microseconds: 100 priority_levels: 2 default_priority_level: 1
          default_queue_policy { default_timeout_microseconds: 5000 }
          priority_queue_policy { key: 2 value: { default_timeout_microseconds: 7 } }
        }
    """)
    doc = config.as_json()
    assert doc["input"][0]["dims"] == [2]
    assert doc["output"][0]["dims"] == [2]
    assert doc["version_policy"]["specific"]["versions"] == [1, 3]
    db = doc["dynamic_batching"]
    assert db["max_queue_delay_microseconds"] == 100
    assert db["priority_levels"] == 2
    assert db["default_queue_policy"]["default_timeout_microseconds"] == 5000
    assert db["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 7
    # numbers, not the strings protobuf's JSON mapping uses for 64-bit integers
    assert isinstance(doc["input"][0]["dims"][0], int)
    assert isinstance(db["max_queue_delay_microseconds"], int)
    assert isinstance(doc["version_policy"]["specific"]["versions"][0], int)
    assert doc["input"][0]["data_type"] == "TYPE_FP32"
    assert doc["instance_group"][0]["kind"] == "KIND_CPU"
    assert db["default_queue_policy"]["timeout_action"] == "REJECT"
    text = json.dumps(doc)
    assert '"dims": [2]' in text
    assert '"max_queue_delay_microseconds": 100' in text


def test_as_json_prints_primitive_defaults() -> None:
    doc = config_from_pbtxt(IO).as_json()
    assert doc["name"] == "m"
    assert doc["platform"] == ""
    assert doc["backend"] == "identity"
    assert doc["max_batch_size"] == 4
    assert doc["input"][0]["is_shape_tensor"] is False
    assert doc["input"][0]["optional"] is False
    assert doc["instance_group"][0]["count"] == 1
    assert doc["version_policy"]["latest"]["num_versions"] == 1
    assert doc["default_model_filename"] == "model.txt"


def test_as_json_of_a_platform_config_names_both() -> None:
    doc = config_from_pbtxt(IO.replace('backend: "identity"', 'platform: "onnxruntime_onnx"')).as_json()
    assert doc["platform"] == "onnxruntime_onnx"
    assert doc["backend"] == "onnxruntime"
