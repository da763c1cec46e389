"""Who may call what, and how much, on a real server (engine/access/policy.py wired into both frontends):
Triton's restriction flags with Triton's answers, hubserve's API keys over both protocols with tritonclient
(`headers=`), per-key quotas and the in-flight byte budget with raw HTTP (429 + Retry-After, the body
never buffered), and the flags refused at start. Every test holds under HUBSERVE_TEST_WORKERS=2 (limits
split between the frontend processes so that they hold server-wide).
"""

from __future__ import annotations

import http.client
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, start_server
from hubserve_models import examples
from serve_refusals import serve_refusals
from test_http_limits import INFER, A, B, RawConnection, infer_body, post, wait_for

BUDGET = 4_000_000  # --max-inflight-bytes; with --workers 2 each frontend holds half
HELD = 1_500_000  # a body two of which fit, three not (in one process or in either half)
KEYS = """
keys:
  - key: "s3cret-admin"
    groups: ["*"]
  - key: "s3cret-app"
    groups: [inference, metadata, health]
  - key: "s3cret-slow"
    groups: [inference, metadata]
    requests_per_second: 2
  - key: "s3cret-pair"
    groups: [inference]
    max_concurrent: 2
    tokens_per_minute: 20000
"""
ADMIN = {"Authorization": "Bearer s3cret-admin"}
APP = {"Authorization": "Bearer s3cret-app"}


@pytest.fixture(scope="module")
def guarded(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("access")
    (folder / "keys.yaml").write_text(KEYS)
    (folder / "keys.yaml").chmod(0o600)  # private, or the server refuses it (api_keys.file_mode_problem)
    srv = start_server(repository, folder / "server.log", "--no-strict-readiness", "--model-control-mode",
                       "none", "--api-keys", str(folder / "keys.yaml"),
                       "--http-restricted-api", "model-repository:Admin-Key=open sesame",
                       "--grpc-restricted-protocol=model-repository,statistics:admin-key=open sesame",
                       "--max-inflight-bytes", str(BUDGET))
    yield srv
    srv.stop()


def http_inputs() -> list:
    inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)
    return inputs


def grpc_inputs() -> list:
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)
    return inputs


def raw_get(port: int, path: str, headers: dict[str, str]) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


# ---------------------------------------------------------------------------- keys over HTTP

def test_http_keys_decide_who_may_call_what(guarded):
    with httpclient.InferenceServerClient(guarded.http_url) as client:
        assert client.is_server_live() and client.is_server_ready()  # health stays open for probes
        with pytest.raises(InferenceServerException) as e:
            client.infer("simple", http_inputs())
        assert e.value.status() == "401" and "Authorization: Bearer <key>" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            client.infer("simple", http_inputs(), headers={"Authorization": "Bearer wrong"})
        assert e.value.status() == "401"
        result = client.infer("simple", http_inputs(), headers=APP)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        assert client.get_model_metadata("simple", headers=APP)["name"] == "simple"
        with pytest.raises(InferenceServerException) as e:
            client.get_model_config("simple", headers=APP)
        assert e.value.status() == "403" and e.value.message() == \
            "this API key may not call the 'model-config' API"
        assert client.get_model_config("simple", headers=ADMIN)["name"] == "simple"
    missing = raw_get(guarded.http_port, "/v2", {})
    assert missing.status == 401 and missing.getheader("WWW-Authenticate") == "Bearer"
    assert raw_get(guarded.http_port, "/v2/no/such/endpoint", {}).status == 401  # no way round the key


def test_http_restriction_answers_as_triton(guarded):
    with httpclient.InferenceServerClient(guarded.http_url) as client:
        with pytest.raises(InferenceServerException) as e:
            client.get_model_repository_index(headers=ADMIN)  # the key may, the restriction says no
        assert e.value.status() == "403"
        assert e.value.message() == "This API is restricted, expecting header 'Admin-Key'"
        with pytest.raises(InferenceServerException):
            client.get_model_repository_index(headers={**ADMIN, "admin-key": "open"})
        index = client.get_model_repository_index(headers={**ADMIN, "ADMIN-KEY": "open sesame"})
        assert any(m["name"] == "simple" for m in index)  # header names match in any case
        with pytest.raises(InferenceServerException) as e:
            client.get_model_repository_index(headers={**APP, "admin-key": "open sesame"})
        assert e.value.status() == "403" and "model-repository" in e.value.message()  # and then the key


