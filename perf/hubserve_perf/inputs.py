"""The tensors each request carries, built once before the load starts (perf_analyzer reuses its data too).

Sources, as perf_analyzer's `--input-data`:
  zero     every element 0 (BYTES elements are b"0")
  random   random bytes for numeric inputs (NaN, Inf and denormals included, as perf_analyzer sends),
           random 0/1 for BOOL, random printable strings for BYTES; seeded, so runs repeat
  FILE     a perf_analyzer JSON data file: {"data": [{"INPUT0": [..] | {"content": [..], "shape": [..]}
           | {"b64": ".."}, ...}, ...]}; requests cycle through its entries in order

Shapes come from the model metadata. Variable dims (-1, apart from a batching model's batch dim) need
`--shape NAME:d1,d2,...` (without the batch dim) or a "shape" in the data file. `-b B` prefixes the batch dim;
a data-file entry is repeated B times along it.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.types import DataType

from .types import ExitCode, InputTensor, ModelInfo, PerfError, TensorSpec

STRING_LENGTH = 128  # characters of a random BYTES element, perf_analyzer's --string-length default

RequestInputs = tuple[InputTensor, ...]


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`--shape NAME:d1,d2,...` → (NAME, dims)."""
    name, sep, dims = text.rpartition(":")
    try:
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
    except ValueError:
        shape = (-1,)
    if not sep or not name or any(d < 0 for d in shape):
        raise PerfError(f"--shape expects NAME:d1,d2,... with non-negative dims, got '{text}'",
                        ExitCode.USAGE)
    return name, shape


def build_requests(model: ModelInfo, batch_size: int, input_data: str,
                   shapes: dict[str, tuple[int, ...]]) -> list[RequestInputs]:
    """One entry per distinct request; the load cycles through them."""
    if batch_size < 1:
        raise PerfError(f"-b must be at least 1, got {batch_size}", ExitCode.USAGE)
    if not model.batching and batch_size > 1:
        raise PerfError(f"model '{model.name}' does not batch (max_batch_size 0): -b must be 1",
                        ExitCode.USAGE)
    if model.batching and batch_size > model.max_batch_size:
        raise PerfError(f"-b {batch_size} exceeds model '{model.name}' max_batch_size {model.max_batch_size}",
                        ExitCode.USAGE)
    unknown = set(shapes) - {t.name for t in model.inputs}
    if unknown:
        raise PerfError(f"--shape names no input of model '{model.name}': {', '.join(sorted(unknown))}",
                        ExitCode.USAGE)
    if input_data in ("zero", "random"):
        rng = np.random.default_rng(0)
        return [tuple(_generated(spec, _full_shape(model, _dims(model, spec, shapes, None), batch_size),
                                 input_data, rng)
                      for spec in model.inputs)]
    return [tuple(_from_entry(model, spec, entry, shapes, batch_size) for spec in model.inputs)
            for entry in _read_data_file(Path(input_data), model)]


def _dims(model: ModelInfo, spec: TensorSpec, shapes: dict[str, tuple[int, ...]],
          from_file: tuple[int, ...] | None) -> tuple[int, ...]:
    """The shape of one batch element (the whole shape for a non-batching model)."""
    declared = spec.shape[1:] if model.batching else spec.shape
    given = from_file if from_file is not None else shapes.get(spec.name)
    if given is not None:
        fits = len(given) == len(declared) and all(
            d == -1 or d == g for d, g in zip(declared, given, strict=True))
        if not fits:
            raise PerfError(f"shape {list(given)} of input '{spec.name}' does not fit the model's "
                            f"{list(declared)}", ExitCode.USAGE)
        return given
    if any(d < 0 for d in declared):
        raise PerfError(f"input '{spec.name}' has variable dims {list(declared)}: give its shape with "
                        f"--shape {spec.name}:" + ",".join("N" if d < 0 else str(d) for d in declared),
                        ExitCode.USAGE)
    return declared


def _full_shape(model: ModelInfo, dims: tuple[int, ...], batch_size: int) -> tuple[int, ...]:
    return (batch_size, *dims) if model.batching else dims


def _datatype(spec: TensorSpec) -> DataType:
    try:
        return DataType.from_v2(spec.datatype)
    except EngineError:
        raise PerfError(f"input '{spec.name}' has datatype '{spec.datatype}', which the load tester cannot "
                        "generate") from None


