"""deploy/kubernetes checked offline, as a platform team would apply it: every overlay rendered by the real
`kubectl kustomize`, every object (the overlays' and the files') against its own validator (deploy_objects.py:
Kubernetes' schemas, strict, for 1.28 to the newest; the operators' published CRD schemas for the custom
resources), each validator shown to refuse a broken object; then what the schemas cannot say: the restricted
Pod Security Standard, requests and limits, the stop sequence (preStop, drain, grace period) against the
server's own flags, selectors that select, and the metrics port kept off the public path.
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
from deploy_objects import (
    DEPLOY,
    KUBERNETES_VERSIONS,
    OVERLAYS,
    Document,
    all_documents,
    file_documents,
    is_custom,
    one,
    render,
    validate,
    validate_custom,
)

from engine.cli.parser import build_parser

DOCUMENTS = all_documents()
BUILT_IN = [(n, d) for n, d in DOCUMENTS if not is_custom(d)]
CUSTOM = [(n, d) for n, d in DOCUMENTS if is_custom(d)]
FILES = [d for _, d in file_documents()]
# The parts of KServe's ServingRuntimePodSpec that are Kubernetes core/v1 types, checked as a Pod's as well.
POD_FIELDS = ("containers", "volumes", "nodeSelector", "affinity", "tolerations", "imagePullSecrets",
              "hostIPC", "schedulerName")


def test_every_overlay_renders_the_whole_deployment():
    assert set(OVERLAYS) == {"cpu", "gpu", "llm"}
    for overlay in OVERLAYS:
        kinds = sorted(d["kind"] for d in render(overlay))
        assert kinds == ["Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service", "Service",
                         "ServiceMonitor"], overlay
    assert KUBERNETES_VERSIONS[0] == "1.28" and len(KUBERNETES_VERSIONS) > 1


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("name", "doc"), BUILT_IN, ids=[n for n, _ in BUILT_IN])
def test_kubernetes_objects_validate_strictly(name, doc, version):
    validate(doc, version)


@pytest.mark.parametrize(("name", "doc"), CUSTOM, ids=[n for n, _ in CUSTOM])
def test_custom_resources_validate_against_their_crds(name, doc):
    validate(doc, KUBERNETES_VERSIONS[-1])


def test_the_kubernetes_validator_bites():
    """So a pass above means something: a wrong type and an unknown field are both refused."""
    broken = copy.deepcopy(one(render("cpu"), "Deployment"))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)
    unknown = copy.deepcopy(HPAS[0])
    unknown["spec"]["maxReplica"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, KUBERNETES_VERSIONS[0], strict=True)


def _set(doc: Document, path: str, value: Any) -> Document:
    broken = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = broken
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return broken


@pytest.mark.parametrize(("kind", "path", "value"), [
    ("ServiceMonitor", "spec.endpoints.0.prot", "metrics"),  # unknown field
    ("ServiceMonitor", "spec.endpoints.0.interval", "15 seconds"),  # the CRD's duration pattern
    ("ServiceMonitor", "spec.selector", "app=hubserve"),  # a string where an object goes
    ("ClusterServingRuntime", "spec.containerz", []),
    ("ClusterServingRuntime", "spec.supportedModelFormats.0.autoselect", True),
    ("ClusterServingRuntime", "spec.containers.0.readinessProbe.httpGet.paht", "/"),
    ("ClusterServingRuntime", "metadata.name", "Hubserve_Runtime"),
    ("ScaledObject", "spec.triggers.0.metadata.threshold", 4),  # KEDA's metadata is strings only
    ("ScaledObject", "spec.minReplicaCount", "one"),
    ("ScaledObject", "spec.triggers.0.metadataa", {}),
    ("InferenceService", "spec.predictor.model.storageURI", "s3://x"),
    ("InferenceService", "spec.predictor.minReplicas", "two"),
])
def test_the_crd_validator_bites(kind, path, value):
    doc = (one(render("cpu"), kind) if kind == "ServiceMonitor"
           else [d for _, d in CUSTOM if d["kind"] == kind][0])
    validate_custom(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(_set(doc, path, value))


def test_the_kserve_runtime_is_a_pod_spec_too():
    """KServe builds the runtime's pod from these fields: they pass Kubernetes' own Pod schema, strictly."""
    spec = one(FILES, "ClusterServingRuntime")["spec"]
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runtime"},
                                      "spec": {k: spec[k] for k in POD_FIELDS if k in spec}},
                                     version, strict=True)


# --- the restricted Pod Security Standard ----------------------------------------------------------------

def _image_uid() -> int:
    user = re.findall(r"^USER\s+(\S+)", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)[-1]
    return int(user.split(":")[0])


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Where a pod spec breaks Kubernetes' restricted Pod Security Standard (the checks of the `restricted`
    level, kubernetes.io/docs/concepts/security/pod-security-standards), or writes its root file system."""
    problems = []
    pod_context = pod.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            problems.append(f"{flag} is set")
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= allowed_volumes:
            problems.append(f"volume {volume['name']}: {sorted(kinds - allowed_volumes)} not allowed")
    seccomp_ok = ("RuntimeDefault", "Localhost")
    for container in pod["containers"]:
        context = container.get("securityContext", {})
        name = container["name"]
        if (context.get("seccompProfile", pod_context.get("seccompProfile", {})).get("type")
                not in seccomp_ok):
            problems.append(f"{name}: seccompProfile is not RuntimeDefault")
        if not (context.get("runAsNonRoot") or pod_context.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot is not true")
        if 0 in (context.get("runAsUser"), pod_context.get("runAsUser")):
            problems.append(f"{name}: runs as uid 0")
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {capabilities['add']}")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: the root file system is writable")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_meets_the_restricted_standard_with_the_images_user(overlay):
    pod = one(render(overlay), "Deployment")["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsGroup"] == _image_uid()
    # The one path the server writes (the image's HOME and TMPDIR) is a volume, not the read-only root.
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in pod["containers"]:
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], "/tmp is not an emptyDir"


