"""The sans-I/O HTTP/2 core (engine/frontend/h2/core.py) at the byte level, in-process: bytes fed in, the
frames it answers with and the calls it makes upward checked. No sockets, no loop, no sleeps; time is passed
to `tick`. Frames are built with tests/h2_client.py's `frame` and HPACK with the `hpack` package, both
written apart from the core. The last section runs a server core against a client core, the bytes of one fed
to the other.
"""

from __future__ import annotations

import struct
from typing import Any

import hpack
import pytest

from engine.frontend.h2.core import H2Core
from engine.frontend.h2.frames import H2ConnectionError, H2Error, H2StreamError
from engine.frontend.h2.headers import indexed, literal
from engine.frontend.h2.lifecycle import SHUTDOWN_PING
from engine.frontend.h2.states import TRANSITIONS, StreamEvent, StreamState, transition
from engine.frontend.h2.streams import H2Stream, Limits, Role
from engine.frontend.h2.windows import FlowWindows
from h2_client import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)

INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS, ENABLE_PUSH = 0x4, 0x3, 0x2
RESPONSE_HEAD = indexed(8) + literal(31, b"application/grpc")  # :status 200, content-type
TRAILERS = literal(b"grpc-status", b"0")
S, E = StreamState, StreamEvent


# ------------------------------------------------------------------------------------------------ harness

class Handler:
    """A stream handler that records what the core tells it."""

    def __init__(self, head: Any = None) -> None:
        self.head = head
        self.heads: list[tuple[Any, bool]] = []
        self.data = b""
        self.ended = False
        self.reset_code: Any = None

    def headers_received(self, head: Any, end_stream: bool) -> None:
        self.heads.append((head, end_stream))
        self.ended |= end_stream

    def data_received(self, data: memoryview, end_stream: bool) -> None:
        self.data += bytes(data)
        self.ended |= end_stream

    def reset(self, code: Any) -> None:
        self.reset_code = code


class Peer:
    """The CoreEvents of one core: records every call. `answer`, if set, is called for each opened stream."""

    def __init__(self, role: Role, limits: Limits | None = None, answer: Any = None) -> None:
        self.handlers: dict[int, Handler] = {}
        self.streams: dict[int, H2Stream] = {}
        self.events: list[tuple[Any, ...]] = []
        self.closed: tuple[bool, Any, str] | None = None
        self.answer = answer
        self.core = H2Core(role, limits or Limits(), self, now=0.0)

    def stream_opened(self, stream: H2Stream, head: Any) -> Handler:
        handler = self.handlers[stream.id] = Handler(head)
        self.streams[stream.id] = stream
        if self.answer is not None:
            self.answer(self, stream, head)
        return handler

    def settings_received(self) -> None:
        self.events.append(("settings",))

    def goaway_received(self, last_stream_id: int, code: Any, debug: bytes) -> None:
        self.events.append(("goaway", last_stream_id, code))

    def stream_sent(self, stream: H2Stream) -> None:
        self.events.append(("sent", stream.id))

    def output_ready(self) -> None:
        pass

    def close_transport(self, abort: bool, code: Any, message: str) -> None:
        self.closed = (abort, code, message)

    def out(self) -> bytes:
        return b"".join(self.core.data_to_send())

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        return parse(self.out())


def parse(data: bytes) -> list[tuple[int, int, int, bytes]]:
    frames, offset = [], 0
    while offset < len(data):
        length = int.from_bytes(data[offset:offset + 3], "big")
        kind, flags = data[offset + 3], data[offset + 4]
        sid = int.from_bytes(data[offset + 5:offset + 9], "big") & 0x7FFFFFFF
        frames.append((kind, flags, sid, data[offset + 9:offset + 9 + length]))
        offset += 9 + length
    assert offset == len(data)
    return frames


def settings(**values: int) -> bytes:
    keys = {"initial_window": INITIAL_WINDOW_SIZE, "max_streams": MAX_CONCURRENT_STREAMS, "push": ENABLE_PUSH}
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", keys[k], v) for k, v in values.items()))


def request_block(path: str = "/pkg.Service/Method", extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    encoder = hpack.Encoder()
    encoder.header_table_size = 0  # the server advertises 0 (RFC 7541 §4.2)
    return encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                           ("content-type", "application/grpc"), *extra])


def server(limits: Limits | None = None, answer: Any = None, **client_settings: int) -> Peer:
    """A server core past the handshake: the client's preface and SETTINGS in, our SETTINGS acknowledged."""
    peer = Peer(Role.SERVER, limits, answer)
    peer.core.initiate()
    peer.core.receive(PREFACE + settings(**client_settings) + frame(SETTINGS, ACK, 0))
    peer.out()
    return peer


def word(value: int) -> bytes:
    return struct.pack(">I", value)


def goaway_code(frames: list[tuple[int, int, int, bytes]]) -> int:
    payload = next(p for kind, _, _, p in frames if kind == GOAWAY)
    return int.from_bytes(payload[4:8], "big")


def answer_at_once(peer: Peer, stream: H2Stream, head: Any) -> None:
    peer.core.send(stream, RESPONSE_HEAD, [b"reply"], TRAILERS)


# ------------------------------------------------------------------------------------------ stream states

def test_the_table_follows_rfc_9113_section_5_1():
    """Every pair the RFC allows, and nothing leaves closed."""
    assert transition(S.IDLE, E.RECV_HEADERS, 1) is S.OPEN
    assert transition(S.OPEN, E.RECV_END_STREAM, 1) is S.HALF_CLOSED_REMOTE
    assert transition(S.HALF_CLOSED_REMOTE, E.SEND_END_STREAM, 1) is S.CLOSED
    assert transition(S.IDLE, E.SEND_HEADERS, 1) is S.OPEN
    assert transition(S.OPEN, E.SEND_END_STREAM, 1) is S.HALF_CLOSED_LOCAL
    assert transition(S.HALF_CLOSED_LOCAL, E.RECV_END_STREAM, 1) is S.CLOSED
    for state in (S.OPEN, S.HALF_CLOSED_LOCAL, S.HALF_CLOSED_REMOTE):
        assert transition(state, E.RECV_RST, 1) is S.CLOSED
        assert transition(state, E.SEND_RST, 1) is S.CLOSED
    assert not [key for key in TRANSITIONS if key[0] is S.CLOSED]


