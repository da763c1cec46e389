"""The sequence batcher end to end: a real server, tritonclient over HTTP and gRPC (sync and streaming), the
accumulator example (implicit state) under both strategies, backlog, idle release, errors, and a stream that
disappears."""

from __future__ import annotations

import queue
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, start_server
from hubserve_models import examples

ACCUMULATOR = (EXAMPLES / "sequence_accumulator" / "config.pbtxt").read_text()


def _variant(name: str, max_batch: int = 8, instances: int = 1, strategy: str = "",
             idle_us: int = 5_000_000) -> str:
    text = ACCUMULATOR.replace('name: "sequence_accumulator"', f'name: "{name}"')
    text = text.replace("max_batch_size: 8", f"max_batch_size: {max_batch}")
    text = text.replace("count: 1,", f"count: {instances},")
    text = text.replace("max_sequence_idle_microseconds: 5000000",
                        f"max_sequence_idle_microseconds: {idle_us}\n  {strategy}")
    return text


MODELS = {
    "sequence_accumulator": ACCUMULATOR,
    "acc_direct2": _variant("acc_direct2", max_batch=4, instances=2),
    "acc_oldest": _variant("acc_oldest", max_batch=4, instances=2,
                           strategy="oldest { max_candidate_sequences: 6 "
                                    "max_queue_delay_microseconds: 200 }"),
    # One slot; idle sequences released after 1 s (Triton's default), long enough that a sequence holding
    # the slot while the test sets up the next is not released meanwhile on a loaded machine.
    "acc_one_slot": _variant("acc_one_slot", max_batch=1, idle_us=1_000_000),
    "acc_one_slot_held": _variant("acc_one_slot_held", max_batch=1),  # and one whose sequences stay 5 s
    "acc_backlog": _variant("acc_backlog", max_batch=1),  # one slot, for the backlog's bound
}
BACKLOG = 1000  # this module's --max-sequence-backlog
STALL_BOUND_S = 0.5  # the longest an unrelated request may wait while a stream's backlog is dropped


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("seq_repo")
    model = examples.accumulator_model()
    for name, text in MODELS.items():
        (root / name).mkdir()
        (root / name / "config.pbtxt").write_text(text)
        examples.write_model(model, root / name / "1" / "model.onnx")
    srv = start_server(root, tmp_path_factory.mktemp("seq_server") / "server.log", "--max-sequence-backlog",
                       str(BACKLOG))
    yield srv
    srv.stop()


def _value(v: int) -> np.ndarray:
    return np.full((1, 1), v, dtype=np.int32)


def _http_infer(client, model, v, sid, start=False, end=False):
    inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(_value(v))
    result = client.infer(model, [inp], sequence_id=sid, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0])


def _grpc_input(v, shape=(1, 1)):
    inp = grpcclient.InferInput("INPUT", list(shape), "INT32")
    inp.set_data_from_numpy(np.full(shape, v, dtype=np.int32))
    return inp


def _grpc_infer(client, model, v, sid, start=False, end=False):
    result = client.infer(model, [_grpc_input(v)], sequence_id=sid, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0])


def _wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("sid", [1000, 2**63 - 1, "a-string-id"])  # tritonclient gRPC sends int64
def test_http_and_grpc_sync_sequences_accumulate(server, sid):
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    values = [3, 4, -2, 10]
    for infer, client in ((_http_infer, http), (_grpc_infer, grpc)):
        got = [infer(client, "sequence_accumulator", v, sid, start=i == 0, end=i == len(values) - 1)
               for i, v in enumerate(values)]
        assert got == list(np.cumsum(values))
    assert server.metric("hubserve_sequence_active", "sequence_accumulator") == 0


@pytest.mark.parametrize("model", ["sequence_accumulator", "acc_direct2", "acc_oldest"])
def test_hundreds_of_interleaved_sequences_over_one_stream_each_get_their_own_state(server, model):
    """300 sequences of 5 steps sent round-robin on one gRPC stream: far more sequences than slots, so most
    wait in the backlog; every answer must be its own sequence's running sum."""
    n, steps = 300, 5
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for step in range(steps):
            for s in range(n):
                sid = 10_000 + s if s % 2 else f"str-{s}"
                client.async_stream_infer(model, [_grpc_input(s * 10 + step)], request_id=f"{s}:{step}",
                                          sequence_id=sid, sequence_start=step == 0,
                                          sequence_end=step == steps - 1)
        got: dict[str, int] = {}
        for _ in range(n * steps):
            result, error = answers.get(timeout=60)
            assert error is None, error
            got[result.get_response().id] = int(result.as_numpy("OUTPUT")[0, 0])
    finally:
        client.stop_stream()
    for s in range(n):
        for step in range(steps):
            assert got[f"{s}:{step}"] == sum(s * 10 + k for k in range(step + 1)), (s, step)
    assert server.metric("hubserve_sequence_active", model) == 0
    assert server.metric("hubserve_sequence_backlog", model) == 0


