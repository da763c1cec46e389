"""perf/bench_external.py's instruments, which its README section argues from: the CPU sampler charges a
client the CPU of its whole process tree (aiperf's work is done by grandchildren) and not the server's, and
the server's own time per request is read from the log lines after a run's start only. No timing of the
server is asserted."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import bench_external
from hubserve_harness import RunningServer

BURN = "import time\nwhile time.process_time() < 0.6: pass"  # 0.6 s of CPU, however loaded the machine


def test_the_sampler_charges_a_client_its_grandchildren_and_not_the_server():
    client = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; "
                               f"subprocess.run([sys.executable, '-c', {BURN!r}])"])
    server = subprocess.Popen(["sleep", "5"])
    try:
        sampler = bench_external.CpuSampler(client.pid, server.pid)
        start = time.time()
        client.wait(60)
        sampler.stop()
        end = time.time()
        client_cores, server_cores = sampler.cores(start, end)
    finally:
        server.kill()
        server.wait()
    assert client_cores * (end - start) > 0.4  # CPU seconds: the grandchild's loop (its parent only waits)
    assert server_cores < 0.05


def test_the_servers_time_per_request_is_read_after_the_offset(tmp_path: Path):
    log = tmp_path / "server.log"
    earlier = "request a: finished (length): 1 prompt + 1 generated tokens in 1.0 ms\n"
    log.write_text(earlier)
    since = log.stat().st_size
    with open(log, "a") as f:
        for ms in (30.0, 10.0, 20.0):
            f.write(f"request b: finished (length): 64 prompt + 64 generated tokens in {ms} ms\n")
    server = RunningServer(process=None, http_port=0, grpc_port=0, metrics_port=0,  # type: ignore[arg-type]
                           repository=tmp_path, log_path=log)
    assert bench_external.server_ms_p50(server, since) == 20.0
    assert bench_external.server_ms_p50(server, 0) == 15.0
