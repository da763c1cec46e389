"""Who may register which client shared-memory objects, and how many (engine/shm/client.py): one API key
never sees, uses or drops another key's regions; the server opens only objects owned by the user of the
client's socket, unless the key is under --client-shm-prefix; regions are capped server-wide, per key, and at
a quarter of the open-file limit, so they cannot take the descriptors connections need. Real servers,
tritonclient over both protocols (raw HTTP for a client running as another user), in the layout
HUBSERVE_TEST_WORKERS names; after each hostile case the server still answers a correct inference on both
protocols.

Objects are made by the test with its own keys (this process's id in them) and removed when it ends.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import RunningServer, assert_simple_over_grpc, start_server

MAX_REGIONS, MAX_PER_KEY = 6, 4
KEYS = {"a": "shm-key-a-secret", "b": "shm-key-b-secret"}
NOBODY = 65534
SHARED = f"/hubserve_test_shared_{os.getpid()}_"  # the prefix the prefix test allows


@pytest.fixture(scope="module")
def keyed(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Two keys that may call everything; at most MAX_REGIONS regions, MAX_PER_KEY per key."""
    root = tmp_path_factory.mktemp("shm_keys")
    keys = root / "keys.yaml"
    keys.write_text("keys:\n" + "".join(f'  - key: "{k}"\n    groups: ["*"]\n' for k in KEYS.values()))
    keys.chmod(0o600)
    srv = start_server(repository, root / "server.log", "--no-strict-readiness", "--model-control-mode",
                       "none", "--allow-client-shm", "--api-keys", str(keys), "--client-shm-max-regions",
                       str(MAX_REGIONS), "--client-shm-max-regions-per-key", str(MAX_PER_KEY))
    yield srv
    srv.stop()


@pytest.fixture
def objects() -> Iterator[dict]:
    """Name → handle of objects the test makes (tritonclient's helpers), destroyed afterwards."""
    made: dict = {}
    yield made
    for handle in made.values():
        shm.destroy_shared_memory_region(handle)


def key(name: str) -> str:
    return f"/hubserve_test_owner_{os.getpid()}_{name}"


