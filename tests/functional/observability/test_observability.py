"""Request ids, access lines, Triton's logging and trace extensions, latency histograms and OpenTelemetry
spans, against a real server (HUBSERVE_TEST_WORKERS=2 runs it with two frontend processes) driven by
tritonclient over both protocols, raw HTTP for headers, and a tiny OTLP/HTTP collector on a free port.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as service_pb2
import tritonclient.http as httpclient
from aiohttp import web
from tritonclient.utils import InferenceServerException

from conftest import free_port, start_server, wait_until

ACCESS_KEYS = ["model", "version", "request_id", "status", "queue_us", "compute_us", "total_us", "batch_size"]


class Collector:
    """An OTLP/HTTP collector: every JSON body POSTed to /v1/traces, kept; runs its own loop in a thread."""

    def __init__(self) -> None:
        self.port = free_port()
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def traces(request: web.Request) -> web.Response:
            assert request.content_type == "application/json"
            body = await request.json()
            with self._lock:
                self.bodies.append(body)
            return web.json_response({})

        app = web.Application()
        app.router.add_post("/v1/traces", traces)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def spans(self) -> list[dict[str, Any]]:
        with self._lock:
            return [span for body in self.bodies for rs in body["resourceSpans"] for ss in rs["scopeSpans"]
                    for span in ss["spans"]]

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def access_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs") / "hubserve.log"


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory, collector: Collector,
           access_log: Path):
    srv = start_server(repository, tmp_path_factory.mktemp("server") / "server.log", "--no-strict-readiness",
                       "--model-control-mode", "none", "--log-verbose", "1", "--log-format", "json",
                       "--log-file", str(access_log),
                       "--metrics-config", "histogram_buckets_us=100,1000,10000,100000,1000000",
                       "--trace-config", f"opentelemetry,url=127.0.0.1:{collector.port}",
                       "--trace-config", "opentelemetry,bsp_schedule_delay=50")
    yield srv
    srv.stop()


def simple_inputs(module: Any) -> list[Any]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    return inputs


def access_lines(path: Path) -> list[dict[str, Any]]:
    """The log file's access lines, each a JSON object of exactly the access fields."""
    lines = []
    for text in path.read_text().splitlines():
        doc = json.loads(text)  # every line of a JSON log is JSON
        if "model" in doc:
            assert list(doc) == ACCESS_KEYS, doc
            lines.append(doc)
    return lines


def line_for(path: Path, request_id: str) -> dict[str, Any]:
    return wait_until(lambda: next((d for d in access_lines(path) if d["request_id"] == request_id), None),
                    f"the access line of {request_id}")


def raw_infer(server: Any, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict[str, Any], Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/simple/infer", json.dumps(body), headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read()), resp.headers
    finally:
        conn.close()


SIMPLE_JSON = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                          for n in ("INPUT0", "INPUT1")]}


# --------------------------------------------------------------------------------------------- request ids

def test_http_id_is_echoed_in_body_and_header(server, access_log: Path) -> None:
    status, doc, headers = raw_infer(server, {}, {"id": "body-id-1", **SIMPLE_JSON})
    assert status == 200 and doc["id"] == "body-id-1" and headers["X-Request-ID"] == "body-id-1"
    status, doc, headers = raw_infer(server, {"X-Request-ID": "header-id-1"}, SIMPLE_JSON)
    assert status == 200 and doc["id"] == "header-id-1" and headers["X-Request-ID"] == "header-id-1"
    status, doc, headers = raw_infer(server, {"X-Request-ID": "header-loses"},
                                     {"id": "body-wins", **SIMPLE_JSON})
    assert doc["id"] == "body-wins" and headers["X-Request-ID"] == "body-wins"
    line = line_for(access_log, "header-id-1")
    assert line["model"] == "simple" and line["version"] == "1" and line["status"] == "OK"
    assert line["batch_size"] >= 1 and 0 <= line["queue_us"] + line["compute_us"] <= line["total_us"]


def test_generated_id_is_echoed_and_logged(server, access_log: Path) -> None:
    status, doc, headers = raw_infer(server, {}, SIMPLE_JSON)
    assert status == 200 and doc["id"] and headers["X-Request-ID"] == doc["id"]
    assert line_for(access_log, doc["id"])["status"] == "OK"


