"""Python sequence models (`backend: "python"` with `sequence_batching`): the sequence batcher hands each
batch row to the model as a request of its own, with the control inputs and the implicit state as input
tensors, and takes the next state from the response (engine/backends/python/sequence.py). Checked with
tritonclient over HTTP and gRPC, under both strategies, without batching and in process: the model's view
(control tensors, correlation_id(), flags(), state in, shapes), every sequence getting its own state when
many are interleaved, a bad state output failing its request alone, the committed example Triton's clients
use with --dyna, and a stream whose client disappears while its sequence holds the only slot."""

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
from python_models import write_model

# OUTPUT = the sum so far (the state ACC_IN plus INPUT, or INPUT on START); VIEW = what the model was given,
# as JSON. INPUT -999 returns no state output (an error for that request); a negative INPUT makes the
# model sleep that many milliseconds first (for the disappearing stream).
SEQ_PROBE = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


def scalar(array):
    value = array.reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value.item()


class TritonPythonModel:
    def initialize(self, args):
        self.batching = json.loads(args["model_config"])["max_batch_size"] > 0

    def execute(self, requests):
        responses = []
        for request in requests:
            tensors = {t.name(): t.as_numpy() for t in request.inputs()}
            value = tensors["INPUT"]
            if scalar(value) < 0 and scalar(value) != -999:
                time.sleep(-scalar(value) / 1000)
            total = value if scalar(tensors["START"]) else tensors["ACC_IN"] + value
            view = {"correlation_id": request.correlation_id(), "flags": request.flags(),
                    "controls": {n: scalar(tensors[n]) for n in ("START", "END", "READY", "CORRID")},
                    "state_in": scalar(tensors["ACC_IN"]),
                    "shapes": {n: list(a.shape) for n, a in sorted(tensors.items())},
                    "corrid_type": type(tensors["CORRID"].reshape(-1)[0]).__name__, "rows": len(requests)}
            text = np.array([json.dumps(view).encode()], dtype=object)
            outputs = [pb_utils.Tensor("OUTPUT", total.astype(np.int32)),
                       pb_utils.Tensor("VIEW", text.reshape(1, 1) if self.batching else text)]
            if scalar(value) != -999:
                outputs.append(pb_utils.Tensor("ACC_OUT", total.astype(np.int32)))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