@pytest.mark.parametrize("state, event", [(S.HALF_CLOSED_REMOTE, E.RECV_DATA),
                                          (S.HALF_CLOSED_REMOTE, E.RECV_HEADERS),
                                          (S.HALF_CLOSED_REMOTE, E.RECV_END_STREAM),
                                          (S.CLOSED, E.RECV_DATA)])
def test_receiving_on_a_stream_the_peer_closed_is_stream_closed(state, event):
    with pytest.raises(H2StreamError) as e:
        transition(state, event, 7)
    assert e.value.code == H2Error.STREAM_CLOSED and e.value.stream_id == 7


def test_receiving_data_on_an_idle_stream_is_a_connection_error():
    with pytest.raises(H2ConnectionError) as e:
        transition(S.IDLE, E.RECV_DATA, 3)
    assert e.value.code == H2Error.PROTOCOL_ERROR


@pytest.mark.parametrize("state, event", [(S.HALF_CLOSED_LOCAL, E.SEND_DATA), (S.CLOSED, E.SEND_HEADERS),
                                          (S.IDLE, E.SEND_DATA)])
def test_sending_out_of_turn_is_our_bug(state, event):
    with pytest.raises(RuntimeError):
        transition(state, event, 1)


# ------------------------------------------------------------------------------------------------ windows

def test_receive_window_is_restored_once_half_is_used():
    windows = FlowWindows(1, 0, 100)
    assert windows.received(50) == 0  # half left: nothing yet
    assert windows.received(1) == 51 and windows.recv_window == 100
    assert windows.received(80, end_stream=True) == 0  # the stream takes no more DATA: no update
    with pytest.raises(H2StreamError) as e:
        windows.received(21)
    assert e.value.code == H2Error.FLOW_CONTROL_ERROR


def test_window_errors_are_stream_errors_on_a_stream_and_connection_errors_on_stream_0():
    with pytest.raises(H2StreamError) as stream_error:
        FlowWindows(3, 10, 0).granted(0)
    assert stream_error.value.code == H2Error.PROTOCOL_ERROR
    with pytest.raises(H2ConnectionError) as conn_error:
        FlowWindows(0, 10, 0).granted(0x7FFFFFFF)
    assert conn_error.value.code == H2Error.FLOW_CONTROL_ERROR
    windows = FlowWindows(5, 10, 0)
    windows.shift(-30)  # a smaller SETTINGS_INITIAL_WINDOW_SIZE may make it negative (§6.9.2)
    assert windows.send_window == -20
    windows.shift(0x7FFFFFFF)  # exactly 2^31-1 - 20: allowed
    with pytest.raises(H2ConnectionError):  # past 2^31-1 by a SETTINGS change: a connection error (§6.9.2)
        windows.shift(21)


# ------------------------------------------------------------------------------- server core: the basics

def test_the_server_preface_is_settings_and_the_connection_window():
    peer = Peer(Role.SERVER)
    peer.core.initiate()
    (kind, _, _, payload), (update, _, sid, increment) = peer.frames()
    assert kind == SETTINGS and struct.pack(">HI", INITIAL_WINDOW_SIZE, 1 << 20) in payload
    assert (update, sid, int.from_bytes(increment, "big")) == (WINDOW_UPDATE, 0, (16 << 20) - 65535)


def test_the_preface_may_arrive_byte_by_byte():
    peer = Peer(Role.SERVER)
    for byte in PREFACE + settings():
        peer.core.receive(bytes((byte,)))
    assert [(kind, flags) for kind, flags, _, _ in peer.frames()] == [(SETTINGS, ACK)]
    assert peer.events == [("settings",)]


def test_a_request_and_its_answer():
    peer = server()
    peer.core.receive(frame(HEADERS, END_HEADERS, 1, request_block()) + frame(DATA, END_STREAM, 1, b"ping"))
    handler, stream = peer.handlers[1], peer.streams[1]
    assert (handler.head.fields[b":path"] == b"/pkg.Service/Method" and handler.data == b"ping"
            and handler.ended)
    assert stream.state is S.HALF_CLOSED_REMOTE
    assert peer.core.send(stream, RESPONSE_HEAD, [b"po", b"ng"], TRAILERS)
    frames = peer.frames()
    assert [(k, f, s) for k, f, s, _ in frames] == [(HEADERS, END_HEADERS, 1), (DATA, 0, 1),
                                                    (HEADERS, END_HEADERS | END_STREAM, 1)]
    assert frames[1][3] == b"pong"
    assert stream.state is S.CLOSED and peer.core.open_streams == 0
    assert not peer.core.send(stream, None, [b"late"], None) and peer.out() == b""  # dropped


def test_a_payload_view_kept_by_its_handler_outlives_the_reads_after_it():
    """gRPC keeps a one-frame message as the core's view of it; a frame assembled from several reads is
    read from the buffer it was assembled in, so that buffer must never change after."""
    kept: list[memoryview] = []
    peer = server()
    peer.core.receive(frame(HEADERS, END_HEADERS, 1, request_block()))
    peer.handlers[1].data_received = lambda data, end_stream: kept.append(data)  # type: ignore[method-assign]
    first, second = bytes(range(256)) * 256, b"next" * 5000
    wire = frame(DATA, 0, 1, first) + frame(DATA, END_STREAM, 1, second)
    cut = len(wire) - len(second) // 2  # the read that ends `first` starts `second`
    for start in range(0, cut, 20_000):
        peer.core.receive(wire[start:min(start + 20_000, cut)])
    peer.core.receive(wire[cut:])
    assert [bytes(view) for view in kept] == [first, second]


