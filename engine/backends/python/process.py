"""The engine's side of one Python-model instance process: start it, talk to it, watch it, see it end.

`InstanceProcess.start()` (blocking; called on the instance's thread) makes the two shared-memory regions and
a socket pair, starts `python -m engine.backends.python.stub` with them as inherited fds, sends `Init` and
waits for `Ready` (or `InitFailed`: the model's import or `initialize` error, with its last lines). The
messages are messages.py's.

Its frames are read on the event loop (`attach`, from the owner's bind, before anything is sent): the
socket is watched with `add_reader`, and what has arrived is read without waiting (channel.py `receive`):
results resolve the futures `call_async()` (the loop's) and `call()` (a thread's: warm-up) returned, BLS
requests go to `on_bls`, a decoupled model's responses to `on_response`, all on the loop; every frame counts
as a sign of life. Why not a reader thread: each answer then cost a thread's wake-up, its GIL hand-off to
the loop (call_soon_threadsafe, the loop's self-pipe) and a future per thread; without it (and with one read
per burst of frames) a batch of one small request costs the engine about half the CPU it did
(perf/history/pipelines.md, issue 32).

Then three threads of its own, none of them the event loop:
- the watchdog pings about every second and kills a process that has said nothing for `unresponsive_s`
  (frozen, or stuck holding the GIL) or whose oldest batch has run longer than `execute_timeout_s` (when
  set): a hung instance is detected, not waited on forever. Frames waiting unread in the socket count as a
  sign of life too: a loop too busy to read is not the instance's fault;
- the outbox's writer (outbox.py) writes what the socket does not take at once, and large frames, so
  `call()` and `send()` never block their caller (the loop);
- the output pump forwards what the process prints to the server's log (at the level the model's Logger
  used), keeping the last lines for error messages.

When the process ends for any reason but `stop()`, every batch in flight fails with an error that says what
happened, and `on_exit(reason)` is called (from a thread that waits for the exit status, never the loop) so
the owner can restart it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import child_pythonpath
from ...errors import EngineError, ErrorCode, unavailable
from ...shm.regions import Region
from .channel import Channel, ChannelClosed, Received, engine_side
from .messages import Bls, Bye, Exec, Finalize, Init, Ping, Ready, RequestHeader, Resp, Result, ToInstance
from .outbox import Outbox

PING_INTERVAL_S = 1.0
# An instance gets a process group of its own, so a Ctrl-C or a signal to the server's group reaches the
# server alone, which finalizes its instances; an instance ends by itself when the server's end of the socket
# goes. It stays in the server's session, as Triton's stubs do: where Linux groups CPU time by session
# (autogroup), a session of its own made each instance a scheduling group apart from its server, which cost
# the hop ~10 % at HTTP c = 4 (perf/history/pipelines.md, twenty-eighth session). Python 3.10 has no
# `process_group`: there the instance still starts a session of its own.
_OWN_GROUP: dict[str, Any] = ({"process_group": 0} if sys.version_info >= (3, 11)
                              else {"start_new_session": True})
_LEVEL_MARK = "\x1f"  # the stub's log lines start with \x1f<level>\x1f, so the pump keeps their level

log = logging.getLogger("hubserve.python")


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one instance process."""

    python: str  # the interpreter (the server's own, or EXECUTION_ENV_PATH's)
    model_file: Path
    model_dir: Path  # the model's folder: tracebacks show it as `shown`
    shown: str  # the model folder as messages name it, e.g. "py/"
    instance_name: str
    args: dict[str, str]  # initialize()'s args
    region_bytes: int = 16 << 20
    init_timeout_s: float = 300.0
    unresponsive_s: float = 10.0
    execute_timeout_s: float = 0.0  # 0: a batch may run as long as it likes
    log_level: int = logging.INFO
    env: dict[str, str] = field(default_factory=dict)


Answered = tuple[Result, list[Received]]
Waiter = Future[Answered] | asyncio.Future[Answered]  # a thread's (warm-up) or the loop's


