"""Triton's CUDA shared memory extension: the registry of clients' GPU buffers, shared by cudaIpc handles.

A client allocates device memory, exports it with `cudaIpcGetMemHandle` and registers the 64-byte
`cudaIpcMemHandle_t` under a name (HTTP: `{"raw_handle": {"b64": ...}, "device_id": N, "byte_size": N}` on
/v2/cudasharedmemory/region/NAME/register; gRPC: CudaSharedMemoryRegister with the raw bytes). Requests then
name the region in a tensor's parameters, as with system shared memory (requests.py): inputs are copied from
the device, outputs copied to it.

This module is the protocol and the bookkeeping, pure and tested on the CPU: the request's checks in Triton's
words (server src/http_server.cc HandleCudaSharedMemory, src/shared_memory_manager.cc), names unique across
both kinds of region, status, unregister one or all. The device work (cudaIpcOpenMemHandle, cudaMemcpy through
`cuda-bindings`) is cuda_ipc.py, imported only when a register reaches it, so a server without a GPU never
imports CUDA. There, a register is refused UNAVAILABLE saying why (no cuda-bindings, no device) and status and
unregister keep working; on a machine with a device it stays refused until the path has passed a device run
(cuda_ipc.py `VERIFIED_ON_DEVICE`).

Off unless the server was started with `--allow-client-shm`, like system shared memory (Triton's one switch
for both), and scoped by API key like it (`Caller.owner`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..access.caller import NOBODY, Caller
from ..errors import EngineError, ErrorCode, invalid
from .client import SystemSharedMemory, TensorPlace, region_status

IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t), CUDA_IPC_HANDLE_SIZE
_UINT64_MAX = (1 << 64) - 1
BAD_HANDLE = "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"


@dataclass(frozen=True, slots=True)
class CudaRegisterRequest:
    """A checked register request: `raw_handle` is the handle's 64 raw bytes."""

    name: str
    raw_handle: bytes
    device_id: int
    byte_size: int


class DeviceMemory(Protocol):
    """An opened client buffer (cuda_ipc.py `IpcRegion`; a host buffer in the CPU tests): what a request's
    tensors are copied from and to, offsets relative to the region."""

    def read_into(self, offset: int, target: Any) -> None: ...

    def write(self, offset: int, data: Any) -> None: ...

    def close(self) -> None: ...


Opener = Callable[[CudaRegisterRequest], DeviceMemory]


def _uint(value: Any, what: str, top: int = _UINT64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) <= top:
        raise invalid(f"cuda shared memory register request: '{what}' must be an unsigned integer, got "
                      f"{value!r}")
    return int(value)


def checked(name: str, raw_handle: Any, device_id: Any, byte_size: Any) -> CudaRegisterRequest:
    """The request both protocols make, checked: a handle of exactly 64 bytes, a device id and a byte size
    that are unsigned integers, a byte size above zero (an empty region can hold no tensor)."""
    if not isinstance(name, str) or not name:
        raise invalid("'region name' is necessary to register cuda shared memory region")
    if not isinstance(raw_handle, bytes) or len(raw_handle) != IPC_HANDLE_BYTES:
        raise invalid(BAD_HANDLE)
    device = _uint(device_id, "device_id", (1 << 63) - 1)  # int64 on gRPC's wire
    size = _uint(byte_size, "byte_size")
    if size == 0:
        raise invalid(f"failed to register shared memory region '{name}': invalid args (byte_size is 0)")
    return CudaRegisterRequest(name, raw_handle, device, size)


def from_json(name: str, doc: Any) -> CudaRegisterRequest:
    """HTTP's register body, `{"raw_handle": {"b64": "..."}, "device_id": 0, "byte_size": 64}`, checked in
    Triton's order and words."""
    if not isinstance(doc, dict) or "raw_handle" not in doc:
        raise invalid("Shared memory register request has no 'raw_handle' field")
    handle = doc["raw_handle"]
    b64 = handle.get("b64") if isinstance(handle, dict) else None
    if not isinstance(b64, str):
        raise invalid("Shared memory register request's 'raw_handle' has no 'b64' string field")
    for field in ("byte_size", "device_id"):
        if field not in doc:
            raise invalid(f"Shared memory register request has no '{field}' field")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(BAD_HANDLE) from None
    return checked(name, raw, doc["device_id"], doc["byte_size"])


