"""The trace settings (sampling, per-model overrides, Triton's validation), the OTLP span shape, the
exporter's bound when the collector is down, and the histogram configuration: pure, no server.
"""

from __future__ import annotations

import asyncio
import re
import socket

import pytest

from engine.errors import EngineError
from engine.observability.histograms import Histogram, parse_metrics_config
from engine.observability.tracing.otlp import OtlpExporter, request_spans
from engine.observability.tracing.settings import (
    ExporterConfig,
    TraceSettings,
    TraceValues,
    changes_from_json,
    changes_from_lists,
    parse_trace_config,
)


def tracing(level: str = "TIMESTAMPS", rate: int = 1, count: int = -1) -> TraceSettings:
    return TraceSettings(TraceValues(frozenset({level}) if level != "OFF" else frozenset(), rate, count))


def test_rate_samples_one_request_in_n_and_count_runs_out() -> None:
    t = tracing(rate=3, count=2)
    assert [t.sample("m") for _ in range(9)] == [False, False, True, False, False, True, False, False, False]
    assert t.as_json("m")["trace_count"] == "0"


def test_off_samples_nothing_and_is_inactive() -> None:
    t = tracing("OFF")
    assert not t.active and not any(t.sample("m") for _ in range(10))


def test_a_model_override_has_its_own_rate_and_clears_back() -> None:
    t = tracing("OFF", rate=1000)
    t.update("m", {"trace_level": frozenset({"TIMESTAMPS"}), "trace_rate": 1})
    assert t.active and t.sample("m") and not t.sample("other")
    assert t.as_json("m")["trace_level"] == ["TIMESTAMPS"] and t.as_json("")["trace_level"] == ["OFF"]
    t.update("m", {"trace_level": None, "trace_rate": None})
    assert not t.active and t.as_json("m")["trace_rate"] == "1000"


def test_global_clear_returns_to_the_default() -> None:
    t = tracing(rate=5)
    t.update("", {"trace_rate": None})
    assert t.as_json("")["trace_rate"] == "1000"


@pytest.mark.parametrize(("doc", "message"), [
    ({"trace_rate": 5}, "'trace_rate' must be a string holding a number, got 5"),
    ({"trace_level": "TIMESTAMPS"}, "'trace_level' must be an array of strings"),
    ({"trace_count": "2147483648"},
     "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ]"),
])
def test_json_changes_are_checked(doc: dict, message: str) -> None:
    with pytest.raises(EngineError, match=re.escape(message)):
        changes_from_json(doc)


def test_json_changes_parse_like_stoi_and_ignore_unknown_levels() -> None:
    assert changes_from_json({"trace_rate": " 12abc", "trace_level": ["NOPE"]}) == {"trace_rate": 12}
    assert changes_from_json({"trace_level": ["TENSORS", "TIMESTAMPS"]}) == \
        {"trace_level": frozenset({"TENSORS", "TIMESTAMPS"})}


def test_grpc_changes_take_one_value_and_none_clears() -> None:
    assert changes_from_lists({"trace_rate": [], "trace_level": []}) == {"trace_rate": None,
                                                                           "trace_level": None}
    with pytest.raises(EngineError, match="expect only 1 value for 'trace_count'"):
        changes_from_lists({"trace_count": ["1", "2"]})
    with pytest.raises(EngineError, match="trace file location can not be updated"):
        changes_from_lists({"trace_file": ["x"]})


def test_trace_config_in_tritons_form() -> None:
    values, mode, exporter = parse_trace_config(
        ["level=TIMESTAMPS", "rate=10", "count=5", "mode=opentelemetry", "opentelemetry,url=collector:4318",
         "opentelemetry,resource=service.name=svc", "opentelemetry,bsp_max_queue_size=64"])
    assert (values.level, values.rate, values.count) == (frozenset({"TIMESTAMPS"}), 10, 5)
    assert mode == "opentelemetry"
    assert exporter.url == "http://collector:4318/v1/traces" and exporter.max_queue_size == 64
    assert exporter.resource["service.name"] == "svc"
    assert parse_trace_config(["opentelemetry,url=http://h:1/custom"])[2].url == "http://h:1/custom"
    for bad, message in ((",rate=1", "No trace mode specified"), ("rate", "option format is"),
                         ("opentelemetry,nope=1", 'Bad option: "--trace-config opentelemetry,nope"'),
                         ("mode=triton", "not served by hubserve"),
                         ("jaeger,url=x", "invalid value for trace")):
        with pytest.raises(EngineError, match=re.escape(message)):
            parse_trace_config([bad])


def test_spans_of_a_request() -> None:
    spans = request_spans("m", "1", "rid", "", 1_000, 2_000, 3_000, 4_000, 5_000)
    assert [s["name"] for s in spans] == ["frontend", "queue", "compute"]
    root = spans[0]
    assert "parentSpanId" not in root and all(s["parentSpanId"] == root["spanId"] for s in spans[1:])
    assert {a["key"]: a["value"]["stringValue"] for a in root["attributes"]}["request_id"] == "rid"
    assert int(spans[2]["endTimeUnixNano"]) - int(spans[2]["startTimeUnixNano"]) == 1_000
    cancelled = request_spans("m", "1", "rid", "cancelled", 1_000, 2_000, 0, 0, 5_000)
    assert [s["name"] for s in cancelled] == ["frontend"] and cancelled[0]["status"]["code"] == 2


def test_exporter_drops_rather_than_grows_when_the_collector_is_down() -> None:
    # A port bound and not listening refuses every connection, and no other process can take it meanwhile.
    refuser = socket.socket()
    refuser.bind(("127.0.0.1", 0))
    port = refuser.getsockname()[1]

    async def go() -> OtlpExporter:
        config = ExporterConfig(url=f"http://127.0.0.1:{port}/v1/traces", max_queue_size=30,
                                schedule_delay_ms=10, max_export_batch_size=10)
        exporter = OtlpExporter(config)
        exporter.start()
        for i in range(1000):
            exporter.add(("m", "1", str(i), "", 1, 2, 3, 4, 5))
            assert exporter.queued <= 30
            if i % 100 == 0:
                await asyncio.sleep(0.01)
        await exporter.close()
        return exporter

    try:
        exporter = asyncio.run(go())
    finally:
        refuser.close()
    assert exporter.exported == 0 and exporter.dropped == 3000


def test_histogram_buckets() -> None:
    h = Histogram((100, 1000), 1000)  # bounds in µs, observations in ns
    for ns in (50_000, 100_000, 100_001, 5_000_000):
        h.observe(ns)
    h.observe(500_000, 3)
    assert h.cumulative() == [2, 6, 7] and h.count == 7
    config = parse_metrics_config(["histogram_latencies=false", "histogram_buckets_us=1,2.5,10"])
    assert not config.enabled and config.buckets_us == (1, 2.5, 10)
    for bad in ("histogram_buckets_us=10,5", "histogram_latencies=maybe", "summary_latencies=true", "x"):
        with pytest.raises(EngineError):
            parse_metrics_config([bad])
