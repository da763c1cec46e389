"""The hot path of the load tester: send one pre-encoded inference request and read its answer.

Every request is encoded once, before the load starts (`http_request_bytes`, `grpc_request_bytes`), so a
request costs the client only a write and a read:

  HTTP  a hand-written HTTP/1.1 keep-alive connection on `asyncio.Protocol` with llhttp's parser (httptools),
        inputs and outputs in the binary tensor extension, as perf_analyzer sends them. Connections are
        pooled: one per request in flight.
  gRPC  ModelInfer with the serialized request bytes (`raw_input_contents`), the answer parsed with our
        generated `ModelInferResponse`; over HTTP/2 connections of our own (grpc_h2.py, the default: a
        fraction of grpcio's client CPU; at most 6 calls in flight per connection, as perf_analyzer) or over
        one grpc.aio channel (`--grpc-client grpcio`).

`InferClient.infer()` returns (send_ns, recv_ns): the time spent writing the request, and the time from the
first byte of the answer to a decoded answer ("Client Send" and "Client Recv" of perf_analyzer's report).
Used by load.py on one event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any
from typing import Protocol as TypingProtocol

import orjson

from .inputs import RequestInputs
from .types import PerfError, Protocol, TensorSpec

_now = time.monotonic_ns


class InferClient(TypingProtocol):
    async def infer(self, wire: bytes) -> tuple[int, int]: ...

    async def close(self) -> None: ...


GRPC_CLIENTS = ("h2", "grpcio")


def connect(protocol: Protocol, host: str, port: int, grpc_client: str = "h2",
            grpc_calls_per_connection: int | None = None) -> InferClient:
    if protocol is Protocol.HTTP:
        return HttpInferClient(host, port)
    if grpc_client == "grpcio":
        return GrpcInferClient(host, port)
    from .grpc_h2 import CALLS_PER_CONNECTION, GrpcH2Client

    per_connection = CALLS_PER_CONNECTION if grpc_calls_per_connection is None else grpc_calls_per_connection
    return GrpcH2Client(host, port, MODEL_INFER, per_connection)


def encode_requests(protocol: Protocol, host: str, port: int, model: str, version: str,
                    requests: list[RequestInputs], outputs: tuple[TensorSpec, ...]) -> list[bytes]:
    if protocol is Protocol.HTTP:
        return [http_request_bytes(host, port, model, version, r, outputs) for r in requests]
    return [grpc_request_bytes(model, version, r, outputs) for r in requests]


# ---------------------------------------------------------------------------------------------------- HTTP


def http_request_bytes(host: str, port: int, model: str, version: str, inputs: RequestInputs,
                       outputs: tuple[TensorSpec, ...]) -> bytes:
    """A complete POST .../infer with a JSON header and binary tensors after it."""
    header = json.dumps({
        "inputs": [{"name": t.name, "shape": list(t.shape), "datatype": t.datatype,
                    "parameters": {"binary_data_size": len(t.data)}} for t in inputs],
        "outputs": [{"name": o.name, "parameters": {"binary_data": True}} for o in outputs],
    }, separators=(",", ":")).encode()
    body = header + b"".join(t.data for t in inputs)
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection; one request at a time (HTTP/1.1 without pipelining)."""

    def __init__(self) -> None:
        import httptools

        self._parser = httptools.HttpResponseParser(self)
        self._parse_error = httptools.HttpParserError
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._body: list[bytes] = []
        self._header_length = -1
        self._first_byte_ns = 0
        self._complete = False
        self.closed = False

    # asyncio.Protocol -----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self._first_byte_ns:
            self._first_byte_ns = _now()
        try:
            self._parser.feed_data(data)
        except self._parse_error as e:
            self._fail(PerfError(f"unreadable HTTP answer: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(PerfError(f"the server closed the connection{': ' + str(exc) if exc else ''}"))

    # httptools callbacks --------------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 31 and name.lower() == b"inference-header-content-length":
            self._header_length = int(value)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._complete = True
        if not self._parser.should_keep_alive():
            self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ----------------------------------------------------------------------------------------------------
    def _fail(self, error: PerfError) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)

    async def infer(self, wire: bytes) -> tuple[int, int]:
        if self._transport is None:
            raise PerfError("HTTP connection used before it was made")
        self._body.clear()
        self._header_length = -1
        self._first_byte_ns = 0
        self._complete = False
        self._waiter = asyncio.get_running_loop().create_future()
        start = _now()
        self._transport.write(wire)
        sent = _now()
        await self._waiter
        status = self._parser.get_status_code()
        body = b"".join(self._body) if len(self._body) != 1 else self._body[0]
        header = body[:self._header_length] if self._header_length >= 0 else body
        try:
            doc = orjson.loads(header)
        except orjson.JSONDecodeError:
            raise PerfError(f"the server answered {status} with a header that is not JSON: "
                            f"{header[:200]!r}") from None
        if status != 200:
            raise PerfError(f"the server refused an inference request ({status}): {doc.get('error', doc)}")
        return sent - start, _now() - self._first_byte_ns

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class HttpInferClient:
    """A pool of HttpConnections: one per request in flight, reused while alive."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._idle: list[HttpConnection] = []
        self._all: set[HttpConnection] = set()

    async def _open(self) -> HttpConnection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(HttpConnection, self._host, self._port)
        except OSError as e:
            raise PerfError(f"cannot connect to {self._host}:{self._port}: {e}") from None
        self._all.add(conn)
        return conn

    async def infer(self, wire: bytes) -> tuple[int, int]:
        conn = self._idle.pop() if self._idle else await self._open()
        try:
            result = await conn.infer(wire)
        except BaseException:
            self._all.discard(conn)
            conn.close()
            raise
        if conn.closed:
            self._all.discard(conn)
            conn.close()
        else:
            self._idle.append(conn)
        return result

    async def close(self) -> None:
        for conn in self._all:
            conn.close()
        self._all.clear()
        self._idle.clear()


# ---------------------------------------------------------------------------------------------------- gRPC

_GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def grpc_request_bytes(model: str, version: str, inputs: RequestInputs,
                       outputs: tuple[TensorSpec, ...]) -> bytes:
    from engine.proto import grpc_service_pb2

    pb: Any = grpc_service_pb2  # generated classes: mypy cannot see them
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for t in inputs:
        request.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        request.raw_input_contents.append(t.data)
    for o in outputs:
        request.outputs.add(name=o.name)
    return bytes(request.SerializeToString())


class GrpcInferClient:
    def __init__(self, host: str, port: int) -> None:
        import grpc

        from engine.proto import grpc_service_pb2

        pb: Any = grpc_service_pb2
        self._grpc = grpc
        self._parse = pb.ModelInferResponse.FromString
        self._channel = grpc.aio.insecure_channel(f"{host}:{port}", options=_GRPC_OPTIONS)
        self._infer: Any = self._channel.unary_unary(MODEL_INFER)  # bytes in, bytes out

    async def infer(self, wire: bytes) -> tuple[int, int]:
        start = _now()
        call = self._infer(wire)
        sent = _now()
        try:
            answer = await call
        except self._grpc.aio.AioRpcError as e:
            raise PerfError(f"the server refused an inference request ({e.code().name}): {e.details()}") \
                from None
        received = _now()
        self._parse(answer)
        return sent - start, _now() - received

    async def close(self) -> None:
        await self._channel.close()
