"""Where a generative model version's engine runs: its instance group's device, through the same selection
as an ordinary ONNX model (engine/instances/placement.py `place`, engine/backends/onnxruntime.py
`providers_for`).

A version has one engine and so one ONNX Runtime session, on the device of the first instance its groups
place (more instances or GPUs do not make more engines). KIND_CPU gives the CPU provider; KIND_GPU (or
KIND_AUTO with a GPU visible) gives CUDA on that GPU, TensorRT first when the config's
`optimization { execution_accelerators { gpu_execution_accelerator: [{ name: "tensorrt" }] } }` asks for it,
the CPU provider last; a group that wants a GPU when none is visible fails with the placement's words, as an
ONNX model's does.

ONNX Runtime quietly falls back to the CPU when it cannot start the CUDA provider (no GPU, no CUDA or cuDNN
libraries): an ordinary model then runs slower, but a generation engine sized and scheduled for a GPU would
run on the CPU without a word, so `check_session` refuses that session (UNAVAILABLE, with the provider asked
for and the ones the session got).

Unverified on a GPU: no GPU here or in CI. What is tested (on the CPU) is the selection as data and the
refusal of a session that did not get its GPU. The KV blocks stay host memory (numpy) on every provider:
each run's past goes to the device and its present comes back, which ONNX Runtime does for host tensors
(runner.py), so no run needs device memory of ours; binding device-resident KV (IO binding on CUDA) would
save those copies and is left until it can be measured on a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime as ort

from ...backends.onnxruntime import check_providers, providers_for
from ...config.model_config import ModelConfig
from ...instances.devices import CPU, Device
from ...instances.placement import place
from ..core.decoder_model import DecoderModel


def engine_device(config: ModelConfig, gpus: tuple[int, ...]) -> Device:
    """The device of the version's first placed instance (`gpus`: the visible ones, devices.py); CPU for a
    config with no instance group. UNAVAILABLE as placement says it (a GPU wanted, none visible)."""
    placements = place(config, gpus)
    return placements[0].device if placements else CPU


def engine_providers(config: ModelConfig, gpus: tuple[int, ...]) -> list[Any]:
    """The providers list the engine's session is made with: the ONNX backend's for the same device."""
    return providers_for(config, engine_device(config, gpus))


def check_session(session: ort.InferenceSession, providers: list[Any], where: str) -> None:
    """UNAVAILABLE when the session did not get the provider asked first (ONNX Runtime fell back to the
    CPU): the engine must run where its instance group says, or not at all (the ONNX backend's check)."""
    check_providers(session, providers, where)


def open_decoder(config: ModelConfig, model_path: Path | bytes, options: ort.SessionOptions,
                 gpus: tuple[int, ...], where: str, shared_kv: bool,
                 kv_shape: tuple[int | None, int | None] = (None, None)) -> DecoderModel:
    """The version's decoder session on its instance group's device (model_folder.py `build_engine`);
    `kv_shape`: the folder's stated KV heads and head size (core/decoder_model.py)."""
    providers = engine_providers(config, gpus)
    decoder = DecoderModel(model_path, options, providers, where, shared_kv, kv_shape)
    check_session(decoder.session, providers, where)
    return decoder
