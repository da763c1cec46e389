"""Tests of engine/instances.py's pure parts: `place()` (device placement, no GPU needed: the discovered GPUs
are passed in) and `RateLimiter` arithmetic. The pool's async side is exercised in tests/test_batcher.py."""

from __future__ import annotations

from typing import Callable

import pytest

from engine import config as cfg
from engine.config import ModelConfig, RateLimiterResource
from engine.devices import CPU, Device
from engine.errors import EngineError, ErrorCode
from engine.proto import model_config_pb2 as pb
from engine.instances import RateLimiter, place

IO = """
backend: "identity"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }]
"""


def model_config(extra: str, name: str = "placed") -> ModelConfig:
    msg = pb.ModelConfig()
    cfg.parse_pbtxt(IO + extra, msg)
    cfg.autocomplete(msg, None, name)
    return cfg.validate(msg, f"{name}/config.pbtxt")


# --------------------------------------------------------------------------------------------- place()

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


# --------------------------------------------------------------------------------------------- RateLimiter

R1 = (RateLimiterResource("R", 1),)
R2 = (RateLimiterResource("R", 2),)


def test_unlimited_limiter_always_admits() -> None:
    limiter = RateLimiter()
    assert all(limiter.try_acquire(()) for _ in range(100))


def test_max_concurrent_executions() -> None:
    limiter = RateLimiter(max_concurrent_executions=2)
    assert limiter.try_acquire(())
    assert limiter.try_acquire(())
    assert not limiter.try_acquire(())
    limiter.release(())
    assert limiter.try_acquire(())
    assert not limiter.try_acquire(())


def test_explicit_resource_counts_are_respected() -> None:
    limiter = RateLimiter(resources={"R": 3})
    limiter.register(R2)  # an explicit count is never resized
    assert limiter.try_acquire(R2)
    assert not limiter.try_acquire(R2)  # 1 left
    assert limiter.try_acquire(R1)
    assert not limiter.try_acquire(R1)
    limiter.release(R2)
    assert limiter.try_acquire(R2)
    assert not limiter.try_acquire(R1)


def test_a_refused_acquire_takes_nothing() -> None:
    limiter = RateLimiter(resources={"R": 1, "S": 1})
    both = (RateLimiterResource("R", 1), RateLimiterResource("S", 1))
    assert limiter.try_acquire((RateLimiterResource("S", 1),))
    assert not limiter.try_acquire(both)  # S is taken; R must not have been taken either
    assert limiter.try_acquire(R1)


def test_unknown_resources_are_sized_to_the_largest_single_need() -> None:
    limiter = RateLimiter()
    assert not limiter.try_acquire(R1)  # never registered: none of it exists
    limiter.register(R1)
    limiter.register(R2)
    limiter.register(R1)
    assert limiter.try_acquire(R2)
    assert not limiter.try_acquire(R1)
    limiter.release(R2)
    assert limiter.try_acquire(R1)
    assert limiter.try_acquire(R1)
    assert not limiter.try_acquire(R1)


def test_registering_while_a_resource_is_held_does_not_create_more_of_it() -> None:
    limiter = RateLimiter()
    limiter.register(R2)
    assert limiter.try_acquire(R2)  # all of R is in use
    limiter.register(R1)  # another model loads meanwhile
    assert not limiter.try_acquire(R1)
    limiter.release(R2)
    assert limiter.try_acquire(R2)
    assert not limiter.try_acquire(R1)  # still exactly 2 units in all


def test_release_calls_every_listener_until_removed() -> None:
    limiter = RateLimiter()
    calls: list[str] = []

    def first() -> None:
        calls.append("first")

    def second() -> None:
        calls.append("second")

    limiter.add_listener(first)
    limiter.add_listener(second)
    assert limiter.try_acquire(())
    limiter.release(())
    assert sorted(calls) == ["first", "second"]
    limiter.remove_listener(first)
    limiter.remove_listener(first)  # removing twice is harmless
    calls.clear()
    assert limiter.try_acquire(())
    limiter.release(())
    assert calls == ["second"]


def test_release_offers_capacity_to_each_listener_first_in_turn() -> None:
    limiter = RateLimiter(max_concurrent_executions=1)
    first_called: list[str] = []
    calls: list[str] = []

    def listener(tag: str) -> Callable[[], None]:
        def called() -> None:
            calls.append(tag)
        return called

    for tag in ("a", "b", "c"):
        limiter.add_listener(listener(tag))
    for _ in range(6):
        assert limiter.try_acquire(())
        calls.clear()
        limiter.release(())
        assert sorted(calls) == ["a", "b", "c"]  # everyone hears of every release
        first_called.append(calls[0])
    assert first_called == ["a", "b", "c", "a", "b", "c"]  # so no busy model keeps the slot to itself