def test_errors_in_tritons_words_over_both_protocols(server):
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    model = "sequence_accumulator"
    cases = [
        (dict(sid=0, start=True),
         f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID"),
        (dict(sid=424242), f"inference request for sequence 424242 to model '{model}' must specify the "
                           "START flag on the first request of the sequence"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InferenceServerException) as e:
            _http_infer(http, model, 1, **kwargs)
        assert message in e.value.message() and e.value.status() == "400"
        with pytest.raises(InferenceServerException) as e:
            _grpc_infer(grpc, model, 1, **kwargs)
        assert message in e.value.message() and e.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="must specify batch-size 1 due to requirements of "
                                                       "sequence batcher"):
        grpc.infer(model, [_grpc_input(1, (2, 1))], sequence_id=5, sequence_start=True)
    # A sequence ended is gone: its id needs a new START.
    _grpc_infer(grpc, model, 1, 77, start=True, end=True)
    with pytest.raises(InferenceServerException, match="sequence 77 .* must specify the START flag"):
        _grpc_infer(grpc, model, 1, 77)


def test_bad_sequence_parameters_are_invalid_argument(server):
    import json
    import urllib.error
    import urllib.request
    for params in ({"sequence_id": 1.5, "sequence_start": True}, {"sequence_id": True},
                   {"sequence_id": -3, "sequence_start": True}, {"sequence_id": 3, "sequence_start": "yes"}):
        body = json.dumps({"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}],
                           "parameters": params}).encode()
        req = urllib.request.Request(f"http://{server.http_url}/v2/models/sequence_accumulator/infer", body)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400, params
        assert "sequence" in json.loads(e.value.read())["error"], params


def test_backlog_waits_for_the_slot_and_idle_release_frees_it(server):
    """acc_one_slot has one slot and a 1 s idle limit. A second sequence waits in the backlog until the
    first ends; a sequence left idle is released, its id then needs START, and its slot serves the next."""
    model = "acc_one_slot"
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert _grpc_infer(grpc, model, 5, 1, start=True) == 5
    answers: queue.Queue = queue.Queue()
    waiting = grpcclient.InferenceServerClient(server.grpc_url)
    waiting.async_infer(model, [_grpc_input(7)], lambda result, error: answers.put((result, error)),
                        sequence_id=2, sequence_start=True)
    _wait_for(lambda: server.metric("hubserve_sequence_backlog", model) == 1, "the backlog")
    assert answers.empty()
    released = server.metric("hubserve_sequence_idle_released_total", model)  # before 2 can be released
    assert _grpc_infer(grpc, model, 6, 1, end=True) == 11
    result, error = answers.get(timeout=20)
    assert error is None and int(result.as_numpy("OUTPUT")[0, 0]) == 7  # sequence 2 got the slot
    # Sequence 2 is left idle: released after 1 s, and a new sequence takes its slot.
    _wait_for(lambda: server.metric("hubserve_sequence_idle_released_total", model) == released + 1,
              "the idle release")
    assert server.metric("hubserve_sequence_active", model) == 0
    with pytest.raises(InferenceServerException, match="sequence 2 .* must specify the START flag"):
        _grpc_infer(grpc, model, 1, 2)
    assert _grpc_infer(grpc, model, 9, 3, start=True, end=True) == 9


def test_a_stream_that_disappears_leaves_no_sequence_behind(server):
    """Sequence 1 holds acc_one_slot_held's only slot (no idle release within the test); a stream starts
    sequence 2 (backlogged, requests queued) and is cancelled. Its requests leave the queue, sequence 2
    leaves the backlog, and the slot is usable by the next sequence at once after sequence 1 ends."""
    model = "acc_one_slot_held"
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert _grpc_infer(grpc, model, 1, 101, start=True) == 1
    stream = grpcclient.InferenceServerClient(server.grpc_url)
    stream.start_stream(callback=lambda result, error: None)
    for step in range(5):
        stream.async_stream_infer(model, [_grpc_input(step)], sequence_id=102, sequence_start=step == 0)
    _wait_for(lambda: server.metric("hubserve_sequence_backlog", model) == 1, "the backlog")
    cancelled = server.metric("hubserve_inference_request_cancelled_total", model)
    stream.stop_stream(cancel_requests=True)
    stream.close()
    _wait_for(lambda: server.metric("hubserve_sequence_backlog", model) == 0, "the backlog to empty")
    assert server.metric("hubserve_inference_request_cancelled_total", model) > cancelled
    assert _grpc_infer(grpc, model, 2, 101, end=True) == 3
    assert server.metric("hubserve_sequence_active", model) == 0
    with pytest.raises(InferenceServerException, match="sequence 102 .* must specify the START flag"):
        _grpc_infer(grpc, model, 1, 102)
    assert _grpc_infer(grpc, model, 4, 103, start=True, end=True) == 4


def test_a_full_backlog_refuses_starts_and_dropping_it_does_not_stall_the_server(server):
    """One stream starts 3,000 sequences on a one-slot model: BACKLOG of them wait, every later START is
    refused RESOURCE_EXHAUSTED on the stream (and 429 over HTTP) naming --max-sequence-backlog. Closing the
    stream drops every waiting sequence, while an unrelated /v2/health/live keeps answering within
    STALL_BOUND_S (before the bound, and with removal quadratic in the backlog, 10,000 waiting sequences
    stalled it 0.6-2 s)."""
    model, starts = "acc_backlog", 3000
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert _grpc_infer(grpc, model, 1, 9000, start=True) == 1  # holds the only slot
    refusals: queue.Queue = queue.Queue()
    stream = grpcclient.InferenceServerClient(server.grpc_url)
    stream.start_stream(callback=lambda result, error: refusals.put(error) if error is not None else None)
    for sid in range(10_000, 10_000 + starts):
        stream.async_stream_infer(model, [_grpc_input(1)], sequence_id=sid, sequence_start=True)
    errors = [refusals.get(timeout=30) for _ in range(starts - BACKLOG)]
    assert all("(--max-sequence-backlog)" in e.message() for e in errors), errors[0].message()
    assert server.metric("hubserve_sequence_backlog", model) == BACKLOG
    with pytest.raises(urllib.error.HTTPError) as e:
        body = b'{"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}], ' \
               b'"parameters": {"sequence_id": 99999, "sequence_start": true}}'
        urllib.request.urlopen(urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/infer",
                                                      body), timeout=10)
    assert e.value.code == 429 and b"--max-sequence-backlog" in e.value.read()

    worst = [0.0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            start = time.perf_counter()
            with urllib.request.urlopen(f"http://{server.http_url}/v2/health/live", timeout=30) as r:
                assert r.status == 200
            worst[0] = max(worst[0], time.perf_counter() - start)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        stream.stop_stream(cancel_requests=True)
        stream.close()
        _wait_for(lambda: server.metric("hubserve_sequence_backlog", model) == 0, "the backlog to empty")
    finally:
        done.set()
        watcher.join()
    assert worst[0] < STALL_BOUND_S, f"/v2/health/live waited {worst[0]:.3f} s while the backlog was dropped"
    assert _grpc_infer(grpc, model, 2, 9000, end=True) == 3
    assert _grpc_infer(grpc, model, 4, 9001, start=True, end=True) == 4
    assert _http_infer(httpclient.InferenceServerClient(server.http_url), model, 5, 9002, start=True,
                       end=True) == 5


def test_statistics_and_metrics_count_sequences_and_batches(server):
    model = "acc_direct2"
    http = httpclient.InferenceServerClient(server.http_url)
    before = http.get_inference_statistics(model)["model_stats"][0]
    started = server.metric("hubserve_sequence_started_total", model)
    for sid in (501, 502):
        for i in range(3):
            _http_infer(http, model, 1, sid, start=i == 0, end=i == 2)
    after = http.get_inference_statistics(model)["model_stats"][0]
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 6
    assert after["execution_count"] - before["execution_count"] == 6
    assert server.metric("hubserve_sequence_started_total", model) == started + 2
    assert server.metric("hubserve_sequence_ended_total", model) >= 2


def test_config_endpoint_shows_sequence_batching(server):
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("acc_oldest")
    sb = config["sequence_batching"]
    assert sb["oldest"]["max_candidate_sequences"] == 6
    assert sb["state"][0]["input_name"] == "ACC_IN"


def test_model_folder_exists() -> None:
    assert Path(EXAMPLES / "sequence_accumulator" / "config.pbtxt").is_file()
