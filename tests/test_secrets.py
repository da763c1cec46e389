"""Where the server's secrets may be seen (issue 27): restriction values never on a frontend's command line
or in its environment (--workers N: they cross through an inherited pipe, workers/supervisor.py), an
--api-keys file others can read or change is refused at start (api_keys.file_mode_problem), and what a
client sends in its headers (its key, a restriction value) never reaches the log, at any verbose level.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import assert_simple_over_grpc, start_server
from test_encoded_paths import request
from test_workers import _alive, frontends, wait_for

SECRET_HTTP, SECRET_GRPC = "TOPSECRET-http-5b1c", "TOPSECRET-grpc-77ad"


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
        wait_for(lambda: not _alive(pids[0]) and len(frontends(srv)) == 2 and pids[0] not in frontends(srv),
                 30, "the frontend's restart")
        for pid in frontends(srv):
            assert SECRET_HTTP.encode() not in process_text(pid)
        wait_for(lambda: request(srv.http_port, "GET", "/v2/health/live", None, {}) == 200, 30, "serving")
        restricted_calls_answer(srv)
        assert_simple_over_grpc(srv)
    finally:
        srv.stop()
