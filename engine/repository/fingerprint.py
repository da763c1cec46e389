"""Fingerprints: what a model folder looked like, to tell whether it changed.

A fingerprint lists each file's (relative path, size, mtime). The repository stores one per model at each
load (engine/repository/lifecycle.py), and compares the parts of each version folder to rebuild only what
changed; the watcher (engine/repository/watcher.py) compares the disk with the stored ones. Pure functions
over the file system, run on worker threads.
"""

from __future__ import annotations

from pathlib import Path

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(model_dir: Path) -> Fingerprint | None:
    """What changes when a user edits, adds or removes files: (relative path, size, mtime) of each file.
    None when the folder does not exist. Runs on a worker thread."""
    if not model_dir.is_dir():
        return None
    items = []
    for path in sorted(model_dir.rglob("*")):
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_file():
            items.append((path.relative_to(model_dir).as_posix(), st.st_size, st.st_mtime_ns))
    return tuple(items)


def split_fingerprint(fp: Fingerprint | None) -> dict[str, Fingerprint]:
    """The fingerprint of each version folder (keyed by its name) and of everything else (key "")."""
    parts: dict[str, list[tuple[str, int, int]]] = {}
    for item in fp or ():
        head, sep, _ = item[0].partition("/")
        key = head if sep and head.isdigit() else ""
        parts.setdefault(key, []).append(item)
    return {k: tuple(v) for k, v in parts.items()}
