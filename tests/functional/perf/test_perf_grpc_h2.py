"""The lean gRPC client's wire pieces, and how it spreads calls over connections against the real server. Its
measurements are covered by test_perf_tool.py (hubserve) and the agreement check against perf_analyzer
(perf/agreement.py)."""

from __future__ import annotations

import asyncio

import hpack
import numpy as np
import pytest

from conftest import RunningServer
from engine.frontend.h2.frames import DATA, END_STREAM, frame
from hubserve_perf.client import MODEL_INFER, grpc_request_bytes
from hubserve_perf.grpc_h2 import GrpcH2Client, request_header_block
from hubserve_perf.types import InputTensor, PerfError


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


def simple_request() -> bytes:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = (InputTensor("INPUT0", "INT32", (1, 16), a.tobytes()),
              InputTensor("INPUT1", "INT32", (1, 16), a.tobytes()))
    return grpc_request_bytes("simple", "", inputs, ())


@pytest.mark.parametrize("per_connection,calls,connections", [(6, 16, 3), (6, 4, 1), (0, 16, 1), (1, 5, 5)])
def test_calls_spread_over_connections_as_perf_analyzers_channels(
        server: RunningServer, per_connection: int, calls: int, connections: int) -> None:
    """perf_analyzer's client puts at most 6 requests in flight on one connection; so does ours by default."""
    host, port = server.grpc_url.split(":")

    async def run() -> tuple[int, list[tuple[int, int]]]:
        client = GrpcH2Client(host, int(port), MODEL_INFER, per_connection)
        try:
            wire = simple_request()
            results = await asyncio.gather(*(client.infer(wire) for _ in range(calls)))
            opened = client.connections
            # Sequential calls afterwards reuse the first connection rather than opening more.
            for _ in range(3):
                await client.infer(wire)
            assert client.connections == opened
            return opened, results
        finally:
            await client.close()

    opened, results = asyncio.run(run())
    assert opened == connections
    assert len(results) == calls and all(send >= 0 and recv >= 0 for send, recv in results)


def test_a_refused_call_names_its_grpc_status(server: RunningServer) -> None:
    """The status name comes from grpcio's table, not a copy of it; the message is the server's, decoded."""
    host, port = server.grpc_url.split(":")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = (InputTensor("INPUT0", "INT32", (1, 16), a.tobytes()),)

    async def run() -> str:
        client = GrpcH2Client(host, int(port), MODEL_INFER)
        try:
            with pytest.raises(PerfError) as refused:
                await client.infer(grpc_request_bytes("no_such_model", "", inputs, ()))
            return refused.value.message
        finally:
            await client.close()

    message = asyncio.run(run())
    assert message.startswith("the server refused an inference request (NOT_FOUND): ")
    assert "no_such_model" in message