def test_grpc_id_from_message_and_metadata(server, access_log: Path) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        result = c.infer("simple", simple_inputs(grpcclient), request_id="grpc-id-1")
        assert result.get_response().id == "grpc-id-1"
        result = c.infer("simple", simple_inputs(grpcclient), headers={"x-request-id": "grpc-meta-1"})
        assert result.get_response().id == "grpc-meta-1"
    with grpc.insecure_channel(server.grpc_url) as channel:  # the metadata comes back as a header
        call = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        _, answer = call.with_call(b"", metadata=[("x-request-id", "grpc-meta-2")], timeout=10)
        assert ("x-request-id", "grpc-meta-2") in answer.initial_metadata()
    assert line_for(access_log, "grpc-id-1")["status"] == "OK"
    assert line_for(access_log, "grpc-meta-1")["model"] == "simple"


def refusal_status(call: Any) -> str:
    with pytest.raises(InferenceServerException) as e:
        call()
    return str(e.value.status())


def test_a_request_refused_before_any_model_has_its_access_line(server, access_log: Path) -> None:
    """Malformed (refused by a frontend's decoding), an unknown model, a wrong shape or a missing input
    (refused by the data plane or the model): each is answered with its error and logged once, with its
    status, zero queue and compute time, batch size 0, over both protocols."""
    shape = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}
                        for n in ("INPUT0", "INPUT1")]}
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/simple/infer", b'{"inputs": [', {"X-Request-ID": "refused-json"})
        assert conn.getresponse().status == 400
    finally:
        conn.close()
    assert raw_infer(server, {}, {"id": "refused-shape", **shape})[0] == 400
    with httpclient.InferenceServerClient(server.http_url) as c:
        refusal_status(lambda: c.infer("nosuch", simple_inputs(httpclient), request_id="refused-unknown"))
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        assert refusal_status(lambda: c.infer("nosuch", simple_inputs(grpcclient),
                                              request_id="refused-grpc-unknown")) == "StatusCode.NOT_FOUND"
        bad = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        bad.set_data_from_numpy(np.zeros((1, 16), np.int32))
        assert refusal_status(lambda: c.infer("simple", [bad], request_id="refused-grpc-inputs")) == \
            "StatusCode.INVALID_ARGUMENT"
    message = service_pb2.ModelInferRequest(model_name="simple", id="refused-grpc-datatype")
    message.inputs.add(name="INPUT0", datatype="BOGUS", shape=[1, 16])
    message.raw_input_contents.append(bytes(64))
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as e:
        channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(message.SerializeToString(),
                                                                          timeout=30)
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # refused by the frontend's decoding
    expected = {"refused-json": ("simple", "", "INVALID_ARG"),
                "refused-shape": ("simple", "1", "INVALID_ARG"),
                "refused-unknown": ("nosuch", "", "NOT_FOUND"),
                "refused-grpc-unknown": ("nosuch", "", "NOT_FOUND"),
                "refused-grpc-inputs": ("simple", "1", "INVALID_ARG"),
                "refused-grpc-datatype": ("simple", "", "INVALID_ARG")}
    for request_id, (model, version, status) in expected.items():
        line = line_for(access_log, request_id)
        assert (line["model"], line["version"], line["status"]) == (model, version, status), line
        assert line["queue_us"] == line["compute_us"] == line["batch_size"] == 0 and line["total_us"] >= 0
    ids = [d["request_id"] for d in access_lines(access_log)]
    assert all(ids.count(request_id) == 1 for request_id in expected)


# --------------------------------------------------------------------------------------------- logging

def test_logging_extension_http(server, access_log: Path) -> None:
    with httpclient.InferenceServerClient(server.http_url) as c:
        assert "logging" in c.get_server_metadata()["extensions"]
        settings = c.get_log_settings()
        assert settings == {"log_file": str(access_log), "log_info": True, "log_warning": True,
                            "log_error": True, "log_verbose_level": 1, "log_format": "json"}
        assert c.update_log_settings({"log_verbose_level": 0})["log_verbose_level"] == 0
        try:
            c.infer("simple", simple_inputs(httpclient), request_id="quiet-1")
        finally:
            assert c.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
        c.infer("simple", simple_inputs(httpclient), request_id="loud-1")
        line_for(access_log, "loud-1")
        assert all(d["request_id"] != "quiet-1" for d in access_lines(access_log))
        for body, code, message in (
                ({"log_file": "/tmp/x"}, 501,
                 "log file location can not be updated through network protocol"),
                ({"log_info": "yes"}, 400, "expect boolean for 'log_info'"),
                ({"log_verbose_level": -1}, 400, "expect unsigned integer for 'log_verbose_level'"),
                ({"log_format": "xml"}, 503, "invalid argument for --log_format, got: xml")):
            conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
            conn.request("POST", "/v2/logging", json.dumps(body))
            resp = conn.getresponse()
            assert (resp.status, json.loads(resp.read())) == (code, {"error": message})
            conn.close()
        assert c.get_log_settings()["log_format"] == "json"


