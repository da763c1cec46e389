"""The device half of CUDA shared memory: a client's cudaIpc handle opened through `cuda-bindings`, and the
copies between it and the host arrays a request's tensors are (cudaMemcpy).

Imported by cuda.py only when a checked register reaches the device, so no CUDA library is loaded by a server
that never registers a CUDA region. `open_region` refuses, UNAVAILABLE and naming why, when the machine cannot
do it (cuda-bindings missing, no CUDA device), and, while `VERIFIED_ON_DEVICE` is False, on every machine: the
open and copies below have not yet run on a GPU (issue 33), and untried code must not touch clients' device
memory. perf/device_check.sh sets HUBSERVE_CUDA_SHM_UNVERIFIED=1 to run them on a lent device; once that run
has passed, `VERIFIED_ON_DEVICE` turns True and the variable is no longer needed.

The copies are synchronous `cudaMemcpy` calls on the default stream, made on the thread that resolves the
request (the event loop) after selecting the region's device; Triton's copies are asynchronous on its own
streams, which matters for large tensors only.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from ..errors import EngineError, ErrorCode, invalid
from .cuda import IPC_HANDLE_BYTES, CudaRegisterRequest

VERIFIED_ON_DEVICE = False
UNVERIFIED_ENV = "HUBSERVE_CUDA_SHM_UNVERIFIED"


def not_available(name: str, why: str) -> EngineError:
    return EngineError(ErrorCode.UNAVAILABLE, f"failed to register CUDA shared memory region: '{name}': CUDA "
                                              f"shared memory is not available: {why}")


def _runtime(name: str) -> Any:
    """cuda.bindings.runtime, or the refusal saying it is missing."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        raise not_available(name, "cuda-bindings is not installed (pip install cuda-bindings)") from None
    return runtime


def _check(cudart: Any, result: Any, what: str) -> Any:
    """A cuda-bindings call's values after its error code, or INTERNAL naming the call and CUDA's error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        _, text = cudart.cudaGetErrorString(err)
        raise EngineError(ErrorCode.INTERNAL, f"{what} failed: {text.decode(errors='replace')}")
    return values[0] if len(values) == 1 else values


def open_region(request: CudaRegisterRequest) -> IpcRegion:
    """The client's buffer opened on its device, after checking that this machine can and may."""
    name = request.name
    cudart = _runtime(name)
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess or count == 0:
        raise not_available(name, "no CUDA device")
    if request.device_id >= count:
        raise invalid(f"failed to register shared memory region '{name}': device_id {request.device_id} is "
                      f"not one of this server's {count} CUDA device(s)")
    if not VERIFIED_ON_DEVICE and os.environ.get(UNVERIFIED_ENV) != "1":
        raise not_available(name, "its GPU path has not yet passed a device run (perf/device_check.sh sets "
                                  f"{UNVERIFIED_ENV}=1 to try it)")
    return IpcRegion(cudart, request)


class IpcRegion:
    """A client's device buffer mapped into this process by cudaIpcOpenMemHandle; closed by `close()` (the
    registry's unregister)."""

    def __init__(self, cudart: Any, request: CudaRegisterRequest) -> None:
        self._cudart = cudart
        self.device_id = request.device_id
        _check(cudart, cudart.cudaSetDevice(request.device_id), "cudaSetDevice")
        handle = cudart.cudaIpcMemHandle_t()
        ctypes.memmove(handle.getPtr(), request.raw_handle, IPC_HANDLE_BYTES)
        try:
            opened = cudart.cudaIpcOpenMemHandle(handle, getattr(cudart, "cudaIpcMemLazyEnablePeerAccess", 1))
            pointer = _check(cudart, opened, "cudaIpcOpenMemHandle")
        except EngineError:  # Triton's words for a handle that does not open
            raise invalid("failed to register shared memory region: invalid args") from None
        self._pointer = int(pointer)
        from cuda.bindings import driver

        err, _, size = driver.cuMemGetAddressRange(self._pointer)
        if err != driver.CUresult.CUDA_SUCCESS or request.byte_size > int(size):
            self.close()
            raise invalid(f"failed to register shared memory region '{request.name}': invalid args")

    def _copy(self, dst: int, src: int, count: int, kind: Any) -> None:
        cudart = self._cudart
        _check(cudart, cudart.cudaSetDevice(self.device_id), "cudaSetDevice")
        _check(cudart, cudart.cudaMemcpy(dst, src, count, kind), "cudaMemcpy")

    def read_into(self, offset: int, target: Any) -> None:
        host = np.frombuffer(memoryview(target).cast("B"), np.uint8)
        if host.nbytes:
            self._copy(host.ctypes.data, self._pointer + offset, host.nbytes,
                       self._cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost)

    def write(self, offset: int, data: Any) -> None:
        host = np.frombuffer(memoryview(data).cast("B"), np.uint8)
        if host.nbytes:
            self._copy(self._pointer + offset, host.ctypes.data, host.nbytes,
                       self._cudart.cudaMemcpyKind.cudaMemcpyHostToDevice)

    def close(self) -> None:
        if self._pointer:
            pointer, self._pointer = self._pointer, 0
            self._cudart.cudaIpcCloseMemHandle(pointer)
