"""engine/shm/cuda.py, the CUDA shared memory protocol and registry, on the CPU: the register request's
checks (both protocols' forms), names shared with system regions, status, unregister one or all, the limit,
and a request's tensors read from and written to a region through requests.py.

The device is replaced by `HostBuffer`, a real `DeviceMemory` over a bytearray (what cuda_ipc.py's IpcRegion
does with cudaMemcpy, done with slicing); what the real opener answers on a machine without a GPU is checked
here too, and over both protocols in tests/functional/shm/test_client_shm.py."""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from engine.access.caller import Caller
from engine.errors import EngineError, ErrorCode
from engine.shm import requests as shm_requests
from engine.shm.client import ShmLimits, SystemSharedMemory
from engine.shm.cuda import (
    BAD_HANDLE,
    IPC_HANDLE_BYTES,
    CudaRegisterRequest,
    CudaSharedMemory,
    checked,
    from_json,
    open_on_device,
)
from engine.types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor

HANDLE = bytes(range(IPC_HANDLE_BYTES))


class HostBuffer:
    """A client buffer in host memory, standing in for the device: copies are slices."""

    def __init__(self, request: CudaRegisterRequest) -> None:
        self.data = bytearray(request.byte_size)
        self.closed = False

    def read_into(self, offset: int, target: Any) -> None:
        view = memoryview(target).cast("B")
        view[:] = self.data[offset:offset + view.nbytes]

    def write(self, offset: int, data: Any) -> None:
        view = memoryview(data).cast("B")
        self.data[offset:offset + view.nbytes] = view

    def close(self) -> None:
        self.closed = True


class Opened:
    """The opener of a registry under test: remembers what it opened, by region name."""

    def __init__(self) -> None:
        self.buffers: dict[str, HostBuffer] = {}

    def __call__(self, request: CudaRegisterRequest) -> HostBuffer:
        self.buffers[request.name] = HostBuffer(request)
        return self.buffers[request.name]


@contextlib.contextmanager
def expect(code: ErrorCode, message: str) -> Iterator[None]:
    with pytest.raises(EngineError) as err:
        yield
    assert err.value.code is code, err.value
    assert message in err.value.message, err.value.message


def registry(allowed: bool = True, max_regions: int = 256) -> tuple[CudaSharedMemory, Opened]:
    opened = Opened()
    return CudaSharedMemory(SystemSharedMemory(allowed, ShmLimits(max_regions=max_regions)), opened), opened


def test_a_handle_must_be_64_bytes_and_sizes_unsigned() -> None:
    assert checked("r", HANDLE, 1, 128) == CudaRegisterRequest("r", HANDLE, 1, 128)
    for handle in (b"", HANDLE[:63], HANDLE + b"x", "x" * 64):
        with expect(ErrorCode.INVALID_ARG, BAD_HANDLE):
            checked("r", handle, 0, 64)
    for device, size in ((-1, 64), (True, 64), (0, -1), (0, 1 << 64), (0, 1.5)):
        with expect(ErrorCode.INVALID_ARG, "must be an unsigned integer"):
            checked("r", HANDLE, device, size)
    with expect(ErrorCode.INVALID_ARG, "failed to register shared memory region 'r': invalid args"):
        checked("r", HANDLE, 0, 0)
    with expect(ErrorCode.INVALID_ARG, "'region name' is necessary to register cuda shared memory region"):
        checked("", HANDLE, 0, 64)


