"""Who reads the instance process's socket (stub.py): the main thread between batches, a helper while it runs.

Why not one reader thread: every batch then crossed from that thread to the main thread that runs the model
(a wake-up and a GIL hand-off per batch: the reader thread's 23 of the instance's 77 µs of CPU per
inference of a small model at c = 16, perf/history/pipelines.md). Here the main thread
reads its next batch itself (`next_work`) and runs it at once; frames that are not work (a ping, a BLS
answer, a decoupled request's cancel or credit) are handled where they are read.

While a batch runs, someone must still read: a model waiting for a BLS answer or for send credit needs its
frame, and a ping must be answered however long `execute` takes, so a frozen process shows that it is and a
busy one does not. The helper thread takes the socket over when one of those needs it (`want`, from the
model's waiting thread: the answer comes as soon as it arrives), or when a batch has run longer than
`TAKEOVER_S` (pings, cancels); a short batch wakes no other thread. When the batch is done, the main
thread takes the socket back, waking the helper through a pipe only if it had taken over.

The socket is read by one thread at a time: whoever holds `_role`. Work read by the helper (the next `Exec`,
`Finalize`) is queued for the main thread. At EOF (the engine is gone) `on_eof` runs: the stub exits at once.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from .channel import Channel, ChannelClosed, Received
from .messages import Exec, Finalize

TAKEOVER_S = 0.05  # a batch running longer than this has the helper answer pings and cancels meanwhile

Work = tuple[Exec | Finalize, list[Received]]
Route = Callable[[Any, list[Received]], None]  # a frame that is not work: handled by the reader at once

log = logging.getLogger("hubserve.python")


class Reading:
    """Created by the stub's main thread once the model is initialized; `route` handles the frames that are
    not work, on whichever thread read them; `on_eof` is called by the thread that finds the socket closed
    (the stub's ends the process; should it return, `next_work` raises ChannelClosed and the helper ends)."""

    def __init__(self, channel: Channel, route: Route, on_eof: Callable[[], None]) -> None:
        self._channel = channel
        self._route = route
        self._on_eof = on_eof
        self._work: collections.deque[Work] = collections.deque()
        self._role = threading.Lock()  # held by the thread reading the socket
        self._state = threading.Lock()  # the three fields below, changed together
        self._main_reading = False
        self._busy_since = time.monotonic()  # when the main thread last stopped reading
        self._helper_reading = False
        self._wanted = threading.Event()  # a model thread waits for a frame: the helper reads now
        self._eof = False
        self._back_r, self._back_w = os.pipe()  # the main thread wants the socket back from the helper
        threading.Thread(target=self._help, name="channel", daemon=True).start()

    def next_work(self) -> Work:
        """The main thread's next batch (or `Finalize`): queued by the helper, or read here."""
        with self._state:
            self._main_reading = True
            if self._helper_reading:
                os.write(self._back_w, b"x")
        with self._role:  # the helper gives it back at once (the pipe)
            try:
                while not self._work:
                    message, tensors = self._receive_blocking()
                    self._dispatch(message, tensors)
                return self._work.popleft()
            finally:
                with self._state:
                    self._main_reading = False
                    self._busy_since = time.monotonic()

    def want(self) -> None:
        """A model thread is about to wait for a frame (a BLS answer, send credit): make sure one is read."""
        self._wanted.set()

    def _receive_blocking(self) -> tuple[Any, list[Received]]:
        try:
            return self._channel.recv()
        except ChannelClosed:
            self._eof = True  # the helper stops too
            self._on_eof()
            raise

    def _dispatch(self, message: Any, tensors: list[Received]) -> None:
        if isinstance(message, (Exec, Finalize)):
            self._work.append((message, tensors))
        else:
            self._route(message, tensors)

    # ------------------------------------------------------------------ the helper thread

    def _help(self) -> None:
        try:
            while not self._eof:
                wanted = self._wanted.wait(TAKEOVER_S)
                with self._state:
                    due = wanted or time.monotonic() - self._busy_since >= TAKEOVER_S
                    if self._main_reading or not due:
                        self._wanted.clear()
                        continue
                    self._helper_reading = True
                self._wanted.clear()
                with self._role:
                    if self._eof:  # found by the main thread meanwhile
                        with self._state:
                            self._helper_reading = False
                        return
                    self._read_until_taken_back()
        except BaseException:  # a bug here must not leave a silent process behind
            log.exception("instance channel failed")
            os._exit(1)

    def _read_until_taken_back(self) -> None:
        """Read (never blocking on the socket itself) until the main thread wants it back."""
        sock = self._channel.socket.fileno()
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        poller.register(self._back_r, select.POLLIN)
        try:
            while True:
                with self._state:
                    if self._main_reading:
                        return
                ready = {fd for fd, _ in poller.poll()}
                if self._back_r in ready:
                    os.read(self._back_r, 64)
                    return
                try:
                    frames = self._channel.receive()
                except ChannelClosed:
                    self._eof = True
                    self._on_eof()
                    return
                for message, tensors in frames:
                    self._dispatch(message, tensors)
        finally:
            with self._state:
                self._helper_reading = False
