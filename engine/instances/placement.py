"""Placement: which device each of a model version's instances runs on, from its `instance_group`s.

Pure: the visible GPUs are passed in (devices.py discovers them), so placement is tested without a GPU. Called
once per version by `Model` before its instance pool (pool.py) is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.model_config import InstanceKind, ModelConfig, RateLimiterResource
from ..errors import unavailable
from .devices import CPU, Device


@dataclass(frozen=True, slots=True)
class Placement:
    """One instance to create: its name (`<group>_<n>`), its device, and what it must hold to execute."""

    name: str
    device: Device
    resources: tuple[RateLimiterResource, ...] = ()
    priority: int = 0


def place(config: ModelConfig, gpus: tuple[int, ...]) -> list[Placement]:
    """Where each instance runs: `count` instances on the CPU, or `count` on each listed (or every) GPU."""
    out: list[Placement] = []
    for group in config.instance_groups:
        kind = group.kind
        if kind is InstanceKind.AUTO:
            kind = InstanceKind.GPU if gpus else InstanceKind.CPU
        if kind is InstanceKind.CPU:
            devices = [CPU] * group.count
        else:
            wanted = group.gpus or gpus
            if not wanted:
                raise unavailable(f"model '{config.name}': instance group '{group.name}' wants a GPU, "
                                  "but none is visible; use kind KIND_CPU")
            missing = [g for g in wanted if g not in gpus]
            if missing:
                raise unavailable(f"model '{config.name}': instance group '{group.name}' names "
                                  f"GPU {missing[0]}, but the visible GPUs are {list(gpus) or 'none'}")
            devices = [Device("gpu", g) for g in wanted for _ in range(group.count)]
        for i, device in enumerate(devices):
            out.append(Placement(f"{group.name}_{i}", device, group.resources, group.priority))
    return out
