"""Which interpreter runs a Python model's instances, and with which hubserve parameters.

`EXECUTION_ENV_PATH` (a config parameter, as in Triton) names a Python environment folder: a venv, or an
unpacked conda environment; its `bin/python3` runs the instances, so the model sees that environment's
packages. `$$TRITON_MODEL_DIRECTORY` in it stands for the model's folder, and a path written that way must
stay inside it. The environment needs numpy (as Triton's does); hubserve's own code reaches the process
through PYTHONPATH. A conda-pack archive (`.tar.gz`) is refused with a clear error: unpack it and name the
folder.
Without the parameter, instances run on the server's own interpreter.

hubserve's own parameters of a Python model (all optional):
- `in_process: "true"` runs a light, thread-safe model on its instance thread inside the server instead of a
  process of its own: no isolation (a crash takes the server down, a blocking call blocks a thread), no
  EXECUTION_ENV_PATH;
- `execute_timeout_secs`: an instance whose batch runs longer is treated as hung: killed and restarted, its
  requests failed (default 0: no limit);
- `instance_unresponsive_secs`: an instance process that answers no ping for this long is treated as hung
  (default 10);
- `initialize_timeout_secs`: how long `initialize` may take (default 300);
- `shm_region_mb`: each direction's shared-memory region per instance (default 16; a message whose tensors
  do not fit goes inline, through the socket). Pages are touched as the ring moves through the region, so an
  instance may show up to twice this in the server's RSS (as shared memory, RssShmem).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ...errors import EngineError, ErrorCode, invalid

MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"


@dataclass(frozen=True)
class PythonOptions:
    interpreter: str
    in_process: bool
    execute_timeout_s: float
    unresponsive_s: float
    init_timeout_s: float
    region_bytes: int


def _number(parameters: Mapping[str, str], key: str, default: float, where: str) -> float:
    text = parameters.get(key)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise invalid(f"{where}: parameter '{key}' must be a non-negative number, got {text!r}")
    return value


def options(parameters: Mapping[str, str], model_dir: Path, where: str) -> PythonOptions:
    """The parameters of a Python model, checked. Raises INVALID_ARG / UNSUPPORTED naming the parameter."""
    in_process = parameters.get("in_process", "false").lower()
    if in_process not in ("true", "false"):
        raise invalid(f"{where}: parameter 'in_process' must be \"true\" or \"false\", got {in_process!r}")
    env_path = parameters.get("EXECUTION_ENV_PATH", "")
    if env_path and in_process == "true":
        raise invalid(f"{where}: EXECUTION_ENV_PATH needs an instance process of its own; remove "
                      "'in_process' or the environment")
    mb = _number(parameters, "shm_region_mb", 16, where)
    return PythonOptions(
        interpreter=interpreter(env_path, model_dir, where) if env_path else sys.executable,
        in_process=in_process == "true",
        execute_timeout_s=_number(parameters, "execute_timeout_secs", 0, where),
        unresponsive_s=_number(parameters, "instance_unresponsive_secs", 10, where) or 10,
        init_timeout_s=_number(parameters, "initialize_timeout_secs", 300, where) or 300,
        region_bytes=max(1 << 20, int(mb * (1 << 20))),
    )


def interpreter(env_path: str, model_dir: Path, where: str) -> str:
    """The interpreter of the environment `env_path` names (see the module docstring)."""
    relative = env_path.startswith(MODEL_DIRECTORY)
    path = Path(env_path.replace(MODEL_DIRECTORY, str(model_dir), 1))
    if relative and not path.resolve().is_relative_to(model_dir.resolve()):
        raise invalid(f"{where}: EXECUTION_ENV_PATH {env_path!r} leads outside the model's folder")
    if env_path.endswith((".tar.gz", ".tgz", ".tar")):
        raise EngineError(ErrorCode.UNSUPPORTED, f"{where}: EXECUTION_ENV_PATH {env_path!r} is an archive; "
                                                 "hubserve runs unpacked environments: unpack it (e.g. "
                                                 "`tar -xzf`) and name the folder")
    if not path.is_dir():
        raise invalid(f"{where}: EXECUTION_ENV_PATH {env_path!r} is not a folder")
    for name in ("python3", "python"):
        candidate = path / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise invalid(f"{where}: EXECUTION_ENV_PATH {env_path!r} has no bin/python3: name a venv or an "
                  "unpacked conda environment")
