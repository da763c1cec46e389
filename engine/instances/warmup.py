"""Model warm-up (`model_warmup` in the config): synthetic requests run on every instance before a version is
READY, so the first real request does not pay for lazy allocations, kernel selection or graph compilation.

Called by `InstanceModel.start()` once the instances exist; a failure there leaves the version UNAVAILABLE
with the reason, and the repository keeps the previous version serving. Each sample is built once
(`build_samples`, on a worker thread: it may read files) and run `count` times on each instance through
`InstancePool.warm_up`, which goes straight to the backends: as in Triton, warm-up is not queued behind
requests and is not counted in the statistics extension or the metrics (those describe traffic). The log says
what ran and how long it took.

Triton's rules are kept: `batch_size` (0 means 1) is the leading dimension of every input of a batching model
and must be 1 for a model that does not batch; `dims` exclude the batch dimension and must be fixed;
`input_data_file` names a file in the model's `warmup/` folder holding the raw data in row-major order (for
BYTES, each element as a 4-byte little-endian length and its bytes); `count` (0 means 1) repeats the sample.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config.model_config import ModelConfig, WarmupData, WarmupInputConfig
from ..errors import EngineError, ErrorCode, invalid
from ..types import DataType
from .pool import InstancePool

log = logging.getLogger("hubserve.warmup")

WARMUP_FOLDER = "warmup"


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One configured warm-up: its inputs (batch dimension included) and how many times to run it."""

    name: str
    inputs: dict[str, np.ndarray]
    count: int


def build_samples(config: ModelConfig, model_dir: Path, seed: int = 0) -> list[WarmupSample]:
    """The config's warm-up samples with their data. Raises INVALID_ARG naming the sample and the input."""
    samples = []
    rng = np.random.default_rng(seed)
    for entry in config.warmup:
        where = f"model '{config.name}' warm-up '{entry.name}'"
        batch = entry.batch_size
        if config.max_batch_size == 0 and batch != 1:
            raise invalid(f"{where}: batch_size must be 1 for a model that does not batch, got {batch}")
        if config.max_batch_size and batch > config.max_batch_size:
            raise invalid(f"{where}: batch_size {batch} exceeds max_batch_size {config.max_batch_size}")
        inputs: dict[str, np.ndarray] = {}
        for spec in entry.inputs:
            inputs[spec.name] = _input_data(config, model_dir, where, spec, batch, rng)
        required = [s.name for s in config.inputs if not s.optional and s.name not in inputs]
        if required:
            raise invalid(f"{where}: no data for input '{required[0]}'")
        ordered = {s.name: inputs[s.name] for s in config.inputs if s.name in inputs}
        samples.append(WarmupSample(entry.name, ordered, entry.count))
    return samples


def _input_data(config: ModelConfig, model_dir: Path, where: str, spec: WarmupInputConfig, batch: int,
                rng: np.random.Generator) -> np.ndarray:
    name = spec.name
    declared = config.input(name)
    if declared is None:
        raise invalid(f"{where}: '{name}' is not an input of the model; its inputs are "
                      f"{', '.join(repr(s.name) for s in config.inputs)}")
    datatype = spec.datatype
    if datatype is None:
        raise invalid(f"{where}: input '{name}' has no data_type")
    if datatype is not declared.datatype:
        raise invalid(f"{where}: input '{name}' is {datatype.value} here but {declared.datatype.value} "
                      "in the model config")
    dims = spec.dims
    if any(d < 0 for d in dims):
        raise invalid(f"{where}: input '{name}' dims {list(dims)} must be fixed (no -1)")
    shape = ((batch,) if config.max_batch_size else ()) + dims
    if spec.data is WarmupData.FILE:
        path = _data_file(model_dir, where, name, spec.data_file)
        return _from_file(path, f"{WARMUP_FOLDER}/{spec.data_file}", where, name, datatype, shape)
    if spec.data is WarmupData.RANDOM:
        return _random(datatype, shape, rng)
    if datatype is DataType.BYTES:
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=datatype.numpy_dtype)