# A DATA frame of 64 KiB or more is read in place (engine/frontend/in_place.py): the adapter hands the socket
# `frame_buffer()` and reports each read with `frame_read(n)`, as uvloop does with a BufferedProtocol.

def read_in_place(core: H2Core, wire: bytes, pieces: list[int]) -> None:
    """Read `wire` as the adapter does, in reads of the sizes in `pieces` (cycled): into the frame's buffer
    while the core reads in place, else through `receive`."""
    i = 0
    while wire:
        size = pieces[i % len(pieces)]
        i += 1
        if core.in_place:
            target = core.frame_buffer()
            n = min(size, len(target), len(wire))
            target[:n] = wire[:n]
            core.frame_read(n)
        else:
            n = min(size, len(wire))
            core.receive(wire[:n])
        wire = wire[n:]


def test_a_large_frame_read_in_place_in_uneven_pieces_arrives_whole_and_the_next_frame_follows():
    peer = server()
    big, tail = bytes(range(256)) * 1200, b"after the large frame"  # 300 KB
    wire = (frame(HEADERS, END_HEADERS, 1, request_block()) + frame(DATA, 0, 1, big)
            + frame(DATA, END_STREAM, 1, tail) + frame(PING, 0, 0, b"8 bytes!"))
    went_in_place = []
    rest, reads = wire, [1000, 7, 65536, 3, 40_000]
    while rest:  # one read at a time, noting where each went
        went_in_place.append(peer.core.in_place)
        n = min(reads[len(went_in_place) % len(reads)], len(rest))
        read_in_place(peer.core, rest[:n], [n])
        rest = rest[n:]
    handler = peer.handlers[1]
    assert handler.data == big + tail and handler.ended
    assert any(went_in_place) and not peer.core.in_place  # the large frame went in place, then ended
    assert [(k, p) for k, f, _, p in peer.frames() if k == PING] == [(PING, b"8 bytes!")]


def test_a_frame_read_in_place_holds_at_most_16_times_what_arrived():
    """A header declaring a large frame, then silence, holds 64 KiB; as the frame arrives its buffer grows,
    never past 16 times what the client sent of it, nor past the frame."""
    peer = server()
    peer.core.receive(frame(HEADERS, END_HEADERS, 1, request_block()))
    payload = b"\x01" * 1_000_000
    wire = frame(DATA, END_STREAM, 1, payload)
    peer.core.receive(wire[:20])
    assert peer.core.in_place and len(peer.core.frame_buffer()) == (1 << 16) - 20
    sent = 20
    while peer.core.in_place:
        held = sent + len(peer.core.frame_buffer())  # what arrived, and the room the buffer has left
        assert held <= min(len(wire), max(1 << 16, 16 * sent)), (sent, held)
        target = peer.core.frame_buffer()
        n = min(4096, len(target))
        target[:n] = wire[sent:sent + n]
        peer.core.frame_read(n)
        sent += n
    assert sent == len(wire) and peer.handlers[1].data == payload


def test_a_frame_read_in_place_that_stalls_ends_the_connection_and_its_buffer_goes():
    peer = server(Limits(client_timeout_secs=5))
    wire = frame(HEADERS, END_HEADERS, 1, request_block()) + frame(DATA, 0, 1, b"x" * 200_000)
    peer.core.receive(wire[:100_000])
    assert peer.core.in_place
    peer.core.tick(1.0)  # the clock sees the last read
    peer.core.tick(5.9)
    assert peer.closed is None
    peer.core.tick(6.0)  # a pause within a frame, as within a body: the client timeout
    assert peer.closed is not None and not peer.core.in_place
    peer.core.frame_read(0)  # a read the transport had in flight: nothing happens
    assert peer.handlers[1].data == b""


def test_an_answer_before_the_request_ended_resets_it_without_error():
    """§8.1: a server may answer early; the client is told to stop sending, with NO_ERROR."""
    peer = server(answer=answer_at_once)
    peer.core.receive(frame(HEADERS, END_HEADERS, 1, request_block()))
    assert [(k, s, p) for k, _, s, p in peer.frames()][-1] == (RST_STREAM, 1, word(H2Error.NO_ERROR))
    peer.core.receive(frame(DATA, END_STREAM, 1, b"in flight"))  # ignored: the stream is closed
    assert peer.handlers[1].data == b"" and peer.out() == b""


def test_padding_and_priority_are_stripped_and_continuation_joins_the_block():
    peer = server()
    block = request_block()
    priority_padded = bytes((3,)) + struct.pack(">IB", 0, 15) + block[:5] + b"\0" * 3
    peer.core.receive(frame(HEADERS, PADDED | 0x20, 1, priority_padded)
                      + frame(CONTINUATION, 0, 1, block[5:9])
                      + frame(CONTINUATION, END_HEADERS, 1, block[9:])
                      + frame(DATA, PADDED, 1, b"\x02ab\0\0") + frame(DATA, END_STREAM, 1, b"c"))
    assert peer.handlers[1].head.fields[b":path"] == b"/pkg.Service/Method"
    assert peer.handlers[1].data == b"abc"


def test_trailers_end_the_request():
    peer = server()
    peer.core.receive(frame(HEADERS, END_HEADERS, 1, request_block()) + frame(DATA, 0, 1, b"x")
                      + frame(HEADERS, END_HEADERS | END_STREAM, 1, literal(b"x-trailer", b"1")))
    assert peer.handlers[1].ended and peer.streams[1].state is S.HALF_CLOSED_REMOTE


