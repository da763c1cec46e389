"""Device discovery, kept apart from placement so placement can be tested without a GPU.

The GPUs an instance group names (`gpus: [0, 1]`) are CUDA's device numbers in this process, as Triton's
are: the position in `CUDA_VISIBLE_DEVICES` when it is set, else the driver's order. `parse_visible` turns
`CUDA_VISIBLE_DEVICES` and the driver's list (`nvidia-smi -L`) into those numbers with CUDA's rules, as data,
so every form is tested without a GPU; `discover_visible_gpus` asks the driver.

An index in `CUDA_VISIBLE_DEVICES` is matched to `nvidia-smi`'s index, which is the PCI bus order; CUDA
numbers GPUs fastest first unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so on a machine with unlike GPUs an index
may name another board for CUDA than for NVML. Placement does not care (it uses CUDA's numbers); the GPU
metrics' UUID for an index-named GPU would. Unverified: no GPU here.

`HUBSERVE_PRETEND_GPUS=1` takes `CUDA_VISIBLE_DEVICES` at its word without asking any driver: the listed
GPUs are placed on as if present. It is for testing placement on a machine without one: a Python model's
instance then runs (on the CPU) with its GPU's device id; an ONNX model's GPU instance fails UNAVAILABLE,
since ONNX Runtime has no CUDA provider to start (backends/onnxruntime.py).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("hubserve")

PRETEND_ENV = "HUBSERVE_PRETEND_GPUS"


@dataclass(frozen=True, slots=True)
class Device:
    kind: str  # "cpu" | "gpu"
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"gpu:{self.index}"


CPU = Device("cpu")


@dataclass(frozen=True, slots=True)
class PhysicalGpu:
    """One GPU as the driver lists it (`nvidia-smi -L`): its index there and its UUID."""

    index: int
    uuid: str


@dataclass(frozen=True, slots=True)
class VisibleGpu:
    """A GPU this process may use. `ordinal`: its CUDA device number here (what `gpus` in an instance group
    and `model_instance_device_id` name); `index` / `uuid`: the driver's GPU it is, where known (NVML reads
    its metrics by them: engine/observability/gpu_metrics.py)."""

    ordinal: int
    index: int | None = None
    uuid: str | None = None


_SMI_LINE = re.compile(r"^GPU (\d+):.*\(UUID: ([^)]+)\)")


def parse_smi_list(text: str) -> tuple[PhysicalGpu, ...]:
    """The GPUs in `nvidia-smi -L`'s output ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)")."""
    found = (_SMI_LINE.match(line.strip()) for line in text.splitlines())
    return tuple(PhysicalGpu(int(m.group(1)), m.group(2)) for m in found if m)


def _well_formed(entry: str) -> bool:
    return entry.isdigit() or entry.startswith(("GPU-", "MIG-"))


def parse_visible(value: str | None, physical: tuple[PhysicalGpu, ...] | None) -> tuple[VisibleGpu, ...]:
    """The visible GPUs, numbered as CUDA numbers them, from `CUDA_VISIBLE_DEVICES` (`value`, None when
    unset) and the driver's GPUs (`physical`; None: unknown, every well-formed entry is taken as a GPU).

    CUDA's rules: unset, every GPU; set, the entries in order (indices, or UUIDs or a UUID's unique prefix),
    numbered from 0, and the list ends at the first entry that names no GPU ("-1" and "" hide them all)."""
    if value is None:
        return tuple(VisibleGpu(i, g.index, g.uuid) for i, g in enumerate(physical or ()))
    visible: list[VisibleGpu] = []
    for entry in (e.strip() for e in value.split(",")):
        gpu = _match(entry, physical)
        if gpu is None:
            break
        visible.append(VisibleGpu(len(visible), gpu.index, gpu.uuid))
    return tuple(visible)


def _match(entry: str, physical: tuple[PhysicalGpu, ...] | None) -> VisibleGpu | None:
    """The GPU one entry of CUDA_VISIBLE_DEVICES names (its ordinal not yet set), or None."""
    if not _well_formed(entry):
        return None
    if physical is None:
        return VisibleGpu(-1, int(entry), None) if entry.isdigit() else VisibleGpu(-1, None, entry)
    if entry.isdigit():
        by_index = [g for g in physical if g.index == int(entry)]
        return VisibleGpu(-1, by_index[0].index, by_index[0].uuid) if by_index else None
    by_uuid = [g for g in physical if g.uuid.startswith(entry)]
    return VisibleGpu(-1, by_uuid[0].index, by_uuid[0].uuid) if len(by_uuid) == 1 else None


def _driver_gpus() -> tuple[PhysicalGpu, ...]:
    """The GPUs `nvidia-smi -L` lists; none where it is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return parse_smi_list(out)


def discover_visible_gpus(env: Mapping[str, str] | None = None) -> tuple[VisibleGpu, ...]:
    """The GPUs this process may use (`env`: the environment read, os.environ by default). Called once per
    server (engine/server.py); on a machine without nvidia-smi, none unless HUBSERVE_PRETEND_GPUS says so."""
    env = os.environ if env is None else env
    value = env.get("CUDA_VISIBLE_DEVICES")
    if env.get(PRETEND_ENV, "") not in ("", "0"):
        visible = parse_visible(value, None)
        log.warning("%s: placing on GPUs %s as CUDA_VISIBLE_DEVICES=%r lists them, without asking a driver "
                    "(placement only: nothing here runs on a GPU)", PRETEND_ENV,
                    [g.ordinal for g in visible] or "none", value)
        return visible
    return parse_visible(value, _driver_gpus())


def discover_gpus() -> tuple[int, ...]:
    """The CUDA device numbers of the visible GPUs (what placement.py places on)."""
    return tuple(g.ordinal for g in discover_visible_gpus())
