"""What the engine and a Python-model instance process say to each other: one typed message per kind.

Each frame on the instance channel (channel.py) is an envelope, `ToInstanceFrame` from the engine or
`ToEngineFrame` from the instance: the message, the headers of the tensors that travel beside it, where their
bytes are and the blocks of the receiver's region the sender no longer views. Each is a `msgspec.Struct`
encoded as a MessagePack array (array_like: no field names on the wire); the messages are tagged with their
kind ("exec", "result", ...: no tag is used in both directions), one union per direction. Decoding checks
every field's type, so an instance process that is compromised or broken can make the engine run no code by
what it sends, only break its own channel (FrameError, which the channel reports as ChannelClosed: the
instance's requests then fail as when it crashes), as the plain-values pickle did before.

A message's tensors are not fields of it: they are the frame's tensors, in order, and a message says how many
are whose (`RequestHeader.count`, `Ok.count`).

Engine → instance: `Init`, then `Exec` per batch, `BlsResult` per BLS request the model made, `Cancel` and
`SendCredit` for a decoupled model's requests, `Ping` about every second, `Finalize` at the end.
Instance → engine: `Ready` or `InitFailed`, then `Result` per `Exec`, `Resp` per send of a decoupled model,
`Bls` per BLS request, `Pong` per `Ping`, `Bye` after `Finalize`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...ipc.frames import FrameError
from ...ipc.tensors import Placement

# ------------------------------------------------------------------ parts


class TensorHeader(msgspec.Struct, array_like=True, frozen=True):
    """A tensor of the frame: its bytes are at the envelope's placement, in the order of the headers."""

    name: str
    datatype: str  # its v2 name
    shape: tuple[int, ...]


class RequestHeader(msgspec.Struct, array_like=True, frozen=True):
    """One request of a batch, as pb_utils.InferenceRequest reports it (backend.py `request_meta`):
    `parameters` compact JSON without the ones Triton makes request fields; `requested` the outputs it asked
    for (all the config's when it named none); `count` how many of the frame's tensors, from where the
    previous request's end, are its inputs; `key` names a decoupled model's request in `Resp`, `Cancel` and
    `SendCredit` (0: not decoupled, no response sender)."""

    request_id: str
    correlation_id: int | str
    flags: int  # 1: sequence start, 2: sequence end
    parameters: str
    requested: list[str]
    count: int
    key: int


class Ok(msgspec.Struct, array_like=True, frozen=True, tag="ok"):
    """A response: the next `count` tensors of the frame are its outputs; `parameters` compact JSON."""

    count: int
    parameters: str


class Error(msgspec.Struct, array_like=True, frozen=True, tag="error"):
    """A response's error (or a BLS request's): the name of its pb_utils code (pb_utils.py `CODE_NAMES`:
    "INTERNAL", "INVALID_ARG", ...) and its message."""

    code: str
    message: str


Answer = Ok | Error

# ------------------------------------------------------------------ engine → instance


class Init(msgspec.Struct, array_like=True, frozen=True, tag="init"):
    """The first frame: what the stub imports and initializes (process.py `LaunchSpec`). `args` is what
    `initialize(args)` gets; `shown` the model folder as messages name it; `log_level` the server's."""

    model_file: str
    model_dir: str
    shown: str
    args: dict[str, str]
    log_level: int
    instance_name: str


class Exec(msgspec.Struct, array_like=True, frozen=True, tag="exec"):
    """Run one batch (`batch` numbers it; the `Result` says it back); the frame's tensors are the requests'
    inputs, request after request."""

    batch: int
    requests: list[RequestHeader]


class BlsResult(msgspec.Struct, array_like=True, frozen=True, tag="bls_result"):
    """The answer to the model's `Bls` number `call`: an error, or the frame's tensors as its outputs with
    `parameters` (compact JSON)."""

    call: int
    error: Error | None
    parameters: str


class Cancel(msgspec.Struct, array_like=True, frozen=True, tag="cancel"):
    """The client of the decoupled request `key` left: its is_cancelled() turns true."""

    key: int


class SendCredit(msgspec.Struct, array_like=True, frozen=True, tag="credit"):
    """The client of the decoupled request `key` took `count` more responses, so the model may send that
    many more (send_credits.py)."""

    key: int
    count: int