def _random(datatype: DataType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values a model can take without overflow or NaN: small integers, floats in [0, 1), short strings."""
    if datatype is DataType.BYTES:
        flat = [bytes(rng.integers(97, 123, size=8, dtype=np.uint8)) for _ in range(int(np.prod(shape)))]
        return np.array(flat, dtype=object).reshape(shape)
    if datatype is DataType.BOOL:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    dtype = datatype.numpy_dtype
    if dtype.kind == "f":
        return rng.random(size=shape).astype(dtype)
    if datatype is DataType.BF16:  # uint16 bits of a bfloat16 in [1, 2)
        return np.full(shape, 0x3F80, dtype=np.uint16) + rng.integers(0, 128, size=shape, dtype=np.uint16)
    return rng.integers(0, 64, size=shape).astype(dtype)


def _data_file(model_dir: Path, where: str, name: str, file_name: str) -> Path:
    """The `input_data_file`'s path. INVALID_ARG when it leaves the model folder (`../`, an absolute name, a
    symbolic link to elsewhere): a config, which a client can send with a load request, must not make the
    server read files outside the model."""
    path = model_dir / WARMUP_FOLDER / file_name
    try:
        inside = path.resolve().is_relative_to(model_dir.resolve())
    except (OSError, RuntimeError, ValueError):  # a symbolic-link loop; a NUL byte
        inside = False
    if not inside:
        raise invalid(f"{where}: input '{name}': input_data_file must name a file in the model's "
                      f"{WARMUP_FOLDER}/ folder")
    return path


def _from_file(path: Path, shown: str, where: str, name: str, datatype: DataType, shape: tuple[int, ...]
               ) -> np.ndarray:
    """The file's data; messages name it as `shown` (inside the model folder), not by its absolute path."""
    try:
        raw = path.read_bytes()
    except (OSError, ValueError) as e:
        detail = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise invalid(f"{where}: input '{name}': cannot read input_data_file {shown}: {detail}") from None
    count = int(np.prod(shape))
    if datatype is DataType.BYTES:
        items: list[bytes] = []
        offset = 0
        while offset < len(raw) and len(items) < count:
            length = int.from_bytes(raw[offset:offset + 4], "little")
            items.append(raw[offset + 4:offset + 4 + length])
            offset += 4 + length
        if len(items) < count:
            raise invalid(f"{where}: input '{name}': {shown} holds {len(items)} strings, the shape needs "
                          f"{count}")
        return np.array(items, dtype=object).reshape(shape)
    need = count * datatype.itemsize
    if len(raw) < need:
        raise invalid(f"{where}: input '{name}': {shown} holds {len(raw)} bytes, shape {list(shape)} of "
                      f"{datatype.value} needs {need}")
    return np.frombuffer(raw[:need], dtype=datatype.numpy_dtype).reshape(shape).copy()


async def run(config: ModelConfig, pool: InstancePool, model_dir: Path, version: int) -> None:
    """Run every sample `count` times on each instance. Raises UNAVAILABLE naming the sample that failed."""
    if not config.warmup:
        return
    samples = await asyncio.to_thread(build_samples, config, model_dir)
    output_names = [o.name for o in config.outputs]
    for sample in samples:
        start_ns = time.perf_counter_ns()
        try:
            for _ in range(sample.count):
                await pool.warm_up(sample.inputs, output_names)
        except Exception as e:  # a backend's own exception types too: the reason must reach the index
            detail = e.message if isinstance(e, EngineError) else f"{type(e).__name__}: {e}"
            raise EngineError(ErrorCode.UNAVAILABLE, f"warm-up '{sample.name}' failed: {detail}") from None
        log.info("model %s version %d warm-up '%s': %d run(s) on %d instance(s) in %.1f ms", config.name,
                 version, sample.name, sample.count, pool.size, (time.perf_counter_ns() - start_ns) / 1e6)


__all__ = ["WarmupSample", "build_samples", "run", "WARMUP_FOLDER"]
