"""The prepared device run (issue 33): one hubserve server on a lent GPU machine, every check it can make
there, and ONE results file. Started by perf/device_check.sh (which installs the carried wheels first).

What it serves, from a repository it writes into a temporary folder:
- `simple`, the example ONNX model on the CPU (onnxruntime's CPU build is what the device image has);
- `torch_cuda`, a Python model that runs PyTorch on CUDA (a matmul and tanh on the GPU, the result copied to
  the host and answered through `pb_utils.Tensor.from_dlpack`);
- `bls_cuda`, a Python model that calls `torch_cuda` by BLS and works on its answer on the GPU again.

The checks, in order; each is `pass`, `fail: why` or, without a GPU (`--dry-run`, or none found),
`skipped: no GPU`:
  server_ready, infer_simple, perf_simple            the CPU path, `hubserve perf` for throughput and p99
  cuda_shm_protocol                                  register/status/unregister answered (no device: the
                                                     refusal names why; on a GPU: a real region round trip)
  infer_torch_cuda, infer_bls_cuda, perf_*           the GPU models
  cuda_tensor_refused                                a CUDA tensor answered through from_dlpack: refused
  gpu_metrics                                        nv_gpu_* on /metrics (absent without a GPU)
  load_unload_cycles                                 20 unload/load cycles; GPU memory before and after
The file: `{"dry_run", "gpu", "checks": [{name, status, detail}], "models": {name: {throughput_infer_per_s,
p99_ms}}, "gpu_memory_bytes", "passed", "table"}`, `table` the same as the text table printed at the end.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hubserve_harness.checkout import ROOT
from hubserve_harness.server import RunningServer, start_server
from hubserve_models.examples import build_repository

NO_GPU = "skipped: no GPU"
CYCLES = 20
GPU_METRICS = ("nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes",
               "nv_gpu_power_usage")
# A model's GPU memory left behind by 20 cycles past this is a leak (a CUDA context alone is ~500 MiB).
LEAK_BYTES = 256 << 20

TORCH_CUDA = '''
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.device = torch.device("cuda", int(args.get("model_instance_device_id") or 0))
        self.weight = torch.randn(256, 256, device=self.device, generator=None) / 16

    def execute(self, requests):
        responses = []
        for request in requests:
            x = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy())
            y = torch.tanh(x.to(self.device) @ self.weight).cpu()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUT", y)]))
        return responses
'''
BLS_CUDA = '''
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN")
            answer = pb_utils.InferenceRequest(model_name="torch_cuda", requested_output_names=["OUT"],
                                               inputs=[pb_utils.Tensor("IN", x.as_numpy())]).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            y = torch.from_dlpack(pb_utils.get_output_tensor_by_name(answer, "OUT").to_dlpack()).cuda()
            out = pb_utils.Tensor.from_dlpack("OUT", (y * 0.5).cpu())
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
'''
# Answers a CUDA tensor through from_dlpack, as a model written for Triton's GPU outputs would: refused with
# the reason until that path has run (engine/backends/python/pb_utils.py NO_GPU_TENSORS).
CUDA_OUT = '''
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        x = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUT", torch.from_numpy(a).cuda())])
                for a in x]
'''
CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 256 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 256 ] }} ]
instance_group [ {{ count: 1 kind: KIND_GPU gpus: [ 0 ] }} ]
dynamic_batching {{ }}
'''


@dataclass
class Check:
    name: str
    status: str  # "pass", "fail: ...", NO_GPU
    detail: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Run:
    """Everything the results file holds; `checks` in the order run."""

    dry_run: bool
    gpu: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    gpu_memory_bytes: dict[str, int] = field(default_factory=dict)

    def check(self, name: str, needs_gpu: bool, body: Callable[[], dict[str, Any] | None]) -> bool:
        """Run one check: its detail is what `body` returns; an exception fails it with the reason."""
        if needs_gpu and not self.gpu.get("present"):
            self.checks.append(Check(name, NO_GPU))
            return False
        start = time.monotonic()
        try:
            detail = body() or {}
            status = "pass"
        except Exception as e:  # a check's failure is a result, not the end of the run
            detail = {"traceback": traceback.format_exc(limit=4)[-1500:]}
            status = f"fail: {type(e).__name__}: {e}".splitlines()[0][:300]
        self.checks.append(Check(name, status, detail, round(time.monotonic() - start, 2)))
        print(f"{name}: {status} ({time.monotonic() - start:.1f} s)", flush=True)
        return status == "pass"

    @property
    def passed(self) -> bool:
        return all(not c.status.startswith("fail") for c in self.checks)

    def table(self) -> list[str]:
        width = max(len(c.name) for c in self.checks)
        lines = [f"{'check':<{width}}  status", *(f"{c.name:<{width}}  {c.status}" for c in self.checks), ""]
        lines.append(f"{'model':<12} {'infer/s':>10} {'p99 ms':>8}  stable")
        lines += [f"{m:<12} {v['throughput_infer_per_s']:>10.1f} {v['p99_ms']:>8.2f}  "
                  f"{'yes' if v['stable'] else 'no'}" for m, v in self.models.items()]
        if self.gpu_memory_bytes:
            lines += ["", "GPU memory (bytes): " + ", ".join(f"{k} {v}" for k, v in
                                                          self.gpu_memory_bytes.items())]
        lines += ["", "PASSED" if self.passed else "FAILED"]
        return lines


def find_gpu(dry_run: bool) -> dict[str, Any]:
    """The machine's first GPU through NVML, or why there is none to use."""
    if dry_run:
        return {"present": False, "why": "--dry-run"}
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return {"present": False, "why": "NVML sees no device"}
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {"present": True, "name": pynvml.nvmlDeviceGetName(handle),
                "uuid": pynvml.nvmlDeviceGetUUID(handle), "driver": pynvml.nvmlSystemGetDriverVersion()}
    except Exception as e:  # no nvidia-ml-py, no driver
        return {"present": False, "why": f"{type(e).__name__}: {e}"}


