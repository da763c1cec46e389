"""Tests of engine/instances/placement.py's `place()`: device placement from instance groups, no GPU needed
(the discovered GPUs are passed in)."""

from __future__ import annotations

import pytest

from conftest import config_from_pbtxt
from engine.config.model_config import ModelConfig, RateLimiterResource
from engine.errors import EngineError, ErrorCode
from engine.instances.devices import CPU, Device
from engine.instances.placement import place

IO = """
backend: "identity"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }]
"""


def model_config(extra: str, name: str = "placed") -> ModelConfig:
    return config_from_pbtxt(IO + extra, name)


def test_cpu_group_places_count_instances_on_the_cpu() -> None:
    config = model_config('instance_group [{ name: "g" kind: KIND_CPU count: 3 }]')
    placements = place(config, gpus=(0, 1))  # GPUs are visible but not wanted
    assert [p.name for p in placements] == ["g_0", "g_1", "g_2"]
    assert all(p.device == CPU for p in placements)


def test_default_group_is_one_cpu_instance() -> None:
    placements = place(model_config(""), gpus=())
    assert len(placements) == 1 and placements[0].device == CPU


def test_gpu_group_puts_count_instances_on_each_visible_gpu() -> None:
    config = model_config('instance_group [{ name: "g" kind: KIND_GPU count: 2 }]')
    placements = place(config, gpus=(0, 1))
    assert [p.device for p in placements] == [Device("gpu", 0), Device("gpu", 0),
                                              Device("gpu", 1), Device("gpu", 1)]
    assert len({p.name for p in placements}) == 4  # names are unique


def test_gpu_group_listing_gpus_uses_only_those() -> None:
    config = model_config('instance_group [{ name: "g" kind: KIND_GPU count: 1 gpus: [1] }]')
    assert [p.device for p in place(config, gpus=(0, 1))] == [Device("gpu", 1)]


def test_several_groups_are_placed_in_order_with_their_resources() -> None:
    config = model_config("""
        instance_group [
          { name: "cpu" kind: KIND_CPU count: 1 },
          { name: "gpu" kind: KIND_GPU count: 1 gpus: [0]
            rate_limiter { resources [{ name: "R" count: 2 }] priority: 3 } }
        ]""")
    placements = place(config, gpus=(0,))
    assert [(p.name, p.device) for p in placements] == [("cpu_0", CPU), ("gpu_0", Device("gpu", 0))]
    assert placements[0].resources == ()
    assert placements[1].resources == (RateLimiterResource("R", 2),)
    assert placements[1].priority == 3


def test_gpu_group_with_no_gpu_visible_is_unavailable() -> None:
    config = model_config('instance_group [{ name: "g" kind: KIND_GPU count: 1 }]')
    with pytest.raises(EngineError) as info:
        place(config, gpus=())
    assert info.value.code is ErrorCode.UNAVAILABLE
    message = info.value.message
    assert "'placed'" in message and "'g'" in message
    assert "none is visible" in message and "KIND_CPU" in message


def test_gpu_group_naming_an_invisible_gpu_fails() -> None:
    config = model_config('instance_group [{ name: "g" kind: KIND_GPU count: 1 gpus: [0, 3] }]')
    with pytest.raises(EngineError) as info:
        place(config, gpus=(0, 1))
    assert info.value.code is ErrorCode.UNAVAILABLE
    assert "GPU 3" in info.value.message and "[0, 1]" in info.value.message

    with pytest.raises(EngineError) as info:
        place(config, gpus=())
    assert info.value.code is ErrorCode.UNAVAILABLE