def make(objects: dict, name: str, size: int = 128, object_key: str = "", uid: int | None = None):
    """An object holding 0..31 as INT32 (simple's two inputs), owned by `uid` if given (needs root)."""
    handle = objects[name] = shm.create_shared_memory_region(name, object_key or key(name), size)
    shm.set_shared_memory_region(handle, [np.arange(size // 4, dtype=np.int32)])
    if uid is not None:
        os.chown(f"/dev/shm/{(object_key or key(name)).lstrip('/')}", uid, uid)
    return handle


def client(module, server: RunningServer, who: str):
    c = module.InferenceServerClient(server.http_url if module is httpclient else server.grpc_url)
    c.module, c.auth = module, {"authorization": f"Bearer {KEYS[who]}"}
    return c


def names(c) -> list[str]:
    if c.module is grpcclient:
        return sorted(c.get_system_shared_memory_status(headers=c.auth, as_json=True).get("regions", {}))
    return sorted(r["name"] for r in c.get_system_shared_memory_status(headers=c.auth))


def infer_from(c, region: str) -> np.ndarray:
    """simple with INPUT0 and INPUT1 read from `region` (at 0 and 64): OUTPUT0 = their sum."""
    m = c.module
    inputs = [m.InferInput("INPUT0", [1, 16], "INT32"), m.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory(region, 64, offset=0)
    inputs[1].set_shared_memory(region, 64, offset=64)
    return c.infer("simple", inputs, headers=c.auth).as_numpy("OUTPUT0")


def refusal(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value


def assert_serving(server: RunningServer) -> None:
    """A correct inference of simple on both protocols, with key a, each on a new connection."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    for module in (httpclient, grpcclient):
        c = client(module, server, "a")
        inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        assert c.infer("simple", inputs, headers=c.auth).as_numpy("OUTPUT0").tolist() == (a + a).tolist()
        c.close()


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_one_key_never_sees_uses_or_drops_another_keys_regions(keyed, objects, module):
    make(objects, "a")
    make(objects, "b")
    a, b = client(module, keyed, "a"), client(module, keyed, "b")
    try:
        a.register_system_shared_memory("r", key("a"), 128, headers=a.auth)
        assert names(a) == ["r"] and names(b) == []
        e = refusal(lambda: infer_from(b, "r"))
        assert "Unable to find shared memory region: 'r'" in e.message()
        assert e.status() == ("404" if module is httpclient else "StatusCode.NOT_FOUND")
        b.register_system_shared_memory("r", key("b"), 128, headers=b.auth)  # the same name, its own
        expected = np.arange(16, dtype=np.int32) + np.arange(16, 32, dtype=np.int32)
        assert infer_from(a, "r").ravel().tolist() == expected.tolist()
        b.unregister_system_shared_memory(headers=b.auth)  # all of b's: a's stays
        b.unregister_system_shared_memory("r", headers=b.auth)
        assert names(a) == ["r"] and names(b) == []
        assert infer_from(a, "r").ravel().tolist() == expected.tolist()
    finally:
        a.unregister_system_shared_memory(headers=a.auth)
        b.unregister_system_shared_memory(headers=b.auth)
        a.close()
        b.close()


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_regions_are_capped_per_key_and_server_wide(keyed, objects, module):
    make(objects, "cap")
    a, b = client(module, keyed, "a"), client(module, keyed, "b")
    exhausted = "429" if module is httpclient else "StatusCode.UNAVAILABLE"
    try:
        for i in range(MAX_PER_KEY):
            a.register_system_shared_memory(f"a{i}", key("cap"), 64, headers=a.auth)
        e = refusal(lambda: a.register_system_shared_memory("a-more", key("cap"), 64, headers=a.auth))
        assert e.status() == exhausted
        assert e.message().startswith("failed to register shared memory region 'a-more': this API key "
                                      f"holds {MAX_PER_KEY} regions")
        assert "--client-shm-max-regions-per-key" in e.message()
        for i in range(MAX_REGIONS - MAX_PER_KEY):
            b.register_system_shared_memory(f"b{i}", key("cap"), 64, headers=b.auth)
        e = refusal(lambda: b.register_system_shared_memory("b-more", key("cap"), 64, headers=b.auth))
        assert e.status() == exhausted and f"holds {MAX_REGIONS} regions" in e.message()
        assert "(--client-shm-max-regions)" in e.message()
        a.unregister_system_shared_memory("a0", headers=a.auth)  # room again, for either key
        b.register_system_shared_memory("b-more", key("cap"), 64, headers=b.auth)
        assert_serving(keyed)
    finally:
        a.unregister_system_shared_memory(headers=a.auth)
        b.unregister_system_shared_memory(headers=b.auth)
        a.close()
        b.close()


# ------------------------------------------------------------------------------ the object-owner rule

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making objects of another user needs root")

# A client running as `nobody`: registers `key` as region "theirs" over HTTP and reads it through simple.
AS_NOBODY = r'''
import json, os, sys, urllib.request, urllib.error, encodings.idna
port, key, token = sys.argv[1], sys.argv[2], sys.argv[3]
os.setgid(65534); os.setuid(65534)
def post(path, doc):
    r = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(doc).encode(),
                               {"Authorization": "Bearer " + token})
    try:
        with urllib.request.urlopen(r, timeout=10) as resp: return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e: return e.code, e.read().decode()
print(json.dumps(post("/v2/systemsharedmemory/region/theirs/register", {"key": key, "byte_size": 128})))
'''


@needs_root
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_object_of_another_user_is_refused(keyed, objects, module):
    make(objects, "nobodys", uid=NOBODY)
    a = client(module, keyed, "a")
    try:
        e = refusal(lambda: a.register_system_shared_memory("x", key("nobodys"), 128, headers=a.auth))
        assert e.status() == ("400" if module is httpclient else "StatusCode.INVALID_ARGUMENT")
        assert e.message() == (f"failed to register shared memory region 'x': the object '{key('nobodys')}' "
                               "belongs to another user; the server opens only objects of the client's own "
                               "user (or keys under --client-shm-prefix)")
        assert names(a) == []
    finally:
        a.close()


@needs_root
def test_a_client_of_another_user_cannot_reach_the_servers_users_objects(keyed, objects):
    """The confused deputy: `nobody` cannot open root's 0600 object itself, and before this rule it read and
    overwrote it through the server."""
    make(objects, "roots")
    os.chmod(f"/dev/shm/{key('roots').lstrip('/')}", 0o600)
    out = subprocess.run([sys.executable, "-c", AS_NOBODY, str(keyed.http_port), key("roots"), KEYS["b"]],
                         capture_output=True, text=True, timeout=60)
    status, body = json.loads(out.stdout)
    assert status == 400 and "belongs to another user" in body, (out.stdout, out.stderr)
    make(objects, "theirs", uid=NOBODY)  # its own object: registered
    out = subprocess.run([sys.executable, "-c", AS_NOBODY, str(keyed.http_port), key("theirs"), KEYS["b"]],
                         capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout)[0] == 200, (out.stdout, out.stderr)
    b = client(httpclient, keyed, "b")
    try:
        assert names(b) == ["theirs"]
    finally:
        b.unregister_system_shared_memory(headers=b.auth)
        b.close()
    assert_serving(keyed)


@needs_root
def test_a_prefix_the_operator_allows_opens_objects_of_any_user(repository, tmp_path, objects):
    srv = start_server(repository, tmp_path / "server.log", "--no-strict-readiness", "--model-control-mode",
                       "none", "--allow-client-shm", "--client-shm-prefix", SHARED)
    try:
        make(objects, "shared", object_key=SHARED + "x", uid=NOBODY)
        make(objects, "private", uid=NOBODY)
        for module in (httpclient, grpcclient):
            c = module.InferenceServerClient(srv.http_url if module is httpclient else srv.grpc_url)
            c.module, c.auth = module, {}
            c.register_system_shared_memory("shared", SHARED + "x", 128)
            expected = np.arange(16, dtype=np.int32) + np.arange(16, 32, dtype=np.int32)
            assert infer_from(c, "shared").ravel().tolist() == expected.tolist()
            e = refusal(lambda c=c: c.register_system_shared_memory("private", key("private"), 128))
            assert "belongs to another user" in e.message()
            c.unregister_system_shared_memory()
            c.close()
    finally:
        srv.stop()


# ------------------------------------------------------------------------------ descriptors

def test_regions_cannot_take_the_descriptors_connections_need(repository, tmp_path, objects):
    """The hole: with the server's open-file limit at 256, 233 registrations used every descriptor and new
    connections were refused. Regions now stop at a quarter of the limit, and both ports take new clients."""
    srv = start_server(repository, tmp_path / "server.log", "--no-strict-readiness", "--model-control-mode",
                       "none", "--allow-client-shm")
    make(objects, "fds", 64)
    try:
        resource.prlimit(srv.process.pid, resource.RLIMIT_NOFILE, (256, 256))
        c = httpclient.InferenceServerClient(srv.http_url)
        registered = 0
        with pytest.raises(InferenceServerException) as e:
            for i in range(300):
                c.register_system_shared_memory(f"r{i}", key("fds"), 64)
                registered += 1
        assert registered == 256 // 4 and e.value.status() == "429"
        assert "a quarter of its open-file limit of 256" in e.value.message()
        for _ in range(3):  # new connections, on both ports
            with httpclient.InferenceServerClient(srv.http_url) as other:
                assert other.is_server_live()
            assert_simple_over_grpc(srv)
        c.unregister_system_shared_memory()
        c.register_system_shared_memory("again", key("fds"), 64)
        c.unregister_system_shared_memory()
        c.close()
    finally:
        srv.stop()
