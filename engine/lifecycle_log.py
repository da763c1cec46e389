"""The log lines that tell an operator what happened to the models as a whole: one line when the server is
ready, and one line per reload, in words that say what changed. Pure: the server (`Server.start`) and the
repository (`ModelRepository._load_locked`) write what these return.

    ready in 2.4 s: 20 models ready, 1 failed to load (broken); HTTP on 0.0.0.0:8000, gRPC on ...
    model 'simple' reloaded: version 1 → 1 (files changed)
    model 'busy' reloaded: version 1 → 2 (version 2 added, version 1 retired)

A reload builds the changed versions beside the serving ones and switches in one step, so a reload is never
an unload: the copies it replaced are drained and freed after the switch ("the previous copy drained and
freed"), and only a version no longer served reads UNLOADING / unloaded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .model import ModelState
from .repository.routing import IndexEntry

NOT_LOADED = "not loaded"  # the index's reason for a folder nobody asked to load (explicit mode)
MAX_NAMES = 5  # names listed in the ready line before "and N more"


def ready_line(elapsed_s: float, index: Iterable[IndexEntry], where: str) -> str:
    """`ready in 2.4 s: 20 models ready, 1 failed to load (broken); <where>`: the repository's models by
    outcome (a model is ready when one of its versions is), then `where` the server listens."""
    rows: dict[str, list[IndexEntry]] = {}
    for row in index:
        rows.setdefault(row.name, []).append(row)
    ready = [n for n, r in rows.items() if any(e.state is ModelState.READY for e in r)]
    idle = [n for n, r in rows.items() if n not in ready and all(e.reason == NOT_LOADED for e in r)]
    failed = sorted(set(rows) - set(ready) - set(idle))
    words = [_count(len(ready), "model") + " ready"]
    if failed:
        words.append(f"{len(failed)} failed to load ({_names(failed)}; the reasons are above)")
    if idle:
        words.append(f"{len(idle)} not loaded ({_names(sorted(idle))})")
    return f"ready in {elapsed_s:.1f} s: {', '.join(words)}; {where}"


def process_age_s(fallback_since: float) -> float:
    """Seconds since this process started (Linux: /proc/self/stat's start time against /proc/uptime), so
    "ready in" counts the interpreter and the imports, as the person who typed the command waited them;
    elsewhere, since `fallback_since` (a `time.monotonic()`)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, after the command's name
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return max(0.0, uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic() - fallback_since


def reload_line(name: str, before: Mapping[int, tuple[Any, ...]], after: Mapping[int, tuple[Any, ...]],
                kept: Iterable[int]) -> str | None:
    """One line for a reload that switched routing: the versions serving before → after, and why; None when
    nothing changed (the same copies serve on, as when an ensemble's load loads a composing model again).
    `before` and `after` map each serving version to what it was built from, the repository's version key
    (folder, the model's files, the version's files, config bytes); `kept` are the versions whose serving
    copy did not change."""
    kept = set(kept)
    old, new = set(before), set(after)
    changes = [f"version {v} added" for v in sorted(new - old)]
    changes += [f"version {v} retired" for v in sorted(old - new)]
    rebuilt = sorted((old & new) - kept)
    reasons = {v: _why(before[v], after[v]) for v in rebuilt}
    if not changes and set(rebuilt) == new and len(set(reasons.values())) == 1:
        changes.append(reasons[rebuilt[0]])  # every version, for one reason: "version 1 → 1 (files changed)"
    else:
        changes += [f"version {v}: {reasons[v]}" for v in rebuilt]
    if not changes:
        return None
    return f"model '{name}' reloaded: {_versions(old)} → {_numbers(new)} ({', '.join(changes)})"


def _why(before: tuple[Any, ...], after: tuple[Any, ...]) -> str:
    """From two version keys (folder, the model's own files, the version's files, config bytes). The model's
    own files include config.pbtxt: when the config changed too, that is taken as the config's edit."""
    config = before[3:] != after[3:]
    version_files = before[0] != after[0] or before[2:3] != after[2:3]
    files = version_files or (before[1:2] != after[1:2] and not config)
    if files and config:
        return "files and config changed"
    return "config changed" if config else "files changed" if files else "rebuilt"


def _versions(versions: set[int]) -> str:
    return ("version " if len(versions) == 1 else "versions ") + _numbers(versions)


def _numbers(versions: set[int]) -> str:
    return ", ".join(str(v) for v in sorted(versions))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES])
    return shown if len(names) <= MAX_NAMES else f"{shown} and {len(names) - MAX_NAMES} more"


__all__ = ["process_age_s", "ready_line", "reload_line"]