'''


def _config(max_batch: int, corrid: str, strategy: str, instances: int = 1) -> str:
    return f"""max_batch_size: {max_batch}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "VIEW" data_type: TYPE_STRING dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 10000000
  {strategy}
  control_input [
    {{ name: "START", control [ {{ kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END", control [ {{ kind: CONTROL_SEQUENCE_END, int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY", control [ {{ kind: CONTROL_SEQUENCE_READY, int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID", control [ {{ kind: CONTROL_SEQUENCE_CORRID, data_type: {corrid} }} ] }}
  ]
  state [ {{ input_name: "ACC_IN", output_name: "ACC_OUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
}}
instance_group [ {{ count: {instances}, kind: KIND_CPU }} ]
"""


MODELS = {
    "py_direct": _config(4, "TYPE_UINT64", "direct { }"),
    "py_oldest": _config(4, "TYPE_STRING",
                         "oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 2000 }"),
    "py_nobatch": _config(0, "TYPE_UINT64", "", instances=2),  # a slot per instance
    "py_in_process": _config(4, "TYPE_STRING", "direct { }") +
    'parameters { key: "in_process" value: { string_value: "true" } }\n',
    "py_one_slot": _config(1, "TYPE_UINT64", ""),
}
IDS = {"py_direct": (7001, 7002), "py_oldest": ("alpha", "beta"), "py_nobatch": (7101, 7102),
       "py_in_process": ("gamma", "delta")}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("py_seq_repo")
    for name, config in MODELS.items():
        write_model(repo, name, SEQ_PROBE, config)
    example = EXAMPLES / "simple_string_dyna_sequence"
    (repo / example.name / "1").mkdir(parents=True)
    (repo / example.name / "config.pbtxt").write_text((example / "config.pbtxt").read_text())
    (repo / example.name / "1" / "model.py").write_text((example / "1" / "model.py").read_text())
    srv = start_server(repo, tmp_path_factory.mktemp("py_seq_server") / "server.log", ready_timeout=120)
    yield srv
    srv.stop()


def _inputs(module, model: str, v: int) -> list:
    shape = [1] if model == "py_nobatch" else [1, 1]
    inp = module.InferInput("INPUT", shape, "INT32")
    inp.set_data_from_numpy(np.full(shape, v, dtype=np.int32))
    return [inp]


def _answer(result) -> tuple[int, dict]:
    view = result.as_numpy("VIEW").reshape(-1)[0]
    return int(result.as_numpy("OUTPUT").reshape(-1)[0]), json.loads(view)


def _infer(client, module, model, v, sid, start=False, end=False) -> tuple[int, dict]:
    return _answer(client.infer(model, _inputs(module, model, v), sequence_id=sid, sequence_start=start,
                                sequence_end=end))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["py_direct", "py_oldest", "py_nobatch", "py_in_process"])
def test_the_model_sees_controls_state_and_flags_and_the_server_carries_the_state(server, model, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    a, b = IDS[model]
    values = [5, 3, -2, 10]
    for step, v in enumerate(values):
        first, last = step == 0, step == len(values) - 1
        for sid, scale in ((a, 1), (b, 100)):  # two sequences interleaved: each keeps its own sum
            total, view = _infer(client, module, model, v * scale, sid, start=first, end=last)
            assert total == scale * sum(values[:step + 1])
            assert view["state_in"] == (0 if first else scale * sum(values[:step]))
            assert view["correlation_id"] == sid
            assert view["flags"] == (1 if first else 0) | (2 if last else 0)
            assert view["controls"] == {"START": int(first), "END": int(last), "READY": 1, "CORRID": sid}
            assert view["corrid_type"] == ("bytes" if isinstance(sid, str) else "uint64")
            shape = [1] if model == "py_nobatch" else [1, 1]
            names = ("ACC_IN", "CORRID", "END", "INPUT", "READY", "START")
            assert view["shapes"] == {n: shape for n in names}
    assert server.metric("hubserve_sequence_active", model) == 0


@pytest.mark.parametrize("model", ["py_direct", "py_oldest"])
def test_interleaved_sequences_on_one_stream_each_get_their_own_state_in_batches(server, model):
    """40 sequences of 4 steps sent round-robin on one gRPC stream, with 4 rows per batch (direct: 4 slots,
    so most wait in the backlog; oldest: 8 candidates): each answer is its own sequence's running sum, and
    rows were batched (the model saw several requests in one execute)."""
    n, steps = 40, 4
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for step in range(steps):
            for s in range(n):
                sid = f"s{s}" if model == "py_oldest" else 20_000 + s
                client.async_stream_infer(model, _inputs(grpcclient, model, s + step * 1000),
                                          request_id=f"{s}:{step}", sequence_id=sid,
                                          sequence_start=step == 0, sequence_end=step == steps - 1)
        got, rows = {}, set()
        for _ in range(n * steps):
            result, error = answers.get(timeout=60)
            assert error is None, error
            total, view = _answer(result)
            got[result.get_response().id] = total
            rows.add(view["rows"])
    finally:
        client.stop_stream()
    for s in range(n):
        for step in range(steps):
            assert got[f"{s}:{step}"] == sum(s + k * 1000 for k in range(step + 1)), (s, step)
    assert max(rows) > 1
    assert server.metric("hubserve_sequence_active", model) == 0


def test_a_missing_state_output_fails_that_request_and_the_sequence_keeps_its_state(server):
    client = httpclient.InferenceServerClient(server.http_url)
    assert _infer(client, httpclient, "py_direct", 4, 7301, start=True)[0] == 4
    with pytest.raises(InferenceServerException) as e:
        _infer(client, httpclient, "py_direct", -999, 7301)
    assert e.value.status() == "500"
    assert "model 'py_direct' returned no state output 'ACC_OUT'" in e.value.message()
    assert _infer(client, httpclient, "py_direct", 6, 7301, end=True)[0] == 10


def test_the_string_dyna_example_accumulates_and_adds_its_id_on_end(server):
    """The committed example Triton's sequence clients use with --dyna for string ids."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    model = "simple_string_dyna_sequence"
    values = [20, -11, -7, 1]
    got = []
    for step, v in enumerate(values):
        inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.full((1, 1), v, dtype=np.int32))
        result = client.infer(model, [inp], sequence_id="1002", sequence_start=step == 0,
                              sequence_end=step == len(values) - 1)
        got.append(int(result.as_numpy("OUTPUT")[0, 0]))
    assert got == [20, 9, 2, 3 + 1002]


def test_a_stream_that_disappears_while_running_leaves_no_slot_behind(server):
    """py_one_slot has one slot and a 10 s idle limit. A stream's sequence takes it with three slow requests
    (300 ms each) and the client goes away: its requests are cancelled, the sequence is released, and a new
    sequence gets the slot at once (long before an idle release could free it)."""
    model = "py_one_slot"
    stream = grpcclient.InferenceServerClient(server.grpc_url)
    stream.start_stream(callback=lambda result, error: None)
    for step in range(3):
        stream.async_stream_infer(model, _inputs(grpcclient, model, -300), sequence_id=7401,
                                  sequence_start=step == 0)
    deadline = time.monotonic() + 20
    while server.metric("hubserve_sequence_active", model) != 1:
        assert time.monotonic() < deadline, "the stream's sequence never took the slot"
        time.sleep(0.02)
    stream.stop_stream(cancel_requests=True)
    stream.close()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    started = time.monotonic()
    assert _infer(client, grpcclient, model, 8, 7402, start=True, end=True)[0] == 8
    assert time.monotonic() - started < 5  # the idle release would take 10 s
    assert server.metric("hubserve_sequence_active", model) == 0
    assert server.metric("hubserve_sequence_backlog", model) == 0
    with pytest.raises(InferenceServerException, match="sequence 7401 .* must specify the START flag"):
        _infer(client, grpcclient, model, 1, 7401)
