"""The Python instances' channel (engine/backends/python/channel.py) over a real socketpair and two memfd
regions, no process: tensors cross through an arena block and come back freed once the receiver's views are
gone; a frame whose metadata pickles a function call is refused without running it, and so is a message of
the wrong direction or with a field of the wrong type."""

from __future__ import annotations

import gc
import os
import pickle
import socket
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest

from engine.backends.python.channel import Channel, ChannelClosed, engine_side, instance_side
from engine.backends.python.messages import Bye, Exec, Ping, Pong, RequestHeader
from engine.ipc.frames import HEAD
from engine.shm.regions import Region
from engine.types import DataType


@pytest.fixture
def pair() -> Iterator[tuple[Channel, Channel]]:
    a_sock, b_sock = socket.socketpair()
    a_own, b_own = Region.create(1 << 20), Region.create(1 << 20)
    a = engine_side(a_sock, a_own, Region.attach(os.dup(b_own.fd), b_own.size))
    b = instance_side(b_sock, b_own, Region.attach(os.dup(a_own.fd), a_own.size))
    yield a, b
    a.close()
    b.close()


def test_tensors_cross_in_a_block_which_is_freed_with_the_last_view(pair: tuple[Channel, Channel]) -> None:
    a, b = pair
    big = np.arange(4096, dtype=np.float32)  # 16 KiB: over INLINE_BELOW, so it goes through a block
    text = np.array([b"x", b""], dtype=object)
    batch = Exec(7, [RequestHeader("r", 0, 0, "{}", ["OUT"], 2, 0)])
    a.send(batch, [("BIG", DataType.FP32, big), ("TEXT", DataType.BYTES, text)])
    message, received = b.recv()
    assert message == batch and a.arena_used_bytes > 0
    assert [(n, dt) for n, dt, _ in received] == [("BIG", DataType.FP32), ("TEXT", DataType.BYTES)]
    assert received[0][2].tolist() == big.tolist() and received[1][2].tolist() == [b"x", b""]
    del received
    gc.collect()
    b.send(Bye(""))  # carries the free
    assert a.recv() == (Bye(""), []) and a.arena_used_bytes == 0


class _RunsCode:
    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[object, ...]:
        return os.mkdir, (self.path,)


def test_metadata_that_pickles_a_call_is_refused(pair: tuple[Channel, Channel], tmp_path: Path) -> None:
    a, b = pair
    marker = tmp_path / "ran"
    body = pickle.dumps((_RunsCode(marker), (), (-1, ()), []), protocol=pickle.HIGHEST_PROTOCOL)
    a.socket.sendall(HEAD.pack(len(body), len(body)) + body)
    with pytest.raises(ChannelClosed, match="unreadable frame"):
        b.recv()
    assert not marker.exists()


def _send_raw(channel: Channel, meta: object) -> None:
    body = msgspec.msgpack.encode(meta)
    channel.socket.sendall(HEAD.pack(len(body), len(body)) + body)


def test_a_message_of_the_other_direction_is_refused(pair: tuple[Channel, Channel]) -> None:
    a, b = pair
    b.send(Pong(1))
    assert a.recv() == (Pong(1), [])
    _send_raw(b, [Ping(1), [], [-1, []], []])  # a Ping is the engine's to send, never the instance's
    with pytest.raises(ChannelClosed, match="unreadable frame"):
        a.recv()


def test_a_field_of_the_wrong_type_is_refused(pair: tuple[Channel, Channel]) -> None:
    a, b = pair
    _send_raw(b, [["result", "one", None, []], [], [-1, []], []])  # a Result whose batch number is text
    with pytest.raises(ChannelClosed, match="unreadable frame"):
        a.recv()
