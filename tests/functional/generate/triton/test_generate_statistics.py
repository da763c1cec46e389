"""A generative model's Triton statistics, read with tritonclient's `get_inference_statistics` over gRPC and
HTTP (they must agree), against a real server (also run with HUBSERVE_TEST_WORKERS=2): a request through
ModelStreamInfer or generate counts as Triton counts a decoupled model's (success / fail, queue, one
execution, compute_infer) and each of its responses by index in `response_stats` (success, empty_response,
fail, and cancel where the client left); a /v1 request counts in the same inference statistics, without
response_stats, and in the model's pending count while it runs. Every test compares two snapshots, so the
tests' order does not matter."""

from __future__ import annotations

import json
import queue
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import RunningServer, openai_client, start_example_server, wait_until

MODEL = "tiny_decoder"
KINDS = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")
REQUEST = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    running = start_example_server(tmp_path_factory, "gen_stats", MODEL)
    yield running
    running.stop()


def _from_grpc(server: RunningServer) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        (s,) = client.get_inference_statistics(MODEL).model_stats
    finally:
        client.close()
    i = s.inference_stats
    return {"inference_count": s.inference_count, "execution_count": s.execution_count,
            **{k: getattr(i, k).count for k in REQUEST},
            "responses": {int(key): {k: getattr(r, k).count for k in KINDS}
                          for key, r in s.response_stats.items()}}


def _from_http(server: RunningServer) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        (s,) = client.get_inference_statistics(MODEL)["model_stats"]
    finally:
        client.close()
    i = s["inference_stats"]
    return {"inference_count": s["inference_count"], "execution_count": s["execution_count"],
            **{k: i[k]["count"] for k in REQUEST},
            "responses": {int(key): {k: r[k]["count"] for k in KINDS}
                          for key, r in s["response_stats"].items()}}


