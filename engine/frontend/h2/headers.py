"""Header blocks: HPACK decoding of what the peer sends (with the `hpack` library) — request heads with their
validation for the server, response heads for the client — and the few HPACK encodings our fixed blocks are
built from once, at import.

Why a cache: we advertise SETTINGS_HEADER_TABLE_SIZE 0. Once the client has acknowledged it (and shrunk its
encoder table to 0, RFC 7541 §4.2), no block can refer to or change the dynamic table, so equal bytes decode
to equal headers and each distinct block is decoded by `hpack` once. A client's request blocks repeat (same
path, authority, content type), so the hot path does a dict lookup instead of HPACK work.
"""

from __future__ import annotations

from typing import Any

import hpack

from ...bounded_cache import BoundedCache
from .frames import H2ConnectionError, H2Error

_CACHE_ENTRIES = 512  # distinct blocks kept (grpc-timeout values make blocks vary; bounded, then cleared)
_CONNECTION_SPECIFIC = frozenset((b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding",
                                  b"upgrade"))
_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":authority", b":path"))


class RequestHead:
    """A decoded request field block. `malformed` says why the request is malformed (§8.1.1), else "".
    `list_size` is the header list size as SETTINGS_MAX_HEADER_LIST_SIZE counts it (§6.5.2). Shared between
    requests through the cache: never mutate, but for `memo`, which the application may set once to what it
    concluded from these fields alone (grpc/head.py `CallHead`), so a request repeating a block seen before on
    its connection skips the work (the cache is per connection: so is anything the memo holds)."""

    __slots__ = ("fields", "list_size", "malformed", "memo")

    def __init__(self, fields: dict[bytes, bytes], malformed: str, list_size: int) -> None:
        self.fields = fields
        self.malformed = malformed
        self.list_size = list_size
        self.memo: Any = None


def _request_head(pairs: list[tuple[bytes, bytes]]) -> RequestHead:
    fields: dict[bytes, bytes] = {}
    size = 0
    malformed = ""
    regular_seen = False
    for name, value in pairs:
        size += len(name) + len(value) + 32
        if malformed:
            continue
        if name.startswith(b":"):
            if regular_seen:  # pseudo-header fields come first (§8.3)
                malformed = f"pseudo-header {name.decode('latin-1')} after a regular field"
            elif name not in _REQUEST_PSEUDO:  # only the request pseudo-headers are defined (§8.3.1)
                malformed = f"unknown pseudo-header {name.decode('latin-1')}"
            elif name in fields:
                malformed = f"duplicated pseudo-header {name.decode('latin-1')}"
        else:
            regular_seen = True
            if name != name.lower():  # §8.2.1
                malformed = f"uppercase field name {name.decode('latin-1')}"
            elif name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):  # §8.2.2
                malformed = f"connection-specific field {name.decode('latin-1')}"
        fields[name] = value
    if not malformed:
        for required in (b":method", b":scheme", b":path"):  # §8.3.1
            if not fields.get(required):
                malformed = f"missing or empty {required.decode()}"
                break
    return RequestHead(fields, malformed, size)


class HeaderDecoder:
    """One per connection: HPACK state is per connection (RFC 7541 §2.2). `decode` must see every field
    block the client sends, in order, even for streams that are refused or ignored (RFC 9113 §4.3)."""

    def __init__(self, max_block_bytes: int) -> None:
        # hpack's own list-size guard only protects memory; our advertised limit is checked by the caller.
        self._decoder = hpack.Decoder(max_header_list_size=4 * max_block_bytes + 4096)
        self._cache: BoundedCache[bytes, RequestHead] = BoundedCache(_CACHE_ENTRIES)
        # Once the table is 0 with 0 allowed, it stays 0 (a larger size update is an error): then known
        # without asking hpack's properties (two Python calls) for every block
        self._stateless = False

    def table_size_acknowledged(self) -> None:
        """The client acknowledged our SETTINGS_HEADER_TABLE_SIZE 0: a larger table is now an error."""
        self._decoder.max_allowed_table_size = 0

    def decode(self, block: bytes) -> RequestHead:
        """Raises hpack.HPACKError for a block that cannot be decoded: a connection error (§4.3)."""
        decoder = self._decoder
        stateless = self._stateless
        if not stateless:
            stateless = self._stateless = \
                decoder.max_allowed_table_size == 0 and decoder.header_table_size == 0
        if stateless:
            head = self._cache.get(block)
            if head is not None:
                return head
        head = _request_head(decoder.decode(block, raw=True))  # type: ignore[arg-type]
        if stateless:
            self._cache.put(block, head)
        return head