class CudaRegion:
    """One registered region: the request it came from and its opened memory. Requests' TensorPlaces hold
    it like a system region (`name`, `byte_size`, `read_into`, `write`). Its memory is closed when the last
    holder lets go (`__del__`): unregistering drops the registry's hold, and a request in flight keeps the
    mapping until it is done, as Triton defers an unregister until its in-flight requests complete."""

    __slots__ = ("device_id", "memory", "name", "byte_size")

    def __init__(self, request: CudaRegisterRequest, memory: DeviceMemory) -> None:
        self.name = request.name
        self.device_id = request.device_id
        self.byte_size = request.byte_size
        self.memory = memory

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # never raise from a finalizer
            self.memory.close()

    def read_into(self, offset: int, target: Any) -> None:
        self.memory.read_into(offset, target)

    def write(self, offset: int, data: Any) -> None:
        self.memory.write(offset, data)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


def open_on_device(request: CudaRegisterRequest) -> DeviceMemory:
    """The default opener: imports the device module only now, when a register has passed every check."""
    from . import cuda_ipc  # CUDA is imported only where a register reaches the device

    return cuda_ipc.open_region(request)


class CudaSharedMemory:
    """The CUDA regions: owner → name → CudaRegion, beside the server's SystemSharedMemory (`system`), whose
    switch, limits and names it shares: a name is one region's, of either kind, as in Triton's one map.
    `opener` opens a checked request's memory (default: on the device, cuda_ipc.py)."""

    def __init__(self, system: SystemSharedMemory, opener: Opener = open_on_device) -> None:
        self.system = system
        self._open = opener
        self._regions: dict[str, dict[str, CudaRegion]] = {}
        system.cuda_holds = self.holds

    def holds(self, name: str, owner: str) -> bool:
        return name in self._regions.get(owner, {})

    def register(self, request: CudaRegisterRequest, caller: Caller = NOBODY) -> None:
        self.system.require_allowed()
        name = request.name
        owned = self._regions.get(caller.owner, {})
        if name in owned or self.system.holds(name, caller.owner):
            raise EngineError(ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        cap = self.system.limits.max_regions
        if cap and sum(len(r) for r in self._regions.values()) >= cap:
            raise EngineError(ErrorCode.RESOURCE_EXHAUSTED,
                              f"failed to register shared memory region '{name}': the server holds {cap} "
                              "CUDA regions, the most it may (--client-shm-max-regions); unregister some "
                              "first")
        region = CudaRegion(request, self._open(request))
        self._regions.setdefault(caller.owner, {})[name] = region

    def unregister(self, name: str = "", caller: Caller = NOBODY) -> None:
        """One of `caller`'s CUDA regions, or all of them when `name` is empty; an unknown name (or one of
        a system region) is no error, as Triton's."""
        self.system.require_allowed()
        owned = self._regions.get(caller.owner)
        if not owned:
            return
        if name:
            owned.pop(name, None)  # closed once no request in flight holds it (CudaRegion.__del__)
        else:
            owned.clear()
        if not owned:
            del self._regions[caller.owner]

    def status(self, name: str = "", caller: Caller = NOBODY) -> list[dict[str, Any]]:
        """`caller`'s CUDA regions (one, by name) in Triton's form: name, device_id, byte_size."""
        return region_status(self._regions.get(caller.owner, {}), name, "CUDA", "system",
                             lambda: self.system.holds(name, caller.owner))

    def place(self, name: Any, offset: Any, byte_size: Any, owner: str = "") -> TensorPlace:
        """A tensor's place in a region of either kind, checked as Triton's GetMemoryInfo does: a CUDA
        region's own, else the system registry's answer (which knows the errors' words)."""
        region = self._regions.get(owner, {}).get(name) if isinstance(name, str) else None
        if region is None:
            return self.system.place(name, offset, byte_size, owner)
        for value, what in ((offset, "shared_memory_offset"), (byte_size, "shared_memory_byte_size")):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise invalid(f"Unable to parse '{what}'")
        offset, byte_size = int(offset), int(byte_size)
        if offset >= region.byte_size:
            raise invalid(f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > region.byte_size:
            raise invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        return TensorPlace(region, offset, byte_size)
