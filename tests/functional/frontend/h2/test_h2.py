"""The h2 gRPC frontend (engine/frontend/h2/) at the protocol level, where real clients can't reach: a bare
HTTP/2 client on a blocking socket sends exactly the frames each test needs (RFC 9113), and checks what comes
back. Plus grpcio, an HTTP/2 and gRPC client written apart from ours, end to end, and what real clients see
of the limits, deadlines and shutdown.

Our server runs in its own process on a repository of echo models (identity backend: no model file, shape
[-1], so any size passes) and `simple`, with --max-message-mb 8.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import struct
import threading
import time
import urllib.request
import zlib
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from conftest import start_server, wait_until
from h2_client import (
    ACK,
    CANCEL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    WINDOW_UPDATE,
    RawClient,
    frame,
    grpc_message,
    status_of,
    unwrap,
)

MAX_MESSAGE_BYTES = 8 << 20

ECHO = """name: "{name}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}
"""


def echo_request(values: np.ndarray, model: str = "echo_fp32") -> bytes:
    request = pb.ModelInferRequest(model_name=model, raw_input_contents=[values.tobytes()])
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[values.size])
    return request.SerializeToString()


def simple_request() -> bytes:
    request = pb.ModelInferRequest(model_name="simple", id="raw")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    return request.SerializeToString()


def stats(server, model: str) -> dict:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats", timeout=10) as r:
        return json.loads(r.read())["model_stats"][0]["inference_stats"]


def build_repository(root: Path, session_repository: Path) -> Path:
    shutil.copytree(session_repository / "simple", root / "simple")
    for name, delay_ms in (("echo_fp32", 0), ("slow_echo", 400), ("fails_on_13", 0)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(ECHO.format(name=name, delay_ms=delay_ms))
    with open(root / "fails_on_13" / "config.pbtxt", "a") as f:
        f.write('parameters { key: "fail_on_value" value: { string_value: "13" } }\n')
    return root


@pytest.fixture(scope="module")
def h2_repository(tmp_path_factory, repository) -> Path:
    return build_repository(tmp_path_factory.mktemp("h2_repository"), repository)


@pytest.fixture(scope="module")
def h2_server(h2_repository, tmp_path_factory):
    srv = start_server(h2_repository, tmp_path_factory.mktemp("h2") / "server.log",
                       "--max-message-mb", str(MAX_MESSAGE_BYTES >> 20), "--model-control-mode", "none")
    yield srv
    srv.stop()


@pytest.fixture
def client(h2_server):
    c = RawClient(h2_server.grpc_port)
    c.handshake()
    yield c
    c.close()


# ------------------------------------------------------------------------------------------ connection level

def expect_goaway(c: RawClient, code: int) -> None:
    _, _, _, payload = c.read_until(GOAWAY)
    assert int.from_bytes(payload[4:8], "big") == code, payload[8:]
    while c.read() is not None:  # then the server closes the connection
        pass


def test_bad_preface_is_answered_with_goaway_and_close(h2_server):
    expect_goaway(RawClient(h2_server.grpc_port, preface=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
                  PROTOCOL_ERROR)


@pytest.mark.parametrize("frames, code", [
    ([frame(PING, 0, 0, b"12345678")], PROTOCOL_ERROR),  # the preface must end in SETTINGS (§3.4)
], ids=["first frame not SETTINGS"])
def test_preface_must_end_in_settings(h2_server, frames, code):
    c = RawClient(h2_server.grpc_port, preface=PREFACE + b"".join(frames))
    expect_goaway(c, code)


@pytest.mark.parametrize("make, code", [
    (lambda c: frame(DATA, 0, 1, b"x" * (c.server_settings[MAX_FRAME_SIZE] + 1))[:4096], FRAME_SIZE_ERROR),
    (lambda c: frame(HEADERS, END_HEADERS, 2, b"\x83"), PROTOCOL_ERROR),  # servers' even ids (§5.1.1)
    (lambda c: frame(CONTINUATION, END_HEADERS, 1, b"\x83"), PROTOCOL_ERROR),  # no HEADERS before it (§6.10)
    (lambda c: frame(DATA, END_STREAM, 9, b"x"), PROTOCOL_ERROR),  # idle stream (§5.1)
    (lambda c: frame(PING, 0, 0, b"short"), FRAME_SIZE_ERROR),  # §6.7
    (lambda c: frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF)), 0x3),  # window > 2^31-1 (§6.9.1)
    (lambda c: frame(PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\2"), PROTOCOL_ERROR),  # §8.4
    (lambda c: frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff"), 0x9),  # undecodable HPACK (§4.3)
], ids=["frame over max size", "even stream id", "stray CONTINUATION", "DATA on idle stream", "short PING",
        "window overflow", "PUSH_PROMISE", "bad HPACK"])
def test_connection_errors_send_goaway(client, make, code):
    client.send(make(client))
    expect_goaway(client, code)


def test_ping_is_answered(client):
    client.send(frame(PING, 0, 0, b"pingpong"))
    _, flags, stream_id, payload = client.read_until(PING)
    assert flags & ACK and stream_id == 0 and payload == b"pingpong"


# -------------------------------------------------------------------------------------------- streams, flow

def test_large_response_to_a_client_that_opens_its_windows_slowly(h2_server):
    """4 MiB each way: the request waits for the server's WINDOW_UPDATEs, the response for ours; the server
    never sends more than a window or a frame allows, and everything arrives intact."""
    c = RawClient(h2_server.grpc_port, settings={INITIAL_WINDOW_SIZE: 7000})
    c.handshake()
    values = np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32)
    c.call(1, echo_request(values))
    stream_avail, conn_avail, body, trailers = 7000, 65535, b"", None
    while trailers is None:
        kind, flags, _, payload = c.read_until_stream(1)
        if kind == HEADERS:
            trailers = dict(c.decoder.decode(payload)) if flags & END_STREAM else None
            continue
        assert len(payload) <= min(stream_avail, conn_avail, 16384), (
            "the server overran a window or frame size")
        stream_avail -= len(payload)
        conn_avail -= len(payload)
        body += payload
        c.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", len(payload))))  # stream: as consumed
        if conn_avail < 20000:  # connection: lazily, so it is the limit now and then
            c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 65535 - conn_avail)))
            conn_avail = 65535
        stream_avail += len(payload)
    assert trailers.get("grpc-status") == "0", trailers
    response = pb.ModelInferResponse.FromString(unwrap(body))
    assert response.raw_output_contents[0] == values.tobytes()


@pytest.mark.parametrize("frame_bytes", [3, 4093, 70_000])
def test_a_large_message_in_frames_of_any_size_arrives_intact(client, frame_bytes):
    """A message over 64 KiB is assembled in a buffer of its declared size (grpc/call.py `whole`): frames
    that split its 5-byte prefix, frames of odd sizes, and frames larger than it all fill it exactly."""
    values = np.random.default_rng(frame_bytes).standard_normal(40_000).astype(np.float32)  # 160 KB
    message = grpc_message(echo_request(values))
    if frame_bytes == 3:  # the prefix split, then the rest in frames as large as the windows allow
        pieces = [message[:3], message[3:]]
    else:
        pieces = [message[i:i + frame_bytes] for i in range(0, len(message), frame_bytes)]
    client.send(client.headers(1))
    for i, piece in enumerate(pieces):
        client.send_data(1, piece, frame_bytes=len(piece), end_stream=i == len(pieces) - 1)
    head, body, trailers = client.response(1)
    assert trailers.get("grpc-status") == "0", trailers
    assert pb.ModelInferResponse.FromString(unwrap(body)).raw_output_contents[0] == values.tobytes()


def test_a_large_frame_in_uneven_pieces_then_a_call_in_the_same_bytes(client):
    """A DATA frame of 64 KiB or more is read straight into a buffer of its own (frontend/in_place.py):
    however the socket splits it, and with the next call's frames right behind it, both are answered."""
    values = np.random.default_rng(7).standard_normal(40_000).astype(np.float32)  # 160 KB in one frame
    wire = (client.headers(1) + frame(DATA, END_STREAM, 1, grpc_message(echo_request(values)))
            + client.headers(3) + frame(DATA, END_STREAM, 3, grpc_message(simple_request())))
    offset, sizes = 0, [1, 8, 20, 5000, 65536, 3, 70_000]
    for i in range(len(wire)):
        if offset >= len(wire):
            break
        client.send(wire[offset:offset + sizes[i % len(sizes)]])
        offset += sizes[i % len(sizes)]
    data: dict[int, bytes] = {1: b"", 3: b""}
    trailers: dict[int, dict[str, str]] = {}
    while len(trailers) < 2:  # the answers in whichever order they come, windows opened as DATA arrives
        got = client.read()
        assert got is not None, "the server closed the connection"
        kind, flags, stream_id, payload = got
        if kind == DATA and payload:
            data[stream_id] += payload
            client.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", len(payload))),
                        frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", len(payload))))
        elif kind == HEADERS and flags & END_STREAM:
            trailers[stream_id] = dict(client.decoder.decode(payload))
        elif kind == HEADERS:
            client.decoder.decode(payload)
    assert trailers[1].get("grpc-status") == "0" and trailers[3].get("grpc-status") == "0", trailers
    assert pb.ModelInferResponse.FromString(unwrap(data[1])).raw_output_contents[0] == values.tobytes()
    assert pb.ModelInferResponse.FromString(unwrap(data[3])).id == "raw"