class InstanceProcess:
    def __init__(self, spec: LaunchSpec, on_bls: Callable[[Bls, list[Received]], None],
                 on_exit: Callable[[str], None],
                 on_response: Callable[[Resp, list[Received]], None] | None = None) -> None:
        self.spec = spec
        self._on_bls = on_bls
        self._on_response = on_response
        self._on_exit = on_exit
        self._proc: subprocess.Popen[bytes] | None = None
        self._channel: Channel | None = None
        self._outbox: Outbox | None = None  # every write after start-up
        self._pending: dict[int, tuple[Waiter, float]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop that reads the frames (attach)
        self._reading = False  # the socket is registered with the loop's add_reader
        self._lock = threading.Lock()
        self._next_batch = 0
        self._last_heard = time.monotonic()
        self._stopping = False
        self._kill_reason = ""
        self._bye = threading.Event()
        self._tail: collections.deque[str] = collections.deque(maxlen=12)
        self.pid = 0

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        """Start the process and wait for its `Ready`; raises EngineError with the model's error."""
        spec = self.spec
        to_child = Region.create(spec.region_bytes, f"{spec.instance_name}-in")
        from_child = Region.create(spec.region_bytes, f"{spec.instance_name}-out")
        ours, theirs = socket.socketpair()
        env = {**os.environ, **spec.env, "PYTHONPATH": child_pythonpath(os.environ.get("PYTHONPATH")),
               "PYTHONUNBUFFERED": "1"}
        cmd = [spec.python, "-m", "engine.backends.python.stub", str(theirs.fileno()), str(from_child.fd),
               str(from_child.size), str(to_child.fd), str(to_child.size)]
        try:
            self._proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(), to_child.fd, from_child.fd),
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, cwd=str(spec.model_dir), env=env,
                                          **_OWN_GROUP)
        except OSError as e:
            for thing in (ours, to_child, from_child):
                thing.close()
            raise unavailable(f"instance '{spec.instance_name}': cannot start {spec.python}: "
                              f"{e.strerror}") from None
        finally:
            theirs.close()
        self.pid = self._proc.pid
        threading.Thread(target=self._pump, name=f"{spec.instance_name}.out", daemon=True).start()
        channel = self._channel = engine_side(ours, to_child, from_child)
        ours.settimeout(spec.init_timeout_s)
        try:
            channel.send(Init(str(spec.model_file), str(spec.model_dir), spec.shown, spec.args,
                              spec.log_level, spec.instance_name))
            message, _ = channel.recv()
        except ChannelClosed:
            self._abandon()
            raise unavailable(f"instance '{spec.instance_name}' {self._exit_reason(spec.init_timeout_s)} "
                              f"before it was initialized{self._tail_text()}") from None
        if not isinstance(message, Ready):
            self._abandon()
            text = getattr(message, "text", f"sent {type(message).__name__} before it was ready")
            raise EngineError(ErrorCode.INTERNAL, f"instance '{spec.instance_name}': {text}")
        ours.settimeout(None)
        self._outbox = Outbox(channel, spec.instance_name)
        self._last_heard = time.monotonic()
        threading.Thread(target=self._watch, name=f"{spec.instance_name}.watch", daemon=True).start()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the process's frames on `loop` from now on. Called on the loop, once the process started
        (the owner's bind, or its restart); frames that came before (pongs) wait in the socket."""
        channel = self._channel
        assert channel is not None and self._loop is None
        self._loop = loop
        self._reading = True
        loop.add_reader(channel.socket.fileno(), self._readable)

    def _abandon(self) -> None:
        self._stopping = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._proc is not None:
            self._proc.wait(10)
        if self._channel is not None:
            self._channel.close()

    # ------------------------------------------------------------------ calls

    def call(self, requests: list[RequestHeader], tensors: list[Any]) -> Future[Answered]:
        """Send one batch (an `Exec` numbered here) from a thread other than the loop's (warm-up); the
        future resolves with its `Result` and the result's tensors, or fails with the reason the process
        ended."""
        future: Future[Answered] = Future()
        self._post(requests, tensors, future)
        return future

    def call_async(self, requests: list[RequestHeader], tensors: list[Any]) -> asyncio.Future[Answered]:
        """`call`, on the loop that reads the frames (attach): the loop's own future, resolved there."""
        assert self._loop is not None
        future: asyncio.Future[Answered] = self._loop.create_future()
        self._post(requests, tensors, future)
        return future

    def _post(self, requests: list[RequestHeader], tensors: list[Any], future: Waiter) -> None:
        outbox = self._outbox
        with self._lock:
            self._next_batch += 1
            batch = self._next_batch
            if self._stopping or outbox is None:
                self._settle(future, unavailable(f"instance '{self.spec.instance_name}' is not running"))
                return
            self._pending[batch] = (future, time.monotonic())

        def unsendable(error: EngineError) -> None:  # from the outbox's writer thread, or right here
            with self._lock:
                entry = self._pending.pop(batch, None)
            if entry is not None:
                self._settle(entry[0], error)

        try:
            outbox.post(Exec(batch, requests), tensors, unsendable)
        except ChannelClosed:
            pass  # the reader fails the pending batches with the reason the process ended
        except EngineError as e:
            unsendable(e)

    def _settle(self, future: Waiter, outcome: Answered | BaseException) -> None:
        """Resolve `future` from any thread: a loop's future on its loop."""
        if isinstance(future, asyncio.Future):
            loop = future.get_loop()
            if _running_loop() is not loop:
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits it any more
                    loop.call_soon_threadsafe(_resolve, future, outcome)
                return
        _resolve(future, outcome)

    def send(self, message: ToInstance, tensors: list[Any] = ()) -> None:  # type: ignore[assignment]
        """A frame that expects no answer (a BLS result, a ping); lost quietly when the process is gone.
        Never blocks (outbox.py)."""
        outbox = self._outbox
        if outbox is None:
            return
        with contextlib.suppress(ChannelClosed):
            outbox.post(message, tensors)

    # ------------------------------------------------------------------ threads

    def _readable(self) -> None:
        """The socket has bytes (add_reader, on the loop): handle every frame that has arrived."""
        channel = self._channel
        assert channel is not None
        try:
            frames = channel.receive()
            if frames:
                self._last_heard = time.monotonic()
            for message, tensors in frames:
                if isinstance(message, Result):
                    with self._lock:
                        entry = self._pending.pop(message.batch, None)
                    if entry is not None:
                        _resolve(entry[0], (message, tensors))
                elif isinstance(message, Resp):
                    if self._on_response is not None:
                        self._on_response(message, tensors)  # a decoupled model's send
                elif isinstance(message, Bls):
                    self._on_bls(message, tensors)
                elif isinstance(message, Bye):
                    if message.text:
                        log.error("instance %s: finalize failed: %s", self.spec.instance_name, message.text)
                    self._bye.set()
            return
        except ChannelClosed:
            pass
        except Exception:
            log.exception("instance %s: reading its channel failed", self.spec.instance_name)
            self._kill("sent a frame the engine could not read")
        self._detach()
        if self._outbox is not None:
            self._outbox.close()  # its writer thread ends with the process
        if not self._stopping:  # its exit status is waited for off the loop
            threading.Thread(target=self._ended, name=f"{self.spec.instance_name}.exit", daemon=True).start()

    def _detach(self) -> None:
        """Stop watching the socket (before it closes: a closed descriptor must not stay registered with
        the loop). From the loop, or from a thread while the loop runs."""
        loop, channel = self._loop, self._channel
        if not self._reading or loop is None or channel is None:
            return
        self._reading = False
        fd = channel.socket.fileno()
        # Not Optional: compiled (mypyc), a method called on a union has its result checked against the
        # declared type, and uvloop's remove_reader returns None where asyncio's says bool.
        owner: asyncio.AbstractEventLoop = loop
        if _running_loop() is owner:
            owner.remove_reader(fd)
            return
        removed = threading.Event()

        def remove() -> None:
            owner.remove_reader(fd)
            removed.set()

        try:
            owner.call_soon_threadsafe(remove)
        except RuntimeError:  # the loop is closed, and its registrations with it
            return
        removed.wait(5)

    def _ended(self) -> None:
        """The process is gone (its socket closed) and `stop()` was not the reason: fail what is in flight
        with the reason, and tell the owner. On a thread of its own: the exit status may take a moment."""
        reason = self._exit_reason(0)
        error = unavailable(f"Python model instance '{self.spec.instance_name}' {reason} while running "
                            "this request")
        with self._lock:
            self._stopping = True
            pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            self._settle(future, error)
        log.error("instance %s (pid %d) %s", self.spec.instance_name, self.pid, reason)
        self._on_exit(reason)

    def _read_until_bye(self, timeout_s: float) -> None:
        """`stop()` of a process no loop reads (its owner was never bound): its frames up to `Bye`."""
        channel = self._channel
        assert channel is not None
        channel.socket.settimeout(timeout_s)
        while True:
            message, _ = channel.recv()  # ChannelClosed at EOF or when the time is up
            if isinstance(message, Bye):
                if message.text:
                    log.error("instance %s: finalize failed: %s", self.spec.instance_name, message.text)
                return

    def _unread(self) -> bool:
        """Whether frames wait in the socket for the loop to read them."""
        channel = self._channel
        if channel is None:
            return False
        poller = select.poll()
        poller.register(channel.socket.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    def _watch(self) -> None:
        spec = self.spec
        last_ping = 0.0
        while not self._stopping:
            time.sleep(0.25)
            now = time.monotonic()
            if now - self._last_heard > spec.unresponsive_s and not self._unread():
                self._kill(f"was unresponsive for {spec.unresponsive_s:g} s (hung) and was killed")
                return
            if spec.execute_timeout_s:
                with self._lock:
                    oldest = min((t for _, t in self._pending.values()), default=now)
                if now - oldest > spec.execute_timeout_s:
                    self._kill(f"ran one execute past execute_timeout_secs ({spec.execute_timeout_s:g} s) "
                               "and was killed")
                    return
            if now - last_ping >= PING_INTERVAL_S:
                last_ping = now
                self.send(Ping(int(now)))

    def _pump(self) -> None:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return
        logger = logging.getLogger(f"hubserve.python.{self.spec.instance_name}")
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            level = logging.INFO
            if line.startswith(_LEVEL_MARK):
                mark, _, rest = line[1:].partition(_LEVEL_MARK)
                if mark.isdigit():
                    level, line = int(mark), rest
            self._tail.append(line)
            logger.log(level, "%s", line)

    # ------------------------------------------------------------------ ending

    def _kill(self, reason: str) -> None:
        self._kill_reason = reason
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()

    def kill(self, reason: str) -> None:
        """End the process now (the owner's decision, e.g. a test); it then ends as a crash does."""
        self._kill(reason)

    def _exit_reason(self, timeout_s: float) -> str:
        """Why the process ended, once it has (waits a moment for its status)."""
        if self._kill_reason:
            return self._kill_reason
        proc = self._proc
        if proc is None:
            return "did not start"
        try:
            code = proc.wait(5)
        except subprocess.TimeoutExpired:
            if timeout_s:
                self._kill("")
                proc.wait(5)
                return f"took longer than {timeout_s:g} s"
            return "stopped answering"
        if code < 0:
            try:
                return f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def _tail_text(self) -> str:
        lines = [line for line in self._tail if line.strip()][-6:]
        return (":\n" + "\n".join(lines)) if lines else ""

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finalize the model and end the process (killed if it takes longer than `timeout_s`)."""
        with self._lock:
            was_stopping, self._stopping = self._stopping, True
        proc, channel, outbox = self._proc, self._channel, self._outbox
        if not was_stopping and outbox is not None:
            with contextlib.suppress(ChannelClosed):
                outbox.post(Finalize())
                if self._loop is None:  # never attached: no loop reads its frames, so read them here
                    self._read_until_bye(timeout_s)
                else:
                    self._bye.wait(timeout_s)
        if outbox is not None:
            outbox.close()
        self._detach()
        if channel is not None:
            channel.close()
        if proc is not None:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _resolve(future: Waiter, outcome: Answered | BaseException) -> None:
    """Called on the future's loop for the loop's futures; one cancelled meanwhile (its caller gone) stays
    so."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
