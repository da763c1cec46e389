"""TensorRT engines (`model.plan`).

Unverified here: CI and the development machines have no GPU, and the `tensorrt` package is optional. The
backend fails to load with a clear UNAVAILABLE reason when TensorRT or a GPU is missing, so a `.plan` model in
a CPU-only repository is marked unavailable instead of taking the server down. ONNX models can already use
TensorRT through ONNX Runtime's TensorRT execution provider (see `onnxruntime.py`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config.model_config import ModelConfig
from ..errors import unavailable
from ..instances.devices import Device


def create(config: ModelConfig, model_path: Path, device: Device, instance_name: str) -> TensorRTBackend:
    """The registry's factory (engine/backends/__init__.py)."""
    return TensorRTBackend(config, model_path, device)


class TensorRTBackend:
    def __init__(self, config: ModelConfig, model_path: Path, device: Device) -> None:
        if device.kind != "gpu":
            raise unavailable(f"model '{config.name}': TensorRT engines need a GPU instance (KIND_GPU)")
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            raise unavailable(
                f"model '{config.name}': the tensorrt package is not installed (pip install tensorrt)"
            ) from None
        raise unavailable(f"model '{config.name}': native TensorRT engine execution is not implemented yet; "
                          "serve the ONNX model with the tensorrt GPU execution accelerator instead")

    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        raise AssertionError("unreachable: construction always fails")

    def close(self) -> None:
        pass
