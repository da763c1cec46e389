"""The autoscalers' queries (deploy/kubernetes: keda-scaledobject.yaml's triggers, prometheus-adapter.yaml's
rules) evaluated by Prometheus' own `promtool test rules` on series shaped like a real server's /metrics.

A real server with a generative model and an ordinary (identity) one answers one interactive completion and
one Batch API job; its /metrics is scraped, and the families the queries read must be there, of the type the
query needs, with interactive and batch work told apart. Then each family's real label sets (model,
version, priority, le), with the labels the ServiceMonitor adds (namespace, pod, service) for two pods, become
promtool's input series, with values set to a scene where the answer is known: the queries must give it. The
same run with the value a query counting batch jobs would give fails, and so does the one a rule counting
executing requests would give, so a pass means promtool evaluated the queries.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import EXAMPLES, ROOT, RunningServer, openai_client, start_server, wait_until
from hubserve_models import examples

MODEL = "tiny_decoder"
PLAIN = "plain"  # an identity-backend model: the CPU and GPU overlays' autoscaler reads its queue
PLAIN_CONFIG = """name: "plain"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
KUBERNETES = ROOT / "deploy" / "kubernetes"
PROMTOOL = ROOT / ".tools" / "bin" / "promtool"
PODS = ("hubserve-0", "hubserve-1")
NAMESPACE, SERVICE = "hubserve", "hubserve-metrics"  # keda-scaledobject.yaml's, and the ServiceMonitor's
JOB_REQUESTS = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("autoscaling")
    (folder / "repo" / MODEL).mkdir(parents=True)
    shutil.copy(EXAMPLES / MODEL / "config.pbtxt", folder / "repo" / MODEL / "config.pbtxt")
    examples.build_repository(folder / "repo", [MODEL])
    (folder / "repo" / PLAIN / "1").mkdir(parents=True)  # the identity backend needs no model file
    (folder / "repo" / PLAIN / "config.pbtxt").write_text(PLAIN_CONFIG)
    running = start_server(folder / "repo", folder / "server.log", "--batch-dir", str(folder / "jobs"))
    yield running
    running.stop()


def _families(server: RunningServer) -> dict[str, Any]:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def scrape(server: RunningServer) -> dict[str, Any]:
    """/metrics after one interactive completion and one finished Batch API job of JOB_REQUESTS requests."""
    client: openai.OpenAI = openai_client(server)
    client.completions.create(model=MODEL, prompt="hello", max_tokens=2, temperature=0.0)
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": f"job line {i}", "max_tokens": 2, "temperature": 0.0}}
             for i in range(JOB_REQUESTS)]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
    job = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                completion_window="24h")
    done = wait_until(lambda: (b := client.batches.retrieve(job.id)).status in ("completed", "failed") and b,
                      "the batch job to finish", timeout_s=120)
    assert done.status == "completed" and done.request_counts.completed == JOB_REQUESTS, done
    return _families(server)


def _count(family: Any, model: str = MODEL) -> float:
    return next(s.value for s in family.samples
                if s.name.endswith("_count") and s.labels.get("model") == model)


def test_interactive_and_batch_work_are_told_apart(scrape):
    assert _count(scrape["hubserve_generation_time_to_first_token_seconds"]) == 1 + JOB_REQUESTS
    assert _count(scrape["hubserve_generation_interactive_time_to_first_token_seconds"]) == 1
    waiting = scrape["hubserve_generation_waiting_sequences_by_priority"]
    assert waiting.type == "gauge"
    assert {(s.labels["model"], s.labels["priority"]): s.value for s in waiting.samples} == {
        (MODEL, "interactive"): 0, (MODEL, "batch"): 0}


# --- what the manifests query ------------------------------------------------------------------------------

def _keda_queries() -> dict[str, str]:
    scaled = yaml.safe_load((KUBERNETES / "keda-scaledobject.yaml").read_text())
    return {t["name"]: t["metadata"]["query"] for t in scaled["spec"]["triggers"]}


def _adapter_rules() -> list[dict[str, Any]]:
    config = yaml.safe_load((KUBERNETES / "prometheus-adapter.yaml").read_text())
    return yaml.safe_load(config["data"]["config.yaml"])["rules"]


def _adapter_query(rule: dict[str, Any]) -> str:
    """The query prometheus-adapter sends for the rule's metric over PODS, as it fills the template."""
    series = rule["seriesQuery"].split("{")[0].strip("'\"")
    matchers = f'namespace="{NAMESPACE}",pod=~"{"|".join(PODS)}"'
    return (rule["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", "pod"))


def _series_read(query: str) -> set[str]:
    return set(re.findall(r"\b((?:hubserve|nv)_[a-z_]+)\{", query))


def test_every_series_the_autoscalers_read_is_exported_with_the_type_they_need(scrape):
    read = set().union(*map(_series_read, _keda_queries().values()),
                       *(_series_read(_adapter_query(r)) for r in _adapter_rules()))
    assert read, "no query found"
    for name in read:
        family = name.removesuffix("_bucket")
        assert family in scrape, f"{family} is not on a real server's /metrics"
        # histogram_quantile reads a histogram's buckets; everything else is summed or averaged per pod,
        # which means something of a gauge only.
        assert scrape[family].type == ("histogram" if name.endswith("_bucket") else "gauge"), name


# --- promtool ----------------------------------------------------------------------------------------------

