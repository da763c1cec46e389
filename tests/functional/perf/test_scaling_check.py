"""perf/scaling_check.sh --dry-run (issue 32's prepared 16-core scaling run, at tiny scale), as CI runs it on
2 cores: it serves `simple` and `mlp` in their tuned configs with `--workers 1` and then `--workers 2`, drives
each with the real perf_analyzer over gRPC and HTTP with the server and the load on different cores, and
writes one results file whose shape the device run will have too: every point measured, the server's CPU per
inference split into engine and frontends, and the scaling efficiency against `--workers 1`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from hubserve_harness.perf_analyzer import perf_analyzer_available


@pytest.mark.skipif(not perf_analyzer_available(), reason="perf_analyzer not installed (make perf-analyzer)")
def test_dry_run_measures_every_layout_into_one_results_file(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    done = subprocess.run([str(ROOT / "perf" / "scaling_check.sh"), "--dry-run", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=150,
                          env={**os.environ, "PYTHON": sys.executable, "SCALING_CHECK_LIMIT_S": "140",
                               "SCALING_LIMIT_S": "120"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = json.loads(out.read_text())
    assert set(result) == {"dry_run", "machine", "tool", "pinning", "settings", "points", "passed", "table",
                           "seconds"}
    assert result["dry_run"] is True and result["passed"] is True
    assert result["tool"]["name"] == "perf_analyzer", result["tool"]
    if len(os.sched_getaffinity(0)) > 1:
        assert result["pinning"] == {"pinned": True, "server_cores": [0], "client_cores": [1]}
    points = result["points"]
    assert [(p["workers"], p["model"], p["protocol"]) for p in points] == [
        (w, m, p) for w in (1, 2) for m in ("simple", "mlp") for p in ("grpc", "http")]
    for p in points:
        assert p["status"] in ("pass", "unstable"), p
        assert p["infer_per_s"] > 0 and p["cpu_us_per_infer"] > 0 and p["avg_batch"] >= 1, p
        assert p["concurrency"] == 4 * p["workers"], p
        assert (p["p99_ms"] > 0) if p["status"] == "pass" else (p["p99_ms"] is None), p
        assert p["efficiency"] is not None and p["efficiency"] > 0, p
        if p["workers"] == 1:
            assert p["frontends_us"] == 0 and p["efficiency"] == 1.0, p
        else:  # two frontend processes did the protocol work and the engine process ran the model
            assert p["frontends_us"] > 0 and p["engine_us"] > 0, p
    table = "\n".join(result["table"])  # printed as the run ends, and beside the JSON
    assert table in done.stdout and out.with_suffix(".txt").read_text().strip() == table
    assert {f"scaling-w{w}.log" for w in (1, 2)} <= {f.name for f in tmp_path.iterdir()}