def gpu_memory_used() -> int:
    import pynvml

    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)


def write_repository(root: Path, gpu: bool) -> list[str]:
    """`simple` (CPU ONNX), and with a GPU the two Python models; the names to load."""
    build_repository(root, ["simple"])
    (root / "simple" / "config.pbtxt").write_text((ROOT / "model_repository/simple/config.pbtxt").read_text())
    if not gpu:
        return ["simple"]
    for name, source in (("torch_cuda", TORCH_CUDA), ("bls_cuda", BLS_CUDA), ("cuda_out", CUDA_OUT)):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    return ["simple", "torch_cuda", "bls_cuda", "cuda_out"]


def http_json(server: RunningServer, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(f"http://{server.http_url}{path}", data,
                                                       method="GET" if body is None else "POST"),
                                timeout=120) as r:
        text = r.read()
    return json.loads(text) if text else None


def infer_simple(server: RunningServer) -> dict[str, Any]:
    a, b = np.arange(16, dtype=np.int32), np.full(16, 3, np.int32)
    out = http_json(server, "/v2/models/simple/infer", {"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.tolist()},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.tolist()}]})
    got = {o["name"]: o["data"] for o in out["outputs"]}
    assert got["OUTPUT0"] == (a + b).tolist() and got["OUTPUT1"] == (a - b).tolist(), got
    return {}


def infer_fp32(server: RunningServer, model: str) -> dict[str, Any]:
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    out = http_json(server, f"/v2/models/{model}/infer", {"inputs": [
        {"name": "IN", "datatype": "FP32", "shape": [1, 256], "data": x.tolist()}]})
    y = np.array(out["outputs"][0]["data"], np.float32)
    assert y.shape == (256,) and np.all(np.abs(y) <= 1.0), y[:4]
    return {"first": y[:4].tolist()}


def cuda_tensor_refused(server: RunningServer) -> dict[str, Any]:
    """A real CUDA tensor handed to from_dlpack fails its request with the reason, and the instance lives."""
    try:
        infer_fp32(server, "cuda_out")
    except urllib.error.HTTPError as e:
        message = json.loads(e.read())["error"]
        assert e.code == 500 and "is on CUDA device 0" in message, (e.code, message)
        return {"error": message[:300]}
    raise AssertionError("a CUDA tensor was answered: the GPU output path is no longer refused; move this "
                         "check to the verified list")


def perf(run: Run, server: RunningServer, model: str, seconds_per_window: float) -> dict[str, Any]:
    """`hubserve perf` at concurrency 4 over gRPC: throughput and p99 into run.models."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "perf.json"
        cmd = [sys.executable, "-m", "hubserve_perf", "-m", model, "-u", server.grpc_url, "-i", "grpc",
               "--concurrency-range", "4", "-p", str(int(seconds_per_window * 1000)), "-r", "3", "-s", "50",
               "--json", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
        # an unstable measurement exits non-zero (perf_analyzer's rule) but is a measurement: kept, marked
        assert out.exists(), (done.stdout + done.stderr)[-1500:]
        step = json.loads(out.read_text())["steps"][-1]
    run.models[model] = {"throughput_infer_per_s": round(step["throughput_infer_per_s"], 1),
                         "p99_ms": round(step["latency_us"]["p99"] / 1000, 3), "stable": step["stable"]}
    return run.models[model]


def cuda_shm(server: RunningServer, gpu: bool) -> dict[str, Any]:
    """Without a GPU: the protocol answers (register refused naming why, status and unregister work). With
    one: `simple`'s inputs and outputs in CUDA regions made by tritonclient's own utilities."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        if not gpu:
            try:
                client.register_cuda_shared_memory("dc", base64.b64encode(bytes(64)).decode(), 0, 64)
                raise AssertionError("a CUDA region was registered on a machine without a GPU")
            except InferenceServerException as e:
                assert "CUDA shared memory is not available" in e.message(), e.message()
                refusal = e.message()
            client.unregister_cuda_shared_memory()
            assert client.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}
            return {"refusal": refusal}
        return cuda_shm_round_trip(client)
    finally:
        client.close()


def cuda_shm_round_trip(client: Any) -> dict[str, Any]:
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.cuda_shared_memory as cudashm

    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 3, np.int32)
    size = a.nbytes
    handles = {name: cudashm.create_shared_memory_region(name, size * (2 if name == "dc_in" else 1), 0)
               for name in ("dc_in", "dc_out0", "dc_out1")}
    try:
        cudashm.set_shared_memory_region(handles["dc_in"], [a, b])
        for name, handle in handles.items():
            client.register_cuda_shared_memory(name, cudashm.get_raw_handle(handle), 0,
                                               size * (2 if name == "dc_in" else 1))
        status = client.get_cuda_shared_memory_status(as_json=True)["regions"]
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("dc_in", size, 0)
        inputs[1].set_shared_memory("dc_in", size, size)
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory("dc_out0", size)
        outputs[1].set_shared_memory("dc_out1", size)
        client.infer("simple", inputs, outputs=outputs)
        got0 = cudashm.get_contents_as_numpy(handles["dc_out0"], "INT32", [1, 16])
        got1 = cudashm.get_contents_as_numpy(handles["dc_out1"], "INT32", [1, 16])
        assert (got0 == a + b).all() and (got1 == a - b).all(), (got0, got1)
        client.unregister_cuda_shared_memory()
        return {"regions": sorted(status)}
    finally:
        for handle in handles.values():
            cudashm.destroy_shared_memory_region(handle)