# ---------------------------------------------------------------------------- keys over gRPC

def test_grpc_keys_decide_who_may_call_what(guarded):
    with grpcclient.InferenceServerClient(guarded.grpc_url) as client:
        assert client.is_server_live() and client.is_model_ready("simple")  # health stays open
        with pytest.raises(InferenceServerException) as e:
            client.infer("simple", grpc_inputs())
        assert e.value.status() == "StatusCode.UNAUTHENTICATED"
        assert "Authorization: Bearer <key>" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            client.infer("simple", grpc_inputs(), headers={"authorization": "Bearer wrong"})
        assert e.value.status() == "StatusCode.UNAUTHENTICATED"
        result = client.infer("simple", grpc_inputs(), headers={"authorization": "Bearer s3cret-app"})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
        with pytest.raises(InferenceServerException) as e:
            client.get_model_config("simple", headers={"authorization": "Bearer s3cret-app"})
        assert e.value.status() == "StatusCode.PERMISSION_DENIED"
        assert e.value.message() == "this API key may not call the 'model-config' API"
        assert client.get_model_config("simple", headers={"authorization": "Bearer s3cret-admin"}) \
            .config.name == "simple"


def test_grpc_restriction_answers_as_triton(guarded):
    admin = {"authorization": "Bearer s3cret-admin"}
    with grpcclient.InferenceServerClient(guarded.grpc_url) as client:
        for call in (client.get_model_repository_index, client.get_inference_statistics):
            with pytest.raises(InferenceServerException) as e:
                call(headers=admin)
            assert e.value.status() == "StatusCode.UNAVAILABLE"
            assert e.value.message() == \
                "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
        allowed = {**admin, "triton-grpc-protocol-admin-key": "open sesame"}
        assert any(m.name == "simple" for m in client.get_model_repository_index(headers=allowed).models)
        assert client.get_inference_statistics("simple", headers=allowed).model_stats


# ---------------------------------------------------------------------------- quotas: 429, RESOURCE_EXHAUSTED

def test_rate_limit_answers_429_with_retry_after(guarded):
    headers = {"Authorization": "Bearer s3cret-slow"}
    statuses, retry = [], None
    for _ in range(8):  # a new connection each time, so requests reach every frontend process
        response = raw_get(guarded.http_port, "/v2/models/simple", headers)
        statuses.append(response.status)
        if response.status == 429:
            retry = response.getheader("Retry-After")
    assert set(statuses) == {200, 429}, statuses
    assert retry is not None and int(retry) >= 1
    wait_for(lambda: raw_get(guarded.http_port, "/v2/models/simple", headers).status == 200, 10,
             "the bucket to refill")


def test_rate_limit_over_grpc_is_resource_exhausted(guarded):
    headers = {"authorization": "Bearer s3cret-slow"}
    codes = []
    with grpcclient.InferenceServerClient(guarded.grpc_url) as client:
        for _ in range(8):
            try:
                client.get_model_metadata("simple", headers=headers)
                codes.append("OK")
            except InferenceServerException as e:
                codes.append(e.status())
                message = e.message()
    assert "StatusCode.RESOURCE_EXHAUSTED" in codes, codes
    assert "requests_per_second 2" in message and "retry after" in message


