"""`hubserve perf generate` (the generative mode) against a real server serving the tiny_decoder example, run
as the user runs it: a separate `python -m engine perf generate` process, small counts, bounded in time."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hubserve_harness import ROOT, RunningServer, checkout_env, start_server
from hubserve_models import examples

MODEL = "tiny_decoder"


def hubserve_perf(*args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", "perf", "generate", *args], cwd=ROOT,
                          env=checkout_env(), capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL, check=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("perf_generate") / "repo"
    (root / MODEL).mkdir(parents=True)
    shutil.copy(ROOT / "model_repository" / MODEL / "config.pbtxt", root / MODEL / "config.pbtxt")
    examples.build_repository(root, [MODEL])
    running = start_server(root, tmp_path_factory.mktemp("perf_generate_log") / "server.log")
    yield running
    running.stop()


def test_concurrency_sweep_over_chat_reports_every_percentile(server: RunningServer, tmp_path: Path) -> None:
    out, out_csv = tmp_path / "gen.json", tmp_path / "gen.csv"
    result = hubserve_perf("-m", MODEL, "-u", server.http_url, "--concurrency-range", "1:3:2",
                           "--prompt-tokens", "24", "--max-tokens", "8", "--ignore-eos", "--temperature", "0",
                           "--request-count", "6", "--json", str(out), "-f", str(out_csv))
    assert result.returncode == 0, result.stderr
    assert "TTFT p95" in result.stdout and "out tok/s" in result.stdout
    points = json.loads(out.read_text())["points"]
    assert [p["concurrency"] for p in points] == [1, 3]
    for p in points:
        assert p["requests"] == 6
        assert p["mean_output_tokens"] == 8  # ignore_eos: every request ran to max_tokens
        assert p["mean_prompt_tokens"] > 24  # the server's count: the chat template wraps the prompt
        assert p["output_tokens_per_s"] > 0 and p["requests_per_s"] > 0
        for key in ("ttft_ms", "inter_token_latency_ms", "request_latency_ms"):
            q = p[key]
            assert 0 < q["p50"] <= q["p90"] <= q["p95"] <= q["p99"]
        assert p["ttft_ms"]["p50"] <= p["request_latency_ms"]["p50"]
    # -f is CSV here too, as in the other modes and perf_analyzer: one row per point, the JSON's numbers
    rows = list(csv.DictReader(out_csv.read_text().splitlines()))
    assert [r["Concurrency"] for r in rows] == ["1", "3"]
    for row, p in zip(rows, points, strict=True):
        assert float(row["Output Tokens/s"]) == pytest.approx(p["output_tokens_per_s"], abs=1e-3)
        assert float(row["TTFT p95 ms"]) == pytest.approx(p["ttft_ms"]["p95"], abs=1e-3)
        assert float(row["Request Latency avg ms"]) == pytest.approx(p["request_latency_ms"]["avg"], abs=1e-3)


def test_poisson_request_rate_over_completions(server: RunningServer, tmp_path: Path) -> None:
    out = tmp_path / "gen.json"
    result = hubserve_perf("-m", MODEL, "-u", server.http_url, "--endpoint", "completions",
                           "--request-rate-range", "20", "--request-distribution", "poisson",
                           "--prompt-tokens", "16", "--max-tokens", "4", "--ignore-eos",
                           "--request-count", "8", "--profile-export-file", str(out))  # --json's other name
    assert result.returncode == 0, result.stderr
    (point,) = json.loads(out.read_text())["points"]
    assert point["request_rate"] == 20 and point["distribution"] == "poisson"
    # the byte tokenizer: one token per character, plus the BOS token
    assert point["requests"] == 8 and point["mean_prompt_tokens"] == 17
    assert point["mean_output_tokens"] == 4


def test_a_refused_request_exits_99_with_the_servers_message(server: RunningServer) -> None:
    result = hubserve_perf("-m", "no_such_model", "-u", server.http_url, "--request-count", "1")
    assert result.returncode == 99
    assert "404" in result.stderr and "no_such_model" in result.stderr


def test_bad_flags_exit_1() -> None:
    result = hubserve_perf("-m", MODEL, "--concurrency-range", "2", "--request-rate-range", "5")
    assert result.returncode == 1 and "not both" in result.stderr
