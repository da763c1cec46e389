"""gRPC's message layer (engine/frontend/grpc/messages.py), pure: framing, decompression and the
response encoding, without a server. End to end: test_h2.py (the bare client) and test_parity.py
(tritonclient.grpc's compression_algorithm)."""

from __future__ import annotations

import gzip

import pytest

from engine.frontend.grpc.handlers import GrpcStatus
from engine.frontend.grpc.messages import (
    ACCEPT_ENCODING,
    PREFIX,
    MessageError,
    decompress,
    frame,
    response_encoding,
    response_head,
)
from engine.frontend.grpc.rpcs import RESPONSE_HEAD


def test_an_uncompressed_message_is_prefixed_and_its_parts_kept_as_they_are() -> None:
    view = memoryview(b"tensor")
    parts = frame([b"head", view], 10, None)
    assert parts[0] == PREFIX.pack(0, 10)
    assert parts[1] == b"head" and parts[2] is view


def test_a_compressed_message_round_trips_within_the_limit() -> None:
    flag, length = PREFIX.unpack(frame([b"abc", b"def"], 6, "gzip")[0])
    body = frame([b"abc", b"def"], 6, "gzip")[1]
    assert (flag, length) == (1, len(body))
    assert decompress(flag, "gzip", memoryview(body), 6) == b"abcdef"


@pytest.mark.parametrize(("flag", "encoding", "limit", "status"), [
    (2, "gzip", 100, GrpcStatus.INTERNAL),  # a Compressed-Flag other than 0 or 1
    (1, "identity", 100, GrpcStatus.INTERNAL),  # marked compressed, no grpc-encoding
    (1, "snappy", 100, GrpcStatus.UNIMPLEMENTED),  # an encoding we lack
    (1, "gzip", 10, GrpcStatus.RESOURCE_EXHAUSTED),  # inflates past the message limit
])
def test_an_unreadable_message_names_the_status_the_call_ends_with(flag: int, encoding: str, limit: int,
                                                                   status: int) -> None:
    with pytest.raises(MessageError) as caught:
        decompress(flag, encoding, memoryview(gzip.compress(b"x" * 1000)), limit)
    assert caught.value.status == status
    assert caught.value.extra == (ACCEPT_ENCODING if status == GrpcStatus.UNIMPLEMENTED else b"")


def test_responses_are_compressed_only_as_the_client_compresses_and_accepts() -> None:
    assert response_encoding("gzip", b"identity, gzip") == "gzip"
    assert response_encoding("gzip", b"identity") is None
    assert response_encoding("identity", b"gzip") is None
    assert response_head(None) == RESPONSE_HEAD
    assert response_head("gzip").startswith(RESPONSE_HEAD) and response_head("gzip") != RESPONSE_HEAD
