"""A Batch API file's bytes for a download (`GET /v1/files/{id}/content`), a chunk at a time: the route
(engine/frontend/openai/batch_routes.py) writes each chunk to the client's stream and reads the next once the
client has taken enough (the stream's `drain`), so a download holds one chunk in memory however large its
file (up to a key's storage quota) and however slowly its client reads.

The file is opened once, so a download that started goes on even if the owner deletes the file meanwhile;
every open and read runs on a worker thread. Owned by one download's task, which `close`s it when the
download ends, however it ends: the close first waits for a read still running on its thread (a cancelled
task does not stop a thread), so the file is never closed under it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import IO

CHUNK_BYTES = 64 << 10  # one read; what a download holds besides the transport's buffer


class FileChunks:
    def __init__(self, f: IO[bytes]) -> None:
        self._file = f
        self._reading: asyncio.Future[bytes] | None = None

    @classmethod
    async def open(cls, path: Path) -> FileChunks:
        """FileNotFoundError if the file went meanwhile (deleted after the route found it)."""
        return cls(await asyncio.to_thread(open, path, "rb"))

    async def read(self) -> bytes:
        """The next chunk; b"" at the end of the file."""
        future = asyncio.get_running_loop().run_in_executor(None, self._file.read, CHUNK_BYTES)
        self._reading = future
        return await asyncio.shield(future)  # cancelled, the task leaves; the read finishes, for close()

    async def close(self) -> None:
        if self._reading is not None and not self._reading.done():
            await asyncio.wait([self._reading])
        self._file.close()
