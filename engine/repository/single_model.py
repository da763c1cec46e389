"""A folder that holds one model's files directly (`<dir>/model.onnx`, the layout KServe's ONNX guide
uploads and KServe mounts at /mnt/models), served as a one-model repository.

Called once by `hubserve serve` before anything loads: when `--model-repository` names such a folder, the
server serves a repository made here instead, `<tmp>/<name>/1/<each file>` as symbolic links to the folder's
files (so an ONNX model's external data files, resolved beside the model, are found), plus the folder's
`config.pbtxt`/`config.yaml` as the model's config if it has one; without one, the ONNX model's config is
auto-completed from the graph as for any folder without a config. The made folder lives under the system
temp folder (TMPDIR) for the process's life; the files themselves stay where they are, read-only.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

MODEL_FILE = "model.onnx"
CONFIG_FILES = ("config.pbtxt", "config.yaml")


def is_single_model(folder: Path) -> bool:
    """A folder with a model.onnx at its top and no model folder (one with a config or a version folder)
    beside it: a Triton repository never holds a model file at its top."""
    if not (folder / MODEL_FILE).is_file():
        return False
    return not any(p.is_dir() and (any((p / c).is_file() for c in CONFIG_FILES)
                                   or any(v.is_dir() and v.name.isdigit() for v in p.iterdir()))
                   for p in folder.iterdir())


def single_model_repository(folder: Path, name: str) -> Path:
    """A repository whose one model, `name` version 1, is `folder`'s files. The caller checked
    `is_single_model(folder)` and that `name` is a valid model name."""
    root = Path(tempfile.mkdtemp(prefix="hubserve-single-model-"))
    version = root / name / "1"
    version.mkdir(parents=True)
    for item in folder.iterdir():
        if item.name in CONFIG_FILES:
            (root / name / item.name).symlink_to(item.resolve())
        elif not item.name.startswith("."):  # KServe's storage initializer leaves hidden files
            (version / item.name).symlink_to(item.resolve())
    return root