@pytest.mark.parametrize(("path", "value", "problem"), [
    ("containers.0.securityContext.capabilities", {"drop": ["NET_RAW"]},
     "hubserve: capabilities do not drop ALL"),
    ("containers.0.securityContext.allowPrivilegeEscalation", True,
     "hubserve: allowPrivilegeEscalation is not false"),
    ("containers.0.securityContext.readOnlyRootFilesystem", False,
     "hubserve: the root file system is writable"),
    ("securityContext.seccompProfile", {"type": "Unconfined"},
     "hubserve: seccompProfile is not RuntimeDefault"),
    ("securityContext.runAsUser", 0, "hubserve: runs as uid 0"),
    ("volumes.1", {"name": "tmp", "hostPath": {"path": "/tmp"}}, "volume tmp: ['hostPath'] not allowed"),
])
def test_the_restricted_check_bites(path, value, problem):
    pod = one(render("cpu"), "Deployment")["spec"]["template"]["spec"]
    assert restricted_violations(_set(pod, path, value)) == [problem]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_requests_and_limits(overlay):
    container = one(render(overlay), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    resources = container["resources"]
    for resource in ("cpu", "memory"):
        # Equal: the Guaranteed QoS class.
        assert resources["requests"][resource] == resources["limits"][resource], resource
    gpus = resources["limits"].get("nvidia.com/gpu")
    assert gpus == (None if overlay == "cpu" else "1")
    image = container["image"]
    assert image.startswith("hubserve-gpu:" if gpus else "hubserve:"), image


# --- the server's flags, probes and stop sequence ----------------------------------------------------------

def _entrypoint() -> list[str]:
    entry = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)
    assert entry, "deploy/Dockerfile has no ENTRYPOINT in exec form"
    command = json.loads(entry.group(1))
    assert command[0] == "hubserve", shlex.join(command)
    return command[1:]


def _containers(doc: Document) -> list[dict[str, Any]]:
    spec = doc["spec"]
    return spec["template"]["spec"]["containers"] if doc["kind"] == "Deployment" else spec["containers"]


def _serve_args(container: dict[str, Any]) -> list[str]:
    """What `hubserve` is started with: the command if the manifest gives one, else the image's ENTRYPOINT,
    then the args."""
    if "command" in container:
        assert container["command"][0] == "hubserve"
        return [*container["command"][1:], *container.get("args", [])]
    return [*_entrypoint(), *container.get("args", [])]


SERVERS = [(overlay, lambda o=overlay: one(render(o), "Deployment")) for overlay in OVERLAYS] + [
    ("kserve", lambda: one(FILES, "ClusterServingRuntime"))]


