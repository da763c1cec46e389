"""Issue 16 items 1-2: memory under a burst of large requests with and without `--max-inflight-bytes`, and
what API keys cost on the hot path. One run, every configuration side by side.

burst: a fresh single-process server per configuration (the test repository plus `identity_big`, an
    ONNX Identity over one FP32 dimension of any length, no batching). `--clients` raw sockets connect,
    then all send at once one binary-tensor inference of `--body-mib` MiB (a real inference: the model
    echoes it, so the answer is as large), and read their answers. Sampled every 5 ms: the server's
    VmRSS; reported with its VmHWM (peak) and the answers (200 served, 429 refused by the budget). The
    budget is the only difference between the runs.

keys: the real perf_analyzer on `simple` over HTTP (perf_analyzer 2.47's `-H` is ignored for gRPC), one
    concurrency, against one server started without keys and one with `--api-keys` (a key with every group,
    requests_per_second and max_concurrent far above the load, so the bucket and the slot are counted but
    never refuse), measured alternately `--rounds` times; the throughput ratio says what keys cost.

policy: the in-process cost of one `AccessPolicy.admit` + `release` (what each request pays in either
    protocol, gRPC included), with `--keys-in-file` keys, the request's key the last of them, imported from
    the `engine` package the venv has (`PYTHONPATH=.`: this checkout's, where a venv is shared).

    flock /work/probes/bench.lock env PYTHONPATH=. .venv/bin/python perf/bench_access.py [--clients 48]
        [--body-mib 4] [--budget-mib 32] [--concurrency 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import tempfile
import threading
import time
from pathlib import Path

from hubserve_harness import build_test_repository, start_server
from hubserve_harness.perf_analyzer import run_perf_analyzer
from hubserve_models import examples

KEY = "bench-key-0123456789abcdef"
BIG_CONFIG = """name: "identity_big"
backend: "onnxruntime"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [-1] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [-1] }]
"""


def proc_status(pid: int, field: str) -> float:
    """A /proc/<pid>/status field in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def infer_request(body_bytes: int) -> bytes:
    rows = body_bytes // 16
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows * 4],
                                     "parameters": {"binary_data_size": rows * 16}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    data = struct.pack("<f", 1.5) * (rows * 4)
    return (f"POST /v2/models/identity_big/infer HTTP/1.1\r\nHost: bench\r\nContent-Length: "
            f"{len(header) + len(data)}\r\nInference-Header-Content-Length: {len(header)}\r\n\r\n"
            ).encode() + header + data


