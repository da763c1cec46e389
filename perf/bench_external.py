"""An external load generator (NVIDIA's aiperf) beside `hubserve perf generate`, on the same server runs.

Issue 29: a public benchmark client nobody here wrote reads the OpenAI API the way users' tools do. One
hubserve (`--metrics-port 0`, as `make serve` runs it, on free loopback ports) serves a temporary repository
holding a copy of the example `tiny_decoder` (byte-level tokenizer) and a copy of the Llama fixture folder
(tests/fixtures/llm/models/llama: an Optimum export with its `tokenizer.json`, served as it is). For each
model and each concurrency the two clients take turns (aiperf c=1, ours c=1, aiperf c=4, …; which goes first
alternates by round), each on streamed `/v1/completions` with no sampling fields (the model's defaults: the
Llama folder's generation_config.json), `ignore_eos` so every request generates `--output-tokens`:

- aiperf: synthetic prompts of `--input-tokens` tokens of the Llama fixture's tokenizer (a local path),
  `--use-server-token-count` so its token counts are the server's `usage`;
- ours: `--prompt-tokens N` characters of its own seeded words, N chosen so that the server counts the same
  mean prompt tokens as it counted for aiperf's prompts (asked of the server itself, `max_tokens: 1`).

Each run has `4 × c + 10` measured requests after `max(2, c)` warm-up ones. Printed per run: the server's
mean prompt/output tokens (ISL/OSL), TTFT p50/p95, inter-token latency p50 and end-to-end p50 as the client
saw them, the server's own time per request (its log), the cores the client's processes and the server kept
busy while the client measured (CpuSampler), output tokens/s and requests/s; then ours ÷ aiperf per model and
concurrency, the median over rounds with its range. Everything each tool wrote is kept under `--out`
(default perf/results/external-<time>/, gitignored); nothing from aiperf is imported here: it runs in its own
venv (perf/peers/setup_aiperf.sh, pinned).

    flock /work/probes/bench.lock .venv/bin/python perf/bench_external.py [--models tiny_decoder,llama]
        [--concurrency 1,4,16] [--input-tokens 64] [--output-tokens 64] [--rounds 1] [--aiperf PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from hubserve_harness import ROOT, RunningServer, start_server
from hubserve_harness.checkout import checkout_env
from hubserve_perf.generative import GenOptions, prompts

FIXTURE = ROOT / "tests" / "fixtures" / "llm" / "models" / "llama"
CALIBRATION_PROMPTS = 16


def build_repository(root: Path) -> Path:
    """tiny_decoder as model_repository/ has it (built by `hubserve_models.examples`), and the Llama fixture
    folder as the exporter wrote it (served as it is: no config.pbtxt)."""
    tiny = ROOT / "model_repository" / "tiny_decoder"
    if not (tiny / "1" / "model.onnx").exists():
        sys.exit("model_repository/tiny_decoder/1/model.onnx is missing: run "
                 "`.venv/bin/python -m hubserve_models.examples model_repository` first")
    shutil.copytree(tiny, root / "tiny_decoder")
    shutil.copytree(FIXTURE, root / "llama")
    return root


def ensure_aiperf(given: str | None) -> Path:
    if given:
        return Path(given)
    subprocess.run(["bash", str(ROOT / "perf" / "peers" / "setup_aiperf.sh")], check=True)
    return ROOT / ".peers" / "aiperf" / "bin" / "aiperf"


def aiperf_version(aiperf: Path) -> str:
    out = subprocess.run([str(aiperf.parent / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('aiperf'))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float]:
    """(parent pid, CPU seconds so far) of one process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS_PER_S


