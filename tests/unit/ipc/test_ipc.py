"""The frame codec and tensor placement both process channels speak (engine/ipc/), with no process: frames
cut from any split of the byte stream, metadata its codec cannot read refused, tensors placed in an arena
block or inline and read back exactly, and a peer's block handed back only once the last view of it is
gone. The frames here carry untyped MessagePack (each real channel passes its typed codec:
test_worker_messages.py, test_python_channel.py)."""

from __future__ import annotations

import gc
import os
from typing import Any

import msgspec
import numpy as np
import pytest

from engine.errors import EngineError
from engine.ipc.frames import HEAD, FrameError, FrameReader, encode_frame
from engine.ipc.tensors import Inline, PeerBlocks, Reads, place, read_arrays, wire_chunks
from engine.shm.regions import Arena, Region
from engine.types import DataType, Tensor


def decode_meta(data: memoryview) -> Any:
    """Untyped MessagePack, with the codec contract: FrameError for what it cannot read."""
    try:
        return msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise FrameError(f"unreadable frame metadata: {e}") from None


def ipc_frame(meta: Any, inline: list[Any] | tuple[Any, ...] = ()) -> list[Any]:
    return encode_frame(meta, inline, msgspec.msgpack.encode)


def frame_reader() -> FrameReader:
    return FrameReader(decode_meta)


def _stream(*frames: list) -> bytes:
    return b"".join(bytes(part) for parts in frames for part in parts)


def test_frames_survive_any_split_of_the_stream() -> None:
    first = ipc_frame(["a", [1, 2]], [b"xyz", memoryview(b"0123456789")])
    second = ipc_frame({"k": None})
    third = ipc_frame(["big"], [bytes(range(256)) * 1000])
    data = _stream(first, second, third)
    for step in (1, 7, HEAD.size, 1000, len(data)):
        frames = frame_reader()
        got = []
        for pos in range(0, len(data), step):
            got.extend(frames.feed(data[pos:pos + step]))
        assert [meta for meta, _ in got] == [["a", [1, 2]], {"k": None}, ["big"]], step
        assert bytes(got[0][1]) == b"xyz0123456789"
        assert bytes(got[1][1]) == b""
        assert bytes(got[2][1]) == bytes(range(256)) * 1000


def test_a_frame_that_is_not_one_is_refused() -> None:
    with pytest.raises(FrameError):
        frame_reader().feed(HEAD.pack(4, 9) + b"abcd")  # metadata longer than the payload
    with pytest.raises(FrameError):
        frame_reader().feed(HEAD.pack(3, 3) + b"\xc1\x01\x02")  # not MessagePack (0xc1 is never used)


def test_a_declared_size_costs_only_the_bytes_that_arrive() -> None:
    """A head declaring 1 GiB, then a little of it: the reader holds what came, not the 1 GiB declared (a
    broken or hostile peer, a Python model's process, must not make the engine allocate at its word)."""
    import tracemalloc

    frames = frame_reader()
    tracemalloc.start()
    try:
        assert frames.feed(HEAD.pack(1 << 30, 10) + b"x" * 1000) == []
        for _ in range(100):
            assert frames.feed(b"y" * 1000) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def _tensors() -> list[Tensor]:
    fp = np.arange(12, dtype=np.float32).reshape(3, 4)
    text = np.array([b"a", b"", "\u00e9".encode()], dtype=object)
    empty = np.zeros((0, 4), dtype=np.int64)
    return [Tensor("FP", DataType.FP32, fp.shape, fp), Tensor("TEXT", DataType.BYTES, text.shape, text),
            Tensor("EMPTY", DataType.INT64, empty.shape, empty)]


@pytest.mark.parametrize("inline_below", [0, 1 << 20])
def test_tensors_round_trip_through_a_block_or_inline(inline_below: int) -> None:
    region = Region.create(1 << 16)
    arena = Arena(region)
    inline = Inline()
    tensors = _tensors()
    placement = place(wire_chunks(tensors), arena, region, inline, inline_below)
    assert (placement[0] >= 0) == (inline_below == 0)
    raw = memoryview(b"".join(bytes(p) for p in inline.take()))
    specs = [(t.name, t.datatype, t.shape) for t in tensors]
    for got, want in zip(read_arrays(specs, placement, region, raw), tensors, strict=True):
        assert got.shape == want.data.shape and got.dtype == want.data.dtype
        assert got.tolist() == want.data.tolist()
    if placement[0] >= 0:
        arena.free(placement[0])
    assert arena.live_blocks == 0


def _fixed_size_tensors() -> list[Tensor]:
    fp = np.arange(6, dtype=np.float32).reshape(2, 3)
    ints = np.arange(16, dtype=np.int32).reshape(1, 16)
    flags = np.array([True, False, True], dtype=np.bool_)
    return [Tensor("FP", DataType.FP32, fp.shape, fp), Tensor("INT", DataType.INT32, ints.shape, ints),
            Tensor("FLAGS", DataType.BOOL, flags.shape, flags)]


