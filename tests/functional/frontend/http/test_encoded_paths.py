"""Encoded paths against the real server: every API group walked with every spelling trick, under API keys
and under Triton's restrictions, in both process layouts (the tests start their own servers with
--workers 1 and --workers 2, whatever HUBSERVE_TEST_WORKERS says).

The property (issue 27, hole 1): whatever a path routes to, the access check classified it into the group
of what it routes to. So for each endpoint of each group and each spelling of its path:
- a spelling that names the same endpoint (encoded letters in any segment, upper- or lower-case hex, every
  character encoded, a trailing '/', a query string) answers exactly what the plain path answers with the
  group's credential, and 403 with every credential but the group's;
- a spelling two readers could take two ways (an encoded '/', a dot segment raw or encoded, an empty
  segment, an encoded control character, bad percent-encoding, bytes that are not UTF-8) is 400, whoever
  asks;
- a spelling that is no longer the same name (double encoding, ';' parameters, another case, a look-alike
  letter) never answers 2xx, whoever asks.
Once the server was `/v2/%72epository/...`-blind: every one of the first kind answered without a credential.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import EXAMPLES, start_server
from engine.access.groups import ApiGroup
from hubserve_models import examples
from test_http_path import encode_char, same_spellings

G = ApiGroup
INFER = json.dumps({"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                               for n in ("INPUT0", "INPUT1")]}).encode()
GENERATE = json.dumps({"INPUT0": ["a"]}).encode()

# Each group's endpoints, as (method, path, body): every endpoint of every group, versions included.
ENDPOINTS: dict[ApiGroup, list[tuple[str, str, bytes | None]]] = {
    G.HEALTH: [("GET", "/v2/health/live", None), ("GET", "/v2/health/ready", None),
               ("GET", "/v2/models/simple/ready", None), ("GET", "/v2/models/simple/versions/1/ready", None),
               ("GET", "/health", None)],
    G.METADATA: [("GET", "/v2", None), ("GET", "/v2/models/simple", None),
                 ("GET", "/v2/models/simple/versions/1", None), ("GET", "/version", None)],
    G.MODEL_CONFIG: [("GET", "/v2/models/simple/config", None)],
    G.STATISTICS: [("GET", "/v2/models/stats", None), ("GET", "/v2/models/simple/versions/1/stats", None),
                   ("GET", "/metrics", None)],
    G.INFERENCE: [("POST", "/v2/models/simple/infer", INFER),
                  ("POST", "/v2/models/simple/versions/1/infer", INFER),
                  ("POST", "/v2/models/simple_identity/generate", GENERATE),
                  ("POST", "/v2/models/simple_identity/generate_stream", GENERATE),
                  ("GET", "/v1/models", None)],
    G.MODEL_REPOSITORY: [("POST", "/v2/repository/index", b"{}"),
                         ("POST", "/v2/repository/models/simple/load", b"{}")],
    G.SHARED_MEMORY: [("GET", "/v2/systemsharedmemory/status", None),
                      ("POST", "/v2/cudasharedmemory/unregister", b"")],
    G.TRACE: [("GET", "/v2/trace/setting", None), ("GET", "/v2/models/simple/trace/setting", None)],
    G.LOGGING: [("GET", "/v2/logging", None)],
}


def ambiguous_spellings(path: str) -> list[str]:
    segments = path.strip("/").split("/")
    last = len(segments) - 1
    joined = "/" + "/".join(segments[:last - 1] + [segments[last - 1] + "%2F" + segments[last]]) \
        if last else "/" + segments[0][:1] + "%2f" + segments[0][1:]
    return [joined,
            "/" + "/".join(segments[:last]) + "/./" + segments[last],
            "/" + "/".join(segments[:last]) + "/%2e/" + segments[last],
            "/" + segments[0] + "/x/../" + "/".join(segments[1:]) if last else "/x/../" + segments[0],
            "/" + segments[0] + "/%2E%2e/" + "/".join(segments[1:]) if last else "/%2E%2E/" + segments[0],
            "/" + "/".join(segments[:last]) + "//" + segments[last],
            path + "%0A",
            path + "%00",
            path + "%C2%85",
            path + "%",
            path + "%zz",
            path + "%ff"]


def other_names(path: str) -> list[str]:
    """Spellings that decode to other names: never the endpoint itself."""
    segments = path.strip("/").split("/")
    last = segments[-1]
    return ["/" + "/".join(segments[:-1] + ["%25" + f"{ord(last[0]):02x}" + last[1:]]),  # double encoding
            path + ";x=1",
            "/" + "/".join(segments[:-1] + [last.upper()]) if last.lower() == last and last.isalpha()
            else "/" + "/".join(segments[:-1] + [last + "s"]),
            # a look-alike letter (fullwidth 'r'), or another letter
            "/" + "/".join(segments[:-1] + [encode_char("ｒ" if last[0] == "r" else "é") + last[1:]])]


def request(port: int, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        text = response.read()
        if response.status == 400:
            assert "error" in json.loads(text), text  # the protocol's JSON error form
        return response.status
    finally:
        conn.close()


class Credentials:
    """What grants one group and what grants every group but it, under keys or under restrictions."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def only(self, group: ApiGroup) -> dict[str, str]:
        if self.mode == "keys":
            return {"Authorization": f"Bearer only-{group.value}"}
        return {f"x-{group.value}": f"open-{group.value}"}

    def all_but(self, group: ApiGroup) -> dict[str, str]:
        if self.mode == "keys":
            return {"Authorization": f"Bearer all-but-{group.value}"}
        return {f"x-{g.value}": f"open-{g.value}" for g in ApiGroup if g is not group}

    def denies(self, group: ApiGroup) -> bool:
        """Keys never guard health; nor does the restricted server here, which the harness must see ready."""
        return group is not G.HEALTH


