"""perf/device_check.sh --dry-run (issue 33's prepared device run, without its GPU steps): run as CI runs it,
on a machine without a GPU, it serves the CPU ONNX model, measures it with `hubserve perf`, checks the CUDA
shared-memory protocol's refusal, the absence of GPU metrics and 20 load/unload cycles, and writes one results
file whose shape the device run will have too: every CPU check passed, every GPU check skipped with its
reason, throughput and p99 for the CPU model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

GPU_CHECKS = {"infer_torch_cuda", "infer_bls_cuda", "cuda_tensor_refused", "perf_torch_cuda", "perf_bls_cuda",
              "gpu_metrics"}
CPU_CHECKS = {"server_ready", "infer_simple", "perf_simple", "cuda_shm_protocol", "gpu_metrics_absent",
              "load_unload_cycles"}


def test_dry_run_writes_one_results_file_with_cpu_checks_passed(tmp_path: Path) -> None:
    out = tmp_path / "device_check.json"
    done = subprocess.run([str(ROOT / "perf" / "device_check.sh"), "--dry-run", "--out", str(out),
                           "--window-s", "0.5"], cwd=ROOT, capture_output=True, text=True, timeout=150,
                          env={**os.environ, "PYTHON": sys.executable, "DEVICE_CHECK_LIMIT_S": "140"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = json.loads(out.read_text())
    assert set(result) == {"dry_run", "gpu", "checks", "models", "gpu_memory_bytes", "passed", "table"}
    assert result["dry_run"] is True and result["passed"] is True
    assert result["gpu"]["present"] is False and result["gpu"]["why"] == "--dry-run"
    statuses = {c["name"]: c["status"] for c in result["checks"]}
    assert set(statuses) == GPU_CHECKS | CPU_CHECKS
    assert {n for n, s in statuses.items() if s == "pass"} == CPU_CHECKS, statuses
    assert {n for n, s in statuses.items() if s == "skipped: no GPU"} == GPU_CHECKS, statuses
    checks = {c["name"]: c["detail"] for c in result["checks"]}
    assert "CUDA shared memory is not available" in checks["cuda_shm_protocol"]["refusal"]
    assert checks["load_unload_cycles"]["cycles"] == 20
    simple = result["models"]["simple"]
    assert simple["throughput_infer_per_s"] > 0 and simple["p99_ms"] > 0
    assert result["gpu_memory_bytes"] == {}
    table = "\n".join(result["table"])  # printed as the run ends, too
    assert result["table"][-1] == "PASSED" and table in done.stdout and "simple" in table
