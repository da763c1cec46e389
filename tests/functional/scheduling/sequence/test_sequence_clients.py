"""Sequences through every way tritonclient sends them, beside what test_sequence_batcher.py covers
(sync over both protocols, one gRPC stream, errors, backlog, idle release): HTTP `async_infer`, gRPC
`async_infer` with a callback, and several client threads at once, each on its own protocol (HTTP sync,
gRPC sync, its own gRPC stream), with uint64 ids (above 2^63 over HTTP, whose JSON carries them unsigned)
and string ids, each getting exactly its own state. The accumulator example (implicit state) answers each
request with its sequence's running sum, under the direct and the oldest strategy."""

from __future__ import annotations

import queue
import random
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import EXAMPLES, start_server
from hubserve_models import examples

ACCUMULATOR = (EXAMPLES / "sequence_accumulator" / "config.pbtxt").read_text()
OLDEST = ACCUMULATOR.replace('name: "sequence_accumulator"', 'name: "acc_oldest"').replace(
    "max_sequence_idle_microseconds: 5000000",
    "max_sequence_idle_microseconds: 5000000\n  oldest { max_candidate_sequences: 16 "
    "max_queue_delay_microseconds: 500 }")
MODELS = {"sequence_accumulator": ACCUMULATOR, "acc_oldest": OLDEST}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("seq_clients_repo")
    model = examples.accumulator_model()
    for name, text in MODELS.items():
        (root / name).mkdir()
        (root / name / "config.pbtxt").write_text(text)
        examples.write_model(model, root / name / "1" / "model.onnx")
    srv = start_server(root, tmp_path_factory.mktemp("seq_clients_server") / "server.log")
    yield srv
    srv.stop()


def _input(module, v: int):
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.full((1, 1), v, dtype=np.int32))
    return inp


def _out(result) -> int:
    return int(result.as_numpy("OUTPUT")[0, 0])


def _plan(n: int, steps: int, seed: int) -> dict:
    """Sequence id -> its values: half uint64 ids, half strings, none shared between seeds."""
    rng = random.Random(seed)
    return {(2**64 - 1 - 100 * seed - s if s % 2 else f"seq-{seed}-{s}"):
            [rng.randint(-50, 50) for _ in range(steps)] for s in range(n)}


def _expected(plan: dict) -> dict:
    return {sid: list(np.cumsum(values)) for sid, values in plan.items()}


@pytest.mark.parametrize("model", list(MODELS))
def test_http_async_infer_interleaves_sequences(server, model):
    """Step k of every sequence is sent with `async_infer` before any is awaited; a sequence's next step
    goes only after its previous answer (HTTP requests on a connection pool may overtake each other). Eight
    sequences: no more than the accumulator's slots, or one waiting for a slot would stall the others."""
    plan = _plan(8, 5, seed=1)
    client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    got: dict = {sid: [] for sid in plan}
    for step in range(5):
        pending = {sid: client.async_infer(model, [_input(httpclient, values[step])], sequence_id=sid,
                                           sequence_start=step == 0, sequence_end=step == 4)
                   for sid, values in plan.items()}
        for sid, request in pending.items():
            got[sid].append(_out(request.get_result(timeout=30)))
    client.close()
    assert got == _expected(plan)
    assert server.metric("hubserve_sequence_active", model) == 0


@pytest.mark.parametrize("model", list(MODELS))
def test_grpc_async_infer_with_callback_interleaves_sequences(server, model):
    plan = {(10_000 + s if s % 2 else f"g-{s}"): values for s, values in enumerate(_plan(8, 5, 2).values())}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    got: dict = {sid: [] for sid in plan}
    for step in range(5):
        for sid, values in plan.items():
            client.async_infer(model, [_input(grpcclient, values[step])],
                               lambda result, error, sid=sid: answers.put((sid, result, error)),
                               sequence_id=sid, sequence_start=step == 0, sequence_end=step == 4)
        for _ in plan:
            sid, result, error = answers.get(timeout=30)
            assert error is None, error
            got[sid].append(_out(result))
    client.close()
    assert got == _expected(plan)