def _generated(spec: TensorSpec, shape: tuple[int, ...], kind: str, rng: np.random.Generator) -> InputTensor:
    datatype = _datatype(spec)
    count = int(np.prod(shape, dtype=np.int64))
    if datatype is DataType.BYTES:
        if kind == "zero":
            items = [b"0"] * count
        else:
            letters = rng.integers(33, 127, size=(count, STRING_LENGTH), dtype=np.uint8)
            items = [row.tobytes() for row in letters]
        return InputTensor(spec.name, spec.datatype, shape, _bytes_wire(items))
    if kind == "zero":
        data = bytes(count * datatype.itemsize)
    elif datatype is DataType.BOOL:
        data = rng.integers(0, 2, size=count, dtype=np.uint8).tobytes()
    else:
        data = rng.bytes(count * datatype.itemsize)
    return InputTensor(spec.name, spec.datatype, shape, data)


def _read_data_file(path: Path, model: ModelInfo) -> list[dict[str, Any]]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise PerfError(f"--input-data: no such file '{path}' (or use 'zero' or 'random')",
                        ExitCode.USAGE) from None
    except ValueError as e:
        raise PerfError(f"--input-data '{path}' is not JSON: {e}", ExitCode.USAGE) from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PerfError(f"--input-data '{path}' needs a non-empty list under \"data\"", ExitCode.USAGE)
    if any(isinstance(e, list) for e in entries):
        raise PerfError(f"--input-data '{path}' holds streams (lists of steps) for sequence models; "
                        "the load tester sends independent requests only", ExitCode.USAGE)
    for i, entry in enumerate(entries):
        missing = [t.name for t in model.inputs if not isinstance(entry, dict) or t.name not in entry]
        if missing:
            raise PerfError(f"--input-data '{path}': entry {i} lacks input(s) {', '.join(missing)}",
                            ExitCode.USAGE)
    return entries


def _from_entry(model: ModelInfo, spec: TensorSpec, entry: dict[str, Any],
                shapes: dict[str, tuple[int, ...]], batch_size: int) -> InputTensor:
    value = entry[spec.name]
    datatype = _datatype(spec)
    file_shape = None
    if isinstance(value, dict):
        if "shape" in value:
            file_shape = tuple(int(d) for d in value["shape"])
        if "b64" in value:
            raw: Any = base64.b64decode(value["b64"])
        elif "content" in value:
            raw = value["content"]
        else:
            raise PerfError(f"--input-data: input '{spec.name}' needs \"content\" or \"b64\"", ExitCode.USAGE)
    else:
        raw = value
    dims = _dims(model, spec, shapes, file_shape)
    count = int(np.prod(dims, dtype=np.int64))
    if isinstance(raw, bytes):
        one = raw
        if datatype is not DataType.BYTES and len(one) != count * datatype.itemsize:
            raise PerfError(f"--input-data: input '{spec.name}' b64 holds {len(one)} bytes, "
                            f"shape {list(dims)} of {spec.datatype} needs {count * datatype.itemsize}",
                            ExitCode.USAGE)
    else:
        flat = np.asarray(raw, dtype=object).reshape(-1)
        if len(flat) != count:
            raise PerfError(f"--input-data: input '{spec.name}' has {len(flat)} elements, shape {list(dims)} "
                            f"needs {count}", ExitCode.USAGE)
        one = _encode(flat, datatype, spec.name)
    return InputTensor(spec.name, spec.datatype, _full_shape(model, dims, batch_size),
                       one * (batch_size if model.batching else 1))


def _encode(flat: np.ndarray, datatype: DataType, name: str) -> bytes:
    if datatype is DataType.BYTES:
        return _bytes_wire([v.encode() if isinstance(v, str) else bytes(v) for v in flat])
    try:
        if datatype is DataType.BF16:
            bits = np.asarray(flat, dtype=np.float32).view(np.uint32) >> 16
            return bits.astype("<u2").tobytes()
        return np.asarray(flat, dtype=datatype.numpy_dtype.newbyteorder("<")).tobytes()
    except (TypeError, ValueError) as e:
        raise PerfError(f"--input-data: input '{name}' does not hold {datatype.value} values: {e}",
                        ExitCode.USAGE) from None


def _bytes_wire(items: list[bytes]) -> bytes:
    pack = struct.Struct("<I").pack
    return b"".join(pack(len(b)) + b for b in items)
