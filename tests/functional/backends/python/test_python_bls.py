"""BLS: a Python model's `exec()` / `async_exec()` into the engine, through the same batchers as clients.

What is checked: calls to an ONNX model (counted in its statistics), to an ensemble and to a Python model,
sync and async; a call to a decoupled model is an error response; a failed call is a response with
`has_error()`; `timeout` bounds the wait; a call waits for a busy instance and is answered; a model calling
itself with one instance, or two models calling each other, is refused at once instead of hanging, and with
two instances the self-call is answered.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import start_server, wait_until
from ensemble_repository import ensemble, step, write_ensemble
from hubserve_harness import EXAMPLES
from python_models import ASYNC_CALLER, CALLER, CALLER_CONFIG, DECOUPLED_ADDER, add_simple, write_model

TWO = "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
IN_PROCESS = 'parameters { key: "in_process" value: { string_value: "true" } }\n'
MODELS = {"caller": "", "caller2": TWO, "adder": "", "ping": "", "pong": "", "async_caller": "",
          "inproc_caller": IN_PROCESS, "inproc_async": IN_PROCESS}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("bls_repository")
    add_simple(repo)
    for name, extra in MODELS.items():
        source = ASYNC_CALLER if name.endswith("async_caller") or name == "inproc_async" else CALLER
        write_model(repo, name, source, CALLER_CONFIG + extra)
    int16 = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    write_ensemble(repo, "simple_ensemble", ensemble("simple_ensemble", int16, [
        ("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])], [
        step("simple", {"INPUT0": "INPUT0", "INPUT1": "INPUT1"},
             {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"})]))
    write_model(repo, "decoupled_adder", DECOUPLED_ADDER,
                CALLER_CONFIG + "model_transaction_policy { decoupled: true }\n")
    shutil.copytree(EXAMPLES / "tiny_decoder", repo / "tiny_decoder")  # a generative model (decoupled)
    args = ["--model-control-mode", "explicit", "--load-model", "simple", "--load-model", "simple_ensemble",
            "--load-model", "decoupled_adder", "--load-model", "tiny_decoder"]
    args += [a for n in MODELS for a in ("--load-model", n)]
    srv = start_server(repo, tmp_path_factory.mktemp("bls_server") / "server.log", *args, ready_timeout=120)
    yield srv
    srv.stop()


A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, np.int32)


def infer(server, model: str, protocol: str = "http", **parameters):
    module = httpclient if protocol == "http" else grpcclient
    with module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url) as c:
        inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(A)
        inputs[1].set_data_from_numpy(B)
        return c.infer(model, inputs, parameters=parameters)


def executions(server, model: str) -> int:
    with httpclient.InferenceServerClient(server.http_url) as c:
        return int(c.get_inference_statistics(model)["model_stats"][0]["execution_count"])


def batches_started(server, model: str) -> int:
    """The model's queue count: it grows when a batch leaves the queue for an instance."""
    with httpclient.InferenceServerClient(server.http_url) as c:
        stats = c.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_stats"]["queue"].get("count", 0))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_to_an_onnx_model_goes_through_its_batcher(server, protocol: str) -> None:
    before = executions(server, "simple")
    result = infer(server, "caller", protocol, chain="simple")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    assert executions(server, "simple") == before + 1


def test_bls_to_an_ensemble_runs_its_steps(server) -> None:
    """Triton lets a BLS request target an ensemble: it runs as a client's request to it would."""
    before = executions(server, "simple")
    result = infer(server, "caller", chain="simple_ensemble")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    assert executions(server, "simple") == before + 1
    assert executions(server, "simple_ensemble") >= 1


