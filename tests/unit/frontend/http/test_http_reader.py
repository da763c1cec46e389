"""The HTTP/1.1 connection's client side (engine/frontend/http/reader.py `RequestReader`), sans I/O: bytes
fed in, complete requests and refusals out, and its `ReadState` between. No sockets, no event loop."""

from __future__ import annotations

from engine.frontend.http.reader import DIRECT_BODY_BYTES, RequestReader
from engine.frontend.http.states import ReadState
from engine.frontend.http.types import HttpLimits, HttpRequest
from engine.frontend.in_place import IN_PLACE_GROWTH

LIMITS = HttpLimits(max_body_bytes=64, max_header_bytes=256, max_header_count=4)


def reader(limits: HttpLimits = LIMITS) -> tuple[RequestReader, list[HttpRequest]]:
    got: list[HttpRequest] = []
    return RequestReader(limits, None, got.append, 0.0), got


def post(body: bytes, path: bytes = b"/v2/models/simple/infer") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path, len(body), body)


def test_pipelined_requests_in_one_read_come_out_in_order():
    r, got = reader()
    assert r.feed(post(b"one") + post(b"two") + b"GET /v2/health/ready HTTP/1.1\r\n\r\n", 1.0) is None
    assert [(q.method, q.url, bytes(q.body)) for q in got] == [
        (b"POST", b"/v2/models/simple/infer", b"one"), (b"POST", b"/v2/models/simple/infer", b"two"),
        (b"GET", b"/v2/health/ready", b"")]
    assert r.state is ReadState.IDLE
    assert all(q.keep_alive and q.target is not None and q.refusal is None for q in got)


def test_the_state_follows_a_request_arriving_in_pieces():
    r, got = reader()
    whole = post(b"0123456789")
    r.feed(whole[:5], 1.0)
    assert r.state is ReadState.HEAD and r.head_at == 1.0 and r.current is not None
    r.feed(whole[5:-4], 2.0)
    assert r.state is ReadState.BODY and r.last_rx == 2.0 and not got
    r.feed(whole[-4:], 3.0)
    assert r.state is ReadState.IDLE and r.current is None
    assert [bytes(q.body) for q in got] == [b"0123456789"]


def test_a_declared_body_over_the_limit_is_refused_before_it_is_read():
    r, got = reader()
    problem = r.feed(b"POST /v2/models/simple/infer HTTP/1.1\r\nContent-Length: 65\r\n\r\n", 1.0)
    assert problem is not None and problem[0] == 413 and "65 bytes" in problem[1]
    assert not got


def test_a_chunked_body_is_refused_as_it_passes_the_limit():
    r, got = reader()
    head = b"POST /v2/models/simple/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert r.feed(head + b"20\r\n" + b"a" * 32 + b"\r\n", 1.0) is None
    problem = r.feed(b"21\r\n" + b"b" * 33 + b"\r\n", 2.0)
    assert problem is not None and problem[0] == 413
    assert not got


def test_too_many_header_fields_is_431():
    r, _ = reader()
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(5))
    problem = r.feed(b"GET /v2/health/ready HTTP/1.1\r\n" + fields + b"\r\n", 1.0)
    assert problem is not None and problem[0] == 431 and "4 header fields" in problem[1]


def test_a_head_that_keeps_growing_is_431_before_it_ends():
    r, _ = reader()
    assert r.feed(b"GET /v2/health/ready HTTP/1.1\r\nX-Long: ", 1.0) is None
    problem = r.feed(b"v" * 300, 2.0)
    assert problem is not None and problem[0] == 431 and "256 bytes" in problem[1]
    assert r.state is ReadState.HEAD  # the protocol stops the reader as it answers


def test_malformed_input_and_upgrades_are_400():
    r, _ = reader()
    problem = r.feed(b"NOT HTTP AT ALL\r\n\r\n", 1.0)
    assert problem is not None and problem[0] == 400 and problem[1].startswith("malformed HTTP request")
    r, _ = reader()
    problem = r.feed(b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 1.0)
    assert problem == (400, "protocol upgrades are not supported")


def test_a_path_read_two_ways_is_refused_but_still_delivered_in_its_turn():
    r, got = reader()
    assert r.feed(b"GET /v2/models/a%2Fb/ready HTTP/1.1\r\n\r\n", 1.0) is None
    assert len(got) == 1 and got[0].refusal is not None


def test_once_stopped_nothing_is_parsed_and_the_partial_request_is_handed_back():
    r, got = reader()
    r.feed(post(b"abc")[:-1], 1.0)
    r.stop()
    assert r.state is ReadState.STOPPED
    assert r.feed(b"c" + post(b"more"), 2.0) is None
    assert not got and r.last_rx == 2.0  # discarded input still counts as the client being alive
    partial = r.drop_partial()
    assert partial is not None and bytes(partial.body) == b"ab" and r.drop_partial() is None


