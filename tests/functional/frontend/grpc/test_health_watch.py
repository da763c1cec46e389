"""grpc.health.v1 Health/Watch against a real server (grpcio's channel, and raw HTTP/2 where the point is the
streams on one connection):
- with --api-keys, Watch needs a key with the `health` group like every other RPC, while the one-shot
  Health/Check stays keyless, as HTTP's /v2/health/* (load balancers and probes);
- at most 16 Watch streams per connection and --grpc-max-health-watches server-wide: more are refused
  RESOURCE_EXHAUSTED, and a stream that ends makes room;
- every stream is told when its service's readiness changes (a model unloaded and loaded again).
After each hostile case the server answers a correct inference on both protocols. Holds under
HUBSERVE_TEST_WORKERS=2 (each frontend process holds its share of the server-wide cap; a connection lands in
one of them).
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import grpc
import pytest

from conftest import RunningServer, assert_serves_simple, start_server
from h2_client import DATA, END_STREAM, HEADERS, RST_STREAM, RawClient, frame, grpc_message
from python_models import add_simple

WORKERS = int(os.environ.get("HUBSERVE_TEST_WORKERS", "1"))
WATCH = "/grpc.health.v1.Health/Watch"
CHECK = "/grpc.health.v1.Health/Check"
FREE = "Bearer free"
KEYS = 'keys:\n  - key: "free"\n    groups: ["*"]\n  - key: "infer-only"\n    groups: [inference]\n'
SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"  # HealthCheckResponse{status}


def request(service: str = "") -> bytes:
    """A HealthCheckRequest (field 1, `service`)."""
    data = service.encode()
    return b"\x0a" + bytes([len(data)]) + data if data else b""


def _start(tmp: Path, *extra: str) -> RunningServer:
    repo = tmp / "repo"
    add_simple(repo)
    (tmp / "keys.yaml").write_text(KEYS)
    (tmp / "keys.yaml").chmod(0o600)
    return start_server(repo, tmp / "server.log", "--canary-interval-secs", "0", "--api-keys",
                        str(tmp / "keys.yaml"), "--model-control-mode", "explicit", "--load-model", "simple",
                        *extra, ready_timeout=120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = _start(tmp_path_factory.mktemp("health_watch"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory):
    srv = _start(tmp_path_factory.mktemp("health_watch_capped"),
                 "--grpc-max-health-watches", str(2 * WORKERS))
    yield srv
    srv.stop()

def watch(channel: grpc.Channel, service: str = "", key: str | None = FREE):
    call = channel.unary_stream(WATCH, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    return call(request(service), timeout=30, metadata=(("authorization", key),) if key else None)


def open_watches(c: RawClient, first_id: int, count: int, key: str = FREE) -> None:
    for i in range(count):
        sid = first_id + 2 * i
        c.send(c.headers(sid, WATCH, (("authorization", key),))
               + frame(DATA, END_STREAM, sid, grpc_message(b"")))


def answers(c: RawClient, stream_ids: set[int]) -> dict[int, str]:
    """Each stream's first answer: "serving" (a status message) or its refusal's grpc-status."""
    got: dict[int, str] = {}
    while set(got) != stream_ids:
        found = c.read()
        assert found is not None, f"connection closed with {sorted(stream_ids - set(got))} unanswered"
        kind, _, sid, payload = found
        if sid not in stream_ids or sid in got:
            continue
        if kind == DATA and payload:
            assert payload[5:] == SERVING, payload
            got[sid] = "serving"
        elif kind == HEADERS:
            fields = dict(c.decoder.decode(payload))
            if "grpc-status" in fields:
                got[sid] = fields["grpc-status"] + " " + fields.get("grpc-message", "")
    return got


def test_watch_needs_a_key_with_the_health_group_and_check_does_not(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as e:
            next(watch(channel, key=None))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:
            next(watch(channel, key="Bearer infer-only"))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'health'" in e.value.details()
        stream = watch(channel)
        assert next(stream) == SERVING
        stream.cancel()
        check = channel.unary_unary(CHECK, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        assert check(request(), timeout=10) == SERVING  # the one-shot check needs no key, as HTTP health
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=10) as r:
        assert r.status == 200
    assert_serves_simple(server, FREE)


def test_watch_streams_are_capped_per_connection(server: RunningServer) -> None:
    c = RawClient(server.grpc_port)
    try:
        c.handshake()
        open_watches(c, 1, 17)
        got = answers(c, {1 + 2 * i for i in range(17)})
        assert list(got.values()).count("serving") == 16
        assert got[33].startswith("8 ") and "this connection has 16 Health/Watch streams" in got[33], got[33]
        c.send(frame(RST_STREAM, 0, 1, (8).to_bytes(4, "big")))  # one leaves (CANCEL): room for one more
        open_watches(c, 35, 1)
        assert answers(c, {35}) == {35: "serving"}
        other = RawClient(server.grpc_port)  # another connection has its own 16
        try:
            other.handshake()
            open_watches(other, 1, 1)
            assert answers(other, {1}) == {1: "serving"}
        finally:
            other.close()
    finally:
        c.close()
    assert_serves_simple(server, FREE)


def test_watch_streams_are_capped_server_wide(capped: RunningServer) -> None:
    """--grpc-max-health-watches 2 (per frontend process): the third Watch is refused, and one ending makes
    room."""
    c = RawClient(capped.grpc_port)
    try:
        c.handshake()
        open_watches(c, 1, 3)
        got = answers(c, {1, 3, 5})
        assert [got[1], got[3]] == ["serving", "serving"]
        assert got[5].startswith("8 ") and "--grpc-max-health-watches" in got[5], got[5]
        c.send(frame(RST_STREAM, 0, 1, (8).to_bytes(4, "big")))
        open_watches(c, 7, 1)
        assert answers(c, {7}) == {7: "serving"}
    finally:
        c.close()
    assert_serves_simple(capped, FREE)


def test_every_watch_is_told_when_readiness_changes(server: RunningServer) -> None:
    def repository(action: str) -> None:
        req = urllib.request.Request(f"http://{server.http_url}/v2/repository/models/simple/{action}", b"{}",
                                     headers={"Authorization": FREE})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200

    with grpc.insecure_channel(server.grpc_url) as channel:
        streams = [watch(channel, "simple") for _ in range(3)]
        assert [next(s) for s in streams] == [SERVING] * 3
        repository("unload")
        assert [next(s) for s in streams] == [NOT_SERVING] * 3
        repository("load")
        assert [next(s) for s in streams] == [SERVING] * 3
        unknown = watch(channel, "no_such_model")
        assert next(unknown) == b"\x08\x03"  # SERVICE_UNKNOWN; the stream stays open (the health protocol)
        for s in [*streams, unknown]:
            s.cancel()
    assert_serves_simple(server, FREE)

