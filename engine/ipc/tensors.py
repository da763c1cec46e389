"""A message's tensor bytes across a process channel: into one shared-memory arena block, or inline in the
frame (frames.py), and the numpy views the receiver makes of them.

The sender copies a message's tensors once, into one block of the arena it alone writes (`place`); the frame
then carries only the placement (block, ((offset, nbytes), ...)). With no room in the arena, or for tensors
too small in all to be worth a block, the bytes go inline: listed as buffers after the frame's metadata,
addressed by their offset there, block -1. BYTES tensors travel in their wire form (4-byte little-endian
length, then the bytes, per element; `array_to_bytes`), so numpy object arrays are never pickled.

The receiver reads the arrays back as views (`read_arrays`, `PeerBlocks.read`), their sizes checked again
(`Reads`, worked out once where a header repeats: the engine's plans, a frontend's answers). Who frees a
block is the channel's business: the engine frees a frontend's request blocks by protocol (every request is
answered once); a frontend's answers and a Python instance's messages are read through `PeerBlocks`, whose
arrays are all views of one `BlockOwner` per block, so the block is reported freed exactly when the last
view is gone, in whatever thread or task held it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..frontend.wire import array_from_bytes, array_to_bytes
from ..shm.regions import Arena, Region
from ..types import DataType, Tensor, element_count

ALIGN = 64  # each tensor's offset inside a block: every numpy dtype's alignment, and a cache line

# A tensor's location: (offset, nbytes), from the block's start (block >= 0) or the frame's inline bytes.
Location = tuple[int, int]
Placement = tuple[int, tuple[Location, ...]]
# What a receiver makes of a located tensor: its name, datatype and shape.
Spec = tuple[str, DataType, tuple[int, ...]]


class Inline:
    """The inline bytes of the frame being built: buffers in order, and how many bytes they make."""

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.size = 0

    def add(self, chunk: Any) -> int:
        offset = self.size
        if len(chunk):
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
    """Put `chunks` where the reader will find them: one block of `arena` (over `region`) for all of them
    when it has room and they are not all under `inline_below` bytes, else inline. Returns (block offset or
    -1, locations). Not thread-safe: a channel written from several threads holds its lock around it.
    Runs for every message: one pass for the sizes, and the inline case appends to `inline` directly."""
    sizes = []
    total = 0
    for chunk in chunks:
        n = len(chunk)
        sizes.append(n)
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
    parts, offset = inline.parts, inline.size
    inline_locations = []
    for chunk, n in zip(chunks, sizes, strict=True):
        inline_locations.append((offset, n))
        if n:
            parts.append(chunk)
            offset += n
    inline.size = offset
    return -1, tuple(inline_locations)


class Reads:
    """What a receiver makes of one message's located tensors (`specs`), worked out once where the same
    header repeats (the engine keeps one per request plan; a frontend one per answer header): each tensor's
    numpy dtype and byte size, so reading it is a size check and one numpy call (`arrays`). A message that
    does not match (another size, a location outside the bytes) and BYTES tensors take the general path
    (`array_from_bytes`), which raises the error a client sees."""

    __slots__ = ("_fixed", "specs")

    def __init__(self, specs: Sequence[Spec]) -> None:
        self.specs = tuple(specs)
        fixed: list[tuple[np.dtype, tuple[int, ...], int, int, bool]] = []
        for _, datatype, shape in self.specs:
            count = element_count(shape)
            if datatype is DataType.BYTES or count <= 0:
                break
            fixed.append((np.dtype(datatype.numpy_dtype), shape, count, count * datatype.itemsize,
                          len(shape) != 1))
        self._fixed = fixed if len(fixed) == len(self.specs) else None

    def arrays(self, locations: Sequence[Location], base: Any) -> list[np.ndarray]:
        """The arrays at `locations` in `base` (a memoryview, or a uint8 array over a block), as views.
        `np.frombuffer` keeps its buffer (the memoryview, or the array) as the array's base, so the mapping
        under it stays mapped while the array lives (engine/shm/regions.py).

        Over a block (a uint8 array), a tensor of more than one dimension is one `np.ndarray(shape, dtype,
        base, offset)` call instead of `np.frombuffer` + `reshape` (0.4-0.6 against 0.55-0.95 µs); a
        1-D one stays `np.frombuffer`, which is cheaper still. Not over a memoryview: given one,
        `np.ndarray` keeps only the object under it as the base and releases the buffer export, so an mmap
        could be unmapped (or a bytearray resized) under a live view; wrapping the memoryview in a uint8
        array first costs more than it saves for the one or two tensors of a typical message. Offsets and
        sizes are checked here before numpy sees them; read-only-ness comes from the buffer either way."""
        fixed = self._fixed
        if fixed is not None and len(locations) == len(fixed):
            size = len(base)
            arrays = []
            frombuffer = np.frombuffer
            if type(base) is np.ndarray:
                new = np.ndarray
                for (dtype, shape, count, nbytes, reshape), (offset, n) in zip(fixed, locations, strict=True):
                    if n != nbytes or offset < 0 or offset + n > size:
                        break
                    arrays.append(new(shape, dtype, base, offset) if reshape
                                  else frombuffer(base, dtype, count, offset))
                else:
                    return arrays
            else:
                for (dtype, shape, count, nbytes, reshape), (offset, n) in zip(fixed, locations, strict=True):
                    if n != nbytes or offset < 0 or offset + n > size:
                        break
                    array = frombuffer(base, dtype, count, offset)
                    arrays.append(array.reshape(shape) if reshape else array)
                else:
                    return arrays
        return _arrays(self.specs, locations, base)


def _arrays(specs: Sequence[Spec], locations: Sequence[Location], base: Any) -> list[np.ndarray]:
    return [array_from_bytes(name, datatype, shape, base[offset:offset + nbytes])
            for (name, datatype, shape), (offset, nbytes) in zip(specs, locations, strict=True)]


def _end(locations: Sequence[Location]) -> int:
    return max((o + n for o, n in locations), default=0)


def read_arrays(specs: Reads | Sequence[Spec], placement: Placement, region: Region | None,
                inline: memoryview) -> list[np.ndarray]:
    """The arrays of `specs` at `placement`, as views over `region` (the peer's, for a block) or the frame's
    inline bytes, for a receiver that frees blocks by protocol rather than by the views' lifetime."""
    reads = specs if isinstance(specs, Reads) else Reads(specs)
    block, locations = placement
    base: Any = inline
    if block >= 0:
        if region is None:
            raise ValueError("a tensor in shared memory, but this side maps no peer region")
        base = region.view(block, _end(locations))  # checks the range
    return reads.arrays(locations, base)


class BlockOwner:
    """The base of every array read from one block of the peer's region. When the last of them is gone,
    `__del__` reports the block's offset to the `PeerBlocks` it came from."""

    __slots__ = ("__array_interface__", "_freed", "_offset", "_pin")

    def __init__(self, pin: np.ndarray, address: int, offset: int, nbytes: int, read_only: bool,
                 freed: list[int]) -> None:
        self._pin = pin  # the view that keeps the mapping alive while any array of this block exists
        self._offset = offset
        self._freed = freed
        self.__array_interface__ = {"data": (address + offset, read_only), "shape": (nbytes,),
                                    "typestr": "|u1", "version": 3}

    def __del__(self) -> None:
        self._freed.append(self._offset)  # atomic under the GIL, in whichever thread dropped the last view


class PeerBlocks:
    """A receiver's side of the peer's region, for blocks freed by their views' lifetime: `read` makes the
    arrays of one message, `take_freed` the offsets of the blocks no longer viewed (to send to the peer, who
    frees them in its arena). `read_only` is the flag the arrays carry."""

    __slots__ = ("_address", "_freed", "_pin", "_read_only")

    def __init__(self, region: Region, read_only: bool) -> None:
        self._pin = np.frombuffer(region.view(0, region.size), np.uint8)
        self._address = int(self._pin.ctypes.data)
        self._read_only = read_only
        self._freed: list[int] = []

    def block(self, offset: int, nbytes: int) -> np.ndarray:
        if offset < 0 or nbytes < 0 or offset + nbytes > self._pin.size:
            raise ValueError(f"block {offset}+{nbytes} is outside the peer region of {self._pin.size} bytes")
        return np.asarray(BlockOwner(self._pin, self._address, offset, nbytes, self._read_only, self._freed))

    def read(self, specs: Reads | Sequence[Spec], placement: Placement, inline: memoryview
             ) -> list[np.ndarray]:
        block, locations = placement
        base: Any = self.block(block, _end(locations)) if block >= 0 else inline
        reads = specs if isinstance(specs, Reads) else Reads(specs)
        return reads.arrays(locations, base)

    @property
    def has_freed(self) -> bool:
        return bool(self._freed)

    def take_freed(self) -> list[int]:
        """The blocks freed since the last call. Safe against a view dying in another thread meanwhile:
        what is appended after the length is read stays for the next call."""
        freed = self._freed
        n = len(freed)
        taken = freed[:n]
        del freed[:n]
        return taken

    def return_freed(self, offsets: list[int]) -> None:
        """Give back what `take_freed` returned when the frame meant to carry it could not be sent."""
        self._freed.extend(offsets)