def test_logging_extension_grpc(server) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        settings = c.get_log_settings(as_json=True)["settings"]
        assert settings["log_verbose_level"] == {"uint32_param": 1}
        assert settings["log_info"] == {"bool_param": True}
        changed = c.update_log_settings({"log_warning": False}, as_json=True)["settings"]
        assert changed["log_warning"] == {"bool_param": False}
        assert c.update_log_settings({"log_warning": True}, as_json=True)["settings"]["log_warning"] == \
            {"bool_param": True}
        with pytest.raises(InferenceServerException, match="expect boolean for 'log_error'"):
            c.update_log_settings({"log_error": None})  # a setting with no value of its type
        with pytest.raises(InferenceServerException, match="invalid argument for log_format, got: xml"):
            c.update_log_settings({"log_format": "xml"})
        with pytest.raises(InferenceServerException, match="log file location can not be updated"):
            c.update_log_settings({"log_file": "/tmp/x"})


# --------------------------------------------------------------------------------------------- histograms

def scrape(server) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        return r.read().decode()


def histogram(text: str, name: str, model: str) -> dict[str, float]:
    labels = f'model="{model}",version="1"'
    values = {}
    for le, value in re.findall(rf'^{name}_bucket\{{{labels},le="([^"]+)"\}} (\S+)$', text, re.MULTILINE):
        values[le] = float(value)
    count = re.search(rf"^{name}_count\{{{labels}\}} (\S+)$", text, re.MULTILINE)
    assert count, f"{name} missing for {model}"
    values["count"] = float(count.group(1))
    return values