class ResponseDecoder:
    """The client's (the load tester's): response header blocks as dicts. We advertise a header table of 0 and
    treat it as in force from the start, as a server that never indexes (ours) allows: so, as above, each
    distinct block is decoded once and then looked up."""

    def __init__(self, max_block_bytes: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=4 * max_block_bytes + 4096)
        self._decoder.header_table_size = 0
        self._cache: BoundedCache[bytes, dict[bytes, bytes]] = BoundedCache(_CACHE_ENTRIES)

    def table_size_acknowledged(self) -> None:
        self._decoder.max_allowed_table_size = 0

    def decode(self, block: bytes) -> dict[bytes, bytes]:
        fields = self._cache.get(block)
        if fields is None:
            # bounded: distinct blocks (error messages) must not pile up
            fields = self._cache.put(block, dict(self._decoder.decode(block, raw=True)))  # type: ignore[arg-type]
        return fields


class FieldBlock:
    """A field block arriving as HEADERS then CONTINUATION frames (RFC 9113 §4.3, §6.10), bounded in bytes
    and in frames: either past its bound is a flood, not a request (§10.5), answered ENHANCE_YOUR_CALM. One
    per connection; `stream_id` is 0 while no block is open."""

    __slots__ = ("_fragments", "_frames", "_max_bytes", "_max_frames", "_size", "flags", "stream_id")

    def __init__(self, max_bytes: int, max_frames: int) -> None:
        self._max_bytes = max_bytes
        self._max_frames = max_frames
        self.clear()

    def clear(self) -> None:
        self.stream_id = 0
        self.flags = 0  # of the HEADERS frame (END_STREAM)
        self._fragments: list[bytes] = []
        self._size = 0
        self._frames = 0

    def start(self, stream_id: int, flags: int, fragment: bytes) -> None:
        """HEADERS without END_HEADERS."""
        self.stream_id, self.flags = stream_id, flags
        self._fragments = [fragment]
        self._size = len(fragment)
        self._frames = 1

    def add(self, stream_id: int, fragment: bytes, end: bool) -> bytes | None:
        """A CONTINUATION; returns the whole block once `end` (END_HEADERS), else None."""
        if stream_id != self.stream_id or not stream_id:  # §6.10
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, f"unexpected CONTINUATION on stream {stream_id}")
        self._fragments.append(fragment)
        self._size += len(fragment)
        self._frames += 1
        if self._size > self._max_bytes:
            raise H2ConnectionError(H2Error.ENHANCE_YOUR_CALM, "header block too large")
        if self._frames > self._max_frames:
            raise H2ConnectionError(H2Error.ENHANCE_YOUR_CALM,
                                    f"header block in more than {self._max_frames} frames")
        if not end:
            return None
        block = b"".join(self._fragments)
        self.clear()
        return block


# ---------------------------------------------------------------------------------- encoding (RFC 7541)

def hpack_integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer with an N-bit prefix (§5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value & 127 | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_string(raw: bytes) -> bytes:
    """A string literal without Huffman coding (§5.2)."""
    return hpack_integer(len(raw), 7, 0) + raw


def indexed(index: int) -> bytes:
    """A field from the static table (§6.1), e.g. 8 for `:status: 200` (Appendix A)."""
    return hpack_integer(index, 7, 0x80)


def literal(name: bytes | int, value: bytes) -> bytes:
    """A literal field without indexing (§6.2.2): it never touches the dynamic table, so a block made of
    these and static indices means the same on every stream and can be built once. `name` is a static-table
    index or a literal name."""
    if isinstance(name, int):
        return hpack_integer(name, 4, 0) + hpack_string(value)
    return b"\x00" + hpack_string(name) + hpack_string(value)