def test_settings_are_acknowledged_and_ping_answered():
    peer = server()
    peer.core.receive(settings(max_streams=10) + frame(PING, 0, 0, b"12345678"))
    assert [(k, f, p) for k, f, _, p in peer.frames()] == [(SETTINGS, ACK, b""), (PING, ACK, b"12345678")]
    assert peer.core.peer_max_streams == 10


# ---------------------------------------------------------------------------------- flow control: sending

def test_answers_wait_for_the_stream_window_and_go_on_window_update():
    peer = server(initial_window=10)
    peer.core.receive(frame(HEADERS, END_HEADERS | END_STREAM, 1, request_block()))
    stream = peer.streams[1]
    assert not peer.core.send(stream, RESPONSE_HEAD, [b"x" * 25], TRAILERS)  # queued
    assert [(k, len(p)) for k, _, _, p in peer.frames()] == [(HEADERS, len(RESPONSE_HEAD)), (DATA, 10)]
    peer.core.receive(frame(WINDOW_UPDATE, 0, 1, word(10)))
    assert [(k, len(p)) for k, _, _, p in peer.frames()] == [(DATA, 10)]
    peer.core.receive(frame(WINDOW_UPDATE, 0, 1, word(100)))
    assert [(k, f, len(p)) for k, f, _, p in peer.frames()] == [
        (DATA, 0, 5), (HEADERS, END_HEADERS | END_STREAM, len(TRAILERS))]
    assert stream.state is S.CLOSED and ("sent", 1) in peer.events


def test_answers_wait_for_the_connection_window():
    peer = server(initial_window=1 << 20)
    peer.core.receive(frame(HEADERS, END_HEADERS | END_STREAM, 1, request_block()))
    peer.core.send(peer.streams[1], RESPONSE_HEAD, [b"y" * 70000], TRAILERS)
    sent = sum(len(p) for k, _, _, p in peer.frames() if k == DATA)
    assert sent == 65535  # the connection's initial window, in frames of at most 16 KiB
    peer.core.receive(frame(WINDOW_UPDATE, 0, 0, word(10000)))
    frames = peer.frames()
    assert sum(len(p) for k, _, _, p in frames if k == DATA) == 70000 - 65535
    assert frames[-1][0] == HEADERS and frames[-1][1] & END_STREAM


def test_a_smaller_initial_window_mid_stream_holds_data_until_the_window_is_positive():
    """§6.9.2: a SETTINGS_INITIAL_WINDOW_SIZE change moves open streams' windows, possibly below zero."""
    peer = server(initial_window=100)
    peer.core.receive(frame(HEADERS, END_HEADERS | END_STREAM, 1, request_block()))
    stream = peer.streams[1]
    peer.core.send(stream, RESPONSE_HEAD, [b"z" * 60], None)
    peer.out()
    peer.core.receive(settings(initial_window=20))  # 40 left of 100 → 40 - 80 = -40
    assert stream.send_window == -40
    peer.out()
    peer.core.send(stream, None, [b"w" * 10], TRAILERS)
    assert [k for k, _, _, _ in peer.frames()] == []
    peer.core.receive(frame(WINDOW_UPDATE, 0, 1, word(45)))
    assert [(k, len(p)) for k, _, _, p in peer.frames()] == [(DATA, 5)]
    peer.core.receive(settings(initial_window=100))  # +80
    # after the ACK
    assert [(k, len(p)) for k, _, _, p in peer.frames()][1:] == [(DATA, 5), (HEADERS, len(TRAILERS))]


def test_frames_respect_the_peers_max_frame_size():
    peer = server()
    peer.core.receive(frame(SETTINGS, 0, 0, struct.pack(">HI", 0x5, 16384))
                      + frame(HEADERS, END_HEADERS | END_STREAM, 1, request_block()))
    peer.out()
    peer.core.send(peer.streams[1], RESPONSE_HEAD, [b"m" * 40000], TRAILERS)
    assert [len(p) for k, _, _, p in peer.frames() if k == DATA] == [16384, 16384, 40000 - 32768]


# -------------------------------------------------------------------------------- flow control: receiving

def test_we_return_window_as_data_is_consumed():
    """Once past half of a window is used, one WINDOW_UPDATE restores it; none after END_STREAM."""
    peer = server(Limits(stream_window_bytes=1000, connection_window_bytes=70000))
    peer.core.receive(frame(HEADERS, END_HEADERS, 1, request_block()) + frame(DATA, 0, 1, b"d" * 600))
    assert [(k, s, int.from_bytes(p, "big")) for k, _, s, p in peer.frames()] == [(WINDOW_UPDATE, 1, 600)]
    peer.core.receive(frame(DATA, 0, 1, b"d" * 500) + frame(DATA, 0, 1, b"d" * 500))
    assert [(k, s, int.from_bytes(p, "big")) for k, _, s, p in peer.frames()] == [(WINDOW_UPDATE, 1, 1000)]
    peer.core.receive(frame(HEADERS, END_HEADERS, 3, request_block())
                      + frame(DATA, END_STREAM, 3, b"d" * 900))
    assert peer.out() == b""
    peer = server(Limits(connection_window_bytes=70000))
    peer.core.receive(frame(HEADERS, END_HEADERS, 5, request_block()) + frame(DATA, 0, 5, b"d" * 34000))
    assert peer.out() == b""  # 36,000 of 70,000 left
    peer.core.receive(frame(DATA, 0, 5, b"d" * 1001))
    assert [(k, s, int.from_bytes(p, "big")) for k, _, s, p in peer.frames()] == [(WINDOW_UPDATE, 0, 35001)]


