"""Schema helpers for tests: KubeRay's v1 CRD schemas (from ../shared/schemas/kuberay) and ours, made strict."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERAY_SCHEMAS = REPO.parent / "shared" / "schemas" / "kuberay"


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy where objects with declared properties reject unknown fields.

    A real API server prunes unknown fields silently; a typo in what we render must fail the test instead.
    """
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_v1_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return entry["schema"]["openAPIV3Schema"]


@functools.cache
def kuberay_schema(kind: str) -> dict[str, Any]:
    """openAPIV3Schema of KubeRay v1.7.0's `rayjobs` or `rayclusters` CRD, version v1."""
    path = KUBERAY_SCHEMAS / f"ray.io_{kind}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: the KubeRay CRDs live in ../shared/schemas/kuberay")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return crd_v1_schema(yaml.load(path.read_text(), Loader=loader), "v1")


def validator(schema: dict[str, Any], make_strict: bool = True) -> jsonschema.Validator:
    """A Draft 4 validator (OpenAPI 3.0 semantics: boolean exclusiveMinimum)."""
    return jsonschema.Draft4Validator(strict(schema) if make_strict else schema)


def errors(schema_validator: jsonschema.Validator, doc: Any) -> list[str]:
    return [
        f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in sorted(schema_validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    ]


@functools.cache
def sweep_status_validator() -> jsonschema.Validator:
    """Our CRD's status schema (crds/), strict: unknown status fields are errors, not silently pruned."""
    crd = yaml.safe_load((REPO / "crds" / "trainingsweeps.sweeps.dev.yaml").read_text())
    return validator(crd_v1_schema(crd, "v1alpha1")["properties"]["status"])
