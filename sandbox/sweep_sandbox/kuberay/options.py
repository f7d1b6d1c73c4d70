"""How the KubeRay stand-in behaves, shared by its controllers: one object, so a test that turns pod emulation on
after the start reaches them all."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KubeRayOptions:
    """`poll_interval` stands for KubeRay's fixed 3 s requeue (RayJobDefaultRequeueDuration) where the stand-in has no
    better wake-up; `emulate_pods` creates every cluster's Pods; `delete_rayjob_after_job_finishes` is KubeRay's
    DELETE_RAYJOB_CR_AFTER_JOB_FINISHES=true; `deletion_policy_gate` its RayJobDeletionPolicy feature gate (Beta, on by
    default in v1.7.0), which a suspended worker group needs."""

    poll_interval: float = 0.5
    emulate_pods: bool = False
    delete_rayjob_after_job_finishes: bool = False
    deletion_policy_gate: bool = True
