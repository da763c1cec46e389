"""The instance process of a Python model: `python -m engine.backends.python.stub SOCK OWN SIZE PEER SIZE`.

Started by process.py with the socket and the two shared-memory regions as inherited fds. It waits for
`Init`, imports the model and calls `initialize`, answers `Ready` (or `InitFailed` with the error's last
lines), then serves until `finalize` or until the engine is gone (the socket closes: the process exits, so
an instance never outlives its server).

Two threads (reading.py): the main thread reads its batches and runs the model (initialize, execute,
finalize: user code, in order); a helper thread reads the socket while a batch runs, when the model waits for
a BLS answer or send credit or the batch runs long, so pings are answered however busy the model is (and a
frozen process shows it is not), BLS responses reach the waiting calls and cancels and credits the decoupled
sends. The messages, each way, are messages.py's; tensors travel beside them (channel.py).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import sys
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ...errors import EngineError
from ...shm.regions import Region
from ...types import DataType
from . import pb_utils
from .channel import Channel, ChannelClosed, Received, instance_side
from .messages import (
    Answer,
    Bls,
    BlsResult,
    Bye,
    Cancel,
    Error,
    Finalize,
    Init,
    InitFailed,
    Ok,
    Ping,
    Pong,
    Ready,
    RequestHeader,
    Resp,
    Result,
    SendCredit,
)
from .reading import Reading, Route
from .runner import ModelError, ModelRunner, convert_response
from .send_credits import CreditedSink


class StubSink(CreditedSink):
    """A decoupled model's sends, from whichever thread of the model: each a `Resp` frame to the engine (the
    channel's lock keeps frames whole), a send before the last waiting for its request's credit
    (send_credits.py); `cancelled` holds the keys the engine said are cancelled (written by the reader
    thread, which also hands over the engine's credit)."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self._channel = channel

    def deliver(self, key: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        if response is None:
            self._channel.send(Resp(key, final, None))
            return
        answer = convert_response(response, 0)
        try:
            if answer[0] == "ok":
                self._channel.send(Resp(key, final, Ok(len(answer[1]), answer[2])), answer[1])
            else:
                self._channel.send(Resp(key, final, Error(answer[1], answer[2])))
        except EngineError as e:  # e.g. a tensor no wire form fits: the model learns it from send()
            raise pb_utils.TritonModelException(f"the response could not be sent: {e.message}") from None
        except ChannelClosed:
            raise pb_utils.TritonModelException("the response could not be sent: the server is gone") \
                from None


def requests_from(headers: list[RequestHeader], tensors: list[Received],
                  sink: pb_utils.ResponseSink | None = None) -> list[pb_utils.InferenceRequest]:
    """The batch's requests as pb_utils objects; each takes its inputs from `tensors` in order. A request
    with a key (a decoupled model's) gets a response sender over `sink`."""
    out = []
    position = 0
    tensor, request = pb_utils.Tensor._of, pb_utils.make_request
    for header in headers:
        count, key = header.count, header.key
        # `_value_`: the member's v2 name without the `value` property's descriptor call (per input tensor)
        inputs = [tensor(name, array, dt._value_) for name, dt, array in tensors[position:position + count]]
        position += count
        sender = pb_utils.InferenceResponseSender(key, sink) if key and sink is not None else None
        out.append(request(inputs, header.requested, header.request_id, header.correlation_id, header.flags,
                           header.parameters, sender))
    return out


class StubTransport(pb_utils.Transport):
    """BLS from the instance process: each request goes to the engine as a `Bls` frame; whichever thread reads
    its `BlsResult` (reading.py) resolves its future."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._ids = itertools.count(1)
        self.calls: dict[int, Future[pb_utils.InferenceResponse]] = {}
        self.waiting: Callable[[], None] = lambda: None  # a call is out: its answer must be read (reading.py)

    def submit(self, request: pb_utils.InferenceRequest) -> Future[pb_utils.InferenceResponse]:
        future: Future[pb_utils.InferenceResponse] = Future()
        call = next(self._ids)
        self.calls[call] = future
        tensors = []
        for t in request.inputs():
            if not isinstance(t, pb_utils.Tensor):
                self.calls.pop(call)
                future.set_result(_error_response(f"BLS inputs must be pb_utils.Tensor, got "
                                                  f"{type(t).__name__}"))
                return future
            tensors.append((t.name(), _datatype(t), t.as_numpy()))
        try:
            self._channel.send(Bls(call, request.model_name, request.model_version, request.request_id(),
                                   request.correlation_id(), request.flags(), request.timeout(),
                                   request.parameters(), request.requested_output_names()), tensors)
        except (EngineError, ChannelClosed) as e:
            self.calls.pop(call, None)
            future.set_result(_error_response(f"BLS request could not be sent: {e}"))
            return future
        self.waiting()
        return future

    def answered(self, result: BlsResult, tensors: list[Received]) -> None:
        future = self.calls.pop(result.call, None)
        if future is None:
            return
        error = result.error
        if error is not None:
            future.set_result(pb_utils.InferenceResponse(
                error=pb_utils.TritonError(error.message, getattr(pb_utils.TritonError, error.code, 1))))
            return
        outputs = [pb_utils.Tensor._of(name, array, dt._value_) for name, dt, array in tensors]
        future.set_result(pb_utils.InferenceResponse(outputs, parameters=result.parameters))


def _datatype(tensor: pb_utils.Tensor) -> DataType:
    return DataType.from_v2(tensor.datatype())


def _error_response(message: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


def answer_frame(answers: list[Any]) -> tuple[list[Answer], list[Any]]:
    """A batch's answers as its Result frame carries them: one message per answer, the outputs in order."""
    metas: list[Answer] = []
    outputs: list[Any] = []
    for answer in answers:
        if answer[0] == "ok":
            metas.append(Ok(len(answer[1]), answer[2]))
            outputs.extend(answer[1])
        else:
            metas.append(Error(answer[1], answer[2]))
    return metas, outputs


def router(channel: Channel, transport: StubTransport, sink: StubSink) -> Route:
    """What becomes of a frame that is not work, on whichever thread read it (reading.py)."""

    def route(message: Any, tensors: list[Received]) -> None:
        if isinstance(message, Ping):
            channel.send(Pong(message.n))
        elif isinstance(message, BlsResult):
            transport.answered(message, tensors)
        elif isinstance(message, Cancel):
            sink.cancelled.add(message.key)
            sink.credits.cancel(message.key)
        elif isinstance(message, SendCredit):
            sink.credits.grant(message.key, message.count)

    return route


def serve(channel: Channel, runner: ModelRunner, reading: Reading, sink: StubSink) -> None:
    """The main thread's loop: read each batch, run it and answer it; finalize and say goodbye."""
    while True:
        message, tensors = reading.next_work()
        if isinstance(message, Finalize):
            channel.send(Bye(runner.finalize()))
            return
        batch = message.batch
        requests = requests_from(message.requests, tensors, sink)
        del tensors
        try:
            answers = runner.execute(requests)
        except ModelError as e:
            for request in requests:  # the engine fails those not finished with this error
                sender = getattr(request, "_sender", None)
                if sender is not None:
                    sender.close()
                    sink.credits.finished(sender._key)
            del requests
            channel.send(Result(batch, str(e), []))
            continue
        del requests  # the inputs' views: their blocks go back with this frame where nothing else holds them
        metas, outputs = answer_frame(answers)
        try:
            channel.send(Result(batch, None, metas), outputs)
        except EngineError as e:  # e.g. a tensor no wire form fits
            channel.send(Result(batch, f"the responses could not be sent: {e.message}", []))


def main(argv: list[str]) -> int:
    sock_fd, own_fd, own_size, peer_fd, peer_size = (int(a) for a in argv)
    sock = socket.socket(fileno=sock_fd)
    channel = instance_side(sock, Region.attach(own_fd, own_size, "instance-out"),
                            Region.attach(peer_fd, peer_size, "instance-in"))
    init, _ = channel.recv()
    if not isinstance(init, Init):
        channel.send(InitFailed(f"the engine sent {type(init).__name__} before Init"))
        return 1
    # The engine's output pump reads the level from the \x1f marks and logs the line under the instance.
    logging.basicConfig(level=init.log_level, stream=sys.stderr, format="\x1f%(levelno)d\x1f%(message)s")
    pb_utils.set_logger_name(f"hubserve.python.{init.instance_name}")
    model_dir = Path(init.model_dir)
    try:
        runner = ModelRunner(Path(init.model_file), init.args, model_dir, init.shown)
    except ModelError as e:
        channel.send(InitFailed(str(e)))
        return 1
    transport = StubTransport(channel)
    pb_utils.set_transport(transport)
    sink = StubSink(channel)
    reading = Reading(channel, router(channel, transport, sink), lambda: os._exit(0))
    transport.waiting = sink.credits.waiting = reading.want  # their answers are read at once
    channel.send(Ready())
    serve(channel, runner, reading, sink)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