def test_request_split_into_continuation_and_many_data_frames(client):
    block = client.headers(1)[9:]
    step = len(block) // 6 + 1  # 7 frames: within the server's limit on frames per block (nghttp2 allows 8)
    pieces = [block[i:i + step] for i in range(0, len(block), step)]
    padded_priority = bytes((4,)) + struct.pack(">IB", 0, 15) + pieces[0] + b"\0" * 4
    frames = [frame(HEADERS, PADDED | PRIORITY_FLAG, 1, padded_priority)]
    frames += [frame(CONTINUATION, 0, 1, p) for p in pieces[1:-1]]
    frames.append(frame(CONTINUATION, END_HEADERS, 1, pieces[-1]))
    message = grpc_message(simple_request())
    for i in range(0, len(message), 7):  # the 5-byte prefix itself is split
        chunk = message[i:i + 7]
        frames.append(frame(DATA, PADDED, 1, b"\x02" + chunk + b"\0\0") if i % 2
                      else frame(DATA, 0, 1, chunk))
        frames.append(frame(0xFA, 0, 1, b"unknown types are ignored"))  # §5.5
    frames.append(frame(DATA, END_STREAM, 1))
    for f in frames:  # one frame per send: the server sees them arrive piecemeal
        client.send(f)
    headers, data, trailers = client.response(1)
    assert headers[":status"] == "200" and headers["content-type"] == "application/grpc"
    assert trailers["grpc-status"] == "0", trailers
    response = pb.ModelInferResponse.FromString(unwrap(data))
    assert response.id == "raw" and np.frombuffer(response.raw_output_contents[0], np.int32).tolist() == \
        list(range(0, 32, 2))


