"""deploy/ checked offline: every Kubernetes manifest against Kubernetes' own schemas (kubernetes-validate,
strict: no unknown field, for every Kubernetes version it ships), the KServe ServingRuntime against the schema
derived from KServe's documented fields (deploy/schemas/) with its containers against the Pod schema, the
HPA's metric against what engine/observability/metrics.py really exports, the probes, and the server flags the
manifests pass against `hubserve serve`'s own parser.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

from conftest import ROOT
from engine.cli.parser import build_parser
from engine.observability.metrics import FAMILIES

DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
KSERVE_SCHEMA = DEPLOY / "schemas" / "kserve-servingruntime-v1alpha1.json"
KUBERNETES_VERSIONS = sorted({re.sub(r"^v?(\d+\.\d+).*", r"\1", v) for v in all_versions()})
# The parts of KServe's ServingRuntimePodSpec that are Kubernetes core/v1 types, checked as a Pod's.
POD_FIELDS = ("containers", "volumes", "nodeSelector", "affinity", "tolerations", "imagePullSecrets",
              "hostIPC")


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


DOCUMENTS = _documents()
BUILT_IN = [(n, d) for n, d in DOCUMENTS if not d["apiVersion"].startswith("serving.kserve.io/")]
KSERVE = [(n, d) for n, d in DOCUMENTS if d["apiVersion"].startswith("serving.kserve.io/")]


def _one(kind: str) -> dict[str, Any]:
    found = [d for _, d in DOCUMENTS if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in deploy/kubernetes, found {len(found)}"
    return found[0]


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]
    return spec["template"]["spec"]["containers"] if doc["kind"] == "Deployment" else spec["containers"]


def test_the_manifests_are_there():
    kinds = {d["kind"] for _, d in DOCUMENTS}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "ClusterServingRuntime"} <= kinds
    assert KUBERNETES_VERSIONS, "kubernetes-validate ships no schemas"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("name", "doc"), BUILT_IN, ids=[n for n, _ in BUILT_IN])
def test_kubernetes_manifests_validate_strictly(name, doc, version):
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_catches_a_broken_manifest():
    """So a pass above means something: a wrong type and an unknown field are both refused."""
    broken = copy.deepcopy(_one("Deployment"))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)
    unknown = copy.deepcopy(_one("HorizontalPodAutoscaler"))
    unknown["spec"]["maxReplica"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, KUBERNETES_VERSIONS[0], strict=True)


def test_the_kserve_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(json.loads(KSERVE_SCHEMA.read_text()))


def _validate_serving_runtime(doc: dict[str, Any], version: str) -> None:
    jsonschema.Draft202012Validator(json.loads(KSERVE_SCHEMA.read_text())).validate(doc)
    spec = doc["spec"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": doc["metadata"]["name"]},
           "spec": {k: spec[k] for k in POD_FIELDS if k in spec}}
    kubernetes_validate.validate(pod, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("name", "doc"), KSERVE, ids=[n for n, _ in KSERVE])
def test_kserve_serving_runtime_validates(name, doc, version):
    _validate_serving_runtime(doc, version)


@pytest.mark.parametrize(("where", "value"), [
    (("spec", "protocolVersions"), ["v3"]),
    (("spec", "supportedModelFormats"), [{"name": "onnx", "autoselect": True}]),
    (("spec", "containerz"), []),
    (("spec", "containers"), [{"name": "x", "image": "i", "args": "not-a-list"}]),
    (("spec", "containers"), [{"name": "x", "image": "i",
                               "readinessProbe": {"httpGet": {"paht": "/", "port": 8080}}}]),
])
def test_the_serving_runtime_check_catches_mistakes(where, value):
    broken = copy.deepcopy(KSERVE[0][1])
    broken[where[0]][where[1]] = value
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        _validate_serving_runtime(broken, KUBERNETES_VERSIONS[0])


def test_the_hpa_scales_on_a_gauge_the_engine_exports():
    exported = {name: kind for name, kind, _, _ in FAMILIES}
    hpa = _one("HorizontalPodAutoscaler")
    metrics = hpa["spec"]["metrics"]
    assert metrics, "the HPA names no metric"
    for metric in metrics:
        assert metric["type"] == "Pods", metric
        name = metric["pods"]["metric"]["name"]
        assert name in exported, f"{name} is not defined in engine/observability/metrics.py"
        # An average per pod of a counter would only ever grow: it must be a gauge.
        assert exported[name] == "gauge", f"{name} is a {exported[name]}"
        assert metric["pods"]["target"]["type"] == "AverageValue"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": _one("Deployment")["metadata"]["name"]}


def test_the_adapter_rule_serves_the_hpas_metric():
    adapter = yaml.safe_load(_one("ConfigMap")["data"]["config.yaml"])
    served = {rule["name"]["as"] for rule in adapter["rules"]}
    exported = {name for name, *_ in FAMILIES}
    for metric in _one("HorizontalPodAutoscaler")["spec"]["metrics"]:
        assert metric["pods"]["metric"]["name"] in served
    for rule in adapter["rules"]:
        series = rule["seriesQuery"].split("{")[0].strip("'\"")
        assert series in exported, f"the adapter reads {series}, which the engine does not export"


@pytest.mark.parametrize("kind", ["Deployment", "ClusterServingRuntime"])
def test_probes_use_readiness_and_liveness(kind):
    for container in _containers(_one(kind)):
        assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
        if "startupProbe" in container:
            assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live"


def _serve_args(kind: str) -> list[str]:
    """What `hubserve` is started with in a manifest: the Deployment's args after the image's ENTRYPOINT,
    or the ServingRuntime's command."""
    container = _containers(_one(kind))[0]
    if "command" in container:
        assert container["command"][0] == "hubserve"
        return [*container["command"][1:], *container.get("args", [])]
    entry = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)
    assert entry, "deploy/Dockerfile has no ENTRYPOINT in exec form"
    command = json.loads(entry.group(1))
    assert command[0] == "hubserve", shlex.join(command)
    return [*command[1:], *container.get("args", [])]


@pytest.mark.parametrize("kind", ["Deployment", "ClusterServingRuntime"])
def test_manifests_start_hubserve_with_flags_it_has_and_probe_its_http_port(kind):
    args = build_parser().parse_args(_serve_args(kind))  # exits (fails the test) on an unknown flag
    container = _containers(_one(kind))[0]
    ports = {p.get("name", p["containerPort"]): p["containerPort"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        port = container[probe]["httpGet"]["port"]
        assert ports.get(port, port) == args.http_port, f"{probe} does not reach --http-port"


def test_the_grace_period_outlasts_the_drain():
    deployment = _one("Deployment")
    args = build_parser().parse_args(_serve_args("Deployment"))
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > args.exit_timeout_secs
