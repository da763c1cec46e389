"""Where the Batch API keeps things on disk (`--batch-dir`), and how: JSON documents written whole to a
temporary name and renamed over the old one, so a crash leaves either the old or the new document, never
half of one. Ids are made here (`file-<hex>`, `batch_<hex>`) and checked before any path is built from
one, so a client's id can never name a path outside the folder. The folder is made private (0700)."""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

import orjson

_ID = re.compile(r"(file-|batch_)[0-9a-f]{32}")


def new_id(prefix: str) -> str:
    """`prefix` + 32 hex digits: the time in ns, then 64 random bits, so that ids sort in the order they were
    made (listings and the indexes read at start order by creation time, then id)."""
    return f"{prefix}{time.time_ns():016x}{secrets.token_hex(8)}"


def valid_id(text: str, prefix: str) -> bool:
    return text.startswith(prefix) and _ID.fullmatch(text) is not None


def make_private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def write_json(path: Path, doc: Any) -> None:
    """Replace `path` with `doc`, atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(doc))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_bytes(path: Path, data: bytes | memoryview) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


class SharedFolder:
    """A folder of `<id>.json` documents that other replicas write too (`--batch-shared`): `read` returns
    every document, re-reading only those whose inode, size or modification time changed since the last
    read (a document is replaced whole by a rename, so a change is a new inode), and the ids that have a
    `<id><marker>` file beside them. Called on a worker thread, one read at a time (the runner's refresh
    lock)."""

    def __init__(self, root: Path, prefix: str, marker: str = "") -> None:
        self.root = root
        self.prefix = prefix
        self.marker = marker
        self._seen: dict[str, tuple[tuple[int, int, int], Any]] = {}  # id → (its stat, its document)

    def read(self) -> tuple[dict[str, Any], frozenset[str]]:
        docs: dict[str, Any] = {}
        marked = set()
        with os.scandir(self.root) as entries:
            for entry in entries:
                name = entry.name
                if self.marker and name.endswith(self.marker):
                    marked.add(name[:-len(self.marker)])
                    continue
                if not name.endswith(".json") or not valid_id(name[:-5], self.prefix):
                    continue
                doc_id = name[:-5]
                try:
                    st = entry.stat()
                    key = (st.st_ino, st.st_size, st.st_mtime_ns)
                    seen = self._seen.get(doc_id)
                    fresh = seen is not None and seen[0] == key
                    docs[doc_id] = seen[1] if fresh else read_json(Path(entry.path))  # type: ignore[index]
                except FileNotFoundError:  # deleted between the listing and the read
                    continue
                except (OSError, orjson.JSONDecodeError):  # unreadable now: keep what was read before
                    seen = self._seen.get(doc_id)
                    if seen is not None:
                        docs[doc_id] = seen[1]
                    continue
                self._seen[doc_id] = (key, docs[doc_id])
        for gone in self._seen.keys() - docs.keys():
            del self._seen[gone]
        return docs, frozenset(marked)