def read_status(sock) -> int:  # type: ignore[no-untyped-def]
    """One HTTP answer (Content-Length framing): its status."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed before an answer")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    fields = (line.split(":", 1) for line in lines[1:])
    length = next(int(v) for k, v in fields if k.lower() == "content-length")
    while len(rest) < length:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed inside an answer")
        rest += chunk
    return int(lines[0].split()[1])


def burst(repository: Path, folder: Path, clients: int, body_mib: int, budget_mib: int) -> dict[str, object]:
    import socket

    extra = ("--max-inflight-bytes", str(budget_mib << 20)) if budget_mib else ()
    server = start_server(repository, folder / f"burst-{budget_mib}.log", "--no-strict-readiness",
                          "--model-control-mode", "none", "--workers", "1", *extra)
    try:
        pid = server.process.pid
        request = infer_request(body_mib << 20)
        socks = []
        for _ in range(clients):
            s = socket.create_connection(("127.0.0.1", server.http_port), timeout=120)
            socks.append(s)
        warm = socket.create_connection(("127.0.0.1", server.http_port), timeout=120)
        warm.sendall(infer_request(1 << 16))  # the model's first run, outside the measurement
        assert read_status(warm) == 200
        warm.close()
        before = proc_status(pid, "VmRSS")
        hwm_before = proc_status(pid, "VmHWM")
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], proc_status(pid, "VmRSS"))
                time.sleep(0.005)

        statuses: list[int] = []
        lock = threading.Lock()
        start = threading.Barrier(clients)

        def client(s) -> None:  # type: ignore[no-untyped-def]
            start.wait()
            try:
                s.sendall(request)
                status = read_status(s)
            except OSError as e:
                status = -1
                print("client failed:", e)
            with lock:
                statuses.append(status)

        sampler = threading.Thread(target=sample)
        sampler.start()
        threads = [threading.Thread(target=client, args=(s,)) for s in socks]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        elapsed = time.monotonic() - t0
        done.set()
        sampler.join()
        for s in socks:
            s.close()
        return {"budget_mib": budget_mib, "clients": clients, "body_mib": body_mib,
                "rss_before_mib": round(before, 1), "rss_peak_mib": round(peak[0], 1),
                "hwm_mib": round(max(hwm_before, proc_status(pid, "VmHWM")), 1),
                "hwm_before_mib": round(hwm_before, 1),
                "served": statuses.count(200), "refused_429": statuses.count(429),
                "other": len(statuses) - statuses.count(200) - statuses.count(429),
                "seconds": round(elapsed, 2)}
    finally:
        server.stop()


def keys_cost(repository: Path, folder: Path, concurrency: int, rounds: int) -> dict[str, object]:
    keys = folder / "keys.yaml"
    keys.write_text(f'keys:\n  - key: "{KEY}"\n    groups: ["*"]\n    requests_per_second: 1000000\n'
                    f'    max_concurrent: 100000\n')
    plain = start_server(repository, folder / "plain.log", "--no-strict-readiness", "--model-control-mode",
                         "none", "--workers", "1")
    keyed = start_server(repository, folder / "keyed.log", "--no-strict-readiness", "--model-control-mode",
                         "none", "--workers", "1", "--api-keys", str(keys))
    args = ("--concurrency-range", str(concurrency), "--measurement-interval", "3000",
            "--stability-percentage", "25")
    results: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for _ in range(rounds):
            for name, srv, extra in (("off", plain, ()),
                                     ("on", keyed, ("-H", f"Authorization:Bearer {KEY}"))):
                r = run_perf_analyzer("simple", f"127.0.0.1:{srv.http_port}", "http", *args, *extra,
                                      timeout_s=180)
                if r.returncode != 0:
                    raise RuntimeError(f"perf_analyzer failed ({r.returncode}):\n{r.output[-2000:]}")
                results[name].append(r.throughput)
    finally:
        plain.stop()
        keyed.stop()
    off, on = statistics.median(results["off"]), statistics.median(results["on"])
    return {"concurrency": concurrency, "off_infer_per_s": results["off"], "on_infer_per_s": results["on"],
            "median_ratio_on_over_off": round(on / off, 3)}


def policy_cost(keys_in_file: int, n: int = 200_000) -> dict[str, object]:
    from engine.access.api_keys import parse_api_keys
    from engine.access.groups import ApiGroup
    from engine.access.policy import AccessConfig, AccessPolicy

    doc = {"keys": [{"key": f"key-{i:04d}-{KEY}", "groups": ["*"], "requests_per_second": 1e9,
                     "max_concurrent": 1_000_000} for i in range(keys_in_file)]}
    policy = AccessPolicy(AccessConfig({}, {}, parse_api_keys(doc), 1 << 40), 0.0)
    headers = {b"authorization": f"Bearer key-{keys_in_file - 1:04d}-{KEY}".encode(), b"host": b"bench"}
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter_ns()
        for i in range(n):
            policy.release(policy.admit(ApiGroup.INFERENCE, headers, 4096, i * 1e-6))  # type: ignore[arg-type]
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return {"keys_in_file": keys_in_file, "admit_release_us": round(best / 1000, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=48)
    parser.add_argument("--body-mib", type=int, default=4)
    parser.add_argument("--budget-mib", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-keys", action="store_true")
    parser.add_argument("--keys-in-file", default="1,10,100")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_access.") as tmp:
        folder = Path(tmp)
        repository = build_test_repository(folder / "repo")
        big = repository / "identity_big"
        examples.write_model(examples.identity_model("FP32", (-1,)), big / "1" / "model.onnx")
        (big / "config.pbtxt").write_text(BIG_CONFIG)
        print(f"load average before: {os.getloadavg()}")
        for budget in (0, args.budget_mib):
            print(json.dumps(burst(repository, folder, args.clients, args.body_mib, budget)), flush=True)
        for count in args.keys_in_file.split(","):
            print(json.dumps(policy_cost(int(count))), flush=True)
        if not args.skip_keys:
            print(json.dumps(keys_cost(repository, folder, args.concurrency, args.rounds)), flush=True)
        print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
