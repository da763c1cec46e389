"""Ensembles (`platform: "ensemble"`, engine/scheduling/ensemble/driver.py) through Triton's own clients over
both protocols, against a server of their own in explicit model-control mode that starts with nothing loaded:
loading an ensemble loads its composing models; bad ensembles fail alone with their reasons; steps run
concurrently through their models' own batchers; `max_inflight_requests` holds requests back; statistics for
the ensemble and its steps; and the real perf_analyzer against an ensemble.

This file imports `tritonclient.grpc` and none of our generated modules. The models are in
tests/ensemble_repository.py.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import ensemble_repository as repo
from conftest import start_server
from hubserve_harness.perf_analyzer import perf_analyzer_available, run_perf_analyzer_settled

CLIENTS = (httpclient, grpcclient)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = repo.build(tmp_path_factory.mktemp("ensemble_repository"))
    log = tmp_path_factory.mktemp("ensemble_server") / "server.log"
    srv = start_server(root, log, "--model-control-mode", "explicit")
    yield srv
    srv.stop()


@pytest.fixture(params=CLIENTS, ids=["http", "grpc"])
def client(request: pytest.FixtureRequest, server):
    module = request.param
    url = server.http_url if module is httpclient else server.grpc_url
    c = module.InferenceServerClient(url, network_timeout=60.0) if module is httpclient else \
        module.InferenceServerClient(url)
    c.module = module
    yield c
    c.close()


@pytest.fixture(scope="module")
def http(server):
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60.0, concurrency=16) as c:
        c.module = httpclient
        yield c


def int_inputs(module, a: np.ndarray, b: np.ndarray) -> list:
    inputs = []
    for name, data in (("IN_A", a), ("IN_B", b)):
        tensor = module.InferInput(name, list(data.shape), "INT32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


def fp_input(module, data: np.ndarray, name: str = "IN") -> list:
    tensor = module.InferInput(name, list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor]


def model_stats(client, name: str) -> dict:
    stats = client.get_inference_statistics(name)
    if client.module is grpcclient:
        from google.protobuf import json_format

        stats = json_format.MessageToDict(stats, preserving_proto_field_name=True)
    return stats["model_stats"][0]


def count(stats: dict, field: str) -> int:
    return int(stats["inference_stats"][field].get("count", 0))


def test_loading_an_ensemble_loads_its_composing_models(http) -> None:
    assert not http.is_model_ready("simple")
    http.load_model("diamond")
    assert http.is_model_ready("diamond") and http.is_model_ready("simple")
    config = http.get_model_config("diamond")
    assert config["platform"] == "ensemble" and len(config["ensemble_scheduling"]["step"]) == 3
    meta = http.get_model_metadata("diamond")
    assert meta["platform"] == "ensemble" and meta["inputs"][0]["shape"] == [-1, 16]


def test_metrics_answer_with_an_ensemble_loaded(http, server) -> None:
    http.load_model("diamond")
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        assert r.status == 200
        assert 'nv_inference_request_success{model="diamond",version="1"}' in r.read().decode()


def test_diamond_computes_through_every_step(client) -> None:
    client.load_model("diamond")
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    result = client.infer("diamond", int_inputs(client.module, a, b), request_id="d1")
    np.testing.assert_array_equal(result.as_numpy("DOUBLE_SUM"), 2 * (a + b))
    np.testing.assert_array_equal(result.as_numpy("DOUBLE_DIFF"), 2 * (a - b))
    response = result.get_response()
    assert (response["id"] if client.module is httpclient else response.id) == "d1"
    only = client.infer("diamond", int_inputs(client.module, a, b),
                        outputs=[client.module.InferRequestedOutput("DOUBLE_DIFF")])
    assert only.as_numpy("DOUBLE_SUM") is None
    np.testing.assert_array_equal(only.as_numpy("DOUBLE_DIFF"), 2 * (a - b))


def test_bad_request_to_an_ensemble_is_refused_before_any_step(client) -> None:
    client.load_model("diamond")
    bad = client.module.InferInput("IN_A", [1, 8], "INT32")
    bad.set_data_from_numpy(np.zeros((1, 8), np.int32))
    before = model_stats(client, "simple")
    with pytest.raises(InferenceServerException) as e:
        client.infer("diamond", [bad, int_inputs(client.module, np.zeros((1, 16), np.int32),
                                                 np.zeros((1, 16), np.int32))[1]])
    assert "'IN_A' expects shape [-1, 16], got [1, 8]" in e.value.message(), e.value.message()
    after = model_stats(client, "simple")
    assert count(after, "success") + count(after, "fail") == count(before, "success") + count(before, "fail")


@pytest.mark.parametrize("name", sorted(repo.BAD))
def test_a_bad_ensemble_fails_alone_with_its_reason(http, name: str) -> None:
    expected = repo.BAD[name][1]
    with pytest.raises(InferenceServerException) as e:
        http.load_model(name)
    assert expected in e.value.message(), e.value.message()
    if name not in ("bad_cycle", "bad_double"):  # found with the composing models: Triton's form and code
        assert e.value.message().startswith(f"load failed for model '{name}': "), e.value.message()
        assert e.value.status() == "400"
    assert not http.is_model_ready(name)
    rows = [r for r in http.get_model_repository_index() if r["name"] == name]
    assert rows and all(r["state"] == "UNAVAILABLE" for r in rows) and expected in rows[-1]["reason"], rows
    http.load_model("diamond")  # the rest keeps serving
    ones = np.ones((1, 16), np.int32)
    np.testing.assert_array_equal(http.infer("diamond", int_inputs(httpclient, ones, ones))
                                  .as_numpy("DOUBLE_SUM"), 4 * ones)


def test_bad_ensemble_load_over_grpc_is_invalid_argument(server) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as c, pytest.raises(InferenceServerException) as e:
        c.load_model("bad_missing")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message() == "load failed for model 'bad_missing': " + repo.BAD["bad_missing"][1]


def test_independent_steps_run_concurrently(http) -> None:
    # Each step sleeps 300 ms in its own model: one after the other would take at least 600 ms, so no try
    # can beat 0.55 s unless they overlap; a loaded machine may slow one try past it, so the best of three
    # counts.
    http.load_model("parallel")
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    http.infer("parallel", fp_input(httpclient, data))  # warm the path
    tries = []
    while len(tries) < 3 and (not tries or min(tries) >= 0.55):
        start = time.perf_counter()
        result = http.infer("parallel", fp_input(httpclient, data))
        tries.append(time.perf_counter() - start)
        np.testing.assert_array_equal(result.as_numpy("A"), data)
        np.testing.assert_array_equal(result.as_numpy("B"), data)
    assert min(tries) < 0.55, f"two 300 ms steps took {', '.join(f'{t:.3f}' for t in tries)} s"


def test_max_inflight_requests_holds_requests_back(http) -> None:
    # `batchy` waits up to 200 ms to batch; with max_inflight_requests: 1 the ensemble never lets a second
    # request reach it while one is in flight, so every execution is a batch of one.
    http.load_model("gated")
    before = model_stats(http, "batchy")
    data = np.ones((1, 4), np.float32)
    pending = [http.async_infer("gated", fp_input(httpclient, data)) for _ in range(6)]  # all at once
    results = [p.get_result() for p in pending]
    assert all(np.array_equal(r.as_numpy("OUT"), data) for r in results)
    after = model_stats(http, "batchy")
    assert int(after["execution_count"]) - int(before.get("execution_count", 0)) == 6
    assert [b["batch_size"] for b in after["batch_stats"]] == [1], after["batch_stats"]
    ensemble = model_stats(http, "gated")
    assert count(ensemble, "success") >= 6 and count(ensemble, "queue") >= 6


def test_statistics_of_the_ensemble_and_of_each_step(client) -> None:
    client.load_model("diamond")
    before_e, before_s = model_stats(client, "diamond"), model_stats(client, "simple")
    ones = np.ones((1, 16), np.int32)
    for _ in range(4):
        client.infer("diamond", int_inputs(client.module, ones, ones))
    after_e, after_s = model_stats(client, "diamond"), model_stats(client, "simple")
    assert count(after_e, "success") - count(before_e, "success") == 4
    assert count(after_e, "compute_infer") - count(before_e, "compute_infer") == 4
    assert int(after_e["inference_count"]) - int(before_e.get("inference_count", 0)) == 4
    # every request ran three steps on `simple`, each counted there as a request of its own
    assert count(after_s, "success") - count(before_s, "success") == 12
    assert count(after_s, "queue") - count(before_s, "queue") == 12


def test_classification_of_an_ensemble_output_uses_the_ensembles_labels(client) -> None:
    client.load_model("classify")
    data = np.array([[0.1, 0.7, 0.3, 0.5], [0.9, 0.2, 0.2, 0.4]], np.float32)
    out = client.module.InferRequestedOutput("PROBS", class_count=2)
    result = client.infer("classify", fp_input(client.module, data), outputs=[out])
    classes = [[c.decode() for c in row] for row in result.as_numpy("PROBS")]
    assert classes == [["0.700000:1:one", "0.500000:3:three"], ["0.900000:0:zero", "0.400000:3:three"]]


@pytest.mark.parametrize("colour", ["red", "orange", "blue"])
def test_the_example_image_pipeline_names_the_colour(client, colour: str) -> None:
    from hubserve_models.examples import COLOURS, IMAGE_SIDE

    client.load_model("image_pipeline")
    pixels = np.broadcast_to(np.array(COLOURS[colour], np.uint8).reshape(1, 3, 1, 1),
                             (2, 3, IMAGE_SIDE, IMAGE_SIDE)).copy()
    pixels[1] = 255 - pixels[1]  # the second image of the batch: the complementary colour
    tensor = client.module.InferInput("IMAGE", list(pixels.shape), "UINT8")
    tensor.set_data_from_numpy(pixels)
    out = client.module.InferRequestedOutput("CLASSES", class_count=3)
    classes = client.infer("image_pipeline", [tensor], outputs=[out]).as_numpy("CLASSES")
    assert classes.shape == (2, 3)
    best = classes[0][0].decode().split(":")
    assert best[2] == colour and best[1] == str(list(COLOURS).index(colour)), classes
    assert float(best[0]) > 0.5 and len(best[0].split(".")[1]) == 6
    assert classes[1][0].decode().split(":")[2] != colour


@pytest.mark.parametrize("name", ["image_classifier", "image_pipeline"])
def test_the_example_image_models_serve_what_tritons_image_client_reads(client, name: str) -> None:
    """Triton's image_client.py (client repo, src/python/examples/) lays out its pixels from the input's
    `format` in the config (it refuses FORMAT_NONE), sizes them from the metadata's [-1, C, H, W], wants one
    FP32 output, and prints each class-count entry as "score (index) = label"."""
    from tritonclient.grpc import model_config_pb2 as mc

    from hubserve_models.examples import IMAGE_SIDE

    client.load_model("image_pipeline")
    meta = client.get_model_metadata(name)
    config = client.get_model_config(name)
    if client.module is grpcclient:
        inputs = [(t.name, t.datatype, list(t.shape)) for t in meta.inputs]
        outputs = [(t.datatype, list(t.shape)) for t in meta.outputs]
        fmt = mc.ModelInput.Format.Name(config.config.input[0].format)
    else:
        inputs = [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]]
        outputs = [(t["datatype"], t["shape"]) for t in meta["outputs"]]
        fmt = config["input"][0]["format"]
    assert len(inputs) == 1 and inputs[0][2] == [-1, 3, IMAGE_SIDE, IMAGE_SIDE]
    assert fmt == "FORMAT_NCHW"
    assert outputs == [("FP32", [-1, 10])]
    input_name, datatype = inputs[0][0], inputs[0][1]
    pixels = np.zeros((1, 3, IMAGE_SIDE, IMAGE_SIDE), np.float32 if datatype == "FP32" else np.uint8)
    tensor = client.module.InferInput(input_name, list(pixels.shape), datatype)
    tensor.set_data_from_numpy(pixels)
    output_name = "CLASSES" if name == "image_pipeline" else "PROBABILITIES"
    out = client.module.InferRequestedOutput(output_name, class_count=3)
    entries = client.infer(name, [tensor], outputs=[out]).as_numpy(output_name)[0]
    assert [len(e.decode().split(":")) for e in entries] == [3, 3, 3], entries


def test_the_image_pipelines_python_step_computes_the_numpy_formula(client) -> None:
    """image_preprocess (a Triton Python model) answers (x / 255 - mean) / std per channel, batch-aware."""
    from hubserve_models.examples import IMAGE_MEAN, IMAGE_SIDE, IMAGE_STD

    client.load_model("image_pipeline")
    assert client.is_model_ready("image_preprocess")
    pixels = np.random.default_rng(7).integers(0, 256, (3, 3, IMAGE_SIDE, IMAGE_SIDE), dtype=np.uint8)
    pixels[0] = 0
    pixels[1] = 255
    tensor = client.module.InferInput("IMAGE", list(pixels.shape), "UINT8")
    tensor.set_data_from_numpy(pixels)
    got = client.infer("image_preprocess", [tensor]).as_numpy("PIXELS")
    mean, std = IMAGE_MEAN.reshape(1, 3, 1, 1), IMAGE_STD.reshape(1, 3, 1, 1)
    want = (pixels.astype(np.float32) / np.float32(255) - mean) / std
    assert got.dtype == np.float32 and got.shape == pixels.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got[1, :, 0, 0], (1 - IMAGE_MEAN) / IMAGE_STD, rtol=1e-6)


def test_unloading_an_ensemble_keeps_its_composing_models(http) -> None:
    http.load_model("diamond")
    http.unload_model("diamond")
    assert not http.is_model_ready("diamond") and http.is_model_ready("simple")
    http.load_model("diamond")


def test_unload_dependents_unloads_the_composing_models(client) -> None:
    # Triton (docs/protocol/extension_model_repository.md; core model_lifecycle): the ensemble's composing
    # models go with it unless another loaded ensemble still uses them.
    client.load_model("classify")
    assert client.is_model_ready("scores")
    client.unload_model("classify", unload_dependents=True)
    assert not client.is_model_ready("classify") and not client.is_model_ready("scores")
    client.load_model("classify")
    assert client.is_model_ready("scores")


def test_unload_dependents_must_be_a_boolean(server) -> None:
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/models/classify/unload",
                                     data=b'{"parameters": {"unload_dependents": "yes"}}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=10)
    assert e.value.code == 400 and b"'unload_dependents' must be a boolean" in e.value.read()


@pytest.mark.skipif(not perf_analyzer_available(), reason="perf_analyzer not installed")
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_measures_an_ensemble(server, http, protocol: str) -> None:
    http.load_model("diamond")
    url = server.grpc_url if protocol == "grpc" else server.http_url
    result = run_perf_analyzer_settled("diamond", url, protocol, "--concurrency-range", "2")
    assert result.ok, result.output
    assert result.throughput > 0
    assert "Composing models" in result.output and "simple" in result.output, result.output
