"""GPU time held without training (pure): freeing a stopping cluster's workers (suspended while KubeRay still
reconciles the cluster, deleted when it no longer does), and what each hold cost."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import Phase
from sweep_contracts.status_models import IdleGpuStatus, SweepStatus

from ..gpu_time import pod_ended_at, pod_gpus, pod_scheduled_at
from ..status import StatusChanges, parse_time
from .facts import meta_of

# Ray's JobStatus values after which no driver runs (ray/dashboard/modules/job/common.py JobStatus.is_terminal).
TERMINAL_JOB_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
HELD_DELETION = "held-deletion"  # GPU pods of a cluster whose deletion the guard holds
PREEMPTION = "preemption"  # the same after a Kueue eviction
STOPPING = "stopping"  # GPU workers from a graceful stop's request until the operator suspended them
UNSCHEDULED_TRIALS = "unscheduled-trials"  # GPU workers up while the driver's status shows no trial running
STATUS_FIELDS = {  # status.idleGpuSeconds, by the model's attribute names
    HELD_DELETION: "held_deletion",
    PREEMPTION: "preemption",
    STOPPING: "stopping",
    UNSCHEDULED_TRIALS: "unscheduled_trials",
}
# A look at the pods counts the time since the previous one; a longer gap (an operator restart, a stalled pass) counts
# only this much, so an unseen stretch is never billed as idle.
MAX_LOOK_GAP_S = 120.0


@dataclass(frozen=True)
class FreeWorkers:
    """Delete these worker pods of a held cluster; `gpu_seconds` is what they held since the deletion began."""

    pods: tuple[str, ...]
    gpu_seconds: float
    why: str
    cause: str = HELD_DELETION


def driver_stopped(rayjob: Mapping[str, Any] | None, head_status: str | None = None) -> str:
    """Why no driver can still be training on the cluster ("" when one may be): the RayJob is gone or being deleted
    (KubeRay stops the Ray job at once on a RayJob's deletion: rayjob_controller.go, the deletion branch), the head
    says the job ended (`head_status`: its Jobs API, `GET /api/jobs/<id>`; after a preemption KubeRay no longer polls
    the job, so the RayJob's jobStatus stays RUNNING), or the RayJob's jobStatus is terminal."""
    if rayjob is None:
        return "its RayJob is gone"
    if meta_of(rayjob).get("deletionTimestamp"):
        return "its RayJob is being deleted (KubeRay stopped the Ray job)"
    if head_status in TERMINAL_JOB_STATUSES:
        return f"its head says the Ray job is {head_status}"
    job = str(((rayjob.get("status") or {}).get("jobStatus")) or "")
    return f"the Ray job is {job}" if job in TERMINAL_JOB_STATUSES else ""


def decide_free_workers(
    cluster: Mapping[str, Any],
    rayjob: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    now: float,
    graceful_seconds: float,
    head_status: str | None = None,
) -> FreeWorkers | None:
    """A RayCluster held by the guard is no longer reconciled by KubeRay (raycluster_controller.go: a cluster with a
    deletionTimestamp is ignored), so its workers would keep their GPUs until verification passes. Holding the
    data does not need them once the driver has stopped or the graceful window (from the deletion) has passed:
    then the workers go; the object, its head and the finalizer stay. None: nothing to free yet."""
    deleting = parse_time(meta_of(cluster).get("deletionTimestamp"))
    if deleting is None:
        return None
    workers = _live_workers(cluster, pods)
    if not workers:
        return None
    since = deleting.timestamp()
    why = driver_stopped(rayjob, head_status)
    if not why and now < since + graceful_seconds:
        return None
    why = why or f"the {graceful_seconds:g}s graceful window since the deletion passed"
    gpu_seconds = _gpu_seconds_since(workers, since, now)
    return FreeWorkers(tuple(sorted(meta_of(p)["name"] for p in workers)), gpu_seconds, why)


# How long KubeRay gets to delete a suspended worker group's pods before the RayJob's delete goes ahead anyway (a
# held cluster's workers are then deleted by the guard). KubeRay acts on the RayCluster's watch event, within seconds.
SUSPEND_WAIT_S = 30.0
SUSPEND_LOOK_S = 0.5


@dataclass(frozen=True)
class SuspendStep:
    """Before the operator deletes a RayJob: `patch` the RayCluster with (suspend its worker groups), and/or look
    again after `wait_s` holding the delete; `wait_s` None: delete now. `why` says which."""

    patch: dict[str, Any] | None
    wait_s: float | None
    why: str


def _live_workers(cluster: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The cluster's worker pods not being deleted: KubeRay's labels, and (when the cluster's uid is known) its
    ownerReference to the cluster, so a tenant's pod wearing the labels is never taken for one (docs/security.md)."""
    name, uid = meta_of(cluster).get("name"), meta_of(cluster).get("uid")
    return [
        p
        for p in pods
        if (meta_of(p).get("labels") or {}).get(constants.RAY_LABEL_CLUSTER) == name
        and (meta_of(p).get("labels") or {}).get(constants.RAY_LABEL_NODE_TYPE) == "worker"
        and not meta_of(p).get("deletionTimestamp")
        and (not uid or any(r.get("uid") == uid for r in meta_of(p).get("ownerReferences") or []))
    ]


def controlled_by_rayjob(cluster: Mapping[str, Any], rayjob: Mapping[str, Any]) -> bool:
    """The cluster is the one KubeRay made for this RayJob: its controller ownerReference names the RayJob's uid
    (set by KubeRay at creation and immutable in effect; a name alone is a tenant's to choose)."""
    uid = meta_of(rayjob).get("uid")
    return bool(uid) and any(
        r.get("controller") and r.get("kind") == constants.RAYJOB_KIND and r.get("uid") == uid
        for r in meta_of(cluster).get("ownerReferences") or []
    )


def suspend_patch(cluster: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that suspends every worker group (None: all are suspended already). KubeRay v1.7.0 deletes a
    suspended group's pods itself (raycluster_controller.go reconcilePods: `worker.Suspend` -> deleteAllPods) but
    refuses the whole spec while the in-tree autoscaler is on (utils/validation.go ValidateRayClusterSpec: "cannot
    be suspended with Autoscaler enabled"), so the patch turns it off: the run is over, nothing is to be scaled.
    The RayJob's rayClusterSpec is no way in: KubeRay disregards its changes for an existing cluster
    (rayjob_controller.go getOrCreateRayClusterInstance). The resourceVersion makes a concurrent edit a conflict,
    since a merge patch replaces the whole list."""
    spec = cluster.get("spec") or {}
    groups = list(spec.get("workerGroupSpecs") or [])
    if not groups or all(g.get("suspend") is True for g in groups):
        return None
    changes: dict[str, Any] = {"workerGroupSpecs": [{**g, "suspend": True} for g in groups]}
    if spec.get("enableInTreeAutoscaling"):
        changes["enableInTreeAutoscaling"] = False
    return {"metadata": {"resourceVersion": meta_of(cluster).get("resourceVersion")}, "spec": changes}


def decide_suspend_workers(
    cluster: Mapping[str, Any] | None,
    rayjob: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    now: float,
    suspended_at: float | None,
    wait_s: float = SUSPEND_WAIT_S,
) -> SuspendStep:
    """Where the operator starts a deletion (a sweep's delete, its deadline, a spent budget), the GPU workers go
    first, while KubeRay still reconciles the cluster: once the RayJob is deleted, its cluster is deleted too and,
    held by the guard, no longer reconciled. `suspended_at`: when this operator saw the groups suspended."""
    if cluster is None or meta_of(cluster).get("deletionTimestamp") or not controlled_by_rayjob(cluster, rayjob):
        return SuspendStep(None, None, "no running cluster of this RayJob to suspend")
    left = (suspended_at if suspended_at is not None else now) + wait_s - now
    if left <= 0:
        return SuspendStep(None, None, f"KubeRay did not delete the suspended workers within {wait_s:g} s")
    patch = suspend_patch(cluster)
    if patch is not None:
        return SuspendStep(patch, min(left, SUSPEND_LOOK_S), "suspending its worker groups")
    if not _live_workers(cluster, pods):
        return SuspendStep(None, None, "its worker groups are suspended and their pods gone")
    return SuspendStep(None, min(left, SUSPEND_LOOK_S), "waiting for KubeRay to delete the suspended workers")


def _gpu_seconds_since(workers: Sequence[Mapping[str, Any]], since: float, now: float) -> float:
    return sum(pod_gpus(p) * max(0.0, now - max(since, pod_scheduled_at(p) or since)) for p in workers)


def stopping_gpu_seconds(
    cluster: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], asked: float, now: float
) -> float:
    """GPU-seconds the cluster's live workers held since the graceful stop was asked (`asked`), as the operator
    suspends them: the driver's stop window and the operator's look at its end. Where KubeRay deleted the cluster
    first (the stopped job's shutdownAfterJobFinishes), the stop ends where the deletion began: from then on a
    held cluster's workers are `held-deletion` (decide_free_workers counts from the same instant)."""
    deleting = parse_time(meta_of(cluster).get("deletionTimestamp"))
    end = min(now, deleting.timestamp()) if deleting is not None else now
    return _gpu_seconds_since(_live_workers(cluster, pods), asked, end)


def deleted_rayjob_gpu_seconds(
    cluster: Mapping[str, Any], rayjob: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: float
) -> float:
    """GPU-seconds the cluster's live workers held since someone else deleted its RayJob (KubeRay stopped the job at
    once; the cluster stayed at full size while the guard held its owner), as the operator suspends them."""
    deleting = parse_time(meta_of(rayjob).get("deletionTimestamp"))
    return _gpu_seconds_since(_live_workers(cluster, pods), deleting.timestamp(), now) if deleting else 0.0


def stop_outran_suspend(cluster: Mapping[str, Any], asked: float | None) -> bool:
    """The cluster's deletion began after the operator asked its job to stop and before its worker groups were all
    suspended: KubeRay ended the stop (the stopped job's shutdownAfterJobFinishes). A deletion that began before
    the ask (a Kueue preemption, a user's delete of the cluster) is no stop of ours."""
    deleting = parse_time(meta_of(cluster).get("deletionTimestamp"))
    if asked is None or deleting is None:
        return False
    # deletionTimestamp has whole seconds: an ask within the deletion's second counts (it then adds nothing)
    return math.floor(asked) <= deleting.timestamp() and suspend_patch(cluster) is not None


def no_trial_running(status: SweepStatus) -> bool:
    """The driver's `_sweep/status.json`, as the sweep's status copies it (status.trials), shows trials but none
    running: its workers wait for a trial Tune has not scheduled (or that only the driver's end follows)."""
    trials = status.trials
    if status.phase != Phase.RUNNING or trials is None:
        return False
    return trials.total > 0 and trials.running == 0


def unscheduled_gpu_seconds(
    status: SweepStatus,
    pods: Sequence[Mapping[str, Any]],
    previous_look: float | None,
    now: float,
    max_gap: float = MAX_LOOK_GAP_S,
    gpus_per_trial: float = 0.0,
) -> float:
    """GPU-seconds GPU workers were up between the previous look at the pods and this one beyond what the running
    trials use: all of them while no trial runs; with `gpus_per_trial` (workers x GPUs per worker), the GPUs past
    running trials x that (fewer trials left than the group holds, ASHA's stops). 0 without a previous look (an
    unseen stretch is not billed) or without the driver's trial counts."""
    trials = status.trials
    if previous_look is None or status.phase != Phase.RUNNING or trials is None:
        return 0.0
    total, running = trials.total, trials.running
    if total <= 0 or (running > 0 and gpus_per_trial <= 0):
        return 0.0
    up = sum(
        pod_gpus(p)
        for p in pods
        if (meta_of(p).get("labels") or {}).get(constants.RAY_LABEL_NODE_TYPE) == "worker"
        and not meta_of(p).get("deletionTimestamp")
        and pod_scheduled_at(p) is not None
        and pod_ended_at(p) is None
    )
    idle = max(0.0, up - running * gpus_per_trial)
    return idle * max(0.0, min(now - previous_look, max_gap))


def cause_of(free: FreeWorkers, sweep_status: SweepStatus) -> str:
    """`preemption` when Kueue evicted the sweep (its status records the preemption and it waits Suspended: the
    operator's reading of the Workload, never the RayJob's editable spec.suspend), else the hold's own cause."""
    kueue = sweep_status.kueue
    if sweep_status.phase == Phase.SUSPENDED and kueue is not None and (kueue.preemptions or 0) > 0:
        return PREEMPTION
    return free.cause


def idle_status(status: SweepStatus, cause: str, gpu_seconds: float) -> StatusChanges:
    """The change to status.idleGpuSeconds that adds this hold's GPU-seconds under its cause."""
    idle = status.idle_gpu_seconds or IdleGpuStatus()
    field = STATUS_FIELDS[cause]
    held = getattr(idle, field)
    return {"idleGpuSeconds": idle.model_copy(update={field: round(float(held or 0.0) + gpu_seconds, 3)})}