@pytest.mark.parametrize("model", ["decoupled_adder", "tiny_decoder"])
def test_bls_to_a_decoupled_model_is_an_error_response_not_a_hang(server, model: str) -> None:
    """hubserve serves no BLS call to a decoupled model yet (pb_utils refuses `decoupled=True`; Triton answers
    both forms since 23.03): `exec()` on one, a Python model or a generative one, is an error response the
    caller can act on, as a unary client's request to it is, and the caller goes on."""
    with pytest.raises(InferenceServerException,
                       match="BLS: this request doesn't support models with decoupled transaction policy"):
        infer(server, "caller", chain=model)
    assert infer(server, "caller", chain="simple").as_numpy("OUTPUT0") is not None


def test_bls_to_a_python_model_and_on(server) -> None:
    result = infer(server, "caller", chain="adder,simple")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


def test_async_exec_runs_calls_concurrently(server) -> None:
    result = infer(server, "async_caller", chain="adder")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_a_failed_call_is_a_response_with_an_error(server) -> None:
    with pytest.raises(InferenceServerException, match="BLS: Request for unknown model: 'nowhere'"):
        infer(server, "caller", chain="nowhere")
    assert infer(server, "caller", chain="simple").as_numpy("OUTPUT0") is not None  # the caller goes on


def test_a_call_waits_for_a_busy_instance_and_its_timeout_applies(server) -> None:
    """`adder` has one instance, kept busy for a second by another client: a call without timeout waits
    and is answered; one with a 200 ms timeout gets an error response when it passes."""
    with ThreadPoolExecutor(2) as pool:
        before = batches_started(server, "adder")
        busy = pool.submit(infer, server, "adder", sleep_s=1.0)
        # the instance is busy before the call (had the call reached it first, it would be answered at once)
        wait_until(lambda: batches_started(server, "adder") > before, "adder's instance busy")
        started = time.monotonic()
        with pytest.raises(InferenceServerException, match="BLS: BLS request to model 'adder' timed out "
                                                           "after 200000 us"):
            infer(server, "caller", chain="adder", bls_timeout_us=200000)
        assert time.monotonic() - started < 5
        waiting = pool.submit(infer, server, "caller", chain="adder")
        np.testing.assert_array_equal(waiting.result(30).as_numpy("OUTPUT0"), A + B)
        busy.result(30)


def test_a_model_calling_itself_with_one_instance_is_refused_not_hung(server) -> None:
    started = time.monotonic()
    with pytest.raises(InferenceServerException, match="refused: instance 'caller_0_0' calls itself"):
        infer(server, "caller", chain="caller")
    assert time.monotonic() - started < 5
    assert infer(server, "caller", chain="simple").as_numpy("OUTPUT0") is not None


def test_a_model_calling_itself_with_two_instances_is_answered(server) -> None:
    result = infer(server, "caller2", chain="caller2")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_two_models_calling_each_other_are_refused_not_hung(server) -> None:
    started = time.monotonic()
    with pytest.raises(InferenceServerException, match="BLS: BLS: BLS request to model 'ping' refused"):
        infer(server, "ping", chain="pong,ping,pong")
    assert time.monotonic() - started < 5
    np.testing.assert_array_equal(infer(server, "ping", chain="pong").as_numpy("OUTPUT0"), A + B)


def test_a_self_call_from_every_instance_at_once_never_hangs(server) -> None:
    """Both instances of caller2 call caller2 at the same time: at most one call can be refused (then the
    other instance is free to answer the other call); none hangs."""
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(infer, server, "caller2", chain="caller2", sleep_s=0.3) for _ in range(4)]
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result(30).as_numpy("OUTPUT0") is not None)
            except InferenceServerException as e:
                assert "refused" in e.message()
                outcomes.append(False)
    assert any(outcomes)


def test_bls_from_an_in_process_model(server) -> None:
    result = infer(server, "inproc_caller", chain="adder,simple")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    result = infer(server, "inproc_async", "grpc", chain="caller")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    with pytest.raises(InferenceServerException, match="refused: instance 'inproc_caller_0_0' calls itself"):
        infer(server, "inproc_caller", chain="inproc_caller")
