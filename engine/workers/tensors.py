"""Tensor bytes across the process boundary: into a shared-memory arena block, or inline in the frame.

The writer of an arena (a frontend for its requests, the engine for its answers to that frontend) copies a
message's tensors once, into one block (`place`); the frame then carries only (block, ((offset, nbytes),
...)). With no room in the arena, or for a tensor too small to be worth a block, the bytes go inline: listed
as buffers after the frame's metadata (engine/workers/framing.py), addressed by their offset there, block -1.
BYTES tensors travel in their wire form (4-byte little-endian length, then the bytes, per element), so
numpy object arrays are never pickled.

The reader makes numpy views: over the arena (`region_arrays`) or over the received frame. A frontend reads
its answers through a `BlockOwner`: every array of one answer is a view of that object, so the block goes
back to the engine exactly when the last view is gone, whoever held it (an asyncio transport that queued
the bytes, an HTTP/2 stream waiting for window, a compression task).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..frontend.wire import array_from_bytes, array_to_bytes
from ..shm import Arena, Region
from ..types import DataType, Tensor

ALIGN = 16  # each tensor's offset inside a block: enough for every numpy dtype's alignment

# A tensor's location: (offset, nbytes), from the block's start (block >= 0) or the frame's inline bytes.
Location = tuple[int, int]
Placement = tuple[int, tuple[Location, ...]]


class Inline:
    """The inline bytes of the frame being built: buffers in order, and how many bytes they make."""

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.size = 0

    def add(self, chunk: Any) -> int:
        offset = self.size
        self.parts.append(chunk)
        self.size += len(chunk)
        return offset

    def take(self) -> list[Any]:
        parts, self.parts, self.size = self.parts, [], 0
        return parts


def wire_chunks(tensors: Sequence[Tensor]) -> list[Any]:
    """Each tensor's bytes in wire form (views where the array is contiguous, not copies)."""
    return [array_to_bytes(t.data, t.datatype) for t in tensors]


def place(chunks: Sequence[Any], arena: Arena | None, region: Region | None, inline: Inline,
          inline_below: int) -> Placement:
    """Put `chunks` where the reader will find them: one arena block for all of them when the arena has room
    and they are not all under `inline_below` bytes, else inline. Returns (block offset or -1, locations)."""
    sizes = [len(c) for c in chunks]
    total = 0
    for n in sizes:
        total = (total + ALIGN - 1) // ALIGN * ALIGN + n
    if arena is not None and region is not None and total >= inline_below and total > 0:
        block = arena.alloc(total)
        if block is not None:
            locations = []
            offset = 0
            for chunk, n in zip(chunks, sizes, strict=True):
                offset = (offset + ALIGN - 1) // ALIGN * ALIGN
                if n:
                    region.write(block + offset, chunk)
                locations.append((offset, n))
                offset += n
            return block, tuple(locations)
    return -1, tuple((inline.add(c), n) for c, n in zip(chunks, sizes, strict=True))


def read_arrays(specs: Sequence[tuple[str, DataType, tuple[int, ...]]], placement: Placement,
                region: Region | None, inline: memoryview) -> list[np.ndarray]:
    """The engine's side: the arrays of `specs` (name, datatype, shape) at `placement`, as views over the
    arena region (a block) or the frame's inline bytes. Sizes are checked again (array_from_bytes)."""
    block, locations = placement
    arrays = []
    for (name, datatype, shape), (offset, nbytes) in zip(specs, locations, strict=True):
        if block >= 0 and region is not None:
            buf: Any = region.view(block + offset, nbytes) if nbytes else b""
        else:
            buf = inline[offset:offset + nbytes]
        arrays.append(array_from_bytes(name, datatype, shape, buf))
    return arrays


class BlockOwner:
    """A frontend's handle on one block of its response arena, the base of every array made from it. When
    the last of them is gone, `__del__` hands the block's offset to `freed` (sent to the engine with the
    frontend's next frame)."""

    __slots__ = ("__array_interface__", "_freed", "_offset", "_pin")

    def __init__(self, pin: np.ndarray, address: int, offset: int, nbytes: int,
                 freed: Callable[[int], None]) -> None:
        self._pin = pin  # the view that keeps the mapping alive while any array of this block exists
        self._offset = offset
        self._freed = freed
        self.__array_interface__ = {"data": (address + offset, True), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}

    def __del__(self) -> None:
        self._freed(self._offset)


class ResponseArena:
    """A frontend's read side of its response arena: views of blocks the engine wrote, and the list of
    blocks it is done with."""

    __slots__ = ("_address", "_pin", "freed")

    def __init__(self, region: Region) -> None:
        self._pin = np.frombuffer(region.view(0, region.size), np.uint8)  # read-only use: answers only
        self._address = int(self._pin.ctypes.data)
        self.freed: list[int] = []

    def block(self, offset: int, nbytes: int) -> np.ndarray:
        if offset < 0 or nbytes < 0 or offset + nbytes > self._pin.size:
            raise ValueError(f"block {offset}+{nbytes} outside the response arena of {self._pin.size} bytes")
        return np.asarray(BlockOwner(self._pin, self._address, offset, nbytes, self.freed.append))


def read_outputs(specs: Sequence[tuple[str, DataType, tuple[int, ...]]], placement: Placement,
                 arena: ResponseArena | None, inline: memoryview) -> list[np.ndarray]:
    """The frontend's side: the arrays of an answer's outputs, views of its response block or of the
    frame's inline bytes."""
    block, locations = placement
    base: Any = inline
    if block >= 0:
        if arena is None:
            raise ValueError("an answer in the response arena, but this frontend has none")
        end = max((o + n for o, n in locations), default=0)
        base = arena.block(block, end)
    arrays = []
    for (name, datatype, shape), (offset, nbytes) in zip(specs, locations, strict=True):
        arrays.append(array_from_bytes(name, datatype, shape, base[offset:offset + nbytes]))
    return arrays