@pytest.mark.parametrize("inline_below", [0, 1 << 20])
def test_reads_worked_out_once_read_every_message_of_their_header(inline_below: int) -> None:
    """`Reads` (what the engine keeps per plan and a frontend per answer header) reads fixed-size tensors
    message after message as the general path does: same values, dtypes, shapes and writability."""
    region = Region.create(1 << 16)
    arena = Arena(region)
    tensors = _fixed_size_tensors()
    reads = Reads([(t.name, t.datatype, t.shape) for t in tensors])
    for _ in range(3):
        inline = Inline()
        placement = place(wire_chunks(tensors), arena, region, inline, inline_below)
        raw = memoryview(b"".join(bytes(p) for p in inline.take()))
        got = read_arrays(reads, placement, region, raw)
        general = read_arrays([(t.name, t.datatype, t.shape) for t in tensors], placement, region, raw)
        for array, other, want in zip(got, general, tensors, strict=True):
            assert array.shape == want.shape and array.dtype == want.data.dtype
            assert array.tolist() == want.data.tolist() == other.tolist()
            assert array.flags.writeable == (placement[0] >= 0)  # a region's views are writable, bytes not
        if placement[0] >= 0:
            arena.free(placement[0])


def test_a_message_that_does_not_match_its_reads_gets_the_general_error() -> None:
    reads = Reads([("INPUT0", DataType.INT32, (1, 16))])
    raw = memoryview(bytes(128))
    with pytest.raises(EngineError, match=r"input 'INPUT0': shape \[1, 16\] of INT32 needs 64 bytes, got 60"):
        read_arrays(reads, (-1, ((0, 60),)), None, raw)
    with pytest.raises(EngineError, match="needs 64 bytes, got 28"):  # runs past the frame's bytes
        read_arrays(reads, (-1, ((100, 64),)), None, raw)


def test_an_array_read_from_a_region_keeps_its_mapping_after_close() -> None:
    region = Region.create(1 << 16)
    arena = Arena(region)
    tensors = _fixed_size_tensors()
    placement = place(wire_chunks(tensors), arena, region, Inline(), 0)
    reader = Region.attach(os.dup(region.fd), region.size)
    arrays = read_arrays(Reads([(t.name, t.datatype, t.shape) for t in tensors]), placement, reader,
                         memoryview(b""))
    reader.close()  # the unmap waits for the arrays (engine/shm/regions.py): reading them must not fault
    gc.collect()
    assert [a.tolist() for a in arrays] == [t.data.tolist() for t in tensors]


def test_a_small_frame_is_one_buffer_and_a_large_one_is_gathered() -> None:
    small = ipc_frame(["m"], [memoryview(bytes(64)), b"xy"])
    assert len(small) == 1 and isinstance(small[0], bytes)
    big_part = memoryview(bytes(1 << 17))
    big = ipc_frame(["m"], [big_part])
    assert len(big) == 3 and big[2] is big_part  # not copied
    for encoded, inline in ((small, bytes(64) + b"xy"), (big, bytes(1 << 17))):
        [(meta, got)] = frame_reader().feed(_stream(encoded))
        assert meta == ["m"] and bytes(got) == inline


def test_a_full_arena_sends_the_bytes_inline() -> None:
    region = Region.create(4096)
    arena = Arena(region)
    inline = Inline()
    big = np.ones(2048, dtype=np.float32)  # 8 KiB: more than the arena holds
    placement = place(wire_chunks([Tensor("X", DataType.FP32, big.shape, big)]), arena, region, inline, 0)
    assert placement[0] == -1 and inline.size == big.nbytes and arena.live_blocks == 0


def test_a_response_block_is_freed_when_its_last_view_is_gone() -> None:
    region = Region.create(1 << 16)
    arena = Arena(region)
    tensors = _tensors()[:1]
    placement = place(wire_chunks(tensors), arena, region, Inline(), 0)
    reader = PeerBlocks(Region.attach(os.dup(region.fd), region.size), read_only=True)
    (array,) = reader.read([(t.name, t.datatype, t.shape) for t in tensors], placement, memoryview(b""))
    assert array.tolist() == tensors[0].data.tolist() and not array.flags.writeable
    kept = array.reshape(-1)[4:].data.cast("B")  # what a transport holding the answer's bytes would keep
    del array
    gc.collect()
    assert not reader.has_freed
    del kept
    assert reader.take_freed() == [placement[0]] and reader.take_freed() == []



def test_arrays_read_inline_hold_the_frame_bytes_and_their_read_only_ness() -> None:
    """Reads builds each view with `np.ndarray(..., buffer, offset)`, which given a memoryview would keep
    only the object under it and drop the buffer export: the views must still pin the bytes they read."""
    tensors = _fixed_size_tensors()
    specs = [(t.name, t.datatype, t.shape) for t in tensors]
    inline = Inline()
    placement = place(wire_chunks(tensors), None, None, inline, 0)
    frame = bytearray(b"".join(bytes(p) for p in inline.take()))
    arrays = read_arrays(Reads(specs), placement, None, memoryview(frame))
    with pytest.raises(BufferError):  # a reader reusing its buffer cannot resize it under the views
        frame.extend(b"x")
    assert all(a.flags.writeable for a in arrays)
    assert [a.tolist() for a in arrays] == [t.data.tolist() for t in tensors]
    frozen = read_arrays(Reads(specs), placement, None, memoryview(bytes(frame)))
    assert not any(a.flags.writeable for a in frozen)
    assert [a.shape for a in frozen] == [t.shape for t in tensors]