class Ping(msgspec.Struct, array_like=True, frozen=True, tag="ping"):
    """Are you alive? (process.py's watchdog, about every second); answered with `Pong(n)` at once by the
    stub's reader thread, however busy the model is."""

    n: int


class Finalize(msgspec.Struct, array_like=True, frozen=True, tag="finalize"):
    """Call the model's finalize and say `Bye`; sent once, by `InstanceProcess.stop`."""


ToInstance = Init | Exec | BlsResult | Cancel | SendCredit | Ping | Finalize

# ------------------------------------------------------------------ instance → engine


class Ready(msgspec.Struct, array_like=True, frozen=True, tag="ready"):
    """The model is imported and initialized."""


class InitFailed(msgspec.Struct, array_like=True, frozen=True, tag="init_failed"):
    """The model's import or initialize failed: the error as users see it (runner.py `describe_exception`)."""

    text: str


class Result(msgspec.Struct, array_like=True, frozen=True, tag="result"):
    """Batch `batch`'s answers, one per request in order (the engine checks the count), their outputs the
    frame's tensors in order; or `error` (execute raised or its answers could not be sent) and no answers. A
    decoupled model's batch answers no requests here: its answers come as `Resp`."""

    batch: int
    error: str | None
    answers: list[Answer]


class Resp(msgspec.Struct, array_like=True, frozen=True, tag="resp"):
    """One send of a decoupled model for its request `key`: a response (`Ok`, its outputs the frame's
    tensors), its error, or nothing (None: the final flag alone); `final` on its last."""

    key: int
    final: bool
    answer: Answer | None


class Bls(msgspec.Struct, array_like=True, frozen=True, tag="bls"):
    """A BLS request of the model (pb_utils `exec` / `async_exec`), numbered `call` for its `BlsResult`; its
    inputs are the frame's tensors. `version` -1: the model's policy picks; `timeout_us` 0: none;
    `parameters` compact JSON; `outputs` the names it asked for."""

    call: int
    model: str
    version: int
    request_id: str
    correlation_id: int | str
    flags: int
    timeout_us: int
    parameters: str
    outputs: list[str]


class Pong(msgspec.Struct, array_like=True, frozen=True, tag="pong"):
    """The answer to `Ping(n)`."""

    n: int


class Bye(msgspec.Struct, array_like=True, frozen=True, tag="bye"):
    """finalize has run; `text` is its failure ("" when none)."""

    text: str


ToEngine = Ready | InitFailed | Result | Resp | Bls | Pong | Bye

# ------------------------------------------------------------------ envelopes


class ToInstanceFrame(msgspec.Struct, array_like=True):
    """A frame's metadata from the engine: the message, its tensors' headers, where their bytes are
    (engine/ipc/tensors.py) and offsets of the engine's views of the instance's region that it dropped."""

    message: ToInstance
    tensors: tuple[TensorHeader, ...]
    placement: Placement
    freed: list[int]


class ToEngineFrame(msgspec.Struct, array_like=True):
    """A frame's metadata from the instance: as `ToInstanceFrame`, the other way."""

    message: ToEngine
    tensors: tuple[TensorHeader, ...]
    placement: Placement
    freed: list[int]


Envelope = type[ToInstanceFrame] | type[ToEngineFrame]

_encoder = msgspec.msgpack.Encoder()
encode_envelope = _encoder.encode
_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {
    ToInstanceFrame: msgspec.msgpack.Decoder(ToInstanceFrame),
    ToEngineFrame: msgspec.msgpack.Decoder(ToEngineFrame),
}


def decoder(envelope: Envelope) -> Any:
    """The decode function for frames of `envelope`'s kind (a channel's incoming side): FrameError for
    anything else, a broken or hostile peer's."""
    decode = _decoders[envelope].decode

    def decode_envelope(data: memoryview) -> ToInstanceFrame | ToEngineFrame:
        try:
            return decode(data)  # type: ignore[no-any-return]
        except (msgspec.DecodeError, UnicodeDecodeError) as e:  # text that is not UTF-8 raises the latter
            raise FrameError(f"unreadable frame metadata: {e}") from None

    return decode_envelope