def test_http10_keeps_alive_only_when_it_asks():
    r, got = reader()
    r.feed(b"GET /v2/health/ready HTTP/1.0\r\n\r\n", 1.0)
    r2, got2 = reader()
    r2.feed(b"GET /v2/health/ready HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 1.0)
    assert not got[0].keep_alive
    assert got2[0].keep_alive and got2[0].http10


# ---------------------------------------------------------------------------- large bodies, read in place

BIG_LIMITS = HttpLimits(max_body_bytes=1 << 20, max_header_bytes=256, max_header_count=4)


def fill(r: RequestReader, data: bytes, now: float) -> None:
    """What the protocol does while the reader reads in place (connection.py `get_buffer`, then
    `buffer_updated`), with `data` read in as many pieces as the buffer takes."""
    while data:
        assert r.in_place
        room = r.body_buffer()
        n = min(len(room), len(data))
        room[:n] = data[:n]
        r.body_read(n, now)
        data = data[n:]


def test_a_large_body_is_read_into_its_own_buffer_and_the_next_request_parses_after_it():
    r, got = reader(BIG_LIMITS)
    body = bytes(range(256)) * ((DIRECT_BODY_BYTES + 1000) // 256)
    head_and_part = post(body)[:-len(body) + 100]
    assert r.feed(head_and_part, 1.0) is None
    assert r.state is ReadState.BODY and not got
    assert r.in_place and len(r.body_buffer()) <= len(body) - 100  # never past the body
    fill(r, body[100:40_000], 2.0)
    assert r.state is ReadState.BODY and r.last_rx == 2.0 and r.in_place
    fill(r, body[40_000:], 3.0)
    assert not r.in_place and r.state is ReadState.IDLE and r.current is None
    assert len(got) == 1 and isinstance(got[0].body, bytearray) and bytes(got[0].body) == body
    # llhttp never saw those bytes: the next request (and one after it) must parse from its first byte
    assert r.feed(post(b"next") + b"GET /v2/health/ready HTTP/1.1\r\n\r\n", 4.0) is None
    assert [(q.method, bytes(q.body)) for q in got[1:]] == [(b"POST", b"next"), (b"GET", b"")]


def test_a_large_body_that_arrives_with_its_head_needs_no_buffer_of_its_own():
    r, got = reader(BIG_LIMITS)
    body = b"x" * (DIRECT_BODY_BYTES + 10)
    assert r.feed(post(body) + post(b"after"), 1.0) is None
    assert not r.in_place
    assert [bytes(q.body) for q in got] == [body, b"after"]


def test_bodies_read_in_place_only_when_their_length_is_known_and_they_are_wanted():
    r, got = reader(BIG_LIMITS)
    n = DIRECT_BODY_BYTES + 10
    # below the size, chunked, or refused at its head (an encoded '/' is never routed): parsed as it comes
    assert r.feed(post(b"y" * (DIRECT_BODY_BYTES - 1))[:-10], 1.0) is None
    assert not r.in_place
    r.feed(b"y" * 10, 1.0)
    assert r.feed(b"POST /v2/models/simple/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"%x\r\n" % n + b"z" * 100, 2.0) is None
    assert not r.in_place
    r.feed(b"z" * (n - 100) + b"\r\n0\r\n\r\n", 2.0)
    assert r.feed(post(b"w" * n, path=b"/v2/models/a%2Fb/infer")[:-n + 10], 3.0) is None
    assert not r.in_place and r.current is not None and r.current.refusal is not None
    r.feed(b"w" * (n - 10), 3.0)
    assert [len(q.body) for q in got] == [DIRECT_BODY_BYTES - 1, n, 0]


def test_stopping_or_dropping_a_body_being_read_in_place_lets_go_of_it():
    r, got = reader(BIG_LIMITS)
    body = b"q" * (DIRECT_BODY_BYTES * 2)
    r.feed(post(body)[:-len(body) + 5], 1.0)
    assert r.in_place
    dropped = r.drop_partial()
    assert dropped is not None and dropped.body[:5] == b"qqqqq" and not r.in_place
    r, got = reader(BIG_LIMITS)
    r.feed(post(body)[:-len(body) + 5], 1.0)
    r.stop()
    assert not r.in_place and r.state is ReadState.STOPPED and not got
    assert r.feed(b"q" * 100, 2.0) is None and not got  # what still comes is discarded


def test_a_body_read_in_place_holds_no_more_than_a_multiple_of_what_was_sent():
    """A head declaring a large body, then silence, must not make the server hold the declared size."""
    r, got = reader(BIG_LIMITS)
    head = b"POST /v2/models/simple/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % BIG_LIMITS.max_body_bytes
    assert r.feed(head, 1.0) is None and r.in_place
    assert r.current is not None and len(r.current.body) == DIRECT_BODY_BYTES  # not the declared 1 MiB
    sent = len(head)
    body = bytes(range(251)) * (BIG_LIMITS.max_body_bytes // 251 + 1)
    while r.in_place:
        held = len(r.current.body)
        assert held <= max(DIRECT_BODY_BYTES, 2 * IN_PLACE_GROWTH * sent), (held, sent)
        room = r.body_buffer()  # grows when full, keeping what arrived
        n = min(len(room), 50_000)
        room[:n] = body[sent - len(head):sent - len(head) + n]
        r.body_read(n, 2.0)
        sent += n
    assert len(got) == 1 and bytes(got[0].body) == body[:BIG_LIMITS.max_body_bytes]
