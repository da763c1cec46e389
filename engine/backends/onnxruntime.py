"""ONNX Runtime backend: one InferenceSession per instance.

CPU instances use the CPU execution provider. GPU instances put the CUDA provider (bound to the instance's
device id) first, or TensorRT then CUDA when the config asks for the `tensorrt` GPU accelerator. ONNX Runtime
quietly falls back to the CPU when it cannot start the provider asked first (a CPU-only onnxruntime, no CUDA
or cuDNN libraries): `check_providers` refuses that session (UNAVAILABLE), so a GPU instance runs on its GPU
or not at all. The GPU paths cannot be exercised in CI (no GPU there); what is tested is the provider list, as
data, and the refusal.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ..config.model_config import ModelConfig, ModelIO, TensorSpec
from ..errors import EngineError, ErrorCode, invalid, unavailable
from ..instances.devices import Device
from ..types import DataType

# ONNX Runtime's type strings for each protocol datatype.
_ORT_TYPES = {
    "tensor(bool)": DataType.BOOL,
    "tensor(uint8)": DataType.UINT8,
    "tensor(uint16)": DataType.UINT16,
    "tensor(uint32)": DataType.UINT32,
    "tensor(uint64)": DataType.UINT64,
    "tensor(int8)": DataType.INT8,
    "tensor(int16)": DataType.INT16,
    "tensor(int32)": DataType.INT32,
    "tensor(int64)": DataType.INT64,
    "tensor(float16)": DataType.FP16,
    "tensor(float)": DataType.FP32,
    "tensor(double)": DataType.FP64,
    "tensor(string)": DataType.BYTES,
    "tensor(bfloat16)": DataType.BF16,
}
_ONNX_BFLOAT16 = 16  # TensorProto.BFLOAT16


def providers_for(config: ModelConfig, device: Device) -> list[Any]:
    if device.kind == "cpu":
        return ["CPUExecutionProvider"]
    cuda = ("CUDAExecutionProvider", {"device_id": device.index})
    providers: list[Any] = [cuda, "CPUExecutionProvider"]
    if any(a.name == "tensorrt" for a in config.gpu_execution_accelerators):
        providers.insert(0, ("TensorrtExecutionProvider", {"device_id": device.index}))
    return providers


def provider_name(provider: Any) -> str:
    return provider[0] if isinstance(provider, tuple) else str(provider)


def check_providers(session: ort.InferenceSession, providers: list[Any], where: str) -> None:
    """UNAVAILABLE when the session did not get the provider asked first (ONNX Runtime fell back to the
    CPU): an instance runs where its instance group says, or not at all."""
    wanted = provider_name(providers[0])
    got, offered = session.get_providers(), ort.get_available_providers()
    if wanted not in got:
        raise unavailable(
            f"{where}: its instance group asks for {wanted}, but ONNX Runtime could not start it (the "
            f"session got {', '.join(got)}; this onnxruntime offers {', '.join(offered)}): "
            "check the GPU, CUDA and cuDNN (onnxruntime-gpu's requirements), or use kind KIND_CPU")


def session_options(config: ModelConfig) -> ort.SessionOptions:
    """One intra-op thread and no spinning unless the config says otherwise: ORT's default pool spins on
    every core, which starves the event loop and the other instances on a small machine."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    params = config.parameters
    for key, attr in (("intra_op_thread_count", "intra_op_num_threads"),
                      ("inter_op_thread_count", "inter_op_num_threads")):
        if key in params:
            try:
                setattr(opts, attr, int(params[key]))
            except ValueError:
                message = f"model '{config.name}': parameter {key} must be an integer, got {params[key]!r}"
                raise invalid(message) from None
    opts.log_severity_level = 3
    return opts


def _spec(arg: Any) -> TensorSpec:
    datatype = _ORT_TYPES.get(arg.type)
    if datatype is None:
        raise EngineError(ErrorCode.UNSUPPORTED, f"tensor '{arg.name}' has unsupported type {arg.type}")
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape)
    return TensorSpec(arg.name, datatype, dims)


def shown_path(model_path: Path, model_name: str) -> str:
    """A model file as the user knows it, `<model>/<version>/<file>`: messages reach clients, and must not
    carry the server's absolute paths (nor the name of an override's temporary folder)."""
    return f"{model_name}/{model_path.parent.name}/{model_path.name}"


def _ort_failure(e: Exception, model_path: Path, shown: str) -> str:
    """ORT's message for a file it could not load, with the absolute path it quotes replaced by `shown`."""
    return str(e).replace(str(model_path), shown)


def describe_onnx(model_path: Path, model_name: str = "") -> ModelIO:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    shown = shown_path(model_path, model_name or model_path.parent.parent.name)
    try:
        session = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own exception types for corrupt files
        raise invalid(f"cannot read ONNX model {shown}: {_ort_failure(e, model_path, shown)}") from None
    inputs = tuple(_spec(a) for a in session.get_inputs())
    outputs = tuple(_spec(a) for a in session.get_outputs())
    io = ModelIO(inputs, outputs)
    del session
    return io