def test_histograms_count_every_request(server) -> None:
    names = ("nv_inference_request_histogram_us", "nv_inference_queue_histogram_us",
             "nv_inference_compute_histogram_us")
    before = scrape(server)
    assert "# TYPE nv_inference_request_histogram_us histogram" in before
    start = {n: histogram(before, n, "mlp") for n in names}
    assert list(start[names[0]])[:6] == ["100", "1000", "10000", "100000", "1000000", "+Inf"]
    sent = 7
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        x = np.ones((1, 256), dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", [1, 256], "FP32")
        tensor.set_data_from_numpy(x)
        for _ in range(sent):
            c.infer("mlp", [tensor])
    after = scrape(server)
    for n in names:
        now = histogram(after, n, "mlp")
        assert now["count"] - start[n]["count"] == sent, n
        assert now["+Inf"] == now["count"]
        bounds = [now[b] for b in ("100", "1000", "10000", "100000", "1000000", "+Inf")]
        assert bounds == sorted(bounds)  # cumulative
    success = float(re.search(r'^nv_inference_request_success\{model="mlp",version="1"\} (\S+)$', after,
                              re.MULTILINE).group(1))
    assert histogram(after, names[0], "mlp")["count"] == success


# --------------------------------------------------------------------------------------------- traces

def post_trace(server, body: dict[str, Any], model: str = "") -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        path = f"/v2/models/{model}/trace/setting" if model else "/v2/trace/setting"
        conn.request("POST", path, json.dumps(body))
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize(("body", "message"), [
    ({"trace_rate": "abc"}, "Unable to parse 'trace_rate', got: abc"),
    ({"trace_rate": "5000000000"}, "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], "
                                   "got: 5000000000"),
    ({"trace_count": "-2"}, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
    ({"log_frequency": "x"}, "Unable to parse 'log_frequency', got: x"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
])
def test_trace_setting_validation_http(server, body: dict[str, Any], message: str) -> None:
    assert post_trace(server, body) == (400, {"error": message})


def test_trace_setting_http_and_grpc(server) -> None:
    with httpclient.InferenceServerClient(server.http_url) as c:
        assert "trace" in c.get_server_metadata()["extensions"]
        settings = c.get_trace_settings()
        assert settings["trace_mode"] == "opentelemetry" and settings["trace_rate"] == "1000"
        assert settings["trace_level"] == ["OFF"] and settings["trace_count"] == "-1"
        assert post_trace(server, {"trace_file": "x"})[0] == 501
        assert post_trace(server, {}, model="nope") == (400, {"error": "Request for unknown model : nope"})
        model = c.update_trace_settings("strings", {"trace_rate": "7"})
        assert model["trace_rate"] == "7" and c.get_trace_settings()["trace_rate"] == "1000"
        assert c.update_trace_settings("strings", {"trace_rate": None})["trace_rate"] == "1000"
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        settings = c.get_trace_settings(as_json=True)["settings"]
        assert settings["trace_level"] == {"value": ["OFF"]} and settings["trace_rate"] == {"value": ["1000"]}
        changed = c.update_trace_settings("strings", {"trace_count": "3"}, as_json=True)["settings"]
        assert changed["trace_count"] == {"value": ["3"]}
        assert c.update_trace_settings("strings", {"trace_count": None}, as_json=True)["settings"][
            "trace_count"] == {"value": ["-1"]}
        with pytest.raises(InferenceServerException, match="Unable to parse 'trace_rate', got: many"):
            c.update_trace_settings(settings={"trace_rate": "many"})
        with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
            c.get_trace_settings("nope")


def test_spans_reach_the_collector(server, collector: Collector) -> None:
    with httpclient.InferenceServerClient(server.http_url) as c:
        settings = c.update_trace_settings("simple", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                                                      "trace_count": "3"})
        assert settings["trace_level"] == ["TIMESTAMPS"] and settings["trace_count"] == "3"
        try:
            for i in range(5):
                c.infer("simple", simple_inputs(httpclient), request_id=f"traced-{i}")
            assert c.get_trace_settings("simple")["trace_count"] == "0"  # three taken, then no more
        finally:
            c.update_trace_settings("simple", {"trace_level": None, "trace_rate": None, "trace_count": None})

    def traced() -> dict[str, list[dict[str, Any]]]:
        by_id: dict[str, list[dict[str, Any]]] = {}
        for span in collector.spans():
            attrs = {a["key"]: a["value"]["stringValue"] for a in span["attributes"]}
            if attrs["request_id"].startswith("traced-"):
                by_id.setdefault(attrs["request_id"], []).append(span)
        return by_id if sum(map(len, by_id.values())) >= 9 else {}

    by_id = wait_until(traced, "nine spans at the collector")
    assert sorted(by_id) == ["traced-0", "traced-1", "traced-2"]
    for spans in by_id.values():
        named = {s["name"]: s for s in spans}
        assert sorted(named) == ["compute", "frontend", "queue"]
        root = named["frontend"]
        assert re.fullmatch(r"[0-9a-f]{32}", root["traceId"])
        assert re.fullmatch(r"[0-9a-f]{16}", root["spanId"])
        for child in ("queue", "compute"):
            assert named[child]["traceId"] == root["traceId"]
            assert named[child]["parentSpanId"] == root["spanId"]
        start, end = int(root["startTimeUnixNano"]), int(root["endTimeUnixNano"])
        assert start <= int(named["queue"]["startTimeUnixNano"]) <= int(named["compute"]["endTimeUnixNano"]) \
            <= end
        assert abs(start / 1e9 - time.time()) < 300


def test_an_ensemble_and_its_steps_log_under_one_id(tmp_path: Path) -> None:
    import ensemble_repository

    root = ensemble_repository.build(tmp_path / "repository")
    log_file = tmp_path / "access.log"
    srv = start_server(root, tmp_path / "server.log", "--model-control-mode", "explicit", "--load-model",
                       "diamond", "--log-verbose", "1", "--log-format", "json", "--log-file", str(log_file))
    try:
        with httpclient.InferenceServerClient(srv.http_url) as c:
            inputs = []
            for name in ("IN_A", "IN_B"):
                tensor = httpclient.InferInput(name, [1, 16], "INT32")
                tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
                inputs.append(tensor)
            assert c.infer("diamond", inputs).get_response()["id"]  # generated, echoed
            request_id = c.infer("diamond", inputs, request_id="ens-1").get_response()["id"]
        assert request_id == "ens-1"

        def four() -> list[dict[str, Any]] | None:
            found = [d for d in access_lines(log_file) if d["request_id"] == "ens-1"]
            return found if len(found) >= 4 else None

        lines = wait_until(four, "the ensemble's and its three steps' access lines")
        assert sorted(d["model"] for d in lines) == ["diamond", "simple", "simple", "simple"]
        assert all(d["status"] == "OK" for d in lines)
    finally:
        srv.stop()
