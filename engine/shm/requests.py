"""A request's tensors in clients' shared-memory regions (client.py): inputs read before the
request is queued, outputs written once it is answered. Called by the DataPlane, in the process that owns the
registry (the engine, with `--workers N`), for requests whose tensors name `shared_memory_region`.

The model never sees the extension: `resolve` gives it a copy of the request whose inputs hold their data and
whose tensors carry no shared-memory parameters. An output written to a region leaves as a tensor with its
real shape, no data and the parameters `shared_memory_region` / `shared_memory_byte_size` (`is_placed`): the
codecs answer it without bytes (HTTP: name, datatype and shape, as Triton; gRPC: an empty
`raw_output_contents` entry), and with `--workers N` it crosses to the frontend with no bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..errors import EngineError, ErrorCode, invalid
from ..frontend.wire import array_from_bytes, array_to_bytes
from ..types import (
    SHARED_MEMORY_PARAMETERS,
    DataType,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
    element_count,
)
from .client import TensorPlace
from .cuda import CudaSharedMemory

REGION = "shared_memory_region"
OutputPlaces = dict[str, TensorPlace]


def uses_shared_memory(request: InferenceRequest) -> bool:
    """Whether any tensor of `request` names a region: cheap, as it runs for every request."""
    for tensor in request.inputs:
        if tensor.parameters and REGION in tensor.parameters:
            return True
    outputs = request.outputs
    if outputs:
        for out in outputs:
            if out.parameters and REGION in out.parameters:
                return True
    return False


def is_placed(tensor: Tensor) -> bool:
    """Whether a response tensor's bytes were written to a client's region (it then has no data here)."""
    return bool(tensor.parameters) and REGION in tensor.parameters


def _without_shm(parameters: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in parameters.items() if k not in SHARED_MEMORY_PARAMETERS}


def _place(registry: CudaSharedMemory, parameters: dict[str, Any], owner: str) -> TensorPlace:
    return registry.place(parameters[REGION], parameters.get("shared_memory_offset", 0),
                          parameters.get("shared_memory_byte_size", 0), owner)


def resolve(request: InferenceRequest, registry: CudaSharedMemory, max_tensor_bytes: int
            ) -> tuple[InferenceRequest, OutputPlaces]:
    """The request as the model is to see it (inputs read from their regions, shared-memory parameters
    dropped), and where each output in shared memory goes. `registry` finds regions of both kinds (system
    ones through the SystemSharedMemory it wraps). The regions are those of the request's `owner`
    (the API key that sent it). Raises EngineError in Triton's words for an unknown region, a range outside
    it, a byte size that does not match the tensor, or a region removed or truncated by its owner; nothing is
    queued then."""
    owner = request.owner
    inputs = []
    for tensor in request.inputs:
        params = tensor.parameters
        if not params or REGION not in params:
            inputs.append(tensor)
            continue
        place = _place(registry, params, owner)
        data = _read_input(request.model_name, tensor, place, max_tensor_bytes)
        inputs.append(Tensor(tensor.name, tensor.datatype, tensor.shape, data, _without_shm(params)))
    places: OutputPlaces = {}
    outputs = request.outputs
    if outputs and any(o.parameters and REGION in o.parameters for o in outputs):
        stripped = []
        for out in outputs:
            params = out.parameters
            if not params or REGION not in params:
                stripped.append(out)
                continue
            if "classification" in params:
                raise invalid("Output can't set both 'shared_memory_region' and 'classification'")
            places[out.name] = _place(registry, params, owner)
            stripped.append(RequestedOutput(out.name, out.binary_data, _without_shm(params)))
        outputs = stripped
    return dataclasses.replace(request, inputs=inputs, outputs=outputs), places


def _read_input(model: str, tensor: Tensor, place: TensorPlace, max_tensor_bytes: int) -> np.ndarray:
    """The tensor's array, filled from its region by one pread into the array the backend will get."""
    datatype = tensor.datatype
    if datatype is DataType.BYTES:
        if place.byte_size > max_tensor_bytes:
            raise invalid(f"input '{tensor.name}': shared_memory_byte_size {place.byte_size} is larger than "
                          f"the server's message limit of {max_tensor_bytes} bytes")
        buffer = bytearray(place.byte_size)
        place.region.read_into(place.offset, buffer)
        return array_from_bytes(tensor.name, datatype, tensor.shape, buffer)
    expected = element_count(tensor.shape) * datatype.itemsize
    if place.byte_size != expected:
        raise invalid(f"input byte size mismatch for input '{tensor.name}' for model '{model}'. Expected "
                      f"{expected}, got {place.byte_size}")
    array = np.empty(tensor.shape, datatype.numpy_dtype)
    if expected:
        place.region.read_into(place.offset, array)
    return array


def write_outputs(response: InferenceResponse, places: OutputPlaces) -> InferenceResponse:
    """Write the outputs that go to regions and answer them without data. An output larger than its place is
    INTERNAL, in Triton's words (server src/http_server.cc, the output allocator)."""
    outputs = []
    for tensor in response.outputs:
        place = places.get(tensor.name)
        if place is None:
            outputs.append(tensor)
            continue
        chunk = array_to_bytes(tensor.data, tensor.datatype)
        if len(chunk) > place.byte_size:
            raise EngineError(ErrorCode.INTERNAL,
                              f"shared memory size specified with the request for output '{tensor.name}' "
                              f"({place.byte_size} bytes) should be at least {len(chunk)} bytes to hold the "
                              f"results")
        if len(chunk):
            place.region.write(place.offset, chunk)
        params = {REGION: place.region.name, "shared_memory_byte_size": len(chunk)}
        if place.offset:
            params["shared_memory_offset"] = place.offset
        outputs.append(Tensor(tensor.name, tensor.datatype, tensor.shape,
                              np.empty(0, tensor.datatype.numpy_dtype), params))
    response.outputs = outputs
    return response
