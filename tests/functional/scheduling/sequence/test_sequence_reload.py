"""A sequence model reloaded while sequences are active, as Triton does it (docs/sequences-streaming.md,
"Reload and unload"): requests the old version accepted finish there with their state; the new version starts
with no sequences, so the next request of an old sequence is refused (INVALID_ARG, "must specify the START
flag") until the client starts it again. A reload that changes nothing keeps the version and its sequences."""

from __future__ import annotations

import json
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, start_server
from hubserve_models import examples

NAME = "acc_reload"
# One slot (max_batch_size 1, one instance), so a second sequence waits in the backlog until the first is
# released. The example's idle limit is 5 s: a sequence outlives whatever a test does between its requests
# (a reload) however loaded the machine; the backlog test's server has 1 s, which it waits out once.
CONFIG = (EXAMPLES / "sequence_accumulator" / "config.pbtxt").read_text() \
    .replace('name: "sequence_accumulator"', f'name: "{NAME}"') \
    .replace("max_batch_size: 8", "max_batch_size: 1")
SHORT_IDLE = CONFIG.replace("max_sequence_idle_microseconds: 5000000",
                            "max_sequence_idle_microseconds: 1000000")


def _serve(tmp_path, config: str):
    root = tmp_path / "repo"
    (root / NAME).mkdir(parents=True)
    (root / NAME / "config.pbtxt").write_text(config)
    examples.write_model(examples.accumulator_model(), root / NAME / "1" / "model.onnx")
    return start_server(root, tmp_path / "server.log", "--model-control-mode", "explicit",
                        "--load-model", NAME)


@pytest.fixture()
def server(tmp_path):
    srv = _serve(tmp_path, CONFIG)
    yield srv
    srv.stop()


@pytest.fixture()
def short_idle_server(tmp_path):
    srv = _serve(tmp_path, SHORT_IDLE)
    yield srv
    srv.stop()


def _infer(client, module, v, sid, start=False, end=False) -> int:
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.full((1, 1), v, dtype=np.int32))
    result = client.infer(NAME, [inp], sequence_id=sid, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0])


def _changed_config(http, idle_us: int) -> str:
    """The served config with another idle limit, as a load's config override: a changed config, so the
    reload builds a new version."""
    config = http.get_model_config(NAME)
    config["sequence_batching"]["max_sequence_idle_microseconds"] = idle_us
    return json.dumps(config)


def _wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_changed_reload_finishes_accepted_requests_and_the_new_version_needs_a_start(short_idle_server):
    server = short_idle_server
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert [_infer(http, httpclient, v, 11, start=i == 0) for i, v in enumerate((3, 4))] == [3, 7]
    # Sequence 12 waits in the backlog behind 11 (one slot) when the reload starts: the old version accepted
    # it, so the reload's drain waits until 11 is released idle and 12 has run there.
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.full((1, 1), 5, dtype=np.int32))
    grpc.async_stream_infer(NAME, [inp], sequence_id=12, sequence_start=True)
    _wait_for(lambda: server.metric("hubserve_sequence_backlog", NAME) == 1, "sequence 12 in the backlog")
    http.load_model(NAME, config=_changed_config(http, 3_000_000))  # returns once the old version is unloaded
    result, error = answers.get(timeout=20)
    assert error is None and int(result.as_numpy("OUTPUT")[0, 0]) == 5
    grpc.stop_stream()
    # The new version has no sequences: 11 and 12 are unknown there, over both protocols.
    for client, module, sid in ((http, httpclient, 11), (grpc, grpcclient, 12)):
        with pytest.raises(InferenceServerException) as info:
            _infer(client, module, 1, sid)
        assert "must specify the START flag" in info.value.message()
        assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    # Started again, a sequence gets a fresh state on the new version.
    assert [_infer(grpc, grpcclient, v, 11, start=i == 0, end=i == 1) for i, v in enumerate((6, 1))] == [6, 7]
    assert http.get_model_config(NAME)["sequence_batching"]["max_sequence_idle_microseconds"] == 3_000_000


def test_a_reload_that_changes_nothing_keeps_the_sequences(server):
    http = httpclient.InferenceServerClient(server.http_url)
    assert _infer(http, httpclient, 3, 21, start=True) == 3
    http.load_model(NAME)  # same files, same config: the version is kept
    assert _infer(http, httpclient, 4, 21) == 7
    assert _infer(http, httpclient, 5, 21, end=True) == 12


def test_unloading_ends_the_sequences(server):
    http = httpclient.InferenceServerClient(server.http_url)
    assert _infer(http, httpclient, 3, 31, start=True) == 3
    http.unload_model(NAME)
    with pytest.raises(InferenceServerException):
        _infer(http, httpclient, 4, 31)
    http.load_model(NAME)
    with pytest.raises(InferenceServerException) as info:
        _infer(http, httpclient, 4, 31)
    assert "must specify the START flag" in info.value.message()
