"""The backend seam: one small protocol, one module per runtime.

`create(config, model_dir, device)` is called on the instance's own thread (see `engine/instances/pool.py`);
the backend it returns is run and closed on that same thread only.

    onnxruntime.py  ONNX Runtime: one InferenceSession per instance (CPU, CUDA, TensorRT execution providers)
    tensorrt.py     TensorRT engines (`model.plan`): refused clearly, not implemented
    identity.py     no runtime (OUTPUTn = INPUTn), for tests of the batcher and the instance pool
    python/         Triton's Python backend: models in their own processes (its __init__ lists its modules)

`BACKENDS` is the one table of them: name, Triton platform name, default model file, module.

Kept light, like python/: a Python model's instance process imports this package on its way to python/.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """One runtime a config may name (`backend`, or Triton's `platform` spelling), and where its code is.

    `module` (in this package) is imported only when a version of that backend loads: ONNX Runtime and the
    Python backend's machinery cost nothing to a server that serves neither. It has `create(config,
    model_path, device, instance_name) -> Backend`, and, when `describe` names one, a function
    `(model_path, model_name) -> ModelIO` that tells auto-complete what the model file declares."""

    name: str
    model_filename: str  # `default_model_filename` when the config names none
    module: str
    platform: str = ""  # Triton's platform name for the backend, accepted in configs and reported in metadata
    describe: str = ""
    # The plug-in kind of model that serves it (engine/repository/kinds.py), when the core's instance kind
    # must not: a Python model's versions answer per request, and its code runs only under its kind's rules.
    kind: str = ""
    needs_file: bool = True  # whether a version without its model file fails to load


# Every backend a config may name, in the order messages list them. The one list: config validation
# (engine/config/steps.py), platform names (engine/config/model_config.py) and `create` read it.
BACKENDS: dict[str, BackendEntry] = {entry.name: entry for entry in (
    BackendEntry("onnxruntime", "model.onnx", ".onnxruntime", platform="onnxruntime_onnx",
                 describe="describe_onnx"),
    BackendEntry("tensorrt", "model.plan", ".tensorrt", platform="tensorrt_plan"),
    BackendEntry("identity", "model.txt", ".identity", needs_file=False),
    # Python models answer per request: engine/backends/python/backend.py has the wider seam.
    BackendEntry("python", "model.py", ".python.backend", kind="python"),
)}
# Platform spellings accepted in configs, mapped to backend names.
PLATFORMS: dict[str, str] = {entry.platform: entry.name for entry in BACKENDS.values() if entry.platform}


def create(config: ModelConfig, model_path: Path, device: Device, instance_name: str = "") -> Backend:
    """The backend of one instance, from its module's `create`. Called on the instance's own thread
    (engine/instances/pool.py)."""
    entry = BACKENDS.get(config.backend)
    if entry is None:
        raise EngineError(ErrorCode.UNSUPPORTED, f"backend '{config.backend}' is not supported")
    module = importlib.import_module(entry.module, __name__)
    backend: Backend = module.create(config, model_path, device, instance_name or f"{config.name}_0_0")
    return backend


def describe(backend: str, model_path: Path, model_name: str = "") -> ModelIO | None:
    """What the model file declares, for auto-complete; None when the backend cannot tell. `model_name`
    names the file in messages (`<model>/<version>/<file>`; by default from the path)."""
    entry = BACKENDS.get(backend)
    if entry is None or not entry.describe:
        return None
    module = importlib.import_module(entry.module, __name__)
    io: ModelIO = getattr(module, entry.describe)(model_path, model_name)
    return io
