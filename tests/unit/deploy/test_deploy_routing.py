"""deploy/routing/ checked offline: the sticky-routing rule for sequences (docs/replicas.md) against Istio's
published DestinationRule schema (vendored in deploy/routing/schemas/, with where it came from), strictly (an
unknown field is refused, as `kubectl apply --validate=strict` refuses it; the schema's CEL rules,
`x-kubernetes-validations`, are not evaluated here), with negative cases that show the check bites; and the
rule agrees with the rest: its host is the Service deploy/ ships, its header is the one docs/replicas.md tells
clients to send. tests/functional/replicas/test_replicas_sequences.py routes by the same header."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest
import yaml

from conftest import ROOT

ROUTING = ROOT / "deploy" / "routing"
RULE = ROUTING / "destinationrule.yaml"
SCHEMA = ROUTING / "schemas" / "istio-destinationrule-v1.json"


def strict(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others (unless it says it keeps
    unknown fields), as the API server's strict field validation treats a structural schema."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(x) for x in schema]
    return schema


VALIDATOR = jsonschema.Draft7Validator(strict(json.loads(SCHEMA.read_text())))


def rule() -> dict[str, Any]:
    return yaml.safe_load(RULE.read_text())


def errors(doc: dict[str, Any]) -> list[str]:
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
    return [e.message for e in VALIDATOR.iter_errors(body)]


def header_name() -> str:
    """The header the shipped rule hashes on."""
    return str(rule()["spec"]["trafficPolicy"]["loadBalancer"]["consistentHash"]["httpHeaderName"])


def test_the_rule_is_a_valid_istio_destination_rule():
    doc = rule()
    assert (doc["apiVersion"], doc["kind"]) == ("networking.istio.io/v1", "DestinationRule")
    assert errors(doc) == []


def bad(change) -> dict[str, Any]:
    doc = copy.deepcopy(rule())
    change(doc["spec"]["trafficPolicy"]["loadBalancer"]["consistentHash"])
    return doc


@pytest.mark.parametrize("change, why", [
    (lambda h: h.update(httpHeader=h.pop("httpHeaderName")), "Additional properties are not allowed"),
    (lambda h: h.update(useSourceIp=True), "is valid under each of"),  # two hash keys: Istio's oneOf
    (lambda h: h.update(httpHeaderName=7), "is not of type 'string'"),
])
def test_the_schema_check_bites(change, why: str):
    assert any(why in message for message in errors(bad(change))), errors(bad(change))


def test_a_rule_without_a_host_is_refused():
    doc = copy.deepcopy(rule())
    del doc["spec"]["host"]
    assert any("'host' is a required property" in m for m in errors(doc))


def test_the_host_is_the_service_deploy_ships():
    services = set()
    for path in (ROOT / "deploy").rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "Service":
                services.add(doc["metadata"]["name"])
    assert rule()["spec"]["host"] in services, services


def test_the_docs_tell_clients_to_send_the_header_the_rule_hashes():
    text = (ROOT / "docs" / "replicas.md").read_text()
    assert f"`{header_name()}`" in text