def keys_file(folder: Path) -> Path:
    lines = ["keys:"]
    for group in ApiGroup:
        others = ", ".join(g.value for g in ApiGroup if g is not group)
        lines += [f"  - key: only-{group.value}", f"    groups: [{group.value}]",
                  f"  - key: all-but-{group.value}", f"    groups: [{others}]"]
    path = folder / "keys.yaml"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("paths_repo")
    for name in ("simple", "simple_identity"):
        (root / name).mkdir()
        shutil.copy(EXAMPLES / name / "config.pbtxt", root / name / "config.pbtxt")
    examples.build_repository(root, ["simple", "simple_identity"])
    return root


@pytest.fixture(scope="module", params=[("keys", "1"), ("keys", "2"), ("restrictions", "1"),
                                        ("restrictions", "2")], ids=lambda p: f"{p[0]}-workers{p[1]}")
def guarded(request: pytest.FixtureRequest, repo: Path, tmp_path_factory: pytest.TempPathFactory):
    mode, workers = request.param
    folder = tmp_path_factory.mktemp(f"paths_{mode}_{workers}")
    if mode == "keys":
        flags: list[str] = ["--api-keys", str(keys_file(folder))]
    else:
        flags = [f"--http-restricted-api={g.value}:x-{g.value}=open-{g.value}" for g in ApiGroup
                 if g is not G.HEALTH]
    srv = start_server(repo, folder / "server.log", "--workers", workers, "--model-control-mode", "explicit",
                       "--load-model", "simple", "--load-model", "simple_identity", "--allow-client-shm",
                       *flags)
    yield srv, Credentials(mode)
    srv.stop()


@pytest.mark.parametrize("group", list(ApiGroup), ids=[g.value for g in ApiGroup])
def test_every_spelling_of_a_groups_path_is_checked_as_that_group(guarded, group: ApiGroup) -> None:
    srv, creds = guarded
    port = srv.http_port
    for method, path, body in ENDPOINTS[group]:
        expected = request(port, method, path, body, creds.only(group))
        assert expected < 300, (path, expected)
        for spelling in [path, *same_spellings(path)]:
            assert request(port, method, spelling, body, creds.only(group)) == expected, spelling
            denied = request(port, method, spelling, body, creds.all_but(group))
            assert denied == (403 if creds.denies(group) else expected), spelling
        for spelling in ambiguous_spellings(path):
            assert request(port, method, spelling, body, creds.only(group)) == 400, spelling
            assert request(port, method, spelling, body, creds.all_but(group)) == 400, spelling
        for spelling in other_names(path):
            for headers in (creds.only(group), creds.all_but(group), {}):
                status = request(port, method, spelling, body, headers)
                assert status >= 400, (spelling, headers, status)
    assert_serves_both_protocols(srv, creds)


def test_no_credentials_reach_nothing_but_what_is_open(guarded) -> None:
    """The audit's requests, as sent: none answers without the group's credential."""
    srv, creds = guarded
    for method, path, body in [("POST", "/v2/%72epository/models/simple/unload", b"{}"),
                               ("POST", "/v2/%6Cogging", b'{"log_error": false}'),
                               ("POST", "/v2/%74race/setting", b'{"trace_rate": "7"}'),
                               ("POST", "/v2/models/simple/%74race/setting", b'{"trace_rate": "7"}'),
                               ("POST", "/v2/models/simple/infe%72", INFER),
                               ("GET", "/%761/models", None)]:
        status = request(srv.http_port, method, path, body, {})
        assert status == (401 if creds.mode == "keys" else 403), (path, status)
    infer = ("POST", "/v2/models/simple/infe%72", INFER)
    assert request(srv.http_port, *infer, creds.all_but(G.INFERENCE)) == 403
    unload = ("POST", "/v2/%72epository/models/simple/unload", b"{}")
    assert request(srv.http_port, *unload, creds.all_but(G.MODEL_REPOSITORY)) == 403
    assert request(srv.http_port, "GET", "/v2/models/simple/ready", None, creds.only(G.HEALTH)) == 200
    assert_serves_both_protocols(srv, creds)


def assert_serves_both_protocols(srv, creds: Credentials) -> None:
    headers = creds.only(G.INFERENCE)
    assert request(srv.http_port, "POST", "/v2/models/simple/infer", INFER, headers) == 200
    grpc_headers = {k.lower(): v for k, v in headers.items()} if creds.mode == "keys" else {}
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(x)
        result = c.infer("simple", inputs, headers=grpc_headers)
    assert result.as_numpy("OUTPUT0").tolist() == (x + x).tolist()


def test_the_server_process_layout_is_what_the_test_asked(guarded) -> None:
    """--workers 2 really runs frontend processes (the layout under test is not silently one process)."""
    srv, _ = guarded
    children_file = f"/proc/{srv.process.pid}/task/{srv.process.pid}/children"
    children = Path(children_file).read_text().split() if os.path.exists(children_file) else []
    frontends = [c for c in children
                 if b"engine.workers.frontend" in Path(f"/proc/{c}/cmdline").read_bytes()]
    expected = 2 if "--workers\x002" in Path(f"/proc/{srv.process.pid}/cmdline").read_text() else 0
    assert len(frontends) == expected