def test_concurrency_limit_holds_server_wide(guarded):
    """Six requests of a key with max_concurrent 2 held open (heads in and each decided, as its 100 Continue
    says, bodies not yet sent): never more than two admitted, whichever frontend process each connection
    lands in (with --workers 2 each holds one slot, and where the engine hands a connection depends on the
    connections each already has open, so the test cannot count on them filling both); the others are
    refused naming the limit; once they are answered the key may go on."""
    key = "Authorization: Bearer s3cret-pair\r\n"
    body = infer_body()
    held = [RawConnection(guarded.http_port) for _ in range(6)]
    for conn in held:
        conn.send(f"POST {INFER} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
                  f"Expect: 100-continue\r\n{key}\r\n".encode())
        assert conn.response().status == 100
    for conn in held:
        conn.send(body)
    responses = [conn.response() for conn in held]
    statuses = [r.status for r in responses]
    assert statuses.count(200) <= 2 and statuses.count(429) >= 4, statuses
    assert set(statuses) <= {200, 429}, statuses
    assert all("max_concurrent 2" in r.error() for r in responses if r.status == 429)
    for conn in held:
        conn.close()
    probe = RawConnection(guarded.http_port)
    wait_for(lambda: (probe.send(post(INFER, body, key)), probe.response().status)[1] == 200, 10,
             "the slots to come back")
    probe.close()


def test_inflight_byte_budget_refuses_before_reading_the_body(guarded):
    """Three large bodies announced at once (their heads sent, then their bodies): at most two fit the
    budget (in one process, or one in each half with --workers 2); the others are refused at their heads,
    their bodies discarded as they arrive, and their connections go on."""
    extra = "Authorization: Bearer s3cret-admin\r\n"
    held = [RawConnection(guarded.http_port) for _ in range(3)]
    for conn in held:  # one at a time, each head decided before the next is sent: its 100 Continue says so
        conn.send(f"POST {INFER} HTTP/1.1\r\nHost: t\r\nContent-Length: {HELD}\r\n"
                  f"Expect: 100-continue\r\n{extra}\r\n".encode())
        assert conn.response().status == 100
    for conn in held:
        conn.send(b"x" * HELD)
    responses = [conn.response() for conn in held]
    statuses = [r.status for r in responses]
    assert statuses.count(400) <= 2 and statuses.count(429) >= 1, statuses  # 400: admitted, read, no JSON
    refused = responses[statuses.index(429)]
    assert refused.headers["retry-after"] == "1" and "--max-inflight-bytes" in refused.error()
    again = held[statuses.index(429)]
    again.send(post(INFER, infer_body(), extra))  # the same connection: the refused body was discarded
    assert again.response().status == 200
    again.send(post(INFER, b"x" * (BUDGET + 1), extra))
    response = again.response()
    assert response.status == 429 and "larger than the server's budget" in response.error()
    for conn in held:
        conn.close()


