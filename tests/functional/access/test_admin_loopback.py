"""The secure default of the admin groups (engine/access/policy.py LoopbackOnly): model-repository, logging,
trace and shared-memory answer only clients on loopback until the operator opens a group, with a restriction
on it (per protocol), an API key holding it, or --allow-remote-admin-api. Both protocols, both process
layouts.

The remote side is real: the servers listen on every address and the client connects to this machine's own
non-loopback address (eth0's here), so the server sees a peer that is not 127.0.0.1 and no option makes the
server pretend. A machine with no such address skips these tests (saying so); nothing else can stand in.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import assert_simple_over_grpc, start_server
from test_encoded_paths import INFER, keys_file, request


def local_remote_address() -> str | None:
    """An address of this machine that is not loopback (the source the kernel picks towards a TEST-NET
    address: no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


REMOTE = local_remote_address()
pytestmark = pytest.mark.skipif(REMOTE is None, reason="no non-loopback address on this machine to connect "
                                                       "from: the remote side cannot be tested for real")

# (group, method, path, body) over HTTP; (group, call) over gRPC
HTTP_ADMIN = [("model-repository", "POST", "/v2/repository/index", b"{}"),
              ("model-repository", "POST", "/v2/repository/models/simple/load", b"{}"),
              ("logging", "POST", "/v2/logging", b'{"log_error": false}'),
              ("trace", "POST", "/v2/trace/setting", b'{"trace_rate": "9"}'),
              ("trace", "GET", "/v2/models/simple/trace/setting", None),
              ("shared-memory", "GET", "/v2/systemsharedmemory/status", None),
              ("shared-memory", "POST", "/v2/systemsharedmemory/unregister", b"")]
GRPC_ADMIN = [("model-repository", lambda c, h: c.get_model_repository_index(headers=h)),
              ("model-repository", lambda c, h: c.load_model("simple", headers=h)),
              ("logging", lambda c, h: c.update_log_settings({"log_error": False}, headers=h)),
              ("trace", lambda c, h: c.get_trace_settings(headers=h)),
              ("shared-memory", lambda c, h: c.get_system_shared_memory_status(headers=h)),
              ("shared-memory", lambda c, h: c.unregister_system_shared_memory(headers=h))]


def http_answer(host: str, port: int, method: str, path: str, body: bytes | None,
                headers: dict[str, str] | None = None) -> tuple[int, str]:
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def grpc_outcome(host: str, port: int, call, headers: dict[str, str] | None = None) -> tuple[str, str]:
    with grpcclient.InferenceServerClient(f"{host}:{port}") as c:
        try:
            call(c, headers or {})
        except InferenceServerException as e:
            return e.status(), e.message()
    return "OK", ""


def serve(repository: Path, tmp_path: Path, workers: str, *flags: str):
    return start_server(repository, tmp_path / "server.log", "--workers", workers, "--host", "0.0.0.0",
                        "--model-control-mode", "explicit", "--load-model", "simple", "--allow-client-shm",
                        *flags)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_admin_groups_answer_only_loopback_by_default(repository: Path, tmp_path: Path, workers: str) -> None:
    srv = serve(repository, tmp_path, workers)
    try:
        for group, method, path, body in HTTP_ADMIN:
            status, text = http_answer(REMOTE, srv.http_port, method, path, body)
            assert status == 403, (path, status, text)
            message = json.loads(text)["error"]
            assert message.startswith("This API is restricted to clients on loopback")
            assert f"--http-restricted-api {group}:" in message
            assert f"--allow-remote-admin-api {group}" in message
        for group, call in GRPC_ADMIN:
            status, message = grpc_outcome(REMOTE, srv.grpc_port, call)
            assert status == "StatusCode.UNAVAILABLE", (group, status, message)  # as Triton's restrictions
            assert message.startswith("This protocol is restricted to clients on loopback")
            assert f"--grpc-restricted-protocol {group}:" in message
        # the error log a remote client tried to silence is still on
        status, text = http_answer("127.0.0.1", srv.http_port, "GET", "/v2/logging", None)
        assert status == 200 and json.loads(text)["log_error"] is True
        # what uses the server stays open to every client
        assert request_from(REMOTE, srv.http_port, "POST", "/v2/models/simple/infer", INFER) == 200
        assert request_from(REMOTE, srv.http_port, "GET", "/v2/models/simple/config", None) == 200
        assert request_from(REMOTE, srv.http_port, "GET", "/v2/health/ready", None) == 200
        with grpcclient.InferenceServerClient(f"{REMOTE}:{srv.grpc_port}") as c:
            assert c.is_server_ready() and c.get_model_metadata("simple").name == "simple"
        # and on loopback, every admin call answers
        for _, method, path, body in HTTP_ADMIN:
            assert http_answer("127.0.0.1", srv.http_port, method, path, body)[0] == 200, path
        for group, call in GRPC_ADMIN:
            assert grpc_outcome("127.0.0.1", srv.grpc_port, call) == ("OK", ""), group
        assert_simple_over_grpc(srv)
    finally:
        srv.stop()


def request_from(host: str, port: int, method: str, path: str, body: bytes | None) -> int:
    return http_answer(host, port, method, path, body)[0]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_restriction_a_key_or_the_flag_opens_a_group(repository: Path, tmp_path: Path,
                                                        workers: str) -> None:
    """A restriction opens its group on its own protocol only; a key holding a group opens it on both; the
    flag opens the groups it names, with nothing asked."""
    keys = keys_file(tmp_path)  # `only-logging` holds the logging group, and so on
    srv = serve(repository, tmp_path, workers, "--http-restricted-api", "model-repository:admin=s3cret",
                "--api-keys", str(keys), "--allow-remote-admin-api", "shared-memory")
    try:
        repo = {"admin": "s3cret", "Authorization": "Bearer only-model-repository"}
        assert request(srv.http_port, "POST", "/v2/repository/index", b"{}", repo) == 200  # (loopback)
        assert http_answer(REMOTE, srv.http_port, "POST", "/v2/repository/index", b"{}", repo)[0] == 200
        key_only = {"Authorization": "Bearer only-model-repository"}  # no restriction header: Triton's 403
        assert http_answer(REMOTE, srv.http_port, "POST", "/v2/repository/index", b"{}", key_only)[0] == 403
        logging = {"Authorization": "Bearer only-logging"}
        assert http_answer(REMOTE, srv.http_port, "GET", "/v2/logging", None, logging)[0] == 200
        assert grpc_outcome(REMOTE, srv.grpc_port, lambda c, h: c.get_log_settings(headers=h),
                            {"authorization": "Bearer only-logging"}) == ("OK", "")
        shm = {"Authorization": "Bearer only-shared-memory"}
        assert http_answer(REMOTE, srv.http_port, "GET", "/v2/systemsharedmemory/status", None, shm)[0] == 200
        assert grpc_outcome(REMOTE, srv.grpc_port, lambda c, h: c.get_system_shared_memory_status(headers=h),
                            {"authorization": "Bearer only-shared-memory"}) == ("OK", "")
    finally:
        srv.stop()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_flag_alone_opens_only_what_it_names(repository: Path, tmp_path: Path, workers: str) -> None:
    srv = serve(repository, tmp_path, workers, "--allow-remote-admin-api", "trace,logging",
                "--grpc-restricted-protocol", "model-repository:admin=s3cret")
    try:
        assert request_from(REMOTE, srv.http_port, "GET", "/v2/trace/setting", None) == 200
        assert request_from(REMOTE, srv.http_port, "GET", "/v2/logging", None) == 200
        assert grpc_outcome(REMOTE, srv.grpc_port, lambda c, h: c.get_trace_settings(headers=h)) == ("OK", "")
        # a gRPC restriction opens gRPC only: HTTP still answers loopback only
        assert request_from(REMOTE, srv.http_port, "POST", "/v2/repository/index", b"{}") == 403
        assert grpc_outcome(REMOTE, srv.grpc_port, lambda c, h: c.get_model_repository_index(headers=h),
                            {"triton-grpc-protocol-admin": "s3cret"}) == ("OK", "")
        assert request_from(REMOTE, srv.http_port, "GET", "/v2/systemsharedmemory/status", None) == 403
    finally:
        srv.stop()


def test_the_flag_takes_admin_groups_only(repository: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import ROOT
    proc = subprocess.run([sys.executable, "-m", "engine", "serve", "--model-repository", str(repository),
                           "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
                           "--metrics-port", "0", "--allow-remote-admin-api", "inference"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "'inference' is not an admin API group" in proc.stderr
