"""How large a message read in place may be: both protocols read a large message (an HTTP body with a
Content-Length, an HTTP/2 DATA frame) straight from the socket into a buffer of its own, handed to the
transport by a `BufferedProtocol`'s `get_buffer`, instead of into a bytes object per read that is then
joined. The buffer is sized from the declared length, but never more than `IN_PLACE_GROWTH` times what the
client has sent of that message (and at least `IN_PLACE_BYTES`): a head declaring 1 MiB, then silence, holds
64 KiB. It grows as the message arrives, by a new buffer and one copy (never a resize: the transport may
still hold a view of the old one).
"""

from __future__ import annotations

import numpy as np

IN_PLACE_BYTES = 1 << 16  # a message this large is read in place; a smaller one arrives in the usual reads
IN_PLACE_GROWTH = 16  # a buffer read in place is at most this many times the bytes sent of its message


def in_place_size(length: int, need: int, sent: int) -> int:
    """The buffer for a message of `length` bytes that must hold `need` bytes now, `sent` bytes of it (and
    of its head) having arrived."""
    return min(length, max(need, IN_PLACE_BYTES, IN_PLACE_GROWTH * sent))


def unfilled(size: int) -> memoryview:
    """A writable buffer of `size` bytes that is not zeroed (every byte is read into before it is used):
    `bytearray(size)` would write the whole of it once more."""
    return np.empty(size, np.uint8).data