def test_a_held_stream_gets_no_window_back_until_it_is_opened():
    """A handler that stops reading (`held`) lets the stream's window run down: no WINDOW_UPDATE for it, the
    connection's still flows, DATA past what was granted is still an error, and `open_window` grants the
    window back in one WINDOW_UPDATE."""
    peer = server(Limits(stream_window_bytes=1000, connection_window_bytes=70000))
    peer.core.receive(frame(HEADERS, END_HEADERS, 1, request_block()))
    stream = peer.streams[1]
    stream.held = True
    peer.core.receive(frame(DATA, 0, 1, b"d" * 600) + frame(DATA, 0, 1, b"d" * 400))
    assert peer.frames() == [] and stream.recv_window == 0
    peer.core.open_window(stream)
    assert [(k, s, int.from_bytes(p, "big")) for k, _, s, p in peer.frames()] == [(WINDOW_UPDATE, 1, 1000)]
    assert not stream.held
    stream.held = True
    peer.core.receive(frame(DATA, 0, 1, b"d" * 1001))
    assert [(k, s, p) for k, _, s, p in peer.frames()] == [(RST_STREAM, 1, word(H2Error.FLOW_CONTROL_ERROR))]


def test_a_stream_whose_waiting_data_went_out_tells_its_handler_once():
    peer = server(initial_window=10)
    peer.core.receive(frame(HEADERS, END_HEADERS, 1, request_block()))
    stream = peer.streams[1]
    drained: list[int] = []
    peer.core.send(stream, RESPONSE_HEAD, [b"x" * 25], None)
    stream.on_drained = lambda: drained.append(1)
    peer.core.receive(frame(WINDOW_UPDATE, 0, 1, word(10)))
    assert drained == []  # 5 bytes still wait
    peer.core.receive(frame(WINDOW_UPDATE, 0, 1, word(100)))
    assert drained == [1] and stream.on_drained is None
    peer.core.send(stream, None, [b"y" * 5], None)  # went out at once: nothing to tell
    assert drained == [1]


def test_data_beyond_the_stream_window_resets_the_stream():
    peer = server(Limits(stream_window_bytes=100))
    peer.core.receive(frame(HEADERS, END_HEADERS, 1, request_block()) + frame(DATA, 0, 1, b"d" * 101))
    assert [(k, s, p) for k, _, s, p in peer.frames()] == [(RST_STREAM, 1, word(H2Error.FLOW_CONTROL_ERROR))]
    assert peer.handlers[1].reset_code == H2Error.FLOW_CONTROL_ERROR and peer.closed is None


def test_data_beyond_the_connection_window_fails_the_connection():
    peer = server(Limits(connection_window_bytes=70000))
    peer.core.receive(frame(HEADERS, END_HEADERS, 1, request_block()) + frame(DATA, 0, 1, b"d" * 70001))
    assert goaway_code(peer.frames()) == H2Error.FLOW_CONTROL_ERROR
    assert peer.closed == (False, H2Error.FLOW_CONTROL_ERROR, peer.closed[2])
    assert peer.handlers[1].reset_code == H2Error.FLOW_CONTROL_ERROR


# -------------------------------------------------------------------------- peer misbehaviour → error codes

BLOCK = request_block()
OPEN = frame(HEADERS, END_HEADERS, 1, BLOCK)
ENDED = frame(HEADERS, END_HEADERS | END_STREAM, 1, BLOCK)

