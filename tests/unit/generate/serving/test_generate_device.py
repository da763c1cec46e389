"""Where a generative version's engine runs (engine/generate/serving/device.py): the providers list its
session gets from its instance group, through the ONNX backend's own selection, and the refusals.

No GPU here: the CUDA and TensorRT paths are tested as the data they build, and a session asked for CUDA
on a machine where ONNX Runtime cannot start it (no GPU, or no CUDA libraries) is refused rather than left
to run on the CPU; on a machine with a GPU that test has nothing to show and is skipped."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from conftest import EXAMPLES, config_from_pbtxt
from engine.backends.onnxruntime import providers_for
from engine.config.model_config import ModelConfig
from engine.errors import EngineError, ErrorCode
from engine.generate.serving.device import engine_device, engine_providers, open_decoder
from engine.instances.devices import Device, discover_gpus
from hubserve_models import examples
from hubserve_models.tiny_decoder import tiny_decoder_model

CPU_GROUP = "instance_group [ { count: 1 kind: KIND_CPU } ]"
GPU_GROUP = "instance_group [ { count: %d kind: KIND_GPU %s } ]"
AUTO_GROUP = "instance_group [ { count: 1 kind: KIND_AUTO %s } ]"
TENSORRT = 'optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" } ] } }'
CUDA, TRT, CPU = "CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider"


def decoder_config(group: str, extra: str = "") -> ModelConfig:
    """The example tiny_decoder's config with another instance group (and optimization)."""
    text = (EXAMPLES / "tiny_decoder" / "config.pbtxt").read_text()
    assert CPU_GROUP in text
    return config_from_pbtxt(text.replace(CPU_GROUP, f"{group}\n{extra}"), "tiny_decoder")


@pytest.mark.parametrize(("group", "extra", "gpus", "providers"), [
    (CPU_GROUP, "", (0, 1), [CPU]),
    (GPU_GROUP % (1, ""), "", (0, 1), [(CUDA, {"device_id": 0}), CPU]),
    (GPU_GROUP % (2, "gpus: [ 1 ]"), "", (0, 1), [(CUDA, {"device_id": 1}), CPU]),
    (GPU_GROUP % (1, "gpus: [ 1 ]"), TENSORRT, (0, 1),
     [(TRT, {"device_id": 1}), (CUDA, {"device_id": 1}), CPU]),
    (AUTO_GROUP % "", "", (), [CPU]),
    (AUTO_GROUP % "", "", (0,), [CPU]),  # AUTO naming no gpus is the CPU (the config's normalization)
    (AUTO_GROUP % "gpus: [ 0 ]", "", (0,), [(CUDA, {"device_id": 0}), CPU]),
    (CPU_GROUP, TENSORRT, (0,), [CPU]),  # the GPU accelerator applies to GPU instances only
])
def test_the_session_gets_the_onnx_backends_providers_for_the_groups_device(group: str, extra: str,
                                                                             gpus: tuple[int, ...],
                                                                             providers: list):
    config = decoder_config(group, extra)
    assert engine_providers(config, gpus) == providers
    device = engine_device(config, gpus)
    assert providers_for(config, device) == providers  # what an ONNX model's instance on it gets


def test_several_gpus_still_make_one_engine_on_the_first():
    config = decoder_config(GPU_GROUP % (1, "gpus: [ 1, 0 ]"))
    assert engine_device(config, (0, 1)) == Device("gpu", 1)


@pytest.mark.parametrize(("group", "gpus", "words"), [
    (GPU_GROUP % (1, ""), (), "model 'tiny_decoder': instance group 'tiny_decoder_0' wants a GPU, but none "
                              "is visible; use kind KIND_CPU"),
    (GPU_GROUP % (1, "gpus: [ 2 ]"), (0, 1),
     "model 'tiny_decoder': instance group 'tiny_decoder_0' names GPU 2, but the visible GPUs are [0, 1]"),
])
def test_a_gpu_that_is_not_there_is_refused_in_the_placements_words(group: str, gpus: tuple[int, ...],
                                                                    words: str):
    with pytest.raises(EngineError) as caught:
        engine_providers(decoder_config(group), gpus)
    assert caught.value.code is ErrorCode.UNAVAILABLE and caught.value.message == words


def test_a_cpu_group_opens_the_decoder_on_the_cpu():
    decoder = open_decoder(decoder_config(CPU_GROUP), examples.model_bytes(tiny_decoder_model()),
                           ort.SessionOptions(), (), "model 'tiny_decoder'", shared_kv=False)
    assert decoder.session.get_providers() == [CPU]


@pytest.mark.skipif(bool(discover_gpus()), reason="a GPU is visible: ONNX Runtime may start CUDA on it")
def test_a_session_that_did_not_get_its_gpu_is_refused_not_run_on_the_cpu():
    config = decoder_config(GPU_GROUP % (1, ""))
    with pytest.raises(EngineError) as caught:  # GPU 0 said to be visible; ONNX Runtime cannot start CUDA
        open_decoder(config, examples.model_bytes(tiny_decoder_model()), ort.SessionOptions(), (0,),
                     "model 'tiny_decoder'", shared_kv=False)
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert caught.value.message.startswith(
        f"model 'tiny_decoder': its instance group asks for {CUDA}, but ONNX Runtime could not start it "
        f"(the session got {CPU}; this onnxruntime offers "), caught.value.message
    assert caught.value.message.endswith("or use kind KIND_CPU")