def gpu_metrics(server: RunningServer, gpu: bool) -> dict[str, Any]:
    """Triton's nv_gpu_* families, labelled by gpu_uuid; none at all without a GPU (absent, not zero)."""
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        text = r.read().decode()
    lines = [line for line in text.splitlines() if line.startswith("nv_gpu_")]
    if not gpu:
        assert not lines, lines[:4]
        return {}
    found = {name: [line for line in lines if re.match(rf"{name}{{.*gpu_uuid=", line)]
             for name in GPU_METRICS}
    missing = [name for name, got in found.items() if not got]
    assert not missing, f"missing {missing}; nv_gpu_ lines seen: {lines[:8]}"
    return {name: got[0] for name, got in found.items()}


def load_unload_cycles(run: Run, server: RunningServer, model: str, gpu: bool) -> dict[str, Any]:
    """CYCLES unload/load cycles of `model`, each answered before the next; GPU memory before and after."""
    before = gpu_memory_used() if gpu else 0
    start = time.monotonic()
    for _ in range(CYCLES):
        http_json(server, f"/v2/repository/models/{model}/unload", {})
        http_json(server, f"/v2/repository/models/{model}/load", {})
    detail: dict[str, Any] = {"model": model, "cycles": CYCLES, "seconds": round(time.monotonic() - start, 1),
                              "server_rss_bytes": server.rss_bytes()}
    if gpu:
        time.sleep(2)  # the last unloaded instance's process has exited; NVML's reading trails it
        after = gpu_memory_used()
        run.gpu_memory_bytes = {"before_cycles": before, "after_cycles": after}
        assert after - before < LEAK_BYTES, f"GPU memory grew by {after - before} bytes over {CYCLES} cycles"
    return detail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="skip every GPU step, run the rest on the CPU")
    parser.add_argument("--out", type=Path, default=ROOT / "perf" / "results" / "device_check.json")
    parser.add_argument("--window-s", type=float, default=2.0, help="hubserve perf's measurement window")
    args = parser.parse_args(argv)
    gpu = find_gpu(args.dry_run)
    run = Run(args.dry_run, {**gpu, "python": platform.python_version()})
    print(f"device check: {'dry run' if args.dry_run else 'GPU run'}; GPU: {gpu}", flush=True)
    present = bool(gpu.get("present"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repository"
        models = write_repository(root, present)
        env = {"HUBSERVE_CUDA_SHM_UNVERIFIED": "1"} if present else {}
        load = [arg for m in models for arg in ("--load-model", m)]
        server = None

        def ready() -> dict[str, Any]:
            nonlocal server
            server = start_server(root, Path(tmp) / "server.log", "--model-control-mode", "explicit",
                                  "--allow-client-shm", *load, ready_timeout=240, env=env)
            return {"models": models}

        if run.check("server_ready", False, ready) and server is not None:
            try:
                run.check("infer_simple", False, lambda: infer_simple(server))
                run.check("perf_simple", False, lambda: perf(run, server, "simple", args.window_s))
                run.check("cuda_shm_protocol", False, lambda: cuda_shm(server, present))
                run.check("infer_torch_cuda", True, lambda: infer_fp32(server, "torch_cuda"))
                run.check("infer_bls_cuda", True, lambda: infer_fp32(server, "bls_cuda"))
                run.check("cuda_tensor_refused", True, lambda: cuda_tensor_refused(server))
                run.check("perf_torch_cuda", True, lambda: perf(run, server, "torch_cuda", args.window_s))
                run.check("perf_bls_cuda", True, lambda: perf(run, server, "bls_cuda", args.window_s))
                if present:
                    run.check("gpu_metrics", True, lambda: gpu_metrics(server, True))
                else:
                    run.check("gpu_metrics_absent", False, lambda: gpu_metrics(server, False))
                run.check("load_unload_cycles", False,
                          lambda: load_unload_cycles(run, server, "torch_cuda" if present else "simple",
                                                     present))
            finally:
                server.stop()
                if not run.passed:
                    print(server.log()[-4000:], flush=True)
    if not present:
        run.checks.append(Check("gpu_metrics", NO_GPU))
    document = {**asdict(run), "passed": run.passed, "table": run.table()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print("\n".join(run.table()), flush=True)
    print(f"results: {args.out}", flush=True)
    return 0 if run.passed else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
