"""Tests of engine/backends/onnxruntime.py's provider choice, as data: no GPU is needed to see which
execution providers a GPU instance would ask ONNX Runtime for, nor to see one refused where ONNX Runtime
cannot start them."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import config_from_pbtxt
from engine.backends.onnxruntime import OnnxRuntimeBackend, providers_for
from engine.config.model_config import ModelConfig
from engine.errors import EngineError, ErrorCode
from engine.instances.devices import CPU, Device, discover_gpus
from hubserve_models import examples

IO = """
backend: "onnxruntime"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }]
"""
TENSORRT = 'optimization { execution_accelerators { gpu_execution_accelerator [{ name: "tensorrt" }] } }'


def model_config(extra: str = "") -> ModelConfig:
    return config_from_pbtxt(IO + extra)


def test_a_cpu_instance_uses_the_cpu_provider_whatever_the_accelerators() -> None:
    assert providers_for(model_config(TENSORRT), CPU) == ["CPUExecutionProvider"]


def test_a_gpu_instance_puts_cuda_on_its_device_first() -> None:
    assert providers_for(model_config(), Device("gpu", 1)) == [
        ("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]


def test_the_tensorrt_accelerator_puts_tensorrt_before_cuda() -> None:
    assert providers_for(model_config(TENSORRT), Device("gpu", 0)) == [
        ("TensorrtExecutionProvider", {"device_id": 0}), ("CUDAExecutionProvider", {"device_id": 0}),
        "CPUExecutionProvider"]


@pytest.mark.skipif(bool(discover_gpus()), reason="a GPU is visible: ONNX Runtime may start CUDA on it")
def test_a_gpu_instance_without_the_cuda_provider_is_unavailable_not_run_on_the_cpu(tmp_path: Path) -> None:
    """ONNX Runtime would fall back to the CPU without a word; the instance is refused instead."""
    path = tmp_path / "model.onnx"
    examples.write_model(examples.identity_model("FP32", (-1, 2)), path)
    config = config_from_pbtxt(IO, "ident")
    with pytest.raises(EngineError) as caught:
        OnnxRuntimeBackend(config, path, Device("gpu", 0))
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert caught.value.message.startswith(
        "model 'ident': its instance group asks for CUDAExecutionProvider, but ONNX Runtime could not start "
        "it (the session got CPUExecutionProvider; this onnxruntime offers "), caught.value.message
    OnnxRuntimeBackend(config, path, CPU).close()  # the same model on the CPU loads