def test_message_over_the_limit_is_resource_exhausted(client):
    client.send(client.headers(1), frame(DATA, 0, 1, struct.pack(">BI", 0, MAX_MESSAGE_BYTES + 1) + b"abc"))
    status, message = status_of(client, 1)
    assert status == "8" and str(MAX_MESSAGE_BYTES) in message
    client.call(3, simple_request())  # the connection serves on
    assert status_of(client, 3)[0] == "0"


def test_message_over_the_limit_from_a_real_client(h2_server):
    big = np.zeros((MAX_MESSAGE_BYTES // 4) + 16, np.float32)
    with grpc.insecure_channel(h2_server.grpc_url) as channel, pytest.raises(grpc.RpcError) as e:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(pb.ModelInferRequest.FromString(echo_request(big)),
                                                             timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_large_messages_both_ways_from_a_real_client(h2_server):
    """6 MiB each way through grpc's own flow control (its windows and ours), under the 8 MiB limit."""
    values = np.random.default_rng(2).standard_normal(6 << 18).astype(np.float32)
    options = [("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(h2_server.grpc_url, options=options) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            pb.ModelInferRequest.FromString(echo_request(values)), timeout=60)
    assert response.raw_output_contents[0] == values.tobytes()


def test_compressed_message_without_grpc_encoding_is_internal(client):
    # PROTOCOL-HTTP2.md: "If the Message-Encoding header is omitted then the Compressed-Flag must be 0."
    client.send(client.headers(1), frame(DATA, END_STREAM, 1, grpc_message(simple_request(), compressed=1)))
    status, message = status_of(client, 1)
    assert status == "13" and "grpc-encoding" in message


def test_unsupported_grpc_encoding_is_unimplemented_and_names_what_is_accepted(client):
    # grpc/doc/compression.md: UNIMPLEMENTED, and a grpc-accept-encoding header listing what the server takes.
    client.send(client.headers(1, extra=(("grpc-encoding", "snappy"),)),
                frame(DATA, END_STREAM, 1, grpc_message(b"\x00" * 10, compressed=1)))
    _, _, trailers = client.response(1)
    assert trailers["grpc-status"] == "12" and "snappy" in trailers["grpc-message"]
    assert {"gzip", "deflate"} <= {e.strip() for e in trailers["grpc-accept-encoding"].split(",")}


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_call_is_answered_compressed_when_the_client_accepts_it(client, encoding):
    wbits = 31 if encoding == "gzip" else 15
    deflater = zlib.compressobj(6, zlib.DEFLATED, wbits)
    body = deflater.compress(simple_request()) + deflater.flush()
    for stream_id, accept in ((1, f"identity,{encoding}"), (3, "identity")):
        extra = (("grpc-encoding", encoding), ("grpc-accept-encoding", accept))
        client.send(client.headers(stream_id, extra=extra))
        client.send_data(stream_id, grpc_message(body, compressed=1))
        headers, data, trailers = client.response(stream_id)
        assert trailers["grpc-status"] == "0", trailers
        if accept == "identity":  # the client can't read ours: plain
            assert "grpc-encoding" not in headers and data[0] == 0
            message = data[5:]
        else:
            assert headers["grpc-encoding"] == encoding and data[0] == 1
            assert int.from_bytes(data[1:5], "big") == len(data) - 5
            message = zlib.decompress(data[5:], wbits)
        response = pb.ModelInferResponse.FromString(message)
        assert response.id == "raw"
        assert np.frombuffer(response.raw_output_contents[0], np.int32).tolist() == list(range(0, 32, 2))


def zeros_gzip(size: int) -> bytes:
    """`size` zero bytes gzip-compressed, built 1 MiB at a time."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join(deflater.compress(bytes(1 << 20)) for _ in range(size >> 20)) + deflater.flush()


def test_decompression_bomb_is_resource_exhausted_without_inflating(client, h2_server):
    bomb = zeros_gzip(512 << 20)  # 512 MiB in ~0.5 MB, 64 times the message limit
    before = h2_server.rss_bytes()
    for stream_id in (1, 3, 5):
        client.send(client.headers(stream_id, extra=(("grpc-encoding", "gzip"),)))
        client.send_data(stream_id, grpc_message(bomb, compressed=1))
        status, message = status_of(client, stream_id)
        assert status == "8" and "larger than max" in message
    assert h2_server.rss_bytes() - before < 4 * MAX_MESSAGE_BYTES
    client.call(7, simple_request())  # the server serves on, on the same connection
    assert status_of(client, 7)[0] == "0"


def test_unknown_method_is_unimplemented(client, h2_server):
    client.send(client.headers(1, "/inference.GRPCInferenceService/NoSuchRpc", end_stream=True))
    assert status_of(client, 1)[0] == "12"
    with grpc.insecure_channel(h2_server.grpc_url) as channel:
        call = channel.unary_unary("/no.Such/Method", request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as e:
            call(b"", timeout=10)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_oversized_request_headers_are_resource_exhausted(client):
    client.send(client.headers(1, extra=(("x-big", "a" * 20000),), end_stream=True))
    assert status_of(client, 1)[0] == "8"


def test_grpc_timeout_is_deadline_exceeded(client):
    client.send(client.headers(1, extra=(("grpc-timeout", "100m"),)))
    client.send_data(1, grpc_message(echo_request(np.ones(4, np.float32), model="slow_echo")))
    assert status_of(client, 1)[0] == "4"


def cancelled(server, model: str) -> float:
    return server.metric("hubserve_inference_request_cancelled_total", model)


def test_rst_stream_mid_request_and_in_flight_is_harmless(client, h2_server):
    before = cancelled(h2_server, "slow_echo")
    failed_before = stats(h2_server, "slow_echo")["fail"]["count"]
    message = grpc_message(simple_request())
    client.send(client.headers(1), frame(DATA, 0, 1, message[:20]),
                frame(RST_STREAM, 0, 1, struct.pack(">I", CANCEL)))
    client.call(3, echo_request(np.ones(4, np.float32), model="slow_echo"))
    client.send(frame(RST_STREAM, 0, 3, struct.pack(">I", CANCEL)))
    client.call(5, simple_request())
    assert status_of(client, 5)[0] == "0"
    # the request is accounted as cancelled, not failed, once the batcher drops it
    deadline = time.monotonic() + 10
    while cancelled(h2_server, "slow_echo") != before + 1:
        assert time.monotonic() < deadline, "the in-flight request was not cancelled"
        time.sleep(0.02)
    assert stats(h2_server, "slow_echo")["fail"]["count"] == failed_before


def test_client_disconnect_cancels_the_in_flight_request(h2_server):
    before = cancelled(h2_server, "slow_echo")
    c = RawClient(h2_server.grpc_port)
    c.handshake()
    c.call(1, echo_request(np.ones(4, np.float32), model="slow_echo"))
    c.sock.shutdown(socket.SHUT_WR)  # a FIN after the request (a close with unread bytes would be a RST,
    try:                             # which may drop the request before the server reads it)
        deadline = time.monotonic() + 10
        while cancelled(h2_server, "slow_echo") != before + 1:
            assert time.monotonic() < deadline, "the request of a vanished client was not cancelled"
            time.sleep(0.02)
    finally:
        c.close()


def test_error_messages_are_percent_encoded(client, h2_server):
    name = "caf\u00e9 100%"
    request = pb.ModelMetadataRequest(name=name).SerializeToString()
    client.call(1, request, path="/inference.GRPCInferenceService/ModelMetadata")
    assert status_of(client, 1) == ("5", "Request for unknown model: 'caf%C3%A9 100%25' is not found")
    with grpc.insecure_channel(h2_server.grpc_url) as channel, pytest.raises(grpc.RpcError) as e:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(pb.ModelMetadataRequest(name=name),
                                                                timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == f"Request for unknown model: '{name}' is not found"


# ------------------------------------------------------------- grpcio, an independent HTTP/2 and gRPC client

# grpcio's C core implements HTTP/2 and gRPC apart from our code, so what follows checks our reading of the
# protocols against another one: unary ModelInfer and Health/Watch, a stream of several requests, 6 MiB each
# way, an error with a non-ASCII message (test_error_messages_are_percent_encoded) and gzip both ways.

class CountingRelay:
    """A loopback TCP relay in front of the server that counts the bytes each way: what grpcio really put on
    the wire, and what it really got. One thread per direction of each connection, ended by the peers."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.to_server = 0
        self.to_client = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(("127.0.0.1", self.target_port), timeout=30)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, to_server: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if to_server:
                    self.to_server += len(data)
                else:
                    self.to_client += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self.listener.close()


def test_grpcio_gzip_both_ways(h2_server):
    """grpcio compresses every message of a gzip channel and lists gzip in grpc-accept-encoding, so our
    answers come back gzip too (grpc/doc/compression.md), unary and on a stream; grpcio inflates them on its
    own. 1 MiB of zeros each way crosses the relay in a few KiB, which shows that both sides did compress."""
    zeros = np.zeros(1 << 18, np.float32)
    relay = CountingRelay(h2_server.grpc_port)
    try:
        with grpc.insecure_channel(relay.url, compression=grpc.Compression.Gzip) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            response = stub.ModelInfer(pb.ModelInferRequest.FromString(echo_request(zeros)), timeout=30)
            assert response.raw_output_contents[0] == zeros.tobytes()
            requests = [pb.ModelInferRequest.FromString(simple_request())] * 3
            answers = list(stub.ModelStreamInfer(iter(requests), timeout=30))
        assert [(a.infer_response.id, a.error_message) for a in answers] == [("raw", "")] * 3
        assert np.frombuffer(answers[0].infer_response.raw_output_contents[0], np.int32).tolist() == \
            list(range(0, 32, 2))
        assert relay.to_server < 64 << 10 and relay.to_client < 64 << 10, (relay.to_server, relay.to_client)
    finally:
        relay.close()


def test_plain_grpc_stub_health_watch_and_infer(h2_server):
    with grpc.insecure_channel(h2_server.grpc_url) as channel:
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
        stream = watch(b"", timeout=10)
        assert next(stream) == b"\x08\x01"  # status: SERVING
        stream.cancel()
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            pb.ModelInferRequest.FromString(simple_request()), timeout=10)
    assert response.id == "raw" and len(response.raw_output_contents) == 2


def test_stream_infer_answers_and_errors_carry_their_request_ids(h2_server):
    """ModelStreamInfer answers from the wire codec: a success is infer_response, an error found at once
    (unknown model) or only after execution (the backend fails) is error_message with the request's id, and
    the stream stays open through both."""
    def request(model: str, values: list[float], request_id: str) -> pb.ModelInferRequest:
        r = pb.ModelInferRequest(model_name=model, id=request_id,
                                 raw_input_contents=[np.array(values, dtype=np.float32).tobytes()])
        r.inputs.add(name="INPUT0", datatype="FP32", shape=[len(values)])
        return r

    requests = [request("echo_fp32", [1.0, 2.0], "ok-1"), request("fails_on_13", [13.0], "boom"),
                request("no_such_model", [1.0], "lost"), request("echo_fp32", [3.0], "ok-2")]
    with grpc.insecure_channel(h2_server.grpc_url) as channel:
        answers = list(pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(requests), timeout=30))
    by_id = {a.infer_response.id: a for a in answers}
    assert set(by_id) == {"ok-1", "boom", "lost", "ok-2"}
    for ok, values in (("ok-1", [1.0, 2.0]), ("ok-2", [3.0])):
        answer = by_id[ok]
        assert answer.error_message == ""
        assert answer.infer_response.model_name == "echo_fp32"
        assert [(o.name, o.datatype, list(o.shape)) for o in answer.infer_response.outputs] == \
            [("OUTPUT0", "FP32", [len(values)])]
        assert np.frombuffer(answer.infer_response.raw_output_contents[0], np.float32).tolist() == values
    for answer in answers:  # as Triton flags a non-decoupled model's one answer, success or error
        assert answer.infer_response.parameters["triton_final_response"].bool_param is True
    assert "input contains 13" in by_id["boom"].error_message
    assert "no_such_model" in by_id["lost"].error_message


def test_graceful_shutdown_two_step_goaway(h2_repository, tmp_path):
    server = start_server(h2_repository, tmp_path / "server.log", "--model-control-mode", "none")
    try:
        c = RawClient(server.grpc_port)
        c.handshake()
        c.call(1, echo_request(np.arange(4, dtype=np.float32), model="slow_echo"))
        # the request is the server's before the signal (else the final GOAWAY rightly names stream 0)
        wait_until(lambda: server.metric("nv_inference_pending_request_count", "slow_echo") == 1,
                   "the request pending in the server")
        server.process.send_signal(signal.SIGTERM)
        _, _, _, first = c.read_until(GOAWAY)
        assert struct.unpack(">II", first[:8]) == (0x7FFFFFFF, 0)  # §6.8: "2^31-1 and NO_ERROR" first
        _, _, _, payload = c.read_until(PING)
        c.send(frame(PING, ACK, 0, payload))
        _, _, _, final = c.read_until(GOAWAY)
        assert struct.unpack(">II", final[:8]) == (1, 0)  # the last stream it took: ours
        _, data, trailers = c.response(1)
        assert trailers["grpc-status"] == "0"
        assert pb.ModelInferResponse.FromString(unwrap(data)).raw_output_contents[0] == \
            np.arange(4, dtype=np.float32).tobytes()
        assert c.read() is None  # then the connection closes
        assert server.process.wait(30) == 0
    finally:
        server.stop()

