"""The Python instances' channel (engine/backends/python/channel.py) over a real socketpair and two memfd
regions, no process: tensors cross through an arena block and come back freed once the receiver's views are
gone, and a frame whose metadata pickles a function call is refused without running it."""

from __future__ import annotations

import gc
import os
import pickle
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.backends.python.channel import Channel, ChannelClosed
from engine.ipc.frames import HEAD
from engine.shm.regions import Region
from engine.types import DataType


@pytest.fixture
def pair() -> Iterator[tuple[Channel, Channel]]:
    a_sock, b_sock = socket.socketpair()
    a_own, b_own = Region.create(1 << 20), Region.create(1 << 20)
    a = Channel(a_sock, a_own, Region.attach(os.dup(b_own.fd), b_own.size))
    b = Channel(b_sock, b_own, Region.attach(os.dup(a_own.fd), a_own.size))
    yield a, b
    a.close()
    b.close()


def test_tensors_cross_in_a_block_which_is_freed_with_the_last_view(pair: tuple[Channel, Channel]) -> None:
    a, b = pair
    big = np.arange(4096, dtype=np.float32)  # 16 KiB: over INLINE_BELOW, so it goes through a block
    text = np.array([b"x", b""], dtype=object)
    a.send({"id": 7}, [("BIG", DataType.FP32, big), ("TEXT", DataType.BYTES, text)])
    meta, received = b.recv()
    assert meta == {"id": 7} and a.arena_used_bytes > 0
    assert [(n, dt) for n, dt, _ in received] == [("BIG", DataType.FP32), ("TEXT", DataType.BYTES)]
    assert received[0][2].tolist() == big.tolist() and received[1][2].tolist() == [b"x", b""]
    del received
    gc.collect()
    b.send("done")  # carries the free
    assert a.recv() == ("done", []) and a.arena_used_bytes == 0


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
    with pytest.raises(ChannelClosed, match="only plain values"):
        b.recv()
    assert not marker.exists()
