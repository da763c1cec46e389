"""Where this checkout is, and how a subprocess runs its code.

The harness works from a checkout (an editable install), never from an installed wheel: it starts the server
from the repository root and reads the example configs and `.tools/` next to it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "model_repository"
PERF_PACKAGES = ROOT / "perf"  # hubserve_perf (the load tester) and this harness


def checkout_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a subprocess (run with cwd=ROOT) that must run this checkout's load tester, e.g.
    `python -m engine perf`: the server package comes from the working directory, the load tester from
    PERF_PACKAGES, both ahead of wherever the venv's editable install points (a venv shared by several
    checkouts points at one of them). `extra` adds to or overrides the result."""
    path = [str(ROOT), str(PERF_PACKAGES)]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONUNBUFFERED": "1", **(extra or {})}