def _series(family: Any, values: Any, model: str = MODEL,
            pods: tuple[str, ...] = PODS) -> list[dict[str, str]]:
    """promtool input series: every sample of the real family for `model` (its own label sets), on each pod,
    with the labels the ServiceMonitor adds. `values(pod, labels)` is the sample's promtool value string."""
    out = []
    for sample in family.samples:
        if sample.labels.get("model") != model or (family.type == "histogram"
                                                   and sample.name != f"{family.name}_bucket"):
            continue
        for pod in pods:
            labels = {**sample.labels, "namespace": NAMESPACE, "pod": pod, "service": SERVICE}
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            out.append({"series": f"{sample.name}{{{text}}}", "values": values(pod, sample.labels)})
    return out


# The scene, at minute 4: pod 0 has 6 interactive requests and 50 batch-job requests waiting, pod 1 has 2
# interactive; pod 0's KV cache is 90 % held, pod 1's 20 %; both pods answered 50 interactive requests a
# minute, each with its first token between 2.5 s and 5 s (histogram_quantile interpolates 0.9 of the way
# through that bucket: 4.75 s). The identity model: pod 0 executes 32 requests with 8 more waiting (issue 31's
# reading: nv_inference_pending_request_count 40), pod 1 executes 3 with none waiting.
WAITING = {("hubserve-0", "interactive"): 6, ("hubserve-0", "batch"): 50, ("hubserve-1", "interactive"): 2,
           ("hubserve-1", "batch"): 0}
KV_USED = {"hubserve-0": (90, 10), "hubserve-1": (20, 80)}


def _scene(scrape: dict[str, Any], ttft_per_minute: int) -> list[dict[str, str]]:
    def ttft(pod: str, labels: dict[str, str]) -> str:
        return f"0+{ttft_per_minute}x4" if float(labels["le"]) >= 5 else "0x4"

    return [
        *_series(scrape["hubserve_generation_waiting_sequences_by_priority"],
                 lambda pod, labels: f"{WAITING[pod, labels['priority']]}x4"),
        *_series(scrape["hubserve_generation_kv_blocks_used"], lambda pod, labels: f"{KV_USED[pod][0]}x4"),
        *_series(scrape["hubserve_generation_kv_blocks_free"], lambda pod, labels: f"{KV_USED[pod][1]}x4"),
        *_series(scrape["hubserve_generation_interactive_time_to_first_token_seconds"], ttft),
        *_series(scrape["nv_inference_pending_request_count"],
                 lambda pod, labels: "40x4" if pod == "hubserve-0" else "3x4", PLAIN),
        *_series(scrape["hubserve_inference_queued_requests"],
                 lambda pod, labels: "8x4" if pod == "hubserve-0" else "0x4", PLAIN),
    ]


def _expected(busy: bool) -> list[dict[str, Any]]:
    keda = _keda_queries()
    rules = {r["name"]["as"]: _adapter_query(r) for r in _adapter_rules()}
    at = "4m"
    return [
        {"expr": keda["queue-depth"], "eval_time": at, "exp_samples": [{"labels": "{}", "value": 8}]},
        {"expr": keda["kv-cache-use"], "eval_time": at, "exp_samples": [{"labels": "{}", "value": 0.9}]},
        {"expr": keda["time-to-first-token"], "eval_time": at,
         "exp_samples": [{"labels": "{}", "value": 4.75 if busy else 0}]},
        {"expr": rules["hubserve_generation_waiting_interactive"], "eval_time": at,
         "exp_samples": [{"labels": '{pod="hubserve-0"}', "value": 6},
                         {"labels": '{pod="hubserve-1"}', "value": 2}]},
        {"expr": rules["hubserve_inference_queued_requests"], "eval_time": at,
         "exp_samples": [{"labels": '{pod="hubserve-0"}', "value": 8},
                         {"labels": '{pod="hubserve-1"}', "value": 0}]},
    ]


def _promtool(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL.exists(), f"{PROMTOOL} missing: make install-test runs tools/install_promtool.sh"
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    document = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    return subprocess.run([str(PROMTOOL), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("busy", [True, False], ids=["busy", "idle"])
def test_promtool_evaluates_the_autoscaling_queries_on_real_series(scrape, tmp_path, busy):
    """Busy: 50 interactive requests a minute per pod. Idle: none, where the TTFT quantile would be NaN and
    the query must give 0, not NaN (KEDA would refuse NaN)."""
    result = _promtool(tmp_path, [{"interval": "1m", "input_series": _scene(scrape, 50 if busy else 0),
                                   "promql_expr_test": _expected(busy)}])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_refuses_a_wrong_answer(scrape, tmp_path):
    """The queue depth a query counting batch jobs would give (8 + 50) is not what the queries give."""
    expected = _expected(busy=True)
    expected[0]["exp_samples"] = [{"labels": "{}", "value": 58}]
    result = _promtool(tmp_path, [{"interval": "1m", "input_series": _scene(scrape, 50),
                                   "promql_expr_test": expected}])
    output = result.stdout + result.stderr  # promtool writes the failures to stderr
    assert result.returncode == 1
    assert "FAILED" in output and "exp: {} 5.8E+01" in output and "got: {} 8E+00" in output, output


def test_promtool_refuses_the_count_of_executing_requests(scrape, tmp_path):
    """The per-pod value a rule on nv_inference_pending_request_count would give (40 = 32 executing + 8
    waiting on pod 0) is not what the CPU and GPU overlays' rule gives."""
    expected = _expected(busy=True)
    expected[-1]["exp_samples"] = [{"labels": '{pod="hubserve-0"}', "value": 40},
                                   {"labels": '{pod="hubserve-1"}', "value": 3}]
    result = _promtool(tmp_path, [{"interval": "1m", "input_series": _scene(scrape, 50),
                                   "promql_expr_test": expected}])
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert "FAILED" in output and "4E+01" in output and "8E+00" in output, output
