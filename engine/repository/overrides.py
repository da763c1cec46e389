"""Model files sent with a repository load request (`file:<version>/<name>` parameters of Triton's protocol):
checked, then written to a private folder outside the repository that the model is loaded from.

Why outside the repository: the files belong to that one load request. Written into the repository they would
overwrite what the user keeps there, and the watcher would treat them as a dropped folder. Triton does the
same (a temporary override folder). The repository deletes the folder once no loaded version uses it.

The folder's name is ours alone (`hubserve-override-<random>` in the system's temporary folder): no text of
the client's goes into it, so no model name can move it elsewhere. A write that fails for any reason removes
what it had written.
"""

from __future__ import annotations

import shutil
import tempfile
import unicodedata
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from ..errors import invalid, unavailable
from ..names import NAME_MAX_BYTES

PREFIX = "hubserve-override-"


def check_files(name: str, files: Mapping[str, bytes]) -> list[tuple[PurePosixPath, bytes]]:
    """Each file's path inside the model folder. Raises INVALID_ARG for a path that is not
    `<version>/<file>`, that would leave the folder, or that holds a control character (a NUL byte makes the
    operating system refuse the name)."""
    checked = []
    for key, data in files.items():
        if any(unicodedata.category(c) == "Cc" for c in key):
            raise invalid(f"model '{name}': a file parameter's name must not contain control characters; "
                          "name it 'file:<version>/<name>'")
        path = PurePosixPath(key)
        parts = path.parts
        if path.is_absolute() or len(parts) < 2 or any(p in ("", ".", "..") for p in parts) or "\\" in key:
            raise invalid(f"model '{name}': file parameter 'file:{key}' must be 'file:<version>/<name>' "
                          "inside the model folder")
        if not parts[0].isdigit():
            raise invalid(f"model '{name}': file parameter 'file:{key}' must start with a version number")
        if any(len(p.encode("utf-8", "replace")) > NAME_MAX_BYTES for p in parts):
            raise invalid(f"model '{name}': a file parameter's folder and file names are at most "
                          f"{NAME_MAX_BYTES} bytes each")
        if not isinstance(data, (bytes, bytearray)):
            raise invalid(f"model '{name}': file parameter 'file:{key}' must carry bytes")
        checked.append((path, bytes(data)))
    return checked


def write_override(name: str, files: Mapping[str, bytes]) -> Path:
    """A new folder holding `files` in the model-folder layout. Runs on a worker thread. Raises INVALID_ARG
    for a bad file name and UNAVAILABLE when the files cannot be written (the message names the file inside
    the model folder, never the temporary folder)."""
    checked = check_files(name, files)
    try:
        folder = Path(tempfile.mkdtemp(prefix=PREFIX))
    except OSError as e:
        raise unavailable(f"model '{name}': cannot store the files sent with the load request: "
                          f"{e.strerror or type(e).__name__}") from None
    try:
        for path, data in checked:
            target = folder.joinpath(*path.parts)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            except OSError as e:
                raise unavailable(f"model '{name}': cannot store file '{path}' sent with the load request: "
                                  f"{e.strerror or type(e).__name__}") from None
    except BaseException:  # any failure, a cancellation included: leave nothing behind
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def remove_override(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


__all__ = ["check_files", "write_override", "remove_override"]
