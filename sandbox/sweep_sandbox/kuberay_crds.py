"""KubeRay v1.7.0's CRDs for the emulator: the full documents from ../shared/schemas/kuberay when present, else
minimal definitions (names, scope, status subresource, printer columns), beside the KubeRay stand-in."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import yaml

from sweep_contracts import constants

from .emulator_tables import minimal_crd

Obj = dict[str, Any]

_AGE = {"name": "age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}

# KubeRay v1.7.0's CRDs as far as the API server is concerned (names, scope, status subresource, printer columns;
# ../shared/schemas/kuberay has the full schemas).
KUBERAY_CRDS: tuple[Obj, ...] = (
    minimal_crd(
        constants.RAY_GROUP,
        constants.RAY_VERSION_API,
        constants.RAYJOB_KIND,
        constants.RAYJOB_PLURAL,
        categories=["all"],
        columns=[
            {"name": "job status", "type": "string", "jsonPath": ".status.jobStatus"},
            {"name": "deployment status", "type": "string", "jsonPath": ".status.jobDeploymentStatus"},
            {"name": "ray cluster name", "type": "string", "jsonPath": ".status.rayClusterName"},
            {"name": "start time", "type": "string", "jsonPath": ".status.startTime"},
            {"name": "end time", "type": "string", "jsonPath": ".status.endTime"},
            _AGE,
        ],
    ),
    minimal_crd(
        constants.RAY_GROUP,
        constants.RAY_VERSION_API,
        constants.RAYCLUSTER_KIND,
        constants.RAYCLUSTER_PLURAL,
        categories=["all"],
        columns=[
            {"name": "desired workers", "type": "integer", "jsonPath": ".status.desiredWorkerReplicas"},
            {"name": "available workers", "type": "integer", "jsonPath": ".status.availableWorkerReplicas"},
            {"name": "cpus", "type": "string", "jsonPath": ".status.desiredCPU"},
            {"name": "memory", "type": "string", "jsonPath": ".status.desiredMemory"},
            {"name": "gpus", "type": "string", "jsonPath": ".status.desiredGPU"},
            {"name": "status", "type": "string", "jsonPath": ".status.state"},
            _AGE,
        ],
    ),
)


def kuberay_crd_dir() -> Path | None:
    """$KUBERAY_CRDS when set (only there), else ../shared/schemas/kuberay beside the repository (absent in a fresh
    clone); None when that directory lacks either file."""
    configured = os.environ.get("KUBERAY_CRDS")  # as tests/support/schemas.py kuberay_crd_dir reads it
    candidate = (
        Path(configured)
        if configured
        else Path(__file__).resolve().parents[2].parent / "shared" / "schemas" / "kuberay"
    )
    if (candidate / "ray.io_rayjobs.yaml").is_file() and (candidate / "ray.io_rayclusters.yaml").is_file():
        return candidate
    return None


@functools.lru_cache(maxsize=4)
def _load_crd_files(directory: str) -> tuple[Obj, ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the files are 1-1.4 MB: libyaml reads them in 0.5 s
    return tuple(
        yaml.load((Path(directory) / name).read_text(), Loader=loader)
        for name in ("ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml")
    )


def kuberay_crds() -> tuple[Obj, ...]:
    """KubeRay v1.7.0's full CRDs (schemas, CEL rules) when present; the minimal definitions otherwise."""
    directory = kuberay_crd_dir()
    if directory is None:
        return KUBERAY_CRDS
    return _load_crd_files(str(directory))  # install_crd stores a copy
