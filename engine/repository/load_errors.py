"""How a load failure reads to clients (errors, the repository index, the log): the error's own words,
with the server's absolute paths taken out. A client may see which file of its model failed, never where
the server keeps its repository (or the temporary folder of a load that sent files).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import EngineError


def load_failure_text(error: BaseException, model_dir: Path, name: str, root: Path) -> str:
    """The EngineError's message, an OSError as the file and what went wrong, anything else by its repr; with
    the model folder written as the model's name and the repository root left out."""
    if isinstance(error, EngineError):
        text = error.message
    elif isinstance(error, OSError):
        where = ""
        if isinstance(error.filename, str):
            shown = relative_to_repository(error.filename, model_dir, name, root)
            where = f" '{shown if not os.path.isabs(shown) else os.path.basename(shown)}'"
        text = f"model '{name}': cannot read{where}: {error.strerror or type(error).__name__}"
    else:
        text = repr(error)
    return relative_to_repository(text, model_dir, name, root)


def relative_to_repository(text: str, model_dir: Path, name: str, root: Path) -> str:
    """`text` with the model folder (a repository folder, or an override's temporary folder) written as the
    model's name and the repository root left out: `/srv/models/simple/1/model.onnx` becomes
    `simple/1/model.onnx`."""
    for path, label in ((model_dir, name), (root, "")):
        for form in sorted({str(path), os.path.realpath(path)}, key=len, reverse=True):
            if len(form) > 1:
                text = text.replace(form + os.sep, f"{label}/" if label else "")
                text = text.replace(form, label or "the model repository")
    return text
