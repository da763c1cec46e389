"""The HTTP/1.1 connection's client side (engine/frontend/http/reader.py `RequestReader`), sans I/O: bytes
fed in, complete requests and refusals out, and its `ReadState` between. No sockets, no event loop."""

from __future__ import annotations

from engine.frontend.http.reader import RequestReader
from engine.frontend.http.states import ReadState
from engine.frontend.http.types import HttpLimits, HttpRequest

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
