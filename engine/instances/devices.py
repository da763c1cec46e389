"""Device discovery, kept apart from placement so placement can be tested without a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Device:
    kind: str  # "cpu" | "gpu"
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"gpu:{self.index}"


CPU = Device("cpu")


def discover_gpus() -> tuple[int, ...]:
    """Indices of the CUDA devices this process may use. Honours CUDA_VISIBLE_DEVICES; asks nvidia-smi.

    Not exercised on a GPU in CI (none there): tested through `HUBSERVE_GPUS`-free paths only."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        return tuple(range(len(ids)))
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    gpus = [line for line in out.splitlines() if line.startswith("GPU ")]
    return tuple(range(len(gpus)))
