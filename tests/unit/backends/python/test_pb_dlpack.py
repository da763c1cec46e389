"""engine/backends/python/pb_utils.py's DLPack surface, in process: `Tensor.from_dlpack` reads a CPU
producer without a copy (an object with `__dlpack__`, or a bare capsule), keeps dtype and shape, and refuses
a producer on any other device by its `__dlpack_device__` before consuming it; `to_dlpack` round-trips through
numpy. The same through a real Python model: tests/functional/backends/python/test_python_backend.py."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.python.pb_utils import Tensor, TritonModelException


class OnDevice:
    """A producer that reports `device` and must not be read."""

    def __init__(self, device: tuple[int, int]) -> None:
        self.device = device

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(self, **_: object) -> object:
        raise AssertionError("consumed before its device was checked")


class BrokenDevice(OnDevice):
    def __dlpack_device__(self) -> tuple[int, int]:
        raise RuntimeError("driver gone")


def test_cpu_producers_are_shared_with_dtype_and_shape() -> None:
    source = np.arange(12, dtype=np.int16).reshape(3, 4)
    tensor = Tensor.from_dlpack("t", source)
    assert np.shares_memory(tensor.as_numpy(), source)
    assert tensor.datatype() == "INT16" and tensor.shape() == [3, 4] and tensor.is_cpu()
    again = Tensor.from_dlpack("again", tensor.to_dlpack())  # a bare capsule
    assert np.shares_memory(again.as_numpy(), source)
    np.testing.assert_array_equal(np.from_dlpack(tensor), source)
    assert tensor.__dlpack_device__() == (1, 0)


def test_a_read_only_array_is_exported_as_a_copy() -> None:
    source = np.ones(4, np.float32)
    source.flags.writeable = False
    out = np.from_dlpack(Tensor("t", source))
    np.testing.assert_array_equal(out, source)
    assert not np.shares_memory(out, source)


@pytest.mark.parametrize("device, where", [((2, 0), "CUDA device 0"), ((2, 3), "CUDA device 3"),
                                           ((10, 1), "ROCm device 1"),
                                           ((99, 0), "DLPack device type 99 device 0")])
def test_a_tensor_on_another_device_is_refused_by_name(device: tuple[int, int], where: str) -> None:
    with pytest.raises(TritonModelException) as e:
        Tensor.from_dlpack("OUT", OnDevice(device))
    assert str(e.value).startswith(f"Tensor.from_dlpack: 'OUT' is on {where}; hubserve serves Python "
                                   "models' tensors from host memory only")


def test_a_failing_device_report_is_a_model_error() -> None:
    with pytest.raises(TritonModelException, match="has a __dlpack_device__ that failed: RuntimeError"):
        Tensor.from_dlpack("OUT", BrokenDevice((1, 0)))
