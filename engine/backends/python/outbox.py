"""The engine's writes to one Python-model instance process, in order, never blocking the caller.

Why: the engine sends batches and BLS results from the event loop. A frame whose tensors do not fit the
instance's shared-memory arena travels inline through the socket, and a blocking `sendall` of tens of MB to a
process that reads slowly (busy, paused, swapped out, hung until the watchdog kills it) would stop the loop,
and with it every other model's requests.

`Outbox.post()` returns at once, whatever the socket does:
- a small frame (tensors under `DEFER_BYTES`) is framed by the caller and written with `MSG_DONTWAIT` when
  nothing is queued before it: the common case costs no thread hand-off;
- what the socket did not take at once, a frame with larger tensors (whose copy into the arena is itself
  milliseconds of work), and anything posted while earlier frames wait, go to the outbox's writer thread,
  which frames and writes them in posting order with blocking writes.

Called from the loop, the watchdog and the instance's thread; one writer thread per instance process. A
frame that cannot be built (too large, a tensor with no wire form) raises from `post` when framed at once,
or is reported to the poster's `on_error` from the writer thread. When the socket breaks, later posts raise
ChannelClosed; the reader thread sees the process end and fails the batches in flight.
"""

from __future__ import annotations

import collections
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import EngineError
from ...types import DataType
from .channel import Channel, ChannelClosed, write_some

DEFER_BYTES = 256 << 10  # above this, framing (the copy into the arena) is left to the writer thread

OnError = Callable[[EngineError], None]
Tensors = Sequence[tuple[str, DataType, np.ndarray]]
# A job: bytes already framed (the rest of a partial write), or a message the writer frames itself.
_Job = collections.deque[memoryview] | tuple[Any, Tensors, OnError | None]

log = logging.getLogger("hubserve.python")


class Outbox:
    def __init__(self, channel: Channel, name: str) -> None:
        self._channel = channel
        self._sock: socket.socket = channel.socket
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._jobs: collections.deque[_Job] = collections.deque()
        self._busy = False  # the writer thread owns the socket's write side (jobs queued or being written)
        self._closed = ""  # why nothing more can be written
        threading.Thread(target=self._run, name=f"{name}.write", daemon=True).start()

    def post(self, meta: Any, tensors: Tensors = (), on_error: OnError | None = None) -> None:
        """Send one frame without waiting for the socket. Raises ChannelClosed once the socket is broken or
        the outbox closed, and EngineError when a frame framed at once cannot be built."""
        nbytes = sum(int(a.nbytes) for _, _, a in tensors)
        with self._lock:
            if self._closed:
                raise ChannelClosed(self._closed)
            if self._busy or nbytes >= DEFER_BYTES:
                self._queue((meta, tensors, on_error))
                return
            chunks = collections.deque(self._channel.frame(meta, tensors))
            try:
                write_some(self._sock, chunks, socket.MSG_DONTWAIT)
            except OSError as e:
                self._closed = f"the instance channel broke: {e}"
                raise ChannelClosed(self._closed) from None
            if chunks:  # the socket is full: the writer finishes this frame before any other
                self._queue(chunks)

    def _queue(self, job: _Job) -> None:
        """Called under the lock."""
        self._jobs.append(job)
        self._busy = True
        self._wake.notify()

    def close(self) -> None:
        """Stop taking frames; the writer ends once it has written what is queued (or the socket breaks)."""
        with self._lock:
            self._closed = self._closed or "the instance channel is closed"
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    self._busy = False
                    if self._closed:
                        return
                    self._wake.wait()
                job = self._jobs.popleft()
            if isinstance(job, tuple):
                meta, tensors, on_error = job
                try:
                    chunks = collections.deque(self._channel.frame(meta, tensors))
                except EngineError as e:
                    if on_error is not None:
                        on_error(e)
                    else:
                        log.error("a frame for an instance could not be built: %s", e.message)
                    continue
            else:
                chunks = job
            try:
                write_some(self._sock, chunks, 0)
            except OSError as e:
                with self._lock:
                    self._closed = f"the instance channel broke: {e}"
                    self._jobs.clear()
                    self._busy = False
                return
