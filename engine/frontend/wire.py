"""Tensor bytes on the wire, shared by the HTTP binary extension and gRPC raw contents.

Fixed-size datatypes are little-endian and become numpy views over the received buffer (no copy). BYTES
elements are each a 4-byte little-endian length followed by that many bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import EngineError, invalid
from ..types import DataType, element_count


@dataclass(frozen=True, slots=True)
class TensorLimits:
    """What one decoded tensor may be, whatever the protocol (ServerOptions carries them; docs/security.md
    states the defaults). Set once per process, at start (`configure`), so the codecs need no extra
    argument."""

    max_elements: int = 1 << 31  # --max-tensor-elements: a shape claiming more is refused before allocating
    max_bytes_element: int = 16 << 20  # --max-bytes-element-size: one BYTES element's bytes
    max_json_depth: int = 32  # --max-json-depth: nesting of an HTTP request's JSON (the document is 1)


_limits = TensorLimits()


def configure(limits: TensorLimits) -> None:
    global _limits
    _limits = limits


def limits() -> TensorLimits:
    return _limits


def check_shape(name: str, shape: Any) -> tuple[int, ...]:
    """A shape from the wire: a list of non-negative integers whose product is sane."""
    if not isinstance(shape, (list, tuple)):
        raise invalid(f"input '{name}': shape must be a list of integers, got {shape!r}")
    dims = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int):
            raise invalid(f"input '{name}': shape must be a list of integers, got {list(shape)!r}")
        if d < 0:
            raise invalid(f"input '{name}': shape {list(shape)} has a negative dimension")
        dims.append(d)
    limit = _limits.max_elements
    if element_count(dims) > limit:
        raise invalid(f"input '{name}': shape {list(shape)} has more than {limit} elements, the limit "
                      "(--max-tensor-elements)")
    return tuple(dims)


def check_bytes_element(name: str, index: int, length: int) -> None:
    limit = _limits.max_bytes_element
    if length > limit:
        raise invalid(f"input '{name}': BYTES element {index} is {length} bytes, more than the limit of "
                      f"{limit} (--max-bytes-element-size)")


def check_datatype(name: str, datatype: str) -> DataType:
    """A datatype name from the wire; the error names the input, so a request with several can be fixed."""
    try:
        return DataType.from_v2(datatype)
    except EngineError as e:
        raise invalid(f"input '{name}': {e.message}") from None


def array_from_bytes(name: str, datatype: DataType, shape: tuple[int, ...], buf: Any) -> np.ndarray:
    """Interpret `buf` (bytes or memoryview) as a tensor, checking its size against the shape."""
    count = element_count(shape)
    if datatype is DataType.BYTES:
        return bytes_from_wire(name, shape, buf, count)
    expected = count * datatype.itemsize
    if len(buf) != expected:
        raise invalid(f"input '{name}': shape {list(shape)} of {datatype.value} needs {expected} bytes, "
                      f"got {len(buf)}")
    return np.frombuffer(buf, dtype=datatype.numpy_dtype).reshape(shape)


def bytes_from_wire(name: str, shape: tuple[int, ...], buf: Any, count: int) -> np.ndarray:
    data = bytes(buf)
    offset, size = 0, len(data)
    if count > size // 4:  # checked before allocating: a shape may claim billions of elements
        raise invalid(f"input '{name}': {size} bytes of BYTES data cannot hold {count} elements "
                      "(each needs a 4-byte length prefix)")
    out = np.empty(count, dtype=object)
    limit = _limits.max_bytes_element
    for i in range(count):
        if offset + 4 > size:
            raise invalid(f"input '{name}': BYTES data ends after {i} of {count} elements")
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + length > size:
            raise invalid(f"input '{name}': BYTES element {i} claims {length} bytes but only "
                          f"{size - offset} remain")
        if length > limit:
            check_bytes_element(name, i, length)
        out[i] = data[offset:offset + length]
        offset += length
    if offset != size:
        raise invalid(f"input '{name}': {size - offset} bytes left over after {count} BYTES elements")
    return out.reshape(shape)


def array_to_bytes(arr: np.ndarray, datatype: DataType) -> bytes | memoryview:
    """The wire form of a tensor; a view when the array is already contiguous."""
    if datatype is DataType.BYTES:
        return bytes_to_wire(arr)
    if arr.dtype != datatype.numpy_dtype:
        arr = arr.astype(datatype.numpy_dtype)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.size == 0:
        return b""  # memoryview.cast refuses shapes with a zero dim, e.g. an empty batch (0, N)
    return arr.data.cast("B")  # arr.data is memoryview(arr); numpy types ndarray as a buffer only on 3.12+


def bytes_to_wire(arr: np.ndarray) -> bytes:
    parts = []
    pack = struct.Struct("<I").pack
    for item in arr.reshape(-1):
        b = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(pack(len(b)))
        parts.append(b)
    return b"".join(parts)
