"""The backend seam: one small protocol, one module per runtime.

`create(config, model_dir, device)` is called on the instance's own thread (see `engine/instances/pool.py`);
the backend it returns is run and closed on that same thread only.

    onnxruntime.py  ONNX Runtime: one InferenceSession per instance (CPU, CUDA, TensorRT execution providers)
    tensorrt.py     TensorRT engines (`model.plan`): refused clearly, not implemented
    identity.py     no runtime (OUTPUTn = INPUTn), for tests of the batcher and the instance pool
    python/         Triton's Python backend: models in their own processes (its __init__ lists its modules)

Kept light, like python/: a Python model's instance process imports this package on its way to python/.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..errors import EngineError, ErrorCode

if TYPE_CHECKING:  # a Python model's instance process imports this package (python/): nothing heavy here
    from ..config.model_config import ModelConfig, ModelIO
    from ..instances.devices import Device


class Backend(Protocol):
    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        """Run one batch. Called only on the instance's thread; arrays are owned by the caller until it
        returns, and the returned arrays are owned by the caller afterwards."""
        ...

    def close(self) -> None:
        """Release the runtime's memory. Called once, on the instance's thread."""
        ...

    # Optional: `cpu_bound = True` says execution time is CPU time (no device waits, no sleeps), which lets
    # the instance pool run very short batches on the loop instead of paying a thread hand-off.
    #
    # Optional, per request: `async execute_requests(requests, inputs, executor) -> list[answer]` answers
    # each request of a batch on its own, errors included (Python models, engine/backends/python/: a model's
    # `execute` gets the requests, not a concatenated batch, and may fail one request alone). A backend
    # with it gets its batches from python/batcher.py's RequestBatcher, which checks every answer
    # against the config; `execute` then serves warm-up only.


def create(config: ModelConfig, model_path: Path, device: Device, instance_name: str = "") -> Backend:
    if config.backend == "onnxruntime":
        from .onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(config, model_path, device)
    if config.backend == "tensorrt":
        from .tensorrt import TensorRTBackend

        return TensorRTBackend(config, model_path, device)
    if config.backend == "identity":
        from .identity import IdentityBackend

        return IdentityBackend(config)
    if config.backend == "python":
        # Python models answer per request: see engine/backends/python/backend.py for the wider seam.
        from .python import backend as python

        return python.create(config, model_path, device, instance_name or f"{config.name}_0_0")  # type: ignore
    raise EngineError(ErrorCode.UNSUPPORTED, f"backend '{config.backend}' is not supported")


def describe(backend: str, model_path: Path, model_name: str = "") -> ModelIO | None:
    """What the model file declares, for auto-complete; None when the backend cannot tell. `model_name`
    names the file in messages (`<model>/<version>/<file>`; by default from the path)."""
    if backend == "onnxruntime":
        from .onnxruntime import describe_onnx

        return describe_onnx(model_path, model_name)
    return None
