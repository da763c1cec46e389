"""engine/frontend/compression.py: plain functions, no server. What the frontends make of its answers (413,
415, RESOURCE_EXHAUSTED, UNIMPLEMENTED) is tested against real servers in test_http_api.py and test_h2.py."""

from __future__ import annotations

import gzip
import zlib

import pytest

from engine.errors import EngineError, ErrorCode
from engine.frontend import compression
from engine.frontend.compression import TooLarge, UnsupportedEncoding

DATA = b"hubserve " * 1000


def bomb(encoding: str, size: int) -> bytes:
    """`size` zero bytes compressed, built in chunks so the test never holds them all."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
    chunk = bytes(1 << 20)
    out = [deflater.compress(chunk) for _ in range(size >> 20)]
    return b"".join(out) + deflater.flush()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_round_trip_and_the_formats_clients_write(encoding):
    encoded = compression.encode(encoding, [DATA[:10], DATA[10:]])
    assert compression.decode(encoding, encoded, len(DATA)) == DATA
    # What tritonclient.http sends (gzip.compress, zlib.compress) and grpc's gzip/deflate.
    written = gzip.compress(DATA) if encoding == "gzip" else zlib.compress(DATA)
    assert compression.decode(encoding, memoryview(written), len(DATA)) == DATA
    assert compression.decode(encoding.upper(), written, len(DATA)) == DATA  # codings are case-insensitive


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_output_is_bounded_by_the_limit(encoding):
    data = compression.encode(encoding, [DATA])
    assert compression.decode(encoding, data, len(DATA)) == DATA  # exactly the limit is fine
    with pytest.raises(TooLarge) as e:
        compression.decode(encoding, data, len(DATA) - 1)
    assert e.value.code is ErrorCode.RESOURCE_EXHAUSTED


def test_a_bomb_is_refused_without_inflating_it():
    data = bomb("gzip", 256 << 20)  # 256 MiB of zeros in ~250 KB
    assert len(data) < 1 << 20
    with pytest.raises(TooLarge):
        compression.decode("gzip", data, 1 << 20)


@pytest.mark.parametrize("data", [b"not compressed", gzip.compress(DATA)[:-12],
                                  gzip.compress(DATA) + b"junk"],
                         ids=["garbage", "truncated", "trailing bytes"])
def test_corrupt_data_is_invalid(data):
    with pytest.raises(EngineError) as e:
        compression.decode("gzip", data, 1 << 20)
    assert e.value.code is ErrorCode.INVALID_ARG and not isinstance(e.value, TooLarge)


def test_unsupported_encoding_names_what_is_accepted():
    with pytest.raises(UnsupportedEncoding) as e:
        compression.decode("snappy", b"x", 100)
    assert "snappy" in e.value.message and "gzip" in e.value.message


@pytest.mark.parametrize("header, want", [
    ("gzip", "gzip"), ("deflate", "deflate"), ("br, deflate;q=0.5, gzip", "deflate"),
    ("gzip;q=0, deflate", "deflate"), ("GZIP", "gzip"), ("identity", None), ("br", None), ("", None),
    ("gzip; q=0.0", None), ("gzip;q=0.001", "gzip"),
])
def test_accepted(header, want):
    assert compression.accepted(header) == want


def test_accepted_encoding_reads_grpc_accept_encoding():
    assert compression.accepted_encoding("identity,deflate,gzip", "gzip")
    assert compression.accepted_encoding("identity, deflate, gzip", "deflate")
    assert not compression.accepted_encoding("identity", "gzip")
    assert compression.is_identity("") and compression.is_identity("identity")
    assert not compression.is_identity("gzip")
