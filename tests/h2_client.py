"""A bare HTTP/2 client for protocol tests (RFC 9113): it sends exactly the frames a test asks for, and does
nothing on its own beyond acknowledging SETTINGS and counting the windows the server grants. Written apart
from the server's code, so the two cannot share a misreading of the RFC.

This is a helper module, not a test file.
"""

from __future__ import annotations

import socket
import struct

import hpack

(DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE,
 CONTINUATION) = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
PROTOCOL_ERROR, FRAME_SIZE_ERROR, CANCEL = 0x1, 0x6, 0x8
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 0x4, 0x5
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INFER = "/inference.GRPCInferenceService/ModelInfer"


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream_id) + payload


def grpc_message(body: bytes, compressed: int = 0) -> bytes:
    return struct.pack(">BI", compressed, len(body)) + body


class RawClient:
    """An HTTP/2 client that does nothing on its own beyond acknowledging SETTINGS and tracking the windows
    the server grants, so a test controls every frame."""

    def __init__(self, port: int, settings: dict[int, int] | None = None, preface: bytes = PREFACE) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each frame leaves as sent
        self.rest = b""
        self.encoder = hpack.Encoder()
        self.encoder.header_table_size = 0  # the server advertises 0; the first block says so (RFC 7541 §4.2)
        self.decoder = hpack.Decoder()
        self.server_settings: dict[int, int] = {}
        self.window = 65535
        self.stream_windows: dict[int, int] = {}
        payload = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
        self.sock.sendall(preface + frame(SETTINGS, 0, 0, payload))

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def read(self) -> tuple[int, int, int, bytes] | None:
        """The next frame, or None when the server closed the connection."""
        while len(self.rest) < 9 or len(self.rest) < 9 + int.from_bytes(self.rest[:3], "big"):
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:  # closed with our bytes unread: the kernel resets (RFC 9113 §6.8)
                return None
            if not chunk:
                return None
            self.rest += chunk
        length = int.from_bytes(self.rest[:3], "big")
        kind, flags = self.rest[3], self.rest[4]
        stream_id = int.from_bytes(self.rest[5:9], "big") & 0x7FFFFFFF
        payload, self.rest = self.rest[9:9 + length], self.rest[9 + length:]
        if kind == SETTINGS and not flags & ACK:
            for i in range(0, len(payload), 6):
                key, value = struct.unpack(">HI", payload[i:i + 6])
                self.server_settings[key] = value
            self.sock.sendall(frame(SETTINGS, ACK, 0))
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload, "big")
            if stream_id == 0:
                self.window += increment
            else:
                self.stream_windows[stream_id] = self.stream_windows.get(stream_id, 0) + increment
        return kind, flags, stream_id, payload

    def read_until(self, kind: int) -> tuple[int, int, int, bytes]:
        while True:
            got = self.read()
            assert got is not None, f"connection closed while waiting for frame type {kind}"
            if got[0] == kind:
                return got

    def handshake(self) -> None:
        while 0x4 not in self.server_settings:
            self.read_until(SETTINGS)

    def headers(self, stream_id: int, path: str = INFER, extra: tuple[tuple[str, str], ...] = (),
                end_stream: bool = False) -> bytes:
        block = self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                     (":authority", "localhost"), ("content-type", "application/grpc"),
                                     ("te", "trailers"), *extra])
        self.stream_windows.setdefault(stream_id, self.server_settings.get(INITIAL_WINDOW_SIZE, 65535))
        return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream_id, block)

    def send_data(self, stream_id: int, data: bytes, frame_bytes: int = 16384,
                  end_stream: bool = True) -> None:
        """DATA within the windows the server granted, waiting for its WINDOW_UPDATEs (RFC 9113 §6.9)."""
        while data:
            while min(self.window, self.stream_windows[stream_id]) <= 0:
                self.read()
            n = min(len(data), frame_bytes, self.window, self.stream_windows[stream_id])
            last = n == len(data) and end_stream
            self.send(frame(DATA, END_STREAM if last else 0, stream_id, data[:n]))
            self.window -= n
            self.stream_windows[stream_id] -= n
            data = data[n:]

    def call(self, stream_id: int, message: bytes, path: str = INFER) -> None:
        self.send(self.headers(stream_id, path))
        self.send_data(stream_id, grpc_message(message))

    def response(self, stream_id: int) -> tuple[dict[str, str], bytes, dict[str, str]]:
        """Headers, DATA and trailers of one stream; DATA is acknowledged as it arrives."""
        blocks: list[dict[str, str]] = []
        data = b""
        while True:
            kind, flags, _, payload = self.read_until_stream(stream_id)
            if kind == HEADERS:
                blocks.append(dict(self.decoder.decode(payload)))
            elif kind == DATA and payload:
                data += payload
                self.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", len(payload))),
                          frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", len(payload))))
            if flags & END_STREAM:
                return (blocks[0] if len(blocks) > 1 else {}), data, blocks[-1]

    def read_until_stream(self, stream_id: int) -> tuple[int, int, int, bytes]:
        while True:
            got = self.read()
            assert got is not None, f"connection closed before stream {stream_id} ended"
            assert not (got[0] == RST_STREAM and got[2] == stream_id), f"stream {stream_id} was reset"
            if got[2] == stream_id and got[0] in (HEADERS, DATA):
                return got

    def close(self) -> None:
        self.sock.close()


def unwrap(data: bytes) -> bytes:
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == len(data) - 5
    return data[5:]


def status_of(c: RawClient, stream_id: int) -> tuple[str, str]:
    _, _, trailers = c.response(stream_id)
    return trailers.get("grpc-status", ""), trailers.get("grpc-message", "")