def snapshot(server: RunningServer) -> dict[str, Any]:
    """The statistics as both protocols report them. A request finishing between the two reads tears one
    pair (CI saw it while a test waited for a cancel), so a pair is read again until the two agree; two
    that never agree fail."""
    def agreed() -> dict[str, Any] | None:
        over_grpc, over_http = _from_grpc(server), _from_http(server)
        return over_http if over_grpc == over_http else None
    return wait_until(agreed, "gRPC and HTTP report different statistics")


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What changed: the request counts, and per response index the kinds that grew."""
    out: dict[str, Any] = {k: after[k] - before[k] for k in after if k != "responses"}
    responses = {}
    for index, kinds in after["responses"].items():
        old = before["responses"].get(index, dict.fromkeys(KINDS, 0))
        grown = {k: kinds[k] - old[k] for k in KINDS if kinds[k] != old[k]}
        if grown:
            responses[index] = grown
    out["responses"] = responses
    return out


def requests(success: int = 0, fail: int = 0, executions: int = 0) -> dict[str, int]:
    """The request counts a delta must show: one queue entry and one compute per execution."""
    return {"inference_count": executions, "execution_count": executions, "success": success, "fail": fail,
            "queue": executions, "compute_input": executions, "compute_infer": executions,
            "compute_output": executions}


def tensor(name: str, datatype: str, value: Any) -> grpcclient.InferInput:
    x = grpcclient.InferInput(name, [1], datatype)
    x.set_data_from_numpy(np.array([value], dtype=object if datatype == "BYTES" else bool))
    return x


def stream_inputs(sampling: dict) -> list[grpcclient.InferInput]:
    return [tensor("text_input", "BYTES", b"Once upon a time"), tensor("stream", "BOOL", True),
            tensor("sampling_parameters", "BYTES", json.dumps(sampling).encode())]


SUCCESS = {"compute_infer": 1, "compute_output": 1, "success": 1}


def test_a_streamed_generation_counts_each_response_by_index(server: RunningServer):
    before = snapshot(server)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer(MODEL, stream_inputs({"temperature": 0, "max_tokens": 8, "ignore_eos": True}),
                              enable_empty_final_response=True)
    got = []
    while True:
        result, error = results.get(timeout=60)
        assert error is None, error
        got.append(result)
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    assert len(got) >= 2
    last_empty = got[-1].as_numpy("text_output") is None
    expected = {i: SUCCESS for i in range(len(got) - 1)}
    expected[len(got) - 1] = {"compute_infer": 1, "empty_response": 1} if last_empty else SUCCESS
    assert delta(before, snapshot(server)) == {**requests(success=1, executions=1), "responses": expected}


def test_a_whole_text_generation_is_one_response(server: RunningServer):
    before = snapshot(server)
    body = json.dumps({"text_input": "Hello", "parameters": {"max_tokens": 4, "ignore_eos": True}}).encode()
    with urllib.request.urlopen(urllib.request.Request(
            f"http://{server.http_url}/v2/models/{MODEL}/generate", data=body), timeout=60) as r:
        assert r.status == 200
    assert delta(before, snapshot(server)) == {**requests(success=1, executions=1), "responses": {0: SUCCESS}}


def test_an_error_is_a_failed_request_and_a_failed_response(server: RunningServer):
    before = snapshot(server)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer(MODEL, stream_inputs({"max_tokens": 600}))  # past the 512-token context
    _, error = results.get(timeout=60)
    client.stop_stream()
    client.close()
    assert error is not None and "context of 512 tokens" in error.message()
    # refused before it reached the engine: no execution, and its one response failed
    assert delta(before, snapshot(server)) == {**requests(fail=1), "responses": {0: {"compute_infer": 1,
                                                                                     "fail": 1}}}


def _cancels(stats: dict[str, Any]) -> int:
    return sum(r["cancel"] for r in stats["responses"].values())


CANCELLED = "hubserve_inference_request_cancelled_total"


def _ended(server: RunningServer, before: dict[str, Any], cancelled: float) -> str | None:
    """How the one request since `before` (and the cancelled count `cancelled`) ended: "cancel", "success"
    (all its tokens were made before the cancel arrived), or None while it runs."""
    if server.metric(CANCELLED, MODEL) == cancelled + 1:
        return "cancel"
    return "success" if snapshot(server)["success"] == before["success"] + 1 else None


def until_cancelled(server: RunningServer, cancel: Callable[[], int], what: str,
                    ) -> tuple[dict[str, Any], float, int]:
    """`cancel` starts a 480-token request and leaves it, returning the pending count it read meanwhile; a
    try whose tokens were all made before the cancel arrived counts a success and is made again (at most
    five). Returns the snapshot and cancelled count from before the try that counted a cancel, and its
    pending count."""
    for _ in range(5):
        before, cancelled = snapshot(server), server.metric(CANCELLED, MODEL)
        pending = cancel()
        if wait_until(lambda b=before, c=cancelled: _ended(server, b, c),
                      f"the {what} neither cancelled nor done") == "cancel":
            return before, cancelled, pending
    raise AssertionError(f"all 480 tokens were made before each of 5 {what} cancels arrived")


def test_a_client_leaving_mid_stream_counts_a_cancel(server: RunningServer):
    """A stream cancelled after three responses counts a cancel. The tiny model makes the 480 tokens in
    ~200 ms, so on a loaded machine the cancel can arrive after the last (counted a success): such a try
    shows nothing and is made again (at most five)."""
    def cancel_a_stream() -> int:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error, got=results: got.put((result, error)))
        client.async_stream_infer(MODEL, stream_inputs({"max_tokens": 480, "ignore_eos": True}))
        for _ in range(3):
            _, error = results.get(timeout=60)
            assert error is None, error
        pending = server.metric("nv_inference_pending_request_count", MODEL)
        client.stop_stream(cancel_requests=True)
        client.close()
        return pending

    before, cancelled, pending = until_cancelled(server, cancel_a_stream, "stream")
    assert pending == 1  # read while it ran (it was cancelled later)
    wait_until(lambda: _cancels(snapshot(server)) == _cancels(before) + 1, "no cancel counted")
    assert server.metric("nv_inference_pending_request_count", MODEL) == 0
    change = delta(before, snapshot(server))
    responses = change.pop("responses")
    assert change == requests(executions=1)  # it reached the engine; neither a success nor a failure
    (at,) = [i for i, kinds in responses.items() if "cancel" in kinds]
    assert at >= 3 and responses[at] == {"cancel": 1}  # no compute at the cancel, as Triton's
    assert responses == {**{i: SUCCESS for i in range(at)}, at: {"cancel": 1}}
    assert server.metric(CANCELLED, MODEL) == cancelled + 1


def test_openai_requests_count_in_the_model_statistics(server: RunningServer):
    client = openai_client(server)
    before = snapshot(server)
    succeeded = server.metric("nv_inference_request_success", MODEL)
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, n=2, temperature=0)
    assert len(out.choices) == 2
    # one request (whatever its choices), one execution; an OpenAI answer is no Triton response
    assert delta(before, snapshot(server)) == {**requests(success=1, executions=1), "responses": {}}
    assert server.metric("nv_inference_request_success", MODEL) == succeeded + 1

    def close_a_stream() -> int:
        stream = client.completions.create(model=MODEL, prompt="Hello", max_tokens=480, stream=True,
                                           extra_body={"ignore_eos": True})
        next(iter(stream))
        pending = server.metric("nv_inference_pending_request_count", MODEL)
        stream.close()
        return pending

    before, _, pending = until_cancelled(server, close_a_stream, "closed stream")
    assert pending == 1  # one of the model's requests, read while it ran (it was cancelled later)
    assert server.metric("nv_inference_pending_request_count", MODEL) == 0
    assert delta(before, snapshot(server)) == {**requests(executions=1), "responses": {}}

    before = snapshot(server)
    with pytest.raises(openai.BadRequestError):  # refused before the engine: counted nowhere
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=600)
    assert delta(before, snapshot(server)) == {**requests(), "responses": {}}
    client.close()
