"""Watching the repository folder (`--model-control-mode poll`): a model folder that appears, changes or
disappears is reconciled (loaded, reloaded, unloaded) once it has settled.

Why events and polling both: file-system events (on Linux inotify, read on the loop with no thread
(inotify.py); elsewhere FSEvents and friends through `watchfiles`) make a dropped folder serve within about
a second without rescanning every folder, but events can be lost (queue overflow, network file systems,
some container mounts) or unavailable. A full scan every `poll_secs` is the safety net,
and the whole mechanism where events are not available or are turned off (`--no-repository-events`).

Why "settled" and not "a fixed short delay": a copy in progress is not a model, and a copy over a network
or from a slow disk pauses for seconds between files. A folder is reconciled only when its fingerprint (path,
size and mtime of every file) has not changed for `quiet_secs` and no file in it was written within
`quiet_secs`. `SettleTracker` holds that rule as a pure object (tested without a loop or a disk);
`RepositoryWatcher` feeds it from events and scans, and runs each reconcile as its own task, so a slow load
never stops the watcher from reacting to other folders. A failed load is retried when its folder changes
again. Folders whose names are no model names, or that resolve outside the repository, count as absent (the
repository logs each once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from .fingerprint import Fingerprint
from .inotify import InotifyTree
from .lifecycle import ModelRepository

log = logging.getLogger("hubserve.watcher")

EVENT_RETRY_SECS = 5.0  # after the event source fails, how long until it is started again


@dataclass(slots=True)
class Observation:
    fingerprint: Fingerprint | None
    changed_at: float  # monotonic seconds when this fingerprint was first seen


class SettleTracker:
    """Which folders have settled in a state that differs from what is loaded. Pure and synchronous: the
    caller passes the clocks in."""

    def __init__(self, quiet_secs: float) -> None:
        self.quiet_secs = quiet_secs
        self._seen: dict[str, Observation] = {}

    def observe(self, name: str, fp: Fingerprint | None, now: float) -> None:
        seen = self._seen.get(name)
        if seen is None or seen.fingerprint != fp:
            self._seen[name] = Observation(fp, now)

    def settles_at(self, name: str, now: float, wall_ns: int) -> float:
        """Monotonic time from which the folder counts as settled if it does not change again: `quiet_secs`
        after its fingerprint was first seen, and after its newest file was written (by `wall_ns`, the
        wall clock that corresponds to `now`)."""
        seen = self._seen[name]
        at = seen.changed_at + self.quiet_secs
        newest_ns = max((item[2] for item in seen.fingerprint or ()), default=0)
        written_ago = (wall_ns - newest_ns) / 1e9
        if 0 <= written_ago < self.quiet_secs:  # a future mtime (clock skew) is left to the first rule
            at = max(at, now + self.quiet_secs - written_ago)
        return at

    def pending(self, loaded: Mapping[str, Fingerprint | None]) -> list[str]:
        """Folders whose state on disk differs from their state when last loaded (None: not loaded, or no
        folder)."""
        return sorted(n for n, seen in self._seen.items() if seen.fingerprint != loaded.get(n))

    def due(self, loaded: Mapping[str, Fingerprint | None], now: float, wall_ns: int) -> list[str]:
        return [n for n in self.pending(loaded) if self.settles_at(n, now, wall_ns) <= now]

    def next_check(self, loaded: Mapping[str, Fingerprint | None], now: float, wall_ns: int,
                   skip: Collection[str] = ()) -> float | None:
        """When the earliest pending folder (other than `skip`) settles, if none changes before."""
        times = [self.settles_at(n, now, wall_ns) for n in self.pending(loaded) if n not in skip]
        return min(times) if times else None

    def forget(self, name: str) -> None:
        self._seen.pop(name, None)


class RepositoryWatcher:
    """Started by the server in poll mode; `run()` returns only when cancelled."""

    def __init__(self, repository: ModelRepository, poll_secs: float, quiet_secs: float,
                 use_events: bool = True) -> None:
        self.repository = repository
        self.root = repository.root
        self.poll_secs = poll_secs
        self.tracker = SettleTracker(quiet_secs)
        self.use_events = use_events
        self._dirty: set[str] = set()
        self._rescan_all = True
        self._wake = asyncio.Event()
        self._busy: dict[str, asyncio.Task[None]] = {}
        self._stop_events = asyncio.Event()  # tells watchfiles' thread to return (it checks every step)

    async def run(self) -> None:
        events = asyncio.ensure_future(self._watch_events()) if self.use_events else None
        try:
            await self._reconcile_forever()
        finally:
            self._stop_events.set()
            for task in list(self._busy.values()):
                task.cancel()
            if events is not None:
                events.cancel()
                await asyncio.gather(events, return_exceptions=True)

    async def _reconcile_forever(self) -> None:
        next_scan = time.monotonic()
        while True:
            # 1. Look at what events marked, or at everything when the rescan is due.
            now = time.monotonic()
            names = set(self._dirty)
            self._dirty.clear()
            self._wake.clear()
            try:
                if now >= next_scan or self._rescan_all:
                    next_scan, self._rescan_all = now + self.poll_secs, False
                    names |= self.repository.folder_names()
                await self._observe(names)
                # 2. Reconcile each folder that settled in a state other than the loaded one.
                self._start_due()
            except Exception:  # the watcher must never stop reacting
                log.exception("repository watch step failed")
            # 3. Sleep until an event, the next rescan, or the next folder due to settle.
            loaded = self.repository.loaded_fingerprints()
            settles = self.tracker.next_check(loaded, time.monotonic(), time.time_ns(), skip=self._busy)
            wake_at = next_scan if settles is None else min(next_scan, settles)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, wake_at - time.monotonic()))

    async def _observe(self, names: set[str]) -> None:
        repository = self.repository

        def scan() -> dict[str, Fingerprint | None]:
            # A folder that cannot be a model folder (a bad name; one resolving outside the repository)
            # reads as absent: never loaded, and unloaded should a loaded model's folder turn into one.
            return {name: repository.folder_fingerprint(name) for name in names if not name.startswith(".")}

        now = time.monotonic()
        loaded = self.repository.loaded_fingerprints()
        for name, fp in (await asyncio.to_thread(scan)).items():
            if fp is None and name not in loaded:
                self.tracker.forget(name)  # gone, and nothing loaded from it
            else:
                self.tracker.observe(name, fp, now)

    def _start_due(self) -> None:
        loaded = self.repository.loaded_fingerprints()
        for name in self.tracker.due(loaded, time.monotonic(), time.time_ns()):
            if name in self._busy:
                continue  # reconciled again once the running one ends, if still different
            task = asyncio.ensure_future(self.repository.reconcile(name))
            self._busy[name] = task
            task.add_done_callback(self._reconciled)

    def _reconciled(self, task: asyncio.Task[None]) -> None:
        name = next((n for n, t in self._busy.items() if t is task), None)
        if name is None:
            return
        del self._busy[name]
        self._dirty.add(name)
        self._wake.set()

    def notice(self, paths: list[Path]) -> None:
        """Mark the model folders holding these paths for a look. Called by the event source."""
        for path in paths:
            try:
                parts = path.relative_to(self.root).parts
            except ValueError:
                continue
            if parts:
                self._dirty.add(parts[0])
            else:
                self._rescan_all = True
        self._wake.set()

    async def _watch_events(self) -> None:
        """Feed file-system events into `notice` for as long as the server runs; restart after a failure.
        Linux: inotify read on the loop itself (inotify.py says why); elsewhere watchfiles' thread."""
        if sys.platform.startswith("linux") and InotifyTree.available():
            await self._watch_with(self._inotify_once)
            return
        try:
            import watchfiles  # noqa: F401
        except ImportError:
            log.warning("watchfiles is not installed: scanning the repository every %.1f s", self.poll_secs)
            return
        logging.getLogger("watchfiles").setLevel(logging.WARNING)  # it logs every batch of changes at INFO
        await self._watch_with(self._watchfiles_once)

    def _went_live(self) -> None:
        """The watch is in place. A folder dropped between the start-up scan and now raised no event (the
        server answers ready before this task first runs): one more scan finds it, instead of the next poll
        minutes later. Seen under load as a dropped model never served."""
        self._rescan_all = True
        self._wake.set()

    async def _inotify_once(self) -> None:
        """Until cancelled, or until the root goes or the descriptor fails (raised). No thread: the loop's
        epoll wakes for inotify's descriptor only when something changed."""
        loop = asyncio.get_running_loop()
        opening = asyncio.ensure_future(asyncio.to_thread(InotifyTree, self.root))  # walks every folder
        try:
            tree = await asyncio.shield(opening)
        except asyncio.CancelledError:  # a shutdown during the walk: close the descriptor once it exists
            opening.add_done_callback(_close_opened)
            raise
        failed: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            try:
                batch = tree.read()
            except OSError as e:
                loop.remove_reader(tree.fileno())
                if not failed.done():
                    failed.set_exception(e)
                return
            if batch.overflow:
                self._rescan_all = True  # events were lost: look at everything
                self._wake.set()
            if batch.paths:
                self.notice(batch.paths)

        fd = tree.fileno()
        loop.add_reader(fd, readable)
        try:
            self._went_live()
            await failed
        finally:
            loop.remove_reader(fd)
            tree.close()

    async def _watchfiles_once(self) -> None:
        import watchfiles
        live = False
        async for changes in watchfiles.awatch(self.root, watch_filter=None, debounce=200, step=20,
                                               stop_event=self._stop_events, recursive=True,
                                               ignore_permission_denied=True, yield_on_timeout=True,
                                               rust_timeout=500):
            if not live:  # the first yield (changes, or an empty set after rust_timeout): watch in place
                live = True
                self._went_live()
            if changes:
                self.notice([Path(path) for _, path in changes])

    async def _watch_with(self, watch: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                log.info("watching %s for changes (and scanning every %.1f s)", self.root, self.poll_secs)
                await watch()
                return  # stopped
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("file-system events for %s failed (%s); scanning every %.1f s, retrying events "
                            "in %.0f s", self.root, e, self.poll_secs, EVENT_RETRY_SECS)
            self._rescan_all = True
            await asyncio.sleep(EVENT_RETRY_SECS)


def _close_opened(opening: asyncio.Future[InotifyTree]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


__all__ = ["RepositoryWatcher", "SettleTracker"]
