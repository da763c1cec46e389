"""Vendor one version's schema from a published CustomResourceDefinition, as data under deploy/schemas/.

    python tools/crd_schema.py CRD.yaml VERSION SOURCE > deploy/schemas/<group>_<plural>_<version>.json

Writes the CRD's `openAPIV3Schema` for VERSION unchanged except that every `description` is dropped (most of
the bytes, none of the rules), with the CRD's group, kind and version and SOURCE (where the file came from:
repository, tag, path) beside it. tests/unit/deploy/crd.py validates objects against these files.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml


def without_descriptions(node: Any) -> Any:
    """The schema with every `description` dropped; a property *named* description stays."""
    if isinstance(node, dict):
        return {key: (without_descriptions(value) if key != "properties"
                      else {name: without_descriptions(sub) for name, sub in value.items()})
                for key, value in node.items() if key != "description"}
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def main(argv: list[str]) -> int:
    path, version, source = argv
    with open(path) as file:
        crd = yaml.safe_load(file)
    found = [v for v in crd["spec"]["versions"] if v["name"] == version]
    if not found:
        print(f"{path}: no version {version}", file=sys.stderr)
        return 1
    out = {"source": source, "group": crd["spec"]["group"], "kind": crd["spec"]["names"]["kind"],
           "version": version, "openAPIV3Schema": without_descriptions(found[0]["schema"]["openAPIV3Schema"])}
    json.dump(out, sys.stdout, indent=None, separators=(",", ":"), sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
