"""Model lifecycle on a real server in poll mode: folders dropped into, changed in and removed from the
repository are served, reloaded and unloaded, with real clients, and no request fails because of a reload.

One server (`--model-control-mode poll --repository-poll-secs 0.5`, file-system events on, the default quiet
time of 1 s) watches a tmp repository; each test works on model folders of its own. Every wait polls a
condition with a bound; the only sleeps are the slow copy's own pauses, which are the scenario under test.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import start_server
from hubserve_models import examples

SIMPLE = examples.model_bytes(examples.simple_model())
PICKUP_S = 10.0  # a dropped or changed folder is served within this (quiet time 1 s + load)


def simple_config(name: str, extra: str = "") -> str:
    return f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n{extra}\n'


def identity_config(name: str, extra: str = "") -> str:
    return (f'name: "{name}"\nbackend: "identity"\nmax_batch_size: 8\n'
            'input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }\n'
            'output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }\n' + extra)


def drop(root: Path, name: str, files: dict[str, bytes | str], staging: Path) -> None:
    """Copy a model folder into the repository, as a user would (`cp -r`)."""
    src = staging / name
    shutil.rmtree(src, ignore_errors=True)
    for rel, data in files.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    shutil.copytree(src, root / name, dirs_exist_ok=True)


def wait_until(condition: Callable[[], object], what: str, timeout: float = PICKUP_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("lifecycle_repository")
    staging = tmp_path_factory.mktemp("staging")
    drop(root, "anchor", {"config.pbtxt": simple_config("anchor"), "1/model.onnx": SIMPLE}, staging)
    log = tmp_path_factory.mktemp("lifecycle_server") / "server.log"
    srv = start_server(root, log, "--model-control-mode", "poll", "--repository-poll-secs", "0.5")
    srv.staging = staging  # type: ignore[attr-defined]
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(lifecycle):
    with httpclient.InferenceServerClient(lifecycle.http_url, network_timeout=60.0) as client:
        yield client


def rows(client: httpclient.InferenceServerClient, name: str) -> list[tuple[str, str, str]]:
    return [(r.get("version", ""), r.get("state", ""), r.get("reason", ""))
            for r in client.get_model_repository_index() if r["name"] == name]


def failure(client: httpclient.InferenceServerClient, name: str) -> str:
    """The reason `name` failed to load; "" while it has not (a folder not yet looked at is listed as
    UNAVAILABLE "not loaded", then LOADING)."""
    found = [r for r in rows(client, name)
             if r[1] == "UNAVAILABLE" and r[2] not in ("not loaded", "unloaded")]
    return found[0][2] if len(found) == 1 else ""


def simple_inputs(module, batch: int = 2) -> tuple[list, np.ndarray]:
    a = np.arange(batch * 16, dtype=np.int32).reshape(batch, 16)
    inputs = []
    for input_name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(input_name, [batch, 16], "INT32")
        tensor.set_data_from_numpy(a)
        inputs.append(tensor)
    return inputs, a


def infer_simple(client, module, name: str, version: str = "") -> str:
    """Infer `a + a` and `a - a`; returns the version that answered."""
    inputs, a = simple_inputs(module)
    result = client.infer(name, inputs, model_version=version)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros_like(a))
    response = result.get_response()
    return str(response["model_version"] if isinstance(response, dict) else response.model_version)


def test_a_dropped_folder_is_served_within_the_bound(lifecycle, http):
    start = time.monotonic()
    drop(lifecycle.repository, "dropped", {"config.pbtxt": simple_config("dropped"), "1/model.onnx": SIMPLE},
         lifecycle.staging)
    wait_until(lambda: http.is_model_ready("dropped"), "'dropped' READY")
    assert time.monotonic() - start < PICKUP_S
    assert infer_simple(http, httpclient, "dropped") == "1"
    assert rows(http, "dropped") == [("1", "READY", "")]


def test_a_new_version_is_served_per_policy_and_the_old_one_retired(lifecycle, http):
    root, staging = lifecycle.repository, lifecycle.staging
    drop(root, "versioned", {"config.pbtxt": simple_config("versioned"), "1/model.onnx": SIMPLE}, staging)
    wait_until(lambda: http.is_model_ready("versioned"), "'versioned' version 1 READY")
    drop(root, "versioned", {"2/model.onnx": SIMPLE}, staging)  # default policy: latest 1
    wait_until(lambda: http.is_model_ready("versioned", "2"), "'versioned' version 2 READY")
    wait_until(lambda: not http.is_model_ready("versioned", "1"), "'versioned' version 1 retired")
    # As Triton lists them:
    assert rows(http, "versioned") == [("1", "UNAVAILABLE", "unloaded"), ("2", "READY", "")]
    assert infer_simple(http, httpclient, "versioned") == "2"
    with pytest.raises(InferenceServerException) as e:
        infer_simple(http, httpclient, "versioned", version="1")
    assert e.value.status() == "404"

    # A changed config reloads: now every version is served.
    every_version = simple_config("versioned", "version_policy: { all { } }")
    (root / "versioned" / "config.pbtxt").write_text(every_version)
    wait_until(lambda: http.is_model_ready("versioned", "1"), "'versioned' version 1 back with policy all")
    assert [r[:2] for r in rows(http, "versioned")] == [("1", "READY"), ("2", "READY")]
    assert infer_simple(http, httpclient, "versioned", version="1") == "1"
    assert infer_simple(http, httpclient, "versioned") == "2"

    # A removed version folder is retired; the other keeps serving.
    shutil.rmtree(root / "versioned" / "2")
    wait_until(lambda: not http.is_model_ready("versioned", "2"), "'versioned' version 2 retired")
    assert rows(http, "versioned") == [("1", "READY", ""), ("2", "UNAVAILABLE", "unloaded")]
    assert infer_simple(http, httpclient, "versioned") == "1"


def test_a_removed_model_leaves_the_index(lifecycle, http):
    drop(lifecycle.repository, "removed", {"config.pbtxt": simple_config("removed"), "1/model.onnx": SIMPLE},
         lifecycle.staging)
    wait_until(lambda: http.is_model_ready("removed"), "'removed' READY")
    shutil.rmtree(lifecycle.repository / "removed")
    wait_until(lambda: not rows(http, "removed"), "'removed' gone from the index")
    with pytest.raises(InferenceServerException) as e:
        infer_simple(http, httpclient, "removed")
    assert e.value.status() == "404"


def test_a_corrupt_file_is_unavailable_with_its_reason_then_fixed(lifecycle, http):
    root = lifecycle.repository
    drop(root, "corrupt", {"config.pbtxt": simple_config("corrupt"), "1/model.onnx": b"not an onnx file"},
         lifecycle.staging)
    # Listed as UNAVAILABLE "not loaded" until it settles, then LOADING, then UNAVAILABLE with the reason.
    wait_until(lambda: failure(http, "corrupt"), "'corrupt' UNAVAILABLE with a reason")
    reason = failure(http, "corrupt")
    assert "ONNX" in reason and "model.onnx" in reason, reason
    assert not http.is_server_ready()  # strict readiness: one model is not ready
    assert infer_simple(http, httpclient, "anchor") == "1"  # the others serve

    (root / "corrupt" / "1" / "model.onnx").write_bytes(SIMPLE)  # fixed: retried because it changed
    wait_until(lambda: http.is_model_ready("corrupt"), "'corrupt' READY once fixed")
    assert infer_simple(http, httpclient, "corrupt") == "1"
    assert http.is_server_ready()

    # Broken again while serving: the reload fails, the loaded version keeps serving.
    (root / "corrupt" / "1" / "model.onnx").write_bytes(b"broken again")
    wait_until(lambda: "model corrupt version 1 keeps serving" in lifecycle.log(), "the failed reload")
    assert http.is_model_ready("corrupt") and infer_simple(http, httpclient, "corrupt") == "1"
    shutil.rmtree(root / "corrupt")
    wait_until(lambda: not rows(http, "corrupt"), "'corrupt' gone")


def test_a_corrupt_version_beside_a_serving_one_is_listed_with_its_reason(lifecycle, http):
    """The config names no inputs, so auto-complete reads the newest version's file: its failure belongs to
    that version, listed UNAVAILABLE with the reason over both protocols while the older one serves."""
    root = lifecycle.repository
    drop(root, "beside", {"config.pbtxt": simple_config("beside", "version_policy: { all { } }"),
                          "1/model.onnx": SIMPLE}, lifecycle.staging)
    wait_until(lambda: http.is_model_ready("beside"), "'beside' READY")
    drop(root, "beside", {"2/model.onnx": b"not an onnx file"}, lifecycle.staging)
    wait_until(lambda: failure(http, "beside"), "'beside' version 2 UNAVAILABLE with a reason")
    with grpcclient.InferenceServerClient(lifecycle.grpc_url) as grpc:
        grpc_rows = [(m.version, m.state, m.reason) for m in grpc.get_model_repository_index().models
                     if m.name == "beside"]
        assert infer_simple(grpc, grpcclient, "beside") == "1"
    for listed in (rows(http, "beside"), grpc_rows):
        assert [r[:2] for r in listed] == [("1", "READY"), ("2", "UNAVAILABLE")], listed
        assert "ONNX" in listed[1][2] and str(root) not in listed[1][2], listed
    assert infer_simple(http, httpclient, "beside") == "1"
    shutil.rmtree(root / "beside")
    wait_until(lambda: not rows(http, "beside"), "'beside' gone")


def test_a_slow_copy_is_not_loaded_half_way(lifecycle, http):
    target = lifecycle.repository / "slow_copy"
    (target / "1").mkdir(parents=True)
    (target / "config.pbtxt").write_text(simple_config("slow_copy"))
    chunk = len(SIMPLE) // 10 + 1
    with open(target / "1" / "model.onnx", "wb") as f:  # ~2 s for the whole file, as a slow disk would
        for i in range(0, len(SIMPLE), chunk):
            f.write(SIMPLE[i:i + chunk])
            f.flush()
            time.sleep(0.2)
    wait_until(lambda: http.is_model_ready("slow_copy"), "'slow_copy' READY")
    log = [line for line in lifecycle.log().splitlines() if "model slow_copy" in line]
    assert not [line for line in log if "UNAVAILABLE" in line or "ERROR" in line], log
    assert sum("LOADING" in line for line in log) == 1, log  # loaded once, when complete
    assert infer_simple(http, httpclient, "slow_copy") == "1"


def test_reload_under_continuous_load_fails_no_request(lifecycle, http):
    root, staging = lifecycle.repository, lifecycle.staging
    config = simple_config("busy", "dynamic_batching { max_queue_delay_microseconds: 100 }")
    drop(root, "busy", {"config.pbtxt": config, "1/model.onnx": SIMPLE}, staging)
    wait_until(lambda: http.is_model_ready("busy"), "'busy' READY")

    stop = threading.Event()
    done: list[int] = []
    errors: list[str] = []
    seen: set[str] = set()
    lock = threading.Lock()

    def client_loop(module, url: str) -> None:
        with module.InferenceServerClient(url) as client:
            while not stop.is_set():
                try:
                    version = infer_simple(client, module, "busy")
                except Exception as e:  # every failure is a finding: record it, keep going
                    with lock:
                        errors.append(repr(e))
                    continue
                with lock:
                    done.append(1)
                    seen.add(version)

    threads = [threading.Thread(target=client_loop, args=(httpclient, lifecycle.http_url)) for _ in range(4)]
    threads.append(threading.Thread(target=client_loop, args=(grpcclient, lifecycle.grpc_url)))
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(done) >= 100, "traffic flowing")
        drop(root, "busy", {"2/model.onnx": SIMPLE}, staging)  # a new version: v1 retires
        wait_until(lambda: "2" in seen and not http.is_model_ready("busy", "1"), "traffic moved to version 2")
        (root / "busy" / "config.pbtxt").write_text(config.replace("100", "500"))  # a changed config
        wait_until(lambda: http.get_model_config("busy")["dynamic_batching"]["max_queue_delay_microseconds"]
                   == 500, "the new config serving")
        after = len(done)
        wait_until(lambda: len(done) >= after + 100, "traffic on the reloaded model")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert errors == [], errors[:5]
    assert seen == {"1", "2"} and len(done) >= 300
    wait_until(lambda: "model busy version 1 unloaded" in lifecycle.log()  # retired when 2 came
               and "model busy version 2: the previous copy drained and freed" in lifecycle.log(),
               "the replaced versions drained and unloaded")


def test_a_reload_says_in_one_line_what_changed_and_never_reads_as_an_unload(lifecycle, http):
    """engine/lifecycle_log.py: a reload is "model 'x' reloaded: version 1 → 1 (why)", its replaced copy
    "drained and freed"; only a version no longer served is UNLOADING / unloaded."""
    root, staging = lifecycle.repository, lifecycle.staging
    drop(root, "told", {"config.pbtxt": simple_config("told"), "1/model.onnx": SIMPLE}, staging)
    wait_until(lambda: http.is_model_ready("told"), "'told' READY")
    (root / "told" / "config.pbtxt").write_text(simple_config("told", "dynamic_batching { }"))
    wait_until(lambda: "model 'told' reloaded: version 1 → 1 (config changed)" in lifecycle.log(),
               "the config reload's line")
    wait_until(lambda: "model told version 1: the previous copy drained and freed" in lifecycle.log(),
               "the replaced copy freed")
    (root / "told" / "1" / "model.onnx").write_bytes(SIMPLE + b"")  # the same bytes, a new mtime
    wait_until(lambda: "model 'told' reloaded: version 1 → 1 (files changed)" in lifecycle.log(),
               "the file reload's line")
    assert "model told version 1 UNLOADING" not in lifecycle.log()  # reloaded twice, never unloaded
    drop(root, "told", {"2/model.onnx": SIMPLE}, staging)  # the version policy serves the latest only
    wait_until(lambda: "model 'told' reloaded: version 1 → 2 (version 2 added, version 1 retired)"
               in lifecycle.log(), "the new version's line")
    wait_until(lambda: "model told version 1 unloaded" in lifecycle.log(), "version 1 unloaded")
    assert infer_simple(http, httpclient, "told") == "2"


def test_warm_up_runs_before_ready_and_a_failing_one_makes_the_model_unavailable(lifecycle, http):
    root, staging = lifecycle.repository, lifecycle.staging
    zeros = ('model_warmup { name: "zeros" batch_size: 4 count: 2 inputs { key: "INPUT0" value: '
             '{ data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } } '
             'inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } } }')
    from_file = ('model_warmup { name: "sevens" inputs { key: "INPUT0" value: '
                 '{ data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "sevens.bin" } } }')
    fail_on = 'parameters {{ key: "fail_on_value" value: {{ string_value: "{}" }} }}\n'
    drop(root, "warm", {"config.pbtxt": simple_config("warm", zeros), "1/model.onnx": SIMPLE}, staging)
    only_zeros = zeros.split(" inputs { key: \"INPUT1\"")[0] + " }"
    drop(root, "warm_fails", {"config.pbtxt": identity_config("warm_fails", fail_on.format(0) + only_zeros),
                              "1/model.txt": ""}, staging)
    sevens = np.full(16, 7, dtype=np.int32).tobytes()
    drop(root, "warm_file", {"config.pbtxt": identity_config("warm_file", fail_on.format(7) + from_file),
                             "warmup/sevens.bin": sevens, "1/model.txt": ""}, staging)
    wait_until(lambda: http.is_model_ready("warm"), "'warm' READY")
    assert "model warm version 1 warm-up 'zeros': 2 run(s) on 1 instance(s)" in lifecycle.log()
    # As in Triton, warm-up is not traffic: the statistics start from zero.
    stats = http.get_inference_statistics("warm")["model_stats"][0]
    assert stats["execution_count"] == 0 and stats["inference_stats"]["success"]["count"] == 0
    assert infer_simple(http, httpclient, "warm") == "1"
    assert http.get_inference_statistics("warm")["model_stats"][0]["execution_count"] == 1

    wait_until(lambda: failure(http, "warm_fails") and failure(http, "warm_file"), "both warm-ups failed")
    assert failure(http, "warm_fails") == "warm-up 'zeros' failed: identity backend: input contains 0"
    assert failure(http, "warm_file") == "warm-up 'sevens' failed: identity backend: input contains 7"
    assert not http.is_model_ready("warm_fails")
    for name in ("warm", "warm_fails", "warm_file"):
        shutil.rmtree(root / name)
    wait_until(lambda: not any(rows(http, n) for n in ("warm", "warm_fails", "warm_file")),
               "warm-up models gone")


@pytest.mark.parametrize("flags", [("--repository-poll-secs", "300"),
                                   ("--no-repository-events", "--repository-poll-secs", "0.5")],
                         ids=["events-only", "polling-only"])
def test_each_mechanism_alone_picks_up_changes(tmp_path: Path, flags: tuple[str, ...]):
    root = tmp_path / "repository"
    root.mkdir()
    # An empty repository serves nothing: live, never ready (dataplane.py `ready`) until a model lands.
    srv = start_server(root, tmp_path / "server.log", "--model-control-mode", "poll", *flags,
                       wait_ready=False)
    try:
        with httpclient.InferenceServerClient(srv.http_url) as client:
            assert client.is_server_live() and not client.is_server_ready()
            drop(root, "m", {"config.pbtxt": simple_config("m"), "1/model.onnx": SIMPLE},
                 tmp_path / "staging")
            wait_until(lambda: client.is_model_ready("m"), "'m' READY")
            assert client.is_server_ready()
            assert infer_simple(client, httpclient, "m") == "1"
            shutil.rmtree(root / "m")
            wait_until(lambda: not rows(client, "m"), "'m' gone")
    finally:
        srv.stop()


def test_the_folder_alone_decides_api_loads_and_unloads_are_refused(lifecycle, http):
    """In poll mode the folder is the one source of truth, as in Triton: the repository API's load (with a
    config override or model files) and unload are refused with UNAVAILABLE and change nothing; the index
    stays available. test_repository_api.py covers the refusal's words in none mode too."""
    root, staging = lifecycle.repository, lifecycle.staging
    drop(root, "held", {"config.pbtxt": simple_config("held"), "1/model.onnx": SIMPLE}, staging)
    wait_until(lambda: http.is_model_ready("held"), "'held' READY")
    override = json.dumps({"name": "held", "backend": "onnxruntime", "max_batch_size": 2})
    files = {"file:2/model.onnx": SIMPLE}
    with grpcclient.InferenceServerClient(lifecycle.grpc_url) as grpc:
        for client, code in ((http, "503"), (grpc, "StatusCode.UNAVAILABLE")):
            for call, kwargs in ((client.load_model, {"config": override}),
                                 (client.load_model, {"config": override, "files": files}),
                                 (client.unload_model, {})):
                with pytest.raises(InferenceServerException) as e:
                    call("held", **kwargs)
                assert e.value.status() == code, (e.value.status(), e.value.message())
                assert e.value.message().startswith("explicit model load / unload is not allowed"), e.value
                assert "--model-control-mode explicit" in e.value.message()
        assert infer_simple(grpc, grpcclient, "held") == "1"
    assert http.get_model_config("held")["max_batch_size"] == 8
    assert [row[:2] for row in rows(http, "held")] == [("1", "READY")]
    assert infer_simple(http, httpclient, "held") == "1"
    shutil.rmtree(root / "held")  # the folder still decides
    wait_until(lambda: not rows(http, "held"), "'held' gone")
