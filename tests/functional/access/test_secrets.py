"""Where the server's secrets may be seen (issue 27): restriction values never on a frontend's command line
or in its environment (--workers N: they cross through an inherited pipe, workers/supervisor.py), an
--api-keys file others can read or change is refused at start (api_keys.file_mode_problem), and what a
client sends in its headers (its key, a restriction value) never reaches the log, at any verbose level.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, assert_simple_over_grpc, start_server, wait_until
from test_encoded_paths import INFER, request
from test_workers import _alive, frontends, wait_for

SECRET_HTTP, SECRET_GRPC = "TOPSECRET-http-5b1c", "TOPSECRET-grpc-77ad"
KEYS = 'keys:\n  - key: "TOPSECRET-key-0e41"\n    groups: ["*"]\n'


def _execed(pid: int) -> bool:
    try:
        return b"engine.workers.frontend" in process_text(pid)
    except (FileNotFoundError, ProcessLookupError):
        return False


def process_text(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read()
    with open(f"/proc/{pid}/environ", "rb") as f:
        return cmdline + f.read()


def restricted_calls_answer(srv) -> None:
    """The frontends hold the restrictions they were sent: refused without the header, served with it."""
    for _ in range(4):  # connections spread over both frontends
        assert request(srv.http_port, "POST", "/v2/repository/index", b"{}", {}) == 403
        assert request(srv.http_port, "POST", "/v2/repository/index", b"{}", {"admin": SECRET_HTTP}) == 200
        with grpcclient.InferenceServerClient(srv.grpc_url) as c:
            with pytest.raises(InferenceServerException) as e:
                c.get_log_settings()
            assert e.value.status() == "StatusCode.UNAVAILABLE"
            c.get_log_settings(headers={"triton-grpc-protocol-admin": SECRET_GRPC})


def test_restriction_values_never_reach_a_frontends_command_line(repository: Path, tmp_path: Path) -> None:
    srv = start_server(repository, tmp_path / "server.log", "--workers", "2", "--no-strict-readiness",
                       "--http-restricted-api", f"model-repository:admin={SECRET_HTTP}",
                       "--grpc-restricted-protocol", f"logging:admin={SECRET_GRPC}")
    try:
        pids = wait_for(lambda: frontends(srv) if len(frontends(srv)) == 2 else None, 30, "two frontends")
        for pid in pids:
            text = process_text(pid)
            assert b"engine.workers.frontend" in text
            assert SECRET_HTTP.encode() not in text and SECRET_GRPC.encode() not in text
        restricted_calls_answer(srv)
        os.kill(pids[0], signal.SIGKILL)  # a restarted frontend is sent them again, the same way
        # a child between fork and exec still shows the engine's own command line: wait for the exec
        wait_for(lambda: not _alive(pids[0]) and len(frontends(srv)) == 2 and pids[0] not in frontends(srv)
                 and all(_execed(pid) for pid in frontends(srv)), 30, "the frontend's restart")
        for pid in frontends(srv):
            assert SECRET_HTTP.encode() not in process_text(pid)
        wait_for(lambda: request(srv.http_port, "GET", "/v2/health/live", None, {}) == 200, 30, "serving")
        restricted_calls_answer(srv)
        assert_simple_over_grpc(srv)
    finally:
        srv.stop()


def serve_exit(repository: Path, keys: Path) -> subprocess.CompletedProcess:
    """A server started on `keys` that either fails at start or is stopped once it serves."""
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model-repository", str(repository),
                             "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port",
                             "0", "--no-strict-readiness", "--model-control-mode", "none", "--api-keys",
                             str(keys)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "INFO hubserve: ready in" in line:
            proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines))


@pytest.mark.parametrize("mode, refused, words", [
    (0o644, True, "is readable by every user of this machine (mode 0644)"),
    (0o604, True, "is readable by every user of this machine (mode 0604)"),
    (0o666, True, "can be changed by every user of this machine (mode 0666)"),
    (0o620, True, "can be changed by its group (mode 0620)"),
    (0o640, False, "WARNING hubserve: --api-keys: 'keys.yaml' is readable by its group (mode 0640)"),
    (0o600, False, ""),
    (0o400, False, ""),
])
def test_a_keys_file_others_can_read_or_change_is_refused(repository: Path, tmp_path: Path, mode: int,
                                                          refused: bool, words: str) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS)
    keys.chmod(mode)
    done = serve_exit(repository, keys)
    if refused:
        assert done.returncode == 2 and "INFO hubserve: ready in" not in done.stdout, done.stdout
        assert f"hubserve: --api-keys: 'keys.yaml' {words}" in done.stdout, done.stdout
        assert "chmod 600 keys.yaml" in done.stdout
        assert "TOPSECRET" not in done.stdout and str(tmp_path) not in done.stdout
    else:
        assert "INFO hubserve: ready in" in done.stdout, done.stdout
        assert (words in done.stdout) if words else "--api-keys" not in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the file to another user needs root")
def test_a_keys_file_owned_by_another_user_is_refused(repository: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS)
    keys.chmod(0o600)
    os.chown(keys, 65534, -1)  # nobody: who could rewrite the keys
    done = serve_exit(repository, keys)
    assert done.returncode == 2 and "is owned by another user (uid 65534)" in done.stdout


@pytest.mark.parametrize("workers", ["1", "2"])
def test_no_header_a_client_sends_reaches_the_log(repository: Path, tmp_path: Path, workers: str) -> None:
    """--log-verbose 1 logs DEBUG lines; the HPACK decoder's (every header block, `authorization`
    included) are not among them."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS)
    keys.chmod(0o600)
    srv = start_server(repository, tmp_path / "server.log", "--workers", workers, "--log-verbose", "1",
                       "--api-keys", str(keys), "--grpc-restricted-protocol", f"metadata:admin={SECRET_GRPC}",
                       "--no-strict-readiness", "--model-control-mode", "none")
    try:
        with grpcclient.InferenceServerClient(srv.grpc_url) as c:
            c.get_server_metadata(headers={"authorization": "Bearer TOPSECRET-key-0e41",
                                           "triton-grpc-protocol-admin": SECRET_GRPC})
        key = {"Authorization": "Bearer TOPSECRET-key-0e41"}
        assert request(srv.http_port, "GET", "/v2", None, key) == 200
        assert request(srv.http_port, "POST", "/v2/models/simple/infer", INFER, key) == 200
        wait_until(lambda: " hubserve.access: model=simple" in srv.log(), "the access line: verbose is on")
        assert "TOPSECRET" not in srv.log()
    finally:
        srv.stop()