def create(config: ModelConfig, model_path: Path, device: Device, instance_name: str) -> OnnxRuntimeBackend:
    """One instance's session (the registry's factory: engine/backends/__init__.py)."""
    return OnnxRuntimeBackend(config, model_path, device)


class OnnxRuntimeBackend:
    def __init__(self, config: ModelConfig, model_path: Path, device: Device) -> None:
        providers = providers_for(config, device)
        try:
            self._session = ort.InferenceSession(str(model_path), session_options(config),
                                                 providers=providers)
        except EngineError:
            raise
        except Exception as e:
            shown = shown_path(model_path, config.name)
            raise invalid(f"cannot load ONNX model {shown}: {_ort_failure(e, model_path, shown)}") from None
        check_providers(self._session, providers, f"model '{config.name}'")
        self._check_against_config(config)
        # On the CPU provider, execution time is CPU time, so a short run may execute inline
        # (engine/instances/inline_policy.py).
        self.cpu_bound = device.kind == "cpu"
        self._bytes_inputs = {s.name for s in config.inputs if s.datatype is DataType.BYTES}
        self._bytes_outputs = {s.name for s in config.outputs if s.datatype is DataType.BYTES}
        self._bf16_inputs = {s.name for s in config.inputs if s.datatype is DataType.BF16}
        self._bf16_outputs = {s.name for s in config.outputs if s.datatype is DataType.BF16}

    def _check_against_config(self, config: ModelConfig) -> None:
        """A config that names a tensor the model lacks, or the wrong type, fails at load with both sides."""
        for kind, declared, actual in (
            ("input", config.inputs, self._session.get_inputs()),
            ("output", config.outputs, self._session.get_outputs()),
        ):
            found = {a.name: _spec(a) for a in actual}
            for spec in declared:
                model_spec = found.get(spec.name)
                if model_spec is None:
                    raise invalid(
                        f"model '{config.name}': config {kind} '{spec.name}' is not in the model; "
                        f"the model's {kind}s are {', '.join(sorted(found))}"
                    )
                if model_spec.datatype is not spec.datatype:
                    raise invalid(
                        f"model '{config.name}': config {kind} '{spec.name}' is {spec.datatype.value} "
                        f"but the model has {model_spec.datatype.value}"
                    )

    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        if self._bf16_inputs or self._bf16_outputs:
            return self._execute_ort_values(inputs, output_names)
        feed = inputs
        if self._bytes_inputs:
            feed = dict(inputs)
            for name in self._bytes_inputs & feed.keys():
                feed[name] = _bytes_to_str(name, feed[name])
        results = self._session.run(output_names, feed)
        out = dict(zip(output_names, results, strict=True))
        for name in self._bytes_outputs & out.keys():
            out[name] = _str_to_bytes(out[name])
        return out

    def _execute_ort_values(
        self, inputs: dict[str, np.ndarray], output_names: list[str]
    ) -> dict[str, np.ndarray]:
        """BF16 has no numpy dtype: its raw bits travel as uint16 and enter ORT as typed OrtValues."""
        feed = {}
        for name, arr in inputs.items():
            if name in self._bf16_inputs:
                feed[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(arr), _ONNX_BFLOAT16
                )
            elif name in self._bytes_inputs:
                feed[name] = ort.OrtValue.ortvalue_from_numpy(_bytes_to_str(name, arr))
            else:
                feed[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr))
        results = self._session.run_with_ort_values(output_names, feed)
        out = {}
        for name, value in zip(output_names, results, strict=True):
            if name in self._bf16_outputs:
                out[name] = _bf16_bits(value)
            else:
                out[name] = value.numpy()
                if name in self._bytes_outputs:
                    out[name] = _str_to_bytes(out[name])
        return out

    def close(self) -> None:
        del self._session


def _bf16_bits(value: ort.OrtValue) -> np.ndarray:
    """ORT cannot hand a bfloat16 tensor to numpy; copy its raw bits out as uint16 instead."""
    shape = tuple(value.shape())
    count = int(np.prod(shape)) if shape else 1
    buffer = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.frombuffer(memoryview(buffer), dtype=np.uint16, count=count).reshape(shape).copy()


def _bytes_to_str(name: str, arr: np.ndarray) -> np.ndarray:
    """ONNX string tensors are Unicode; protocol BYTES elements must therefore be valid UTF-8 here."""
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, item in enumerate(flat_in):
        if isinstance(item, bytes):
            try:
                flat_out[i] = item.decode("utf-8")
            except UnicodeDecodeError as e:
                raise invalid(
                    f"input '{name}' element {i} is not valid UTF-8, which ONNX string tensors need"
                ) from e
        else:
            flat_out[i] = str(item)
    return out


def _str_to_bytes(arr: np.ndarray) -> np.ndarray:
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, item in enumerate(flat_in):
        flat_out[i] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return out