class CpuSampler:
    """Every 100 ms, from a thread: the CPU seconds so far of each process of a client's tree (aiperf is nine
    processes) and of the server, so that `cores(start, end)` tells how many of the machine's cores each
    kept busy between two wall-clock times: what the two clients cost the 2 cores they share with the
    server. Each process counts from its first sample inside the window to its last: one that ends inside
    the window keeps what it used, and one missing from a sample (a /proc read that raced its exit or
    start) is not counted from zero."""

    def __init__(self, client_pid: int, server_pid: int) -> None:
        self.samples: list[tuple[float, dict[int, float], float]] = []
        self._client, self._server = client_pid, server_pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree_cpu_s(self) -> dict[int, float]:
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stats[int(entry)] = _stat(int(entry))
        tree: dict[int, float] = {}
        for pid in sorted(stats):  # a child's pid is larger than its parent's, short of pid wrap-around
            if pid == self._client or stats[pid][0] in tree:
                tree[pid] = stats[pid][1]
        return tree

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with contextlib.suppress(OSError):
                self.samples.append((time.time(), self._tree_cpu_s(), _stat(self._server)[1]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def cores(self, start: float, end: float) -> tuple[float, float]:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return float("nan"), float("nan")
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        for _, tree, _ in inside:
            for pid, cpu in tree.items():
                first.setdefault(pid, cpu)
            last.update(tree)
        client_s = sum(cpu - first[pid] for pid, cpu in last.items())
        span_s = inside[-1][0] - inside[0][0]
        return client_s / span_s, (inside[-1][2] - inside[0][2]) / span_s


def run_aiperf(aiperf: Path, server: RunningServer, model: str, c: int, args: argparse.Namespace,
               out: Path) -> dict[str, Any]:
    cmd = [str(aiperf), "profile", "-m", model, "--url", f"http://{server.http_url}",
           "--endpoint-type", "completions", "--streaming", "--tokenizer", str(FIXTURE),
           "--use-server-token-count", "--prompt-input-tokens-mean", str(args.input_tokens),
           "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", str(args.output_tokens),
           "--prompt-output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
           "--concurrency", str(c), "--request-count", str(4 * c + 10),
           "--warmup-request-count", str(max(2, c)), "--random-seed", str(args.seed),
           "--output-artifact-dir", str(out), "--ui-type", "none"]
    with open(out.with_suffix(".log"), "w") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        sampler = CpuSampler(process.pid, server.process.pid)
        rc = process.wait(600)
        sampler.stop()
    doc = json.loads((out / "profile_export_aiperf.json").read_text())
    client_cores, server_cores = sampler.cores(datetime.fromisoformat(doc["start_time"]).timestamp(),
                                               datetime.fromisoformat(doc["end_time"]).timestamp())
    aiperf_log = (out / "logs" / "aiperf.log").read_text(errors="replace")
    return {
        "rc": rc, "isl": doc["input_sequence_length"]["avg"], "osl": doc["output_sequence_length"]["avg"],
        "ttft_p50": doc["time_to_first_token"]["p50"], "ttft_p95": doc["time_to_first_token"]["p95"],
        "itl_p50": doc["inter_token_latency"]["p50"], "e2e_p50": doc["request_latency"]["p50"],
        "tok_s": doc["output_token_throughput"]["avg"], "req_s": doc["request_throughput"]["avg"],
        "requests": doc["request_count"]["avg"],
        "error_rate": doc.get("request_error_rate", {}).get("avg", 0.0),
        "no_metrics": "no Prometheus endpoints reachable" in aiperf_log,
        "client_cores": client_cores, "server_cores": server_cores,
    }


def server_prompt_tokens(server: RunningServer, model: str, chars: int, seed: int) -> float:
    """The server's mean `usage.prompt_tokens` over our first prompts at `chars` characters."""
    options = GenOptions("", 0, model, "completions", chars, 0.0, 1, None, True, CALIBRATION_PROMPTS, 0, 60.0,
                         seed)
    counts = []
    for prompt in prompts(options, CALIBRATION_PROMPTS):
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1}).encode()
        request = urllib.request.Request(f"http://{server.http_url}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            counts.append(json.loads(answer.read())["usage"]["prompt_tokens"])
    return sum(counts) / len(counts)


def calibrate(server: RunningServer, model: str, target: float, seed: int) -> int:
    """The prompt length in characters whose server token count is closest to `target` (bisection)."""
    lo, hi = 1, max(2, int(target * 8))
    while lo < hi:
        mid = (lo + hi) // 2
        if server_prompt_tokens(server, model, mid, seed) < target:
            lo = mid + 1
        else:
            hi = mid
    if lo == 1:
        return lo
    below = server_prompt_tokens(server, model, lo - 1, seed)
    at = server_prompt_tokens(server, model, lo, seed)
    return lo - 1 if target - below < at - target else lo


def run_ours(server: RunningServer, model: str, c: int, chars: int, args: argparse.Namespace,
             out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "engine", "perf", "generate", "-m", model, "-u", server.http_url,
           "--endpoint", "completions", "--concurrency-range", str(c), "--prompt-tokens", str(chars),
           "--max-tokens", str(args.output_tokens), "--ignore-eos", "--request-count", str(4 * c + 10),
           "--warmup-request-count", str(max(2, c)), "--seed", str(args.seed), "--json", str(out)]
    with open(out.with_suffix(".log"), "w") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=checkout_env())
        sampler = CpuSampler(process.pid, server.process.pid)
        rc = process.wait(600)
        sampler.stop()
    pt = json.loads(out.read_text())["points"][0]
    ended = out.stat().st_mtime  # its measured span ends just before it writes the JSON
    client_cores, server_cores = sampler.cores(ended - pt["seconds"], ended)
    return {"rc": rc, "isl": pt["mean_prompt_tokens"], "osl": pt["mean_output_tokens"],
            "ttft_p50": pt["ttft_ms"]["p50"], "ttft_p95": pt["ttft_ms"]["p95"],
            "itl_p50": pt["inter_token_latency_ms"]["p50"], "e2e_p50": pt["request_latency_ms"]["p50"],
            "tok_s": pt["output_tokens_per_s"], "req_s": pt["requests_per_s"], "requests": pt["requests"],
            "error_rate": 0.0 if rc == 0 else 100.0, "client_cores": client_cores,
            "server_cores": server_cores}