@pytest.mark.parametrize("where", [name for name, _ in SERVERS])
def test_manifests_start_hubserve_with_flags_it_has_and_probe_its_http_port(where):
    doc = dict(SERVERS)[where]()
    container = _containers(doc)[0]
    args = build_parser().parse_args(_serve_args(container))  # exits (fails the test) on an unknown flag
    ports = {p.get("name", p["containerPort"]): p["containerPort"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in container:
            port = container[probe]["httpGet"]["port"]
            assert ports.get(port, port) == args.http_port, f"{probe} does not reach --http-port"
    if "metrics" in ports:
        assert ports["metrics"] == args.metrics_port


def stop_sequence_problems(pod: dict[str, Any]) -> list[str]:
    """Why stopping this pod could drop requests: no preStop wait while endpoints update, or a grace period
    that ends before the preStop wait plus the server's drain (--exit-timeout-secs) do."""
    container = pod["containers"][0]
    args = build_parser().parse_args(_serve_args(container))
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    if len(command) != 2 or command[0] != "sleep" or not command[1].isdigit() or int(command[1]) < 5:
        return [f"preStop is not a wait of at least 5 s: {command}"]
    needed = int(command[1]) + args.exit_timeout_secs
    grace = pod.get("terminationGracePeriodSeconds", 30)
    return [] if grace > needed else [f"grace period {grace} s <= preStop {command[1]} s + drain "
                                      f"{args.exit_timeout_secs:g} s"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_stopping_pod_leaves_the_endpoints_then_drains_within_its_grace_period(overlay):
    assert stop_sequence_problems(one(render(overlay), "Deployment")["spec"]["template"]["spec"]) == []


def test_the_stop_sequence_check_bites():
    pod = one(render("llm"), "Deployment")["spec"]["template"]["spec"]
    assert stop_sequence_problems(_set(pod, "terminationGracePeriodSeconds", 45)) == [
        "grace period 45 s <= preStop 10 s + drain 120 s"]
    no_wait = copy.deepcopy(pod)
    del no_wait["containers"][0]["lifecycle"]
    assert stop_sequence_problems(no_wait) == ["preStop is not a wait of at least 5 s: []"]


# --- selectors, the metrics path, the network ------------------------------------------------------------

def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels is checked here"
    return bool(selector["matchLabels"]) and selector["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_selector_selects_the_pods(overlay):
    docs = render(overlay)
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert _selects(deployment["spec"]["selector"], pod_labels)
    assert _selects(one(docs, "PodDisruptionBudget")["spec"]["selector"], pod_labels)
    assert _selects(one(docs, "NetworkPolicy")["spec"]["podSelector"], pod_labels)
    for service in (d for d in docs if d["kind"] == "Service"):
        assert service["spec"]["selector"].items() <= pod_labels.items(), service["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_scrapes_the_metrics_port_through_the_service_monitor(overlay):
    docs = render(overlay)
    monitor = one(docs, "ServiceMonitor")
    services = [d for d in docs if d["kind"] == "Service"
                and _selects(monitor["spec"]["selector"], d["metadata"].get("labels", {}))]
    assert [s["metadata"]["name"] for s in services] == ["hubserve-metrics"]
    ports = {p["name"]: p for p in services[0]["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
        assert ports[endpoint["port"]]["targetPort"] == "metrics"
    # The public Service carries inference only.
    public = one(docs, "Service", "hubserve")
    assert {p["targetPort"] for p in public["spec"]["ports"]} == {"http", "grpc"}


def open_to_anyone(policy: Document) -> set[str]:
    """The ports a NetworkPolicy lets any source reach (an ingress rule without `from`)."""
    return {str(port["port"]) for rule in policy["spec"].get("ingress", []) if not rule.get("from")
            for port in rule.get("ports", [{"port": "every port"}])}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_network_policy_keeps_metrics_off_the_public_path(overlay):
    policy = one(render(overlay), "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert open_to_anyone(policy) == {"http", "grpc"}
    metrics_rules = [r for r in policy["spec"]["ingress"] if any(p["port"] == "metrics" for p in r["ports"])]
    assert [r["from"] for r in metrics_rules] == [
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]]


def test_the_network_policy_check_bites():
    policy = copy.deepcopy(one(render("cpu"), "NetworkPolicy"))
    del policy["spec"]["ingress"][1]["from"]
    assert open_to_anyone(policy) == {"http", "grpc", "metrics"}
    policy["spec"]["ingress"].append({})
    assert "every port" in open_to_anyone(policy)


# --- autoscaling (tests/functional/deploy/test_autoscaling_queries.py evaluates the queries) ---------------

HPAS = [d for d in FILES if d["kind"] == "HorizontalPodAutoscaler"]


def _adapter_rules() -> list[dict[str, Any]]:
    return yaml.safe_load(one(FILES, "ConfigMap")["data"]["config.yaml"])["rules"]


@pytest.mark.parametrize("hpa", HPAS, ids=lambda d: d["spec"]["metrics"][0]["pods"]["metric"]["name"])
def test_each_hpa_scales_the_deployment_on_a_metric_the_adapter_serves(hpa):
    served = {rule["name"]["as"] for rule in _adapter_rules()}
    assert hpa["spec"]["metrics"], "the HPA names no metric"
    for metric in hpa["spec"]["metrics"]:
        # Pods + AverageValue: the adapter's per-pod value, averaged over pods (a gauge: a counter's
        # average would only grow; the functional test checks the family is a gauge on a real scrape).
        assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue", metric
        assert metric["pods"]["metric"]["name"] in served
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": one(render("cpu"), "Deployment")["metadata"]["name"]}


def test_the_adapter_rules_group_per_pod():
    for rule in _adapter_rules():
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"},
                                                  "pod": {"resource": "pod"}}
        assert re.fullmatch(rf"\^{re.escape(rule['seriesQuery'].split('{')[0])}\$", rule["name"]["matches"])
        assert "by (<<.GroupBy>>)" in rule["metricsQuery"]


def test_the_keda_scaled_object_scales_the_deployment_and_leaves_batch_jobs_out():
    scaled = one(FILES, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == one(render("llm"), "Deployment")["metadata"]["name"]
    triggers = {t["name"]: t for t in scaled["spec"]["triggers"]}
    assert set(triggers) == {"queue-depth", "kv-cache-use", "time-to-first-token"}
    assert all(t["type"] == "prometheus" for t in triggers.values())
    assert 'priority="interactive"' in triggers["queue-depth"]["metadata"]["query"]
    assert "interactive_time_to_first_token" in triggers["time-to-first-token"]["metadata"]["query"]


# --- KServe ------------------------------------------------------------------------------------------------

RUNTIME = one(FILES, "ClusterServingRuntime")


def test_the_kserve_runtime_meets_the_restricted_standard():
    assert restricted_violations(RUNTIME["spec"]) == []
    mounts = {m["mountPath"]: m["name"] for m in RUNTIME["spec"]["containers"][0]["volumeMounts"]}
    assert "emptyDir" in {v["name"]: v for v in RUNTIME["spec"]["volumes"]}[mounts["/tmp"]]


def test_the_kserve_runtime_declares_both_protocols_ports_and_its_formats():
    container = RUNTIME["spec"]["containers"][0]
    args = build_parser().parse_args(_serve_args(container))
    ports = container["ports"]
    # KServe (RawDeployment) makes the first port the InferenceService's port 80, and gives a port whose name
    # holds "grpc" appProtocol kubernetes.io/h2c (its service reconciler's isGrpcPort).
    assert ports[0]["containerPort"] == args.http_port
    assert [p["containerPort"] for p in ports if "grpc" in p["name"]] == [args.grpc_port]
    assert set(RUNTIME["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
    formats = {f["name"] for f in RUNTIME["spec"]["supportedModelFormats"]}
    assert formats == {"triton", "onnx", "hubserve-llm"}
    # A flat model.onnx is served under the InferenceService's name, which KServe fills in for {{.Name}}.
    assert args.single_model_name == "{{.Name}}" and args.model_repository.as_posix() == "/mnt/models"


@pytest.mark.parametrize("isvc", [d for d in FILES if d["kind"] == "InferenceService"],
                         ids=lambda d: d["metadata"]["name"])
def test_each_inference_service_asks_for_a_format_the_runtime_serves(isvc):
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == RUNTIME["metadata"]["name"]
    supported = {(f["name"], f.get("version")) for f in RUNTIME["spec"]["supportedModelFormats"]}
    wanted = model["modelFormat"]
    assert (wanted["name"], wanted.get("version", dict(supported)[wanted["name"]])) in supported
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
