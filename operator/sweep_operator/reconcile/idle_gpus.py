"""GPU time held without training (pure): when a held RayCluster's workers go, and what each hold cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants

from ..gpu_time import pod_gpus, pod_scheduled_at
from ..status import parse_time
from .facts import meta_of

# Ray's JobStatus values after which no driver runs (ray/dashboard/modules/job/common.py JobStatus.is_terminal).
TERMINAL_JOB_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
HELD_DELETION = "held-deletion"
PREEMPTION = "preemption"
STATUS_KEYS = {HELD_DELETION: "heldDeletion", PREEMPTION: "preemption"}  # status.idleGpuSeconds


@dataclass(frozen=True)
class FreeWorkers:
    """Delete these worker pods of a held cluster; `gpu_seconds` is what they held since the deletion began."""

    pods: tuple[str, ...]
    gpu_seconds: float
    why: str
    cause: str = HELD_DELETION


def driver_stopped(rayjob: Mapping[str, Any] | None) -> str:
    """Why no driver can still be training on the cluster ("" when one may be): the RayJob is gone or being deleted
    (KubeRay stops the Ray job at once on a RayJob's deletion: rayjob_controller.go, the deletion branch), or its
    jobStatus is terminal."""
    if rayjob is None:
        return "its RayJob is gone"
    if meta_of(rayjob).get("deletionTimestamp"):
        return "its RayJob is being deleted (KubeRay stopped the Ray job)"
    job = str(((rayjob.get("status") or {}).get("jobStatus")) or "")
    return f"the Ray job is {job}" if job in TERMINAL_JOB_STATUSES else ""


def decide_free_workers(
    cluster: Mapping[str, Any],
    rayjob: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    now: float,
    graceful_seconds: float,
) -> FreeWorkers | None:
    """A RayCluster held by the guard is no longer reconciled by KubeRay (raycluster_controller.go: a cluster with a
    deletionTimestamp is ignored), so its workers would keep their GPUs until verification passes. Holding the
    data does not need them once the driver has stopped or the graceful window (from the deletion) has passed:
    then the workers go; the object, its head and the finalizer stay. None: nothing to free yet."""
    deleting = parse_time(meta_of(cluster).get("deletionTimestamp"))
    if deleting is None:
        return None
    name = meta_of(cluster).get("name")
    workers = [
        p
        for p in pods
        if (meta_of(p).get("labels") or {}).get(constants.RAY_LABEL_CLUSTER) == name
        and (meta_of(p).get("labels") or {}).get(constants.RAY_LABEL_NODE_TYPE) == "worker"
        and not meta_of(p).get("deletionTimestamp")
    ]
    if not workers:
        return None
    since = deleting.timestamp()
    why = driver_stopped(rayjob)
    if not why and now < since + graceful_seconds:
        return None
    why = why or f"the {graceful_seconds:g}s graceful window since the deletion passed"
    gpu_seconds = sum(pod_gpus(p) * max(0.0, now - max(since, pod_scheduled_at(p) or since)) for p in workers)
    return FreeWorkers(tuple(sorted(meta_of(p)["name"] for p in workers)), gpu_seconds, why)


def cause_of(free: FreeWorkers, sweep_status: Mapping[str, Any]) -> str:
    """`preemption` when Kueue evicted the sweep (its status records the preemption and it waits Suspended: the
    operator's reading of the Workload, never the RayJob's editable spec.suspend), else the hold's own cause."""
    kueue = sweep_status.get("kueue") or {}
    if sweep_status.get("phase") == "Suspended" and int(kueue.get("preemptions") or 0) > 0:
        return PREEMPTION
    return free.cause


def idle_status(status: Mapping[str, Any], cause: str, gpu_seconds: float) -> dict[str, Any]:
    """status.idleGpuSeconds with this hold's GPU-seconds added under its cause."""
    idle = dict(status.get("idleGpuSeconds") or {})
    key = STATUS_KEYS[cause]
    idle[key] = round(float(idle.get(key) or 0.0) + gpu_seconds, 3)
    return {"idleGpuSeconds": idle}
