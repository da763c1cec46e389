"""hubserve: a multi-model inference server speaking the KServe v2 / Triton protocol."""

import os
from pathlib import Path

from . import native

__version__ = "0.1.0"

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)  # the checkout (or install) holding `engine`

# Before any other engine module is imported: the compiled hot path, where build/native matches these sources
# (engine/native.py); pure Python otherwise.
native.install(Path(_PACKAGE_ROOT))


def child_pythonpath(current: str | None) -> str:
    """PYTHONPATH for a child that runs `python -m engine.…` (a frontend, a Python model's instance or its
    auto-complete): the folder holding this `engine` first, so the child runs this code even from a checkout
    without an install or from a model's own EXECUTION_ENV_PATH interpreter, then what was there."""
    return os.pathsep.join(p for p in (_PACKAGE_ROOT, current) if p)