FINISHED = re.compile(r"generated tokens in ([0-9.]+) ms")


def server_ms_p50(server: RunningServer, since: int) -> float:
    """The median of the server's own time per request (arrival at the engine's driver → last token, from
    its log's `finished` lines) over the requests logged after byte `since`: warm-up ones included."""
    with open(server.log_path, "rb") as f:
        f.seek(since)
        times = [float(m) for m in FINISHED.findall(f.read().decode(errors="replace"))]
    return statistics.median(times) if times else float("nan")


def load_averages() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


RUN_COLUMNS = (("ISL", "isl", ".1f"), ("OSL", "osl", ".1f"), ("TTFT p50 ms", "ttft_p50", ".2f"),
               ("TTFT p95 ms", "ttft_p95", ".2f"), ("ITL p50 ms", "itl_p50", ".3f"),
               ("E2E p50 ms", "e2e_p50", ".1f"), ("server p50 ms", "server_p50", ".1f"),
               ("client cores", "client_cores", ".2f"), ("server cores", "server_cores", ".2f"),
               ("out tok/s", "tok_s", ",.0f"), ("req/s", "req_s", ".2f"), ("errors %", "error_rate", "g"))
RATIOS = (("out tok/s", "tok_s"), ("req/s", "req_s"), ("TTFT p50", "ttft_p50"), ("ITL p50", "itl_p50"),
          ("server p50", "server_p50"), ("client cores", "client_cores"))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table(rows: list[dict[str, Any]]) -> str:
    """Every run; per model, concurrency and client the medians over rounds; per model and concurrency ours ÷
    aiperf (the median of the rounds' ratios, with their range)."""
    lines = [_row(["model", "c", "round", "client", *(name for name, _, _ in RUN_COLUMNS)]),
             _row(["---"] * (4 + len(RUN_COLUMNS)))]
    for r in rows:
        lines.append(_row([r["model"], str(r["c"]), str(r["round"]), r["client"],
                           *(format(r[key], fmt) for _, key, fmt in RUN_COLUMNS)]))
    lines += ["", _row(["model", "c", "client (median of rounds)", *(name for name, _, _ in RUN_COLUMNS)]),
              _row(["---"] * (3 + len(RUN_COLUMNS)))]
    for model, c, client in dict.fromkeys((r["model"], r["c"], r["client"]) for r in rows):
        runs = [r for r in rows if (r["model"], r["c"], r["client"]) == (model, c, client)]
        lines.append(_row([model, str(c), client, *(format(statistics.median(r[key] for r in runs), fmt)
                                                    for _, key, fmt in RUN_COLUMNS)]))
    lines += ["", _row(["model", "c", *(f"ours ÷ aiperf: {name}" if i == 0 else name
                                        for i, (name, _) in enumerate(RATIOS))]),
              _row(["---"] * (2 + len(RATIOS)))]
    for model, c in dict.fromkeys((r["model"], r["c"]) for r in rows):
        pairs = [(a, o) for a in rows for o in rows
                 if a["client"] == "aiperf" and o["client"] == "ours"
                 and (a["model"], a["c"]) == (o["model"], o["c"]) == (model, c) and a["round"] == o["round"]]
        cells = []
        for _, key in RATIOS:
            ratios = sorted(o[key] / a[key] for a, o in pairs)
            spread = f" ({ratios[0]:.2f}–{ratios[-1]:.2f})" if len(ratios) > 1 else ""
            cells.append(f"{statistics.median(ratios):.2f}{spread}")
        lines.append(_row([model, str(c), *cells]))
    return "\n".join(lines)


