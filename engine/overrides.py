"""Model files sent with a repository load request (`file:<version>/<name>` parameters of Triton's protocol):
checked, then written to a private folder outside the repository that the model is loaded from.

Why outside the repository: the files belong to that one load request. Written into the repository they would
overwrite what the user keeps there, and the watcher would treat them as a dropped folder. Triton does the
same (a temporary override folder). The repository deletes the folder once no loaded version uses it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from .errors import invalid

PREFIX = "hubserve-override-"


def check_files(name: str, files: Mapping[str, bytes]) -> list[tuple[PurePosixPath, bytes]]:
    """Each file's path inside the model folder. Raises INVALID_ARG for a path that is not
    `<version>/<file>` or that would leave the folder."""
    checked = []
    for key, data in files.items():
        path = PurePosixPath(key)
        parts = path.parts
        if path.is_absolute() or len(parts) < 2 or any(p in ("", ".", "..") for p in parts) or "\\" in key:
            raise invalid(f"model '{name}': file parameter 'file:{key}' must be 'file:<version>/<name>' inside "
                          "the model folder")
        if not parts[0].isdigit():
            raise invalid(f"model '{name}': file parameter 'file:{key}' must start with a version number")
        if not isinstance(data, (bytes, bytearray)):
            raise invalid(f"model '{name}': file parameter 'file:{key}' must carry bytes")
        checked.append((path, bytes(data)))
    return checked


def write_override(name: str, files: Mapping[str, bytes]) -> Path:
    """A new folder holding `files` in the model-folder layout. Runs on a worker thread."""
    checked = check_files(name, files)
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{name}-"))
    try:
        for path, data in checked:
            target = folder.joinpath(*path.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def remove_override(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


__all__ = ["check_files", "write_override", "remove_override"]