def _http_thread(server, model, plan, got):
    client = httpclient.InferenceServerClient(server.http_url)
    for sid, values in plan.items():
        got[sid] = [_out(client.infer(model, [_input(httpclient, v)], sequence_id=sid, sequence_start=i == 0,
                                      sequence_end=i == len(values) - 1)) for i, v in enumerate(values)]
    client.close()


def _grpc_thread(server, model, plan, got):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for sid, values in plan.items():
        got[sid] = [_out(client.infer(model, [_input(grpcclient, v)], sequence_id=sid, sequence_start=i == 0,
                                      sequence_end=i == len(values) - 1)) for i, v in enumerate(values)]
    client.close()


def _stream_thread(server, model, plan, got):
    """All of this thread's sequences at once on its own stream, interleaved step by step."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    keys = {f"r{i}": sid for i, sid in enumerate(plan)}
    steps = len(next(iter(plan.values())))
    for step in range(steps):
        for key, sid in keys.items():
            client.async_stream_infer(model, [_input(grpcclient, plan[sid][step])],
                                      request_id=f"{key}:{step}", sequence_id=sid, sequence_start=step == 0,
                                      sequence_end=step == steps - 1)
    results = {}
    for _ in range(len(plan) * steps):
        result, error = answers.get(timeout=60)
        assert error is None, (error.status(), error.message())
        results[result.get_response().id] = _out(result)
    client.stop_stream()
    client.close()
    for key, sid in keys.items():
        got[sid] = [results[f"{key}:{step}"] for step in range(steps)]


@pytest.mark.parametrize("model", list(MODELS))
def test_sequences_from_several_client_threads_each_get_their_own_state(server, model):
    """Six threads (two per way of sending), each with its own client and its own sequences, run at once:
    up to 16 sequences live together, so some wait in the backlog; gRPC ids stay below 2^63 (tritonclient
    sends them as int64)."""
    workers = [_http_thread, _grpc_thread, _stream_thread] * 2
    plans, gots, errors = [], [], []
    for t in range(len(workers)):
        plan = _plan(6, 6, seed=100 + t)
        if workers[t] is not _http_thread:
            plan = {(sid - 2**63 if isinstance(sid, int) else sid): v for sid, v in plan.items()}
        plans.append(plan)
        gots.append({})

    def run(t):
        try:
            workers[t](server, model, plans[t], gots[t])
        except BaseException as e:  # reported below, from the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(len(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, [str(e) for e in errors]
    for plan, got in zip(plans, gots, strict=True):
        assert got == _expected(plan)
    assert server.metric("hubserve_sequence_active", model) == 0
    assert server.metric("hubserve_sequence_backlog", model) == 0


def test_thousands_of_sequences_from_many_clients_each_get_their_own_state(server):
    """Eight clients, each its own gRPC stream, each with 250 sequences interleaved step by step: 2,000
    sequences, far more than the slots, most of them waiting in the backlog; every answer is its own
    sequence's running sum."""
    model = "acc_oldest"
    # _plan's uint64 ids are 100 * seed apart: seeds 10 apart keep 250 sequences' ids distinct
    plans = [{(sid - 2**63 if isinstance(sid, int) else sid): v
              for sid, v in _plan(250, 3, 1000 + 10 * t).items()} for t in range(8)]
    gots: list[dict] = [{} for _ in plans]
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            _stream_thread(server, model, plans[t], gots[t])
        except BaseException as e:  # reported below, from the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(len(plans))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, [str(e) for e in errors]
    assert sum(len(p) for p in plans) == 2000
    for plan, got in zip(plans, gots, strict=True):
        assert got == _expected(plan)
    assert server.metric("hubserve_sequence_active", model) == 0
    assert server.metric("hubserve_sequence_backlog", model) == 0
