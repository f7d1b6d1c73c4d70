"""Schema helpers for tests: KubeRay's v1 CRD schemas ($KUBERAY_CRDS or ../shared/schemas/kuberay) and ours, made strict.

Without KubeRay's CRDs the tests that need them skip, saying how to get them; SWEEPS_REQUIRE_KUBERAY_CRDS=1 (.ci/run
sets it) makes that a failure, so CI never passes without them.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERAY_SCHEMAS = REPO.parent / "shared" / "schemas" / "kuberay"
KUBERAY_CRD_FILES = ("ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml")
REQUIRE_VARIABLE = "SWEEPS_REQUIRE_KUBERAY_CRDS"
HOW_TO_GET = (
    "KubeRay v1.7.0's CRDs are the files ray-operator/config/crd/bases/ray.io_rayjobs.yaml and ray.io_rayclusters.yaml "
    "of https://github.com/ray-project/kuberay at tag v1.7.0 (also in the kuberay-operator 1.7.0 Helm chart's crds/); "
    "put them in ../shared/schemas/kuberay beside the repository, or in any directory named by $KUBERAY_CRDS"
)


def kuberay_crd_dir() -> Path | None:
    """$KUBERAY_CRDS when set (it alone: a directory named on purpose must hold them), else ../shared/schemas/kuberay."""
    configured = os.environ.get("KUBERAY_CRDS")
    directory = Path(configured) if configured else KUBERAY_SCHEMAS
    return directory if all((directory / name).is_file() for name in KUBERAY_CRD_FILES) else None


def require_kuberay_crds() -> Path:
    """The directory of KubeRay's CRDs; else the test skips (fails under SWEEPS_REQUIRE_KUBERAY_CRDS=1) saying how
    to get them."""
    directory = kuberay_crd_dir()
    if directory is not None:
        return directory
    where = f"$KUBERAY_CRDS={os.environ['KUBERAY_CRDS']}" if os.environ.get("KUBERAY_CRDS") else str(KUBERAY_SCHEMAS)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]  # the skip summary names the helper's line
    message = f"{test + ': ' if test else ''}KubeRay CRD schemas not found in {where}. {HOW_TO_GET}"
    if os.environ.get(REQUIRE_VARIABLE) == "1":
        pytest.fail(f"{message} ({REQUIRE_VARIABLE}=1: required here)", pytrace=False)
    pytest.skip(message)


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
    path = require_kuberay_crds() / f"ray.io_{kind}.yaml"
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


@functools.cache
def ledger_validator() -> jsonschema.Validator:
    """The GPUHourLedger CRD's schema (crds/), strict: a write the API server would refuse (422) is an error here."""
    crd = yaml.safe_load((REPO / "crds" / "gpuhourledgers.sweeps.dev.yaml").read_text())
    return validator(crd_v1_schema(crd, "v1alpha1"))