def test_chunked_body_is_counted_as_it_arrives(guarded):
    """A body that declares no size grows its reservation chunk by chunk; past the budget it is refused,
    the rest of it discarded, and the connection answers on."""
    conn = RawConnection(guarded.http_port)
    chunk = b"x" * (512 << 10)
    conn.send(f"POST {INFER} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
              "Authorization: Bearer s3cret-admin\r\n\r\n".encode())
    for _ in range((BUDGET + len(chunk)) // len(chunk) + 1):
        conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    conn.send(b"0\r\n\r\n")
    response = conn.response()
    assert response.status == 429 and "--max-inflight-bytes" in response.error()
    conn.send(post(INFER, infer_body(), "Authorization: Bearer s3cret-admin\r\n"))
    assert conn.response().status == 200
    conn.close()


def test_grpc_message_over_the_budget_is_resource_exhausted(guarded):
    """A gRPC message is counted against the budget as it arrives, before it is decoded or queued (this one
    would otherwise fail on its shape)."""
    big = np.zeros((1, 2_000_000), dtype=np.int32)  # 8 MB: over the whole budget
    inputs = [grpcclient.InferInput(name, list(big.shape), "INT32") for name in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(big)
    with grpcclient.InferenceServerClient(guarded.grpc_url) as client:
        with pytest.raises(InferenceServerException) as e:
            client.infer("simple", inputs, headers={"authorization": "Bearer s3cret-admin"})
        assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "--max-inflight-bytes" in e.value.message()
        result = client.infer("simple", grpc_inputs(), headers={"authorization": "Bearer s3cret-admin"})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)  # and its bytes came back


# ---------------------------------------------------------------------------- flags refused at start

def test_bad_flags_fail_at_start_in_tritons_words(repository: Path, tmp_path: Path):
    misspelt, one_slot = tmp_path / "keys.yaml", tmp_path / "one_slot.yaml"
    misspelt.write_text("keys:\n  - key: top-secret\n    groups: [inference]\n    max_concurent: 2\n")
    one_slot.write_text("keys:\n  - key: k\n    groups: [inference]\n    max_concurrent: 1\n")
    misspelt.chmod(0o600)
    one_slot.chmod(0o600)
    cases = [("--http-restricted-api", "admin:k=v"),
             ("--grpc-restricted-protocol", "health:a=1",
              "--grpc-restricted-protocol", "inference,health:b=2"),
             ("--http-restricted-api", "inference"),
             ("--api-keys", str(misspelt)),
             ("--api-keys", str(one_slot), "--workers", "2"),
             ("--api-keys", str(tmp_path / "missing.yaml"))]
    admin, twice, no_setting, unknown, split, missing = serve_refusals(repository, *cases)
    assert "unknown restricted api 'admin'" in admin
    assert "restricted protocol 'health' can not be specified in multiple config groups" in twice
    assert "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got inference" in \
        no_setting
    assert "unknown field(s) 'max_concurent'" in unknown and "top-secret" not in unknown
    assert "cannot be split across 2 frontend processes" in split
    assert "cannot read 'missing.yaml'" in missing


def test_no_flags_means_everything_open(server):
    """The default: no keys, no restrictions, no budget (docs/security.md)."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert client.get_model_repository_index()
    assert raw_get(server.http_port, "/v2", {}).status == 200


def metrics_text(server) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        return r.read().decode()


def test_each_key_has_its_share_of_a_sequence_backlog(tmp_path: Path):
    """simple_sequence has 8 slots. With --max-sequence-backlog-per-key 3, the admin key's stream holds the 8
    slots and 3 waiting sequences; its next STARTs are refused on the stream (RESOURCE_EXHAUSTED, in words
    naming the flag), while the app key's START still waits for a slot."""
    (tmp_path / "keys.yaml").write_text(KEYS)
    (tmp_path / "keys.yaml").chmod(0o600)  # private, or the server refuses it (api_keys.file_mode_problem)
    root = tmp_path / "repo"
    (root / "simple_sequence").mkdir(parents=True)
    shutil.copy(EXAMPLES / "simple_sequence" / "config.pbtxt", root / "simple_sequence" / "config.pbtxt")
    examples.build_repository(root, ["simple_sequence"])
    srv = start_server(root, tmp_path / "server.log", "--model-control-mode", "none", "--api-keys",
                       str(tmp_path / "keys.yaml"), "--max-sequence-backlog-per-key", "3")
    streams = []
    try:
        errors: dict[str, list] = {"admin": [], "app": []}
        for who in errors:
            c = grpcclient.InferenceServerClient(srv.grpc_url)
            c.start_stream(callback=lambda result, error, who=who: errors[who].append(error) if error else 0,
                           headers={"authorization": f"Bearer s3cret-{who}"})
            streams.append(c)
        value = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        value.set_data_from_numpy(np.ones((1, 1), np.int32))
        for sid in range(1, 8 + 3 + 2 + 1):  # 8 slots, 3 waiting, then 2 past the key's share
            streams[0].async_stream_infer("simple_sequence", [value], sequence_id=sid, sequence_start=True)
        wait_for(lambda: len(errors["admin"]) == 2, 20, "the refusals of the starts past the key's share")
        assert all("(--max-sequence-backlog-per-key)" in e.message() for e in errors["admin"])
        assert "this API key already has 3 sequences waiting" in errors["admin"][0].message()
        streams[1].async_stream_infer("simple_sequence", [value], sequence_id=100, sequence_start=True)
        wait_for(lambda: 'hubserve_sequence_backlog{model="simple_sequence",version="1"} 4' in
                 metrics_text(srv), 20, "the other key's sequence in the backlog")
        assert errors["app"] == []
    finally:
        for c in streams:
            c.stop_stream(cancel_requests=True)
            c.close()
        srv.stop()
