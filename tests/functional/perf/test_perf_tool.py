"""`hubserve perf` and `hubserve perf tune-window` against a real server, run as the user runs them: a
separate `python -m engine perf` process with short windows and loose stability (2 shared cores), bounded in
time. The CSV header is checked against what the real perf_analyzer writes.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from hubserve_harness import ROOT, RunningServer, checkout_env, start_server
from hubserve_harness.perf_analyzer import PERF_ANALYZER, perf_analyzer_available, run_perf_analyzer

EXPECTED_HEADER = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
                   "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,"
                   "p90 latency,p95 latency,p99 latency,Avg latency,request/response,response wait")
QUICK = ("-p", "500", "-s", "1000", "-r", "8")  # 0.5 s windows; these tests are about what is measured, not
# how steadily: a loaded machine's windows differed 3.9x (2,224 vs 8,587 infer/s), so any 3 within 11x count


def hubserve_perf(*args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", "perf", *args], cwd=ROOT, env=checkout_env(),
                          capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                          check=False)


def url(server: RunningServer, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


def read_csv(path: Path) -> tuple[str, list[dict[str, str]]]:
    text = path.read_text()
    return text.splitlines()[0], list(csv.DictReader(text.splitlines()))


@pytest.mark.parametrize("protocol,grpc_client", [("http", "h2"), ("grpc", "h2"), ("grpc", "grpcio")])
def test_perf_measures_simple(server: RunningServer, tmp_path: Path, protocol: str, grpc_client: str) -> None:
    out_csv, out_json = tmp_path / "out.csv", tmp_path / "out.json"
    result = hubserve_perf("-m", "simple", "-u", url(server, protocol), "-i", protocol,
                           "--grpc-client", grpc_client, "--concurrency-range", "1:2", *QUICK,
                           "-f", str(out_csv), "--json", str(out_json))
    assert result.returncode == 0, result.stderr
    assert "window 1/8" in result.stderr  # progress, one line per window
    header, rows = read_csv(out_csv)
    assert header == EXPECTED_HEADER
    assert sorted(int(r["Concurrency"]) for r in rows) == [1, 2]
    assert all(float(r["Inferences/Second"]) > 0 for r in rows)
    assert all(0 < int(r["p50 latency"]) <= int(r["p99 latency"]) for r in rows)
    steps = json.loads(out_json.read_text())["steps"]
    # Server-side numbers come from the statistics extension.
    assert all(s["server"]["request_count"] > 0 and s["server"]["compute_infer_us"] > 0 for s in steps)


@pytest.mark.parametrize("distribution", ["constant", "poisson"])
def test_request_rate_mode_offers_the_asked_rate(server: RunningServer, tmp_path: Path,
                                                 distribution: str) -> None:
    out_csv = tmp_path / "out.csv"
    # The point is the offered rate, not latency: a loaded machine's latency spikes (avg 0.7 vs 4.9 ms between
    # windows was seen) must not fail the stability rule, so it is loose (windows within 11x).
    result = hubserve_perf("-m", "simple", "-u", server.http_url, "--request-rate-range", "200",
                           "--request-distribution", distribution, "-p", "1000", "-s", "1000", "-r", "6",
                           "-f", str(out_csv))
    assert result.returncode == 0, result.stderr
    header, rows = read_csv(out_csv)
    assert header == EXPECTED_HEADER.replace("Concurrency", "Request Rate", 1)
    assert rows[0]["Request Rate"] == "200"
    # Open loop: the server answers what it is sent, so throughput tracks the rate (loosely: shared cores).
    assert 120 <= float(rows[0]["Inferences/Second"]) <= 280


def test_an_unstable_point_does_not_end_the_sweep(server: RunningServer, tmp_path: Path) -> None:
    """Stability within 0.0001 %: no point settles. Each is reported unstable and the sweep goes on to the
    next; the exit code says so (2, as perf_analyzer's), the JSON holds every point, the CSV (perf_analyzer's
    columns, which cannot mark a point unstable) only the stable ones."""
    out_csv, out_json = tmp_path / "out.csv", tmp_path / "out.json"
    result = hubserve_perf("-m", "simple", "-u", server.http_url, "--concurrency-range", "1:2",
                           "-p", "200", "-s", "0.0001", "-r", "3", "-f", str(out_csv),
                           "--json", str(out_json))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("Failed to obtain a stable measurement within 3 windows") == 2, result.stderr
    steps = json.loads(out_json.read_text())["steps"]
    assert [(s["concurrency"], s["stable"]) for s in steps] == [(1, False), (2, False)]
    assert all(s["throughput_infer_per_s"] > 0 for s in steps)
    assert [line.split()[-1] for line in result.stdout.splitlines()[1:]] == ["NO", "NO"]  # the table
    assert read_csv(out_csv) == (EXPECTED_HEADER, [])


def test_several_worker_processes_merge_their_records(server: RunningServer, tmp_path: Path) -> None:
    out_json = tmp_path / "out.json"
    result = hubserve_perf("-m", "simple", "-u", server.http_url, "--concurrency-range", "4",
                           "--workers", "2",
                           *QUICK, "--json", str(out_json))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out_json.read_text())
    assert doc["workers"] == 2
    assert doc["steps"][0]["throughput_infer_per_s"] > 0


def test_input_data_file_and_errors(server: RunningServer, tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"INPUT0": list(range(16)), "INPUT1": {"content": [1] * 16,
                                                                                 "shape": [16]}}]}))
    ok = hubserve_perf("-m", "simple", "-u", server.http_url, "--input-data", str(data), "-b", "2", *QUICK)
    assert ok.returncode == 0, ok.stderr
    wrong = hubserve_perf("-m", "simple", "-u", server.http_url, "--shape", "NOPE:3", *QUICK)
    assert wrong.returncode == 1 and "NOPE" in wrong.stderr
    missing = hubserve_perf("-m", "no_such_model", "-u", server.http_url, *QUICK)
    assert missing.returncode == 99 and "no_such_model" in missing.stderr


def test_csv_header_is_perf_analyzers(server: RunningServer, tmp_path: Path) -> None:
    if not perf_analyzer_available():
        pytest.fail(f"perf_analyzer is not installed at {PERF_ANALYZER}: run `make perf-analyzer`",
                    pytrace=False)
    theirs = tmp_path / "theirs.csv"
    result = run_perf_analyzer("simple", server.http_url, "http", "-s", "100", "--verbose-csv",
                               "-f", str(theirs), timeout_s=60)
    assert result.ok, result.output
    ours = tmp_path / "ours.csv"
    mine = hubserve_perf("-m", "simple", "-u", server.http_url, *QUICK, "-f", str(ours))
    assert mine.returncode == 0, mine.stderr
    assert read_csv(ours)[0] == read_csv(theirs)[0] == EXPECTED_HEADER


@pytest.fixture
def explicit_server(repository: Path, tmp_path: Path):
    """A server of its own in explicit mode, so reloading `simple` disturbs no other test."""
    repo = tmp_path / "repository"
    shutil.copytree(repository / "simple", repo / "simple")
    srv = start_server(repo, tmp_path / "server.log", "--model-control-mode", "explicit",
                       "--load-model", "simple")
    yield srv
    srv.stop()


def model_config(server: RunningServer) -> dict:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/simple/config", timeout=10) as r:
        return json.loads(r.read())


def test_tune_window_recommends_a_window(explicit_server: RunningServer, tmp_path: Path) -> None:
    original = model_config(explicit_server)["dynamic_batching"]["max_queue_delay_microseconds"]
    out_json = tmp_path / "tune.json"
    result = hubserve_perf("tune-window", "-m", "simple", "-u", explicit_server.http_url,
                           "--windows-us", "0,2000", "--p95-budget-ms", "1000", "--concurrency", "4",
                           *QUICK, "--json", str(out_json), timeout_s=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "recommended max_queue_delay_microseconds" in result.stdout
    doc = json.loads(out_json.read_text())
    assert [p["window_us"] for p in doc["curve"]] == [0, 2000]
    assert doc["recommended_window_us"] in (0, 2000)
    assert all(p["throughput_infer_per_s"] > 0 and p["executions"] > 0 for p in doc["curve"])
    # The original window is back.
    assert model_config(explicit_server)["dynamic_batching"]["max_queue_delay_microseconds"] == original


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tune_window_needs_explicit_mode(server: RunningServer, protocol: str) -> None:
    """Against a server in none mode (the session's) the first reload is refused: the run stops with the
    server's answer, which says what to do, and the model is untouched."""
    original = model_config(server)["dynamic_batching"]["max_queue_delay_microseconds"]
    result = hubserve_perf("tune-window", "-m", "simple", "-u", url(server, protocol), "-i", protocol,
                           "--windows-us", "0", "--p95-budget-ms", "1000", *QUICK, timeout_s=60)
    assert result.returncode == 99, result.stdout + result.stderr
    assert "explicit model load / unload is not allowed" in result.stderr, result.stderr
    assert "--model-control-mode explicit" in result.stderr and "restoring" not in result.stderr
    assert model_config(server)["dynamic_batching"]["max_queue_delay_microseconds"] == original
