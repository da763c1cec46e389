"""One completion path per request, through a real server in explicit model-control mode: routing and a
request plan's validation are cached per model version, and must follow a reload; success, failure and
cancel are accounted by the one done-callback (statistics and metrics).

Models use the identity backend (OUTPUT0 = INPUT0), so a version folder needs no file."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import start_server

BOUND_S = 20.0


def identity_pbtxt(name: str, dims: str = "[ 4 ]", extra: str = "") -> str:
    return (f'name: "{name}"\nbackend: "identity"\nmax_batch_size: 8\n'
            f'input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: {dims} }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: {dims} }} ]\n{extra}')


def override(name: str, dims: list[int]) -> str:
    """A load's config override (JSON) for an identity model with these dims, every version served."""
    tensor = {"data_type": "TYPE_INT32", "dims": dims}
    return json.dumps({"name": name, "backend": "identity", "max_batch_size": 8,
                       "version_policy": {"all": {}},
                       "input": [{"name": "INPUT0", **tensor}], "output": [{"name": "OUTPUT0", **tensor}]})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("completion_repository")
    for name, extra in (("routed", "version_policy: { all: {} }\n"),
                        ("shaped", "version_policy: { all: {} }\n"),
                        ("slow", 'parameters { key: "execute_delay_ms" value: { string_value: "400" } }\n'
                                 'parameters { key: "fail_on_value" value: { string_value: "13" } }\n')):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(identity_pbtxt(name, extra=extra))
    log = tmp_path_factory.mktemp("completion_server") / "server.log"
    srv = start_server(repo, log, "--model-control-mode", "explicit", "--load-model", "routed",
                       "--load-model", "shaped", "--load-model", "slow")
    yield srv
    srv.stop()


def http_infer(client: httpclient.InferenceServerClient, name: str, values: np.ndarray
               ) -> httpclient.InferResult:
    """A binary-data request, as perf_analyzer sends them: its JSON header is the HeaderCache's key."""
    inp = httpclient.InferInput("INPUT0", list(values.shape), "INT32")
    inp.set_data_from_numpy(values, binary_data=True)
    return client.infer(name, [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])


def grpc_infer(client: grpcclient.InferenceServerClient, name: str, values: np.ndarray,
               **kwargs: object) -> grpcclient.InferResult:
    inp = grpcclient.InferInput("INPUT0", list(values.shape), "INT32")
    inp.set_data_from_numpy(values)
    return client.infer(name, [inp], **kwargs)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {BOUND_S}s: {what}")
        time.sleep(0.02)


def test_a_request_after_a_reload_goes_to_the_new_highest_version(server, http, grpc):
    """Both versions stay READY, so only the reload's new versions say the cached pick is stale."""
    values = np.arange(4, dtype=np.int32).reshape(1, 4)
    for _ in range(3):
        assert http_infer(http, "routed", values).get_response()["model_version"] == "1"
    (server.repository / "routed" / "2").mkdir()
    http.load_model("routed")
    assert http_infer(http, "routed", values).get_response()["model_version"] == "2"
    assert grpc_infer(grpc, "routed", values).get_response().model_version == "2"
    http.unload_model("routed")
    with pytest.raises(InferenceServerException):
        http_infer(http, "routed", values)
    (server.repository / "routed" / "2").rmdir()
    http.load_model("routed")
    assert http_infer(http, "routed", values).get_response()["model_version"] == "1"


def test_a_cached_plan_is_validated_again_by_a_reloaded_version(http, grpc):
    """The same request header, accepted twice by each protocol (so its plan is cached and validated), is
    refused once a reload changed the input's dims, and the new shape is served."""
    old, new = np.ones((1, 4), dtype=np.int32), np.ones((1, 3), dtype=np.int32)
    for _ in range(2):
        assert http_infer(http, "shaped", old).as_numpy("OUTPUT0").shape == (1, 4)
        assert grpc_infer(grpc, "shaped", old).as_numpy("OUTPUT0").shape == (1, 4)
    http.load_model("shaped", config=override("shaped", [3]))
    for _ in range(2):
        with pytest.raises(InferenceServerException, match=r"expects shape \[-1, ?3\]"):
            http_infer(http, "shaped", old)
        with pytest.raises(InferenceServerException, match=r"expects shape \[-1, ?3\]"):
            grpc_infer(grpc, "shaped", old)
        assert http_infer(http, "shaped", new).as_numpy("OUTPUT0").shape == (1, 3)
        assert grpc_infer(grpc, "shaped", new).as_numpy("OUTPUT0").shape == (1, 3)


def stats(http: httpclient.InferenceServerClient, name: str) -> dict:
    return http.get_inference_statistics(name)["model_stats"][0]


def test_success_failure_and_cancel_are_each_accounted_once(server, http, grpc):
    """A success, a failure in execution, a failure before queueing, and a request cancelled in the queue by
    its gRPC deadline (never executed): statistics and metrics agree, and the cancel is no failure."""
    ok = np.ones((1, 4), dtype=np.int32)
    http_infer(http, "slow", ok)
    with pytest.raises(InferenceServerException, match="input contains 13"):
        http_infer(http, "slow", np.full((1, 4), 13, dtype=np.int32))
    with pytest.raises(InferenceServerException, match="expects shape"):
        grpc_infer(grpc, "slow", np.ones((1, 5), dtype=np.int32))
    # One request executes (400 ms); one behind it in the queue passes its 100 ms deadline there.
    answered = threading.Event()
    inp = grpcclient.InferInput("INPUT0", [1, 4], "INT32")
    inp.set_data_from_numpy(ok)
    grpc.async_infer("slow", [inp], callback=lambda result, error: answered.set())
    wait_until(lambda: server.metric("nv_inference_pending_request_count", "slow") == 1, "the first executes")
    with pytest.raises(InferenceServerException, match="DEADLINE_EXCEEDED"):
        grpc_infer(grpc, "slow", ok, client_timeout=0.1)
    assert answered.wait(BOUND_S)
    wait_until(lambda: server.metric("hubserve_inference_request_cancelled_total", "slow") == 1,
               "the cancel is accounted")
    wait_until(lambda: server.metric("nv_inference_pending_request_count", "slow") == 0, "nothing pending")
    s = stats(http, "slow")["inference_stats"]
    assert (s["success"]["count"], s["fail"]["count"]) == (2, 2)
    assert server.metric("nv_inference_request_success", "slow") == 2
    assert server.metric("nv_inference_request_failure", "slow") == 2
    assert server.metric("nv_inference_exec_count", "slow") == 2  # the cancelled request never ran
