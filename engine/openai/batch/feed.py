"""A running job's input, for the runner's tasks: the file opened once (so a job keeps reading it even if its
owner deletes the file meanwhile), checked (`scan`) and then read a few requests ahead (`next`), every read
on a worker thread. Owned by one job's task, which `close`s it when the job's work ends, however it ends: the
close first waits for a read still running on its thread (a cancelled task does not stop a thread), so the
file is never closed under it. A job that expires reads it once more (`write_expired`): the requests left.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from .input import BatchLine, InputReader, scan_input
from .jobs import expired_result

READ_AHEAD = 8  # requests parsed ahead of the workers that will submit them

T = TypeVar("T")


class JobFeed:
    def __init__(self, path: Path, endpoint: str) -> None:
        self._file: IO[bytes] = open(path, "rb")  # noqa: SIM115 (closed by close(), after any read)
        self._endpoint = endpoint
        self._reader: InputReader | None = None
        self._ahead: deque[BatchLine] = deque()
        self._lock = asyncio.Lock()
        self._reading: asyncio.Future[Any] | None = None

    async def scan(self) -> tuple[int, list[dict[str, Any]]]:
        """(the number of requests, the errors that fail the job): input.py `scan_input`."""
        return await self._off_loop(scan_input, self._file, self._endpoint)

    def start(self, done: Sequence[int]) -> None:
        """From here `next` hands out the requests, skipping the lines in `done` (sorted)."""
        self._reader = InputReader(self._file, self._endpoint, done)

    async def next(self) -> BatchLine | None:
        """The next request to submit; None once every one has been handed out."""
        reader = self._reader
        assert reader is not None, "start() first"
        async with self._lock:
            if not self._ahead:
                self._ahead.extend(await self._off_loop(reader.read, READ_AHEAD))
            return self._ahead.popleft() if self._ahead else None

    async def write_expired(self, done: Sequence[int], path: Path) -> int:
        """Append an expired result (jobs.py `expired_result`) to `path` for every request not in `done`
        (sorted), reading the file from its start on a worker thread; how many. Once the job's requests
        have stopped: `next` is not called again."""
        if self._reading is not None and not self._reading.done():
            await asyncio.wait([self._reading])  # a read of a cancelled worker, still on its thread
        return await self._off_loop(_append_expired, self._file, self._endpoint, done, path)

    async def close(self) -> None:
        if self._reading is not None and not self._reading.done():
            await asyncio.wait([self._reading])
        self._file.close()

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        future = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        self._reading = future
        return await asyncio.shield(future)  # cancelled, the task leaves; the read finishes, for close()


def _append_expired(f: IO[bytes], endpoint: str, done: Sequence[int], path: Path) -> int:
    reader = InputReader(f, endpoint, done)
    count = 0
    with open(path, "ab") as out:
        while lines := reader.read(256):
            out.write(b"".join(expired_result(line.custom_id) for line in lines))
            count += len(lines)
    return count
