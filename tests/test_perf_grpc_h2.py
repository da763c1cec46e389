"""The lean gRPC client's wire pieces. Its conversations with real servers are covered by test_perf_tool.py
(hubserve) and the agreement check against perf_analyzer (perf/agreement.py)."""

from __future__ import annotations

import hpack

from engine.perf.grpc_h2 import DATA, END_STREAM, frame, request_header_block


def test_request_headers_decode_and_leave_the_dynamic_table_alone() -> None:
    block = request_header_block("127.0.0.1:8001", "/inference.GRPCInferenceService/ModelInfer")
    decoder = hpack.Decoder()
    headers = decoder.decode(block, raw=True)
    assert headers == [(b":method", b"POST"), (b":scheme", b"http"),
                       (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
                       (b":authority", b"127.0.0.1:8001"), (b"content-type", b"application/grpc"),
                       (b"te", b"trailers")]
    # Sent unchanged on every stream, so it must not add entries the server would have to track.
    assert len(decoder.header_table.dynamic_entries) == 0
    assert decoder.decode(block, raw=True) == headers


def test_long_header_values_use_multi_byte_lengths() -> None:
    authority = "h" * 300 + ":1"
    headers = dict(hpack.Decoder().decode(request_header_block(authority, "/x"), raw=True))
    assert headers[b":authority"] == authority.encode()


def test_frame_layout() -> None:
    payload = b"\x00\x00\x00\x00\x02hi"
    raw = frame(DATA, END_STREAM, 5, payload)
    assert raw[:3] == len(payload).to_bytes(3, "big")
    assert raw[3] == DATA and raw[4] == END_STREAM
    assert int.from_bytes(raw[5:9], "big") == 5
    assert raw[9:] == payload