def run_model(aiperf: Path, server: RunningServer, model: str, args: argparse.Namespace,
              out: Path) -> list[dict[str, Any]]:
    """Every concurrency and round of one model, the two clients taking turns (the first alternating by
    round, except that aiperf always runs first once: ours' prompt length is calibrated on its prompts)."""
    rows: list[dict[str, Any]] = []
    chars = 0
    for round_ in range(1, args.rounds + 1):
        for c in (int(x) for x in args.concurrency.split(",")):
            order = ("aiperf", "ours") if round_ % 2 or not chars else ("ours", "aiperf")
            for client in order:
                name = f"{model}-c{c}-r{round_}-{client}"
                since = server.log_path.stat().st_size
                if client == "aiperf":
                    result = run_aiperf(aiperf, server, model, c, args, out / name)
                    result["server_p50"] = server_ms_p50(server, since)
                    if not chars:
                        chars = calibrate(server, model, result["isl"], args.seed)
                        print(f"{model}: aiperf's prompts are {result['isl']:.1f} server tokens; ours get "
                              f"{chars} characters", flush=True)
                else:
                    result = run_ours(server, model, c, chars, args, out / f"{name}.json")
                    result["server_p50"] = server_ms_p50(server, since)
                rows.append({"model": model, "c": c, "round": round_, "client": client, **result})
                print(f"{name}: TTFT p50 {result['ttft_p50']:.2f} ms, {result['tok_s']:,.0f} tok/s, "
                      f"{result['req_s']:.2f} req/s, rc {result['rc']}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny_decoder,llama")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--input-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--aiperf", help="an aiperf executable (default: perf/peers/setup_aiperf.sh's)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    aiperf = ensure_aiperf(args.aiperf)
    out = args.out or ROOT / "perf" / "results" / time.strftime("external-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    print(f"aiperf {aiperf_version(aiperf)}; results in {out}; load before {load_averages()}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        repository = build_repository(Path(tmp) / "repo")
        server = start_server(repository, out / "server.log", "--metrics-port", "0", ready_timeout=120)
        try:
            for model in args.models.split(","):
                rows += run_model(aiperf, server, model, args, out)
        finally:
            server.stop()
    no_metrics = any(r.get("no_metrics") for r in rows)
    report = table(rows) + f"\n\nload after {load_averages()}" + (
        "\naiperf found no Prometheus /metrics on the API port" if no_metrics else "")
    print(report)
    (out / "table.md").write_text(report + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
