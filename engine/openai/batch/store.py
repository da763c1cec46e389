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