CONNECTION_ERRORS = {
    "DATA on stream 0": (frame(DATA, 0, 0, b"x"), H2Error.PROTOCOL_ERROR),
    "DATA on an idle stream": (frame(DATA, 0, 5, b"x"), H2Error.PROTOCOL_ERROR),
    "HEADERS on an even stream": (frame(HEADERS, END_HEADERS, 2, BLOCK), H2Error.PROTOCOL_ERROR),
    "CONTINUATION without HEADERS": (frame(CONTINUATION, END_HEADERS, 1, BLOCK), H2Error.PROTOCOL_ERROR),
    "header block interrupted": (frame(HEADERS, 0, 1, BLOCK[:3]) + frame(PING, 0, 0, b"12345678"),
                                 H2Error.PROTOCOL_ERROR),
    "CONTINUATION on another stream": (frame(HEADERS, 0, 1, BLOCK[:3])
                                       + frame(CONTINUATION, END_HEADERS, 3, b""),
                                       H2Error.PROTOCOL_ERROR),
    "CONTINUATION flood": (frame(HEADERS, 0, 1, BLOCK[:1]) + frame(CONTINUATION, 0, 1, b"") * 20,
                           H2Error.ENHANCE_YOUR_CALM),
    "undecodable HPACK": (frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff"), H2Error.COMPRESSION_ERROR),
    "RST_STREAM on an idle stream": (frame(RST_STREAM, 0, 9, word(8)), H2Error.PROTOCOL_ERROR),
    "RST_STREAM of 3 bytes": (OPEN + frame(RST_STREAM, 0, 1, b"\0\0\0"), H2Error.FRAME_SIZE_ERROR),
    "WINDOW_UPDATE on an idle stream": (frame(WINDOW_UPDATE, 0, 11, word(1)), H2Error.PROTOCOL_ERROR),
    "connection WINDOW_UPDATE of 0": (frame(WINDOW_UPDATE, 0, 0, word(0)), H2Error.PROTOCOL_ERROR),
    "connection window past 2^31-1": (frame(WINDOW_UPDATE, 0, 0, word(0x7FFFFFFF)),
                                      H2Error.FLOW_CONTROL_ERROR),
    "SETTINGS on a stream": (frame(SETTINGS, 0, 1), H2Error.PROTOCOL_ERROR),
    "SETTINGS of 5 bytes": (frame(SETTINGS, 0, 0, b"\0" * 5), H2Error.FRAME_SIZE_ERROR),
    "SETTINGS ACK with a payload": (frame(SETTINGS, ACK, 0, b"\0" * 6), H2Error.FRAME_SIZE_ERROR),
    "ENABLE_PUSH 2": (settings(push=2), H2Error.PROTOCOL_ERROR),
    "INITIAL_WINDOW_SIZE past 2^31-1": (settings(initial_window=1 << 31), H2Error.FLOW_CONTROL_ERROR),
    "a stream window pushed past 2^31-1 by SETTINGS": (OPEN + frame(WINDOW_UPDATE, 0, 1, word(100))
                                                       + settings(initial_window=0x7FFFFFFF),
                                                       H2Error.FLOW_CONTROL_ERROR),
    "PING of 7 bytes": (frame(PING, 0, 0, b"1234567"), H2Error.FRAME_SIZE_ERROR),
    "PING on a stream": (frame(PING, 0, 1, b"12345678"), H2Error.PROTOCOL_ERROR),
    "PUSH_PROMISE": (frame(PUSH_PROMISE, END_HEADERS, 1, word(2) + BLOCK), H2Error.PROTOCOL_ERROR),
    "PRIORITY on stream 0": (frame(PRIORITY, 0, 0, b"\0" * 5), H2Error.PROTOCOL_ERROR),
    "malformed GOAWAY": (frame(GOAWAY, 0, 0, b"\0" * 4), H2Error.PROTOCOL_ERROR),
    "frame over our max frame size": (frame(DATA, 0, 1, b"\0" * ((1 << 20) + 1))[:20],
                                      H2Error.FRAME_SIZE_ERROR),
    "padding longer than the frame": (OPEN + frame(DATA, PADDED, 1, b"\x05ab"), H2Error.PROTOCOL_ERROR),
    "PING flood": (frame(PING, 0, 0, b"12345678") * 1001, H2Error.ENHANCE_YOUR_CALM),
    "SETTINGS flood": (frame(SETTINGS, 0, 0) * 201, H2Error.ENHANCE_YOUR_CALM),
    "empty frame flood": (OPEN + frame(DATA, 0, 1) * 1001, H2Error.ENHANCE_YOUR_CALM),
}


@pytest.mark.parametrize("sent, code", CONNECTION_ERRORS.values(), ids=CONNECTION_ERRORS.keys())
def test_connection_errors_are_goaway_with_the_rfcs_code(sent, code):
    peer = server()
    peer.core.receive(sent)
    frames = peer.frames()
    assert goaway_code(frames) == code
    assert peer.closed is not None and peer.closed[1] == (None if code == H2Error.NO_ERROR else code)
    assert peer.core.closed
    peer.core.receive(frame(PING, 0, 0, b"12345678"))  # nothing more is read or written
    assert peer.out() == b""


STREAM_ERRORS = {
    "DATA after END_STREAM": (ENDED + frame(DATA, 0, 1, b"x"), H2Error.STREAM_CLOSED),
    "HEADERS after END_STREAM": (ENDED + frame(HEADERS, END_HEADERS | END_STREAM, 1, BLOCK),
                                 H2Error.STREAM_CLOSED),
    "trailers without END_STREAM": (OPEN + frame(HEADERS, END_HEADERS, 1, BLOCK), H2Error.PROTOCOL_ERROR),
    "stream WINDOW_UPDATE of 0": (OPEN + frame(WINDOW_UPDATE, 0, 1, word(0)), H2Error.PROTOCOL_ERROR),
    "stream window past 2^31-1": (OPEN + frame(WINDOW_UPDATE, 0, 1, word(0x7FFFFFFF)),
                                  H2Error.FLOW_CONTROL_ERROR),
    "PRIORITY of 4 bytes": (OPEN + frame(PRIORITY, 0, 1, b"\0" * 4), H2Error.FRAME_SIZE_ERROR),
}


@pytest.mark.parametrize("sent, code", STREAM_ERRORS.values(), ids=STREAM_ERRORS.keys())
def test_stream_errors_are_rst_stream_with_the_rfcs_code_and_the_connection_serves_on(sent, code):
    peer = server()
    peer.core.receive(sent)
    assert [(k, s, p) for k, _, s, p in peer.frames()] == [(RST_STREAM, 1, word(code))]
    assert peer.handlers[1].reset_code == code and peer.core.open_streams == 0 and peer.closed is None
    peer.core.receive(frame(HEADERS, END_HEADERS | END_STREAM, 3, BLOCK))
    assert 3 in peer.handlers


@pytest.mark.parametrize("extra", [(("Upper", "x"),), (("connection", "close"),), ((":status", "200"),)],
                         ids=["uppercase name", "connection-specific", "response pseudo-header"])
def test_a_malformed_request_is_reset_protocol_error(extra):
    """§8.1.1: a stream error; the request never reaches the app."""
    peer = server()
    peer.core.receive(frame(HEADERS, END_HEADERS | END_STREAM, 1, request_block(extra=extra)))
    assert [(k, s, p) for k, _, s, p in peer.frames()] == [(RST_STREAM, 1, word(H2Error.PROTOCOL_ERROR))]
    assert peer.handlers == {}


def test_the_first_frame_must_be_settings():
    peer = Peer(Role.SERVER)
    peer.core.receive(PREFACE + frame(PING, 0, 0, b"12345678"))
    assert goaway_code(peer.frames()[-1:]) == H2Error.PROTOCOL_ERROR


def test_a_bad_preface_is_a_protocol_error():
    peer = Peer(Role.SERVER)
    peer.core.receive(b"GET / HTTP/1.1\r\n")
    assert goaway_code(peer.frames()) == H2Error.PROTOCOL_ERROR and peer.closed is not None


def test_streams_past_the_limit_are_refused():
    peer = server(Limits(max_concurrent_streams=2))
    peer.core.receive(b"".join(frame(HEADERS, END_HEADERS, sid, BLOCK) for sid in (1, 3, 5)))
    assert [(k, s, p) for k, _, s, p in peer.frames()] == [(RST_STREAM, 5, word(H2Error.REFUSED_STREAM))]
    assert set(peer.handlers) == {1, 3}


def test_rapid_reset_is_enhance_your_calm():
    peer = server(Limits(max_resets_per_window=3))
    for sid in (1, 3, 5, 7):
        peer.core.receive(frame(HEADERS, END_HEADERS, sid, BLOCK) + frame(RST_STREAM, 0, sid, word(8)))
    assert goaway_code(peer.frames()) == H2Error.ENHANCE_YOUR_CALM
    assert [peer.handlers[sid].reset_code for sid in (1, 3, 5)] == [H2Error.CANCEL] * 3


def test_acks_for_a_peer_that_does_not_read_are_limited():
    peer = server(Limits(max_unread_acks=3))
    peer.core.writing_paused()
    peer.core.receive(frame(PING, 0, 0, b"12345678") * 3)
    assert peer.closed is None
    peer.core.receive(frame(PING, 0, 0, b"12345678"))
    assert peer.closed is not None and peer.closed[0]  # aborted: a close would wait on the unread bytes
    assert goaway_code(peer.frames()) == H2Error.ENHANCE_YOUR_CALM


# ------------------------------------------------------------------------------------- RST_STREAM, GOAWAY

def test_rst_stream_from_the_peer_closes_the_stream_and_later_frames_are_ignored():
    peer = server()
    peer.core.receive(OPEN + frame(RST_STREAM, 0, 1, word(H2Error.CANCEL)))
    assert peer.handlers[1].reset_code == H2Error.CANCEL and peer.streams[1].state is S.CLOSED
    peer.core.receive(frame(DATA, 0, 1, b"late") + frame(WINDOW_UPDATE, 0, 1, word(1)) +
                      frame(RST_STREAM, 0, 1, word(8)))
    assert peer.out() == b"" and peer.closed is None
    assert not peer.core.send(peer.streams[1], RESPONSE_HEAD, [b"x"], TRAILERS)


def test_the_app_resets_a_stream():
    peer = server()
    peer.core.receive(OPEN)
    peer.core.reset_stream(peer.streams[1], H2Error.CANCEL, "stalled")
    assert [(k, s, p) for k, _, s, p in peer.frames()] == [(RST_STREAM, 1, word(H2Error.CANCEL))]
    assert peer.handlers[1].reset_code == H2Error.CANCEL


def test_graceful_shutdown_is_two_goaways_around_a_ping():
    peer = server()
    peer.core.receive(OPEN)
    peer.core.shutdown()
    (kind, _, _, first), (ping, _, _, payload) = peer.frames()
    assert (ping == PING and kind == GOAWAY and struct.unpack(">II", first) == (0x7FFFFFFF, 0)
            and payload == SHUTDOWN_PING)
    peer.core.receive(frame(HEADERS, END_HEADERS, 3, BLOCK) + frame(PING, ACK, 0, SHUTDOWN_PING))
    assert [(k, p[:8]) for k, _, _, p in peer.frames()] == [(GOAWAY, struct.pack(">II", 3, 0))]
    peer.core.receive(frame(HEADERS, END_HEADERS | END_STREAM, 5, BLOCK))  # after the final GOAWAY: ignored
    assert 5 not in peer.handlers and peer.closed is None
    for sid in (1, 3):
        peer.core.receive(frame(DATA, END_STREAM, sid, b""))
        peer.core.send(peer.streams[sid], RESPONSE_HEAD, [b"ok"], TRAILERS)
    assert peer.closed == (False, None, "")  # closed once the streams it took are done


def test_goaway_from_the_peer_closes_once_its_streams_finish():
    peer = server()
    peer.core.receive(ENDED + frame(GOAWAY, 0, 0, struct.pack(">II", 0, H2Error.NO_ERROR)))
    assert ("goaway", 0, H2Error.NO_ERROR) in peer.events and peer.closed is None
    peer.core.send(peer.streams[1], RESPONSE_HEAD, [b"ok"], TRAILERS)
    assert peer.closed == (False, None, "")


# ------------------------------------------------------------------------------------------------ timeouts

def test_no_preface_within_the_client_timeout_aborts_without_goaway():
    peer = Peer(Role.SERVER, Limits(client_timeout_secs=5))
    peer.core.initiate()
    peer.out()
    peer.core.tick(4.0)
    assert peer.closed is None
    peer.core.tick(5.0)
    assert peer.closed == (True, None, "") and peer.out() == b""


def test_an_idle_connection_gets_goaway_no_error():
    peer = server(Limits(idle_timeout_secs=60))
    peer.core.tick(59.0)
    assert peer.out() == b""
    peer.core.tick(60.0)
    assert [(k, p) for k, _, _, p in peer.frames()] == [(GOAWAY, struct.pack(">II", 0, 0))]
    assert peer.closed == (False, None, "")


@pytest.mark.parametrize("split", ["in one frame", "across CONTINUATIONs"])
def test_a_header_block_trickled_past_the_client_timeout_ends_the_connection(split):
    """Slowloris over HTTP/2: one byte of a header block per second keeps reads coming (no stall) and opens
    no stream (not busy), so only the block's own deadline ends it; a block that completes in time resets
    the count, and a slow body does not count (only its pauses do)."""
    peer = server(Limits(client_timeout_secs=5))
    block = request_block()
    wire = (frame(HEADERS, END_HEADERS | END_STREAM, 1, block) if split == "in one frame" else
            frame(HEADERS, END_STREAM, 1, block[:3]) + b"".join(
                frame(CONTINUATION, END_HEADERS if i + 1 >= len(block) else 0, 1, block[i:i + 1])
                for i in range(3, len(block))))
    for second in range(12):
        peer.core.receive(wire[second:second + 1])
        peer.core.tick(float(second))
        if peer.closed is not None:
            break
    assert 1 not in peer.handlers
    assert second == 3 + 5  # the frame's type is known from its 4th byte; then 5 s
    assert goaway_code(peer.frames()) == H2Error.NO_ERROR
    assert peer.closed is not None and "header block not complete" in peer.closed[2]


def test_header_blocks_that_complete_in_time_do_not_add_up():
    peer = server(Limits(client_timeout_secs=5))
    for second in range(20):  # a new request head every second, each half there at the tick
        sid = 2 * second + 1
        wire = frame(HEADERS, END_HEADERS | END_STREAM, sid, request_block())
        peer.core.receive(wire[:5])
        peer.core.tick(float(second))
        peer.core.receive(wire[5:])
        answer_at_once(peer, peer.streams[sid], None)
    assert peer.closed is None and len(peer.handlers) == 20


def test_answers_left_unread_end_the_connection():
    peer = server(Limits(client_timeout_secs=5), initial_window=0)
    peer.core.receive(ENDED)
    peer.core.send(peer.streams[1], RESPONSE_HEAD, [b"never sent"], TRAILERS)
    peer.out()
    for now in (1.0, 3.0, 5.0):
        peer.core.tick(now)
    assert peer.closed is None
    peer.core.tick(6.0)
    assert goaway_code(peer.frames()) == H2Error.ENHANCE_YOUR_CALM and peer.closed is not None


# -------------------------------------------------------------------------- server core ↔ client core

def pump(a: Peer, b: Peer) -> None:
    """Feed each core's bytes to the other until neither has anything to say."""
    for _ in range(1000):
        out_a, out_b = a.out(), b.out()
        if not out_a and not out_b:
            return
        if out_a:
            b.core.receive(out_a)
        if out_b:
            a.core.receive(out_b)
    raise AssertionError("the cores keep talking")


def connected(limits: Limits | None = None, client_limits: Limits | None = None) -> tuple[Peer, Peer]:
    srv, cli = Peer(Role.SERVER, limits), Peer(Role.CLIENT, client_limits)
    srv.core.initiate()
    cli.core.initiate()
    pump(cli, srv)
    assert ("settings",) in cli.events and ("settings",) in srv.events
    return srv, cli


def answer_ended(srv: Peer) -> None:
    """Answer every request that has ended with its own bytes reversed, then trailers."""
    for sid, handler in srv.handlers.items():
        stream = srv.streams[sid]
        if handler.ended and stream.state is S.HALF_CLOSED_REMOTE:
            srv.core.send(stream, RESPONSE_HEAD, [handler.data[::-1]], TRAILERS)


def test_server_and_client_cores_exchange_requests_and_answers():
    srv, cli = connected()
    calls = []
    for body in (b"one", b"two" * 1000, b""):
        handler = Handler()
        stream = cli.core.open_stream(handler)
        assert stream.state is S.IDLE
        assert cli.core.send(stream, request_block(), [body], None, end_stream=True)
        assert stream.state is S.HALF_CLOSED_LOCAL
        calls.append((stream, handler, body))
    pump(cli, srv)
    assert [srv.handlers[s.id].data for s, _, _ in calls] == [b for _, _, b in calls]
    answer_ended(srv)
    pump(srv, cli)
    for stream, handler, body in calls:
        (head, end), (trailers, last) = handler.heads
        assert head[b":status"] == b"200" and not end and trailers == {b"grpc-status": b"0"} and last
        assert handler.data == body[::-1] and stream.state is S.CLOSED
    assert cli.core.open_streams == 0 and srv.core.open_streams == 0
    assert [s.id for s, _, _ in calls] == [1, 3, 5]


def test_large_messages_both_ways_wait_for_windows_in_both_cores():
    """Windows far smaller than the messages, both ways: DATA waits in each core's queue until the other
    core's WINDOW_UPDATEs let it go, and arrives whole."""
    small = Limits(stream_window_bytes=70_000, connection_window_bytes=100_000, max_frame_bytes=16384)
    srv, cli = connected(small, small)
    body = bytes(range(256)) * 2000  # 512,000 bytes
    handler = Handler()
    stream = cli.core.open_stream(handler)
    assert not cli.core.send(stream, request_block(), [body], None, end_stream=True)  # queued
    pump(cli, srv)
    assert srv.handlers[1].data == body and srv.handlers[1].ended
    assert ("sent", 1) in cli.events
    answer_ended(srv)
    pump(srv, cli)
    assert handler.data == body[::-1] and handler.ended and stream.state is S.CLOSED
    assert ("sent", 1) in srv.events


def test_a_reset_and_a_shutdown_reach_the_client_core():
    srv, cli = connected()
    handlers = [Handler() for _ in range(3)]
    streams = [cli.core.open_stream(h) for h in handlers]
    for stream in streams[:2]:
        cli.core.send(stream, request_block(), [b"x"], None, end_stream=True)
    pump(cli, srv)
    srv.core.reset_stream(srv.streams[1], H2Error.CANCEL, "given up")
    srv.core.shutdown()
    pump(srv, cli)  # GOAWAY, PING; the client's ACK brings the final GOAWAY with last id 3
    assert handlers[0].reset_code == H2Error.CANCEL
    assert ("goaway", 3, H2Error.NO_ERROR) in cli.events
    assert handlers[2].reset_code == H2Error.REFUSED_STREAM  # opened, never sent: above the last id
    answer_ended(srv)
    pump(srv, cli)
    assert handlers[1].data == b"x" and handlers[1].ended
    assert srv.closed == (False, None, "") and cli.closed == (False, None, "")


def test_the_client_core_rejects_what_a_server_may_not_send():
    _, cli = connected()
    cli.core.receive(frame(HEADERS, END_HEADERS, 7, RESPONSE_HEAD))  # a stream we never opened
    assert goaway_code(cli.frames()) == H2Error.PROTOCOL_ERROR
    _, cli = connected()
    cli.core.receive(frame(PUSH_PROMISE, END_HEADERS, 1, word(2) + RESPONSE_HEAD))
    assert goaway_code(cli.frames()) == H2Error.PROTOCOL_ERROR