def test_the_http_body_in_tritons_order_and_words() -> None:
    b64 = base64.b64encode(HANDLE).decode()
    assert from_json("r", {"raw_handle": {"b64": b64}, "device_id": 0, "byte_size": 8}).raw_handle == HANDLE
    cases = [({}, "no 'raw_handle' field"), ({"raw_handle": "x"}, "'raw_handle' has no 'b64' string field"),
             ({"raw_handle": {"b64": b64}, "device_id": 0}, "no 'byte_size' field"),
             ({"raw_handle": {"b64": b64}, "byte_size": 8}, "no 'device_id' field"),
             ({"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 8}, BAD_HANDLE),
             ({"raw_handle": {"b64": "aGFuZGxl"}, "device_id": 0, "byte_size": 8}, BAD_HANDLE)]
    for doc, words in cases:
        with expect(ErrorCode.INVALID_ARG, words):
            from_json("r", doc)


def test_register_status_unregister_and_names_shared_with_system_regions() -> None:
    cuda, opened = registry()
    cuda.register(checked("a", HANDLE, 0, 64))
    cuda.register(checked("b", HANDLE, 1, 32))
    assert cuda.status() == [{"name": "a", "device_id": 0, "byte_size": 64},
                             {"name": "b", "device_id": 1, "byte_size": 32}]
    assert cuda.status("b") == [{"name": "b", "device_id": 1, "byte_size": 32}]
    with expect(ErrorCode.ALREADY_EXISTS, "shared memory region 'a' already in manager"):
        cuda.register(checked("a", HANDLE, 0, 64))
    with expect(ErrorCode.NOT_FOUND, "Unable to find cuda shared memory region: 'c'"):
        cuda.status("c")
    assert cuda.status(caller=Caller("other")) == []  # another API key sees none of them
    cuda.unregister("a")
    cuda.unregister("nothing")  # an unknown name is no error
    assert opened.buffers["a"].closed and not opened.buffers["b"].closed
    assert [r["name"] for r in cuda.status()] == ["b"]
    cuda.unregister()
    assert cuda.status() == [] and opened.buffers["b"].closed


def test_a_system_regions_name_is_taken() -> None:
    key = f"hubserve_test_cuda_{os.getpid()}"
    system = SystemSharedMemory(True, ShmLimits(key_prefixes=("hubserve_test_cuda_",)))
    cuda = CudaSharedMemory(system, Opened())
    with open(f"/dev/shm/{key}", "wb") as f:
        f.truncate(64)
    try:
        system.register("sys", "/" + key, 0, 64)
    finally:
        os.unlink(f"/dev/shm/{key}")
    with expect(ErrorCode.ALREADY_EXISTS, "shared memory region 'sys' already in manager"):
        cuda.register(checked("sys", HANDLE, 0, 64))
    with expect(ErrorCode.NOT_FOUND, "registered as system shared memory, not CUDA shared memory"):
        cuda.status("sys")
    cuda.register(checked("gpu", HANDLE, 0, 64))  # and the other way round
    with expect(ErrorCode.ALREADY_EXISTS, "shared memory region 'gpu' already in manager"):
        system.register("gpu", "/" + key, 0, 64)
    with expect(ErrorCode.NOT_FOUND, "The region named 'gpu' is registered as CUDA shared memory, not system "
                                     "shared memory"):
        system.status("gpu")


def test_off_without_the_flag_and_bounded_by_the_region_limit() -> None:
    off, _ = registry(allowed=False)
    for call in (lambda: off.register(checked("a", HANDLE, 0, 64)), lambda: off.unregister()):
        with expect(ErrorCode.NOT_ENABLED, "Client shared memory is disabled"):
            call()
    small, _ = registry(max_regions=1)
    small.register(checked("a", HANDLE, 0, 64))
    with expect(ErrorCode.RESOURCE_EXHAUSTED, "--client-shm-max-regions"):
        small.register(checked("b", HANDLE, 0, 64))


def test_a_requests_tensors_are_copied_from_and_to_a_region() -> None:
    cuda, opened = registry()
    cuda.register(checked("io", HANDLE, 0, 64))
    device = opened.buffers["io"]
    device.write(0, np.arange(4, dtype=np.float32))
    params = {"shared_memory_region": "io", "shared_memory_byte_size": 16}
    request = InferenceRequest("m", "", [Tensor("IN", DataType.FP32, (4,), np.empty(0, np.float32), params)],
                               outputs=[RequestedOutput("OUT", None, {**params, "shared_memory_offset": 32})])
    resolved, places = shm_requests.resolve(request, cuda, 1 << 20)
    cuda.unregister("io")  # while the request is in flight: its place keeps the region open
    assert not device.closed
    np.testing.assert_array_equal(resolved.inputs[0].data, np.arange(4, dtype=np.float32))
    out = Tensor("OUT", DataType.FP32, (4,), resolved.inputs[0].data * 2)
    answered = shm_requests.write_outputs(InferenceResponse("m", "1", [out]), places)
    assert answered.outputs[0].parameters["shared_memory_region"] == "io"
    np.testing.assert_array_equal(np.frombuffer(bytes(device.data[32:48]), np.float32), [0, 2, 4, 6])
    del places, answered
    assert device.closed  # the last holder let go
    cuda.register(checked("io2", HANDLE, 0, 64))
    with expect(ErrorCode.INVALID_ARG, "Invalid offset + byte size for shared memory region: 'io2'"):
        cuda.place("io2", 60, 16)
    with expect(ErrorCode.NOT_FOUND, "Unable to find shared memory region: 'io'"):
        cuda.place("io", 0, 16)


def test_the_device_opener_refuses_clearly_on_this_machine() -> None:
    # Without cuda-bindings, or without a device, or (on a GPU) until the path has passed a device run.
    with expect(ErrorCode.UNAVAILABLE, "failed to register CUDA shared memory region: 'a': CUDA shared "
                                       "memory is not available: "):
        open_on_device(checked("a", HANDLE, 0, 64))
