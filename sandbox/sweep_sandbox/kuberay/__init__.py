"""A stand-in for the KubeRay v1.7 operator: RayJob -> RayCluster lifecycle on a Kubernetes API, with pluggable job
runners. Its public face is the stand-in and the runner seam; the builders, validation and controllers live in the
modules of this package."""

from __future__ import annotations

from .options import KubeRayOptions
from .rayjob_types import RAYJOB_FINALIZER, USER_AGENT
from .runners import (
    JobPoll,
    JobRunner,
    Outcome,
    PendingPods,
    PendingReason,
    RunHandle,
    RunPhase,
    ScriptedRun,
    ScriptedRunner,
)
from .standin import KubeRayStandIn

__all__ = [
    "RAYJOB_FINALIZER",
    "USER_AGENT",
    "JobPoll",
    "JobRunner",
    "KubeRayOptions",
    "KubeRayStandIn",
    "Outcome",
    "PendingPods",
    "PendingReason",
    "RunHandle",
    "RunPhase",
    "ScriptedRun",
    "ScriptedRunner",
]
