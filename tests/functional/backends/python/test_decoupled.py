"""Decoupled Python models (`model_transaction_policy { decoupled: true }`) over gRPC ModelStreamInfer, with
tritonclient's sync and aio streams: many responses in order, ids echoed, `triton_final_response`, the empty
final response, errors mid-stream, cancellation seen by the model, Triton's answers to unary calls and to
misuse of the response sender. The models are the example `repeat_stream` and `misuse` below.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from conftest import start_server, wait_until
from hubserve_harness import EXAMPLES
from python_models import DECOUPLED_MISUSE as MISUSE
from python_models import DECOUPLED_MISUSE_CONFIG as MISUSE_CONFIG
from python_models import write_model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("decoupled_repository")
    shutil.copytree(EXAMPLES / "repeat_stream", repo / "repeat_stream")
    write_model(repo, "misuse", MISUSE, MISUSE_CONFIG)
    write_model(repo, "misuse_in_process", MISUSE, MISUSE_CONFIG +
                'parameters { key: "in_process" value: { string_value: "true" } }\n')
    (repo / "onnx_decoupled").mkdir()
    (repo / "onnx_decoupled" / "config.pbtxt").write_text(
        'name: "onnx_decoupled"\nbackend: "onnxruntime"\nmodel_transaction_policy { decoupled: true }\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    (repo / "onnx_decoupled" / "1").mkdir()
    srv = start_server(repo, tmp_path_factory.mktemp("decoupled_server") / "server.log", wait_ready=False,
                       ready_timeout=120)
    yield srv
    srv.stop()


def repeat_inputs(values: list[int], delay_ms: int | None = None) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("IN", [len(values)], "INT32")]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.int32))
    if delay_ms is not None:
        delay = grpcclient.InferInput("DELAY_MS", [1], "UINT32")
        delay.set_data_from_numpy(np.array([delay_ms], dtype=np.uint32))
        inputs.append(delay)
    return inputs


def mode_inputs(mode: int, module=grpcclient) -> list:
    x = module.InferInput("MODE", [1], "INT32")
    x.set_data_from_numpy(np.array([mode], dtype=np.int32))
    return [x]


class Stream:
    """A tritonclient sync stream whose callback results land in a queue."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def take(self, n: int, timeout: float = 30) -> list:
        return [self.results.get(timeout=timeout) for _ in range(n)]

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def final_flag(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def text_of(result) -> str:
    return result.as_numpy("OUT")[0].decode()


def test_many_responses_in_order_with_ids_and_empty_final(server) -> None:
    stream = Stream(server.grpc_url)
    try:
        values = list(range(100, 140))
        stream.client.async_stream_infer("repeat_stream", repeat_inputs(values), request_id="r-1",
                                         enable_empty_final_response=True)
        got = stream.take(len(values) + 1)
        assert all(error is None for _, error in got)
        data, last = got[:-1], got[-1][0]
        assert [int(r.as_numpy("OUT")[0]) for r, _ in data] == values
        assert [int(r.as_numpy("IDX")[0]) for r, _ in data] == list(range(len(values)))
        assert {r.get_response().id for r, _ in data} == {"r-1"}
        assert not any(final_flag(r) for r, _ in data)
        assert final_flag(last) and last.get_response().id == "r-1" and last.as_numpy("OUT") is None
    finally:
        stream.close()


def test_without_empty_final_only_the_data_comes(server) -> None:
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer("repeat_stream", repeat_inputs([1, 2, 3]), request_id="a")
        stream.client.async_stream_infer("repeat_stream", repeat_inputs([]), request_id="empty")
        stream.client.async_stream_infer("repeat_stream", repeat_inputs([9]), request_id="b")
        got = stream.take(4)
        by_id: dict[str, list[int]] = {}
        for result, error in got:
            assert error is None
            by_id.setdefault(result.get_response().id, []).append(int(result.as_numpy("OUT")[0]))
        assert by_id == {"a": [1, 2, 3], "b": [9]}
        with pytest.raises(queue.Empty):
            stream.results.get(timeout=0.3)  # nothing for "empty", nor any final flag
    finally:
        stream.close()


def test_aio_stream(server) -> None:
    async def run() -> list:
        async with aioclient.InferenceServerClient(server.grpc_url) as client:
            async def requests():
                # (the aio client cannot ask for empty final responses: it refuses triton_ parameters)
                yield {"model_name": "repeat_stream", "inputs": repeat_inputs([5, 6, 7]), "request_id": "x"}
                yield {"model_name": "repeat_stream", "inputs": repeat_inputs([8]), "request_id": "y"}

            out = []
            async for result, error in client.stream_infer(requests()):
                assert error is None
                out.append(result)
                if len(out) == 4:
                    break
            return out

    results = asyncio.run(asyncio.wait_for(run(), 60))
    assert sorted((r.get_response().id, int(r.as_numpy("OUT")[0])) for r in results) == [
        ("x", 5), ("x", 6), ("x", 7), ("y", 8)]
    assert not any(final_flag(r) for r in results)


def test_error_mid_stream_reaches_the_client_and_the_stream_goes_on(server) -> None:
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer("misuse", mode_inputs(5), request_id="e",
                                         enable_empty_final_response=True)
        (one, e1), (bad, e2), (two, e3), (last, e4) = stream.take(4)
        assert e1 is None and text_of(one) == "one"
        assert bad is None and "bad piece" in e2.message()
        assert e3 is None and text_of(two) == "two"
        assert e4 is None and final_flag(last)
    finally:
        stream.close()


@pytest.mark.parametrize("model", ["misuse", "misuse_in_process"])
def test_execute_raising_fails_the_request_after_its_responses(server, model: str) -> None:
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer(model, mode_inputs(6), request_id="boom")
        (before, e1), (_, e2) = stream.take(2)
        assert e1 is None and text_of(before) == "before"
        assert "broke after one" in e2.message()
    finally:
        stream.close()


@pytest.mark.parametrize("model", ["misuse", "misuse_in_process"])
def test_misuse_errors_in_tritons_words(server, model: str) -> None:
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer(model, mode_inputs(1))
        [(_, error)] = stream.take(1)
        assert "is using the decoupled mode and the execute function must return None" in error.message()
        stream.client.async_stream_infer(model, mode_inputs(2))
        [(result, error)] = stream.take(1)
        assert error is None and text_of(result) == ("Inference Response object must be provided when the "
                                                     "response flags is set to zero.")
        stream.client.async_stream_infer(model, mode_inputs(3))
        [(result, error)] = stream.take(1)
        assert error is None and text_of(result) == "last" and final_flag(result)
        stream.client.async_stream_infer(model, mode_inputs(4))
        [(result, error)] = stream.take(1)
        assert text_of(result) == "Unable to send response. Response sender has been closed."
    finally:
        stream.close()


@pytest.mark.parametrize("model", ["misuse", "misuse_in_process"])
def test_client_cancel_is_seen_by_the_model_and_frees_the_instance(server, model: str) -> None:
    def cancels() -> int:  # Triton's response_stats: a cancel at the index of the response not delivered
        stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics(model)
        return stats.model_stats[0].response_stats["1"].cancel.count

    before = cancels()
    stream = Stream(server.grpc_url)
    stream.client.async_stream_infer(model, mode_inputs(7))
    [(result, error)] = stream.take(1)
    assert error is None and text_of(result) == "waiting"
    stream.close(cancel=True)  # the client leaves: the model's execute ends, its instance takes the next
    wait_until(lambda: cancels() == before + 1, "a cancel counted at response 1")
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer(model, mode_inputs(4))
        [(result, error)] = stream.take(1)
        assert error is None and text_of(result) == "cancelled=True sender=True"
    finally:
        stream.close()


def _instance_threads(server) -> int:
    """Threads of the server's Python-model instance processes, all of them (its children: with --workers N,
    the engine's; started from the instances' threads, so found by their parent id), as the OS counts them."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            if parent != server.process.pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"engine.backends.python.stub" in f.read():
                    total += len(os.listdir(f"/proc/{entry}/task"))
        except (FileNotFoundError, ProcessLookupError):  # gone meanwhile
            continue
    return total


def test_repeat_stream_streams_many_requests_on_a_fixed_pool_of_threads(server) -> None:
    """The example holds its own resources bounded: a fixed pool of worker threads, not one per request."""
    requests, workers = 24, 4  # repeat_stream's WORKERS
    before = _instance_threads(server)
    stream = Stream(server.grpc_url)
    try:
        for i in range(requests):
            stream.client.async_stream_infer("repeat_stream", repeat_inputs([i], delay_ms=200),
                                             request_id=str(i))
        got: list = []
        peak = before
        while len(got) < requests:  # the pool streams 4 at a time: 6 rounds of 200 ms
            peak = max(peak, _instance_threads(server))
            with contextlib.suppress(queue.Empty):
                got.append(stream.results.get(timeout=0.05))
        assert all(error is None for _, error in got)
        assert sorted(int(r.as_numpy("OUT")[0]) for r, _ in got) == list(range(requests))
        assert peak - before <= workers, f"{peak - before} threads more while {requests} requests streamed"
    finally:
        stream.close()


def test_statistics_count_the_request_once_and_each_response_by_index(server) -> None:
    def stats() -> dict:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/repeat_stream/stats") as r:
            return json.load(r)["model_stats"][0]

    def count(s: dict, index: str, kind: str) -> int:
        return s["response_stats"].get(index, {}).get(kind, {}).get("count", 0)

    before = stats()
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer("repeat_stream", repeat_inputs([1, 2, 3, 4, 5, 6, 7]),
                                         enable_empty_final_response=True)
        assert all(e is None for _, e in stream.take(8))
    finally:
        stream.close()
    # The execution is recorded once the model's execute returns, which may be after its last response
    # reached the client.
    wait_until(lambda: stats()["execution_count"] == before["execution_count"] + 1, "the execution recorded")
    after = stats()
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert after["execution_count"] == before["execution_count"] + 1
    assert count(after, "0", "success") == count(before, "0", "success") + 1
    assert count(after, "6", "success") == count(before, "6", "success") + 1
    assert count(after, "7", "empty_response") == count(before, "7", "empty_response") + 1
    grpc_stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics("repeat_stream")
    assert grpc_stats.model_stats[0].response_stats["7"].empty_response.count >= 1


def test_unary_on_a_decoupled_model_answers_as_triton(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("repeat_stream", repeat_inputs([1]))
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert info.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]}).encode()
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/repeat_stream/infer", body)
    with pytest.raises(urllib.error.HTTPError) as http_info:
        urllib.request.urlopen(request)
    assert http_info.value.code == 501
    assert json.load(http_info.value) == {
        "error": "HTTP end point doesn't support models with decoupled transaction policy"}


def test_non_decoupled_model_still_streams_one_final_response(server, tmp_path: Path) -> None:
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer("misuse", mode_inputs(8), request_id="one")
        [(result, error)] = stream.take(1)
        assert error is None and final_flag(result) and result.get_response().id == "one"
    finally:
        stream.close()


def test_other_backends_refuse_decoupled_with_a_reason(server) -> None:
    with urllib.request.urlopen(urllib.request.Request(f"http://{server.http_url}/v2/repository/index",
                                                       b"{}")) as r:
        rows = {row["name"]: row for row in json.load(r)}
    assert rows["onnx_decoupled"]["state"] == "UNAVAILABLE"
    assert "decoupled" in rows["onnx_decoupled"]["reason"]
    assert "python" in rows["onnx_decoupled"]["reason"]


CLIENT_THAT_DIES = '''
import os, queue, sys
import numpy as np
import tritonclient.grpc as grpcclient
client = grpcclient.InferenceServerClient(sys.argv[1])
results = queue.Queue()
client.start_stream(callback=lambda result, error: results.put((result, error)))
mode = grpcclient.InferInput("MODE", [1], "INT32")
mode.set_data_from_numpy(np.array([7], dtype=np.int32))
client.async_stream_infer(sys.argv[2], [mode])
results.get(timeout=30)
print("waiting", flush=True)
os._exit(0)  # no goodbye: the kernel closes the connection
'''


@pytest.mark.parametrize("model", ["misuse", "misuse_in_process"])
def test_a_client_whose_connection_drops_cancels_its_request(server, model: str) -> None:
    done = subprocess.run([sys.executable, "-c", CLIENT_THAT_DIES, server.grpc_url, model],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "waiting", done.stderr
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer(model, mode_inputs(4))  # runs once the instance is free again
        [(result, error)] = stream.take(1)
        assert error is None and text_of(result) == "cancelled=True sender=True"
    finally:
        stream.close()
