"""The ONNX basics every example builder shares (examples.py, pipelines.py): the pinned opset and IR version,
protocol datatype names to ONNX element types, graph tensors and the finished model.

Every model uses opset 17 with IR version 8, the IR version that introduced opset 17. ONNX 1.23's own default
(IR 14) is newer than onnxruntime 1.31 accepts (it reads up to IR 13), so the IR version is pinned. Needs the
`onnx` package; the server never imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 8  # opset 17 arrived with IR 8; onnxruntime 1.31 loads up to IR 13, not 14
PRODUCER = "hubserve.engine.examples"  # no version number: a release must not change the model bytes

# StringNormalizer's locale. onnxruntime's default on Linux is "en_US.UTF-8", which fails the session on any
# machine without that locale generated (slim containers); "C" exists everywhere but upper-cases ASCII only.
# glibc always has "C.UTF-8" (built in since 2.35, shipped by Debian/Ubuntu long before) with full Unicode
# case mapping.
STRINGS_LOCALE = "C.UTF-8"

# Protocol datatype name -> ONNX element type.
ONNX_TYPES: dict[str, int] = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
    "BF16": TensorProto.BFLOAT16,
}

Dim = int | str


def shape(dims: Sequence[int]) -> list[Dim]:
    """Protocol dims to an ONNX shape: each -1 becomes a named dynamic dim ('batch' for the first)."""
    out: list[Dim] = []
    for i, d in enumerate(dims):
        if d == -1:
            out.append("batch" if i == 0 else f"dim{i}")
        elif d > 0:
            out.append(int(d))
        else:
            raise ValueError(f"dim {d} at index {i}: dims must be positive or -1 (dynamic)")
    return out


def tensor(name: str, elem_type: int, dims: Sequence[int]) -> onnx.ValueInfoProto:
    """A graph input or output of protocol dims (-1 dynamic)."""
    return helper.make_tensor_value_info(name, elem_type, shape(dims))


def finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    """The model of `graph` at the pinned opset and IR version, checked."""
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name=PRODUCER,
    )
    onnx.checker.check_model(model)
    return model
