"""Tests of engine/backends/onnxruntime.py's provider choice, as data: no GPU is needed to see which
execution providers a GPU instance would ask ONNX Runtime for."""

from __future__ import annotations

from conftest import config_from_pbtxt
from engine.backends.onnxruntime import providers_for
from engine.config.model_config import ModelConfig
from engine.instances.devices import CPU, Device

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
