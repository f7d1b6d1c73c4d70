"""The graceful stop before the operator deletes a RayJob whose Ray job runs (issue 26): ask the head to stop the job
(Ray's Jobs API, which SIGTERMs the driver), wait by state at most the window, then delete. Pure; no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep_contracts.timestamps import epoch_seconds, rfc3339

from . import workloads as kueue  # Kueue's Workload as read (shared with Kueue mode)

# KubeRay's JobStatus values that are final (rayv1.IsJobTerminal); "" and PENDING/RUNNING are not.
TERMINAL_JOB_STATUSES = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
LIVE_JOB_STATUSES = frozenset({"PENDING", "RUNNING"})
# KubeRay learns that the job stopped by polling the head (each reconcile of a running RayJob): after the driver's own
# window (RAY_JOB_STOP_WAIT_TIME_S = gracefulStopSeconds, then Ray's SIGKILL) this long is allowed for it to show.
OBSERVE_MARGIN_S = 15.0
FIRST_LOOK_S = 0.5
MAX_LOOK_S = 15.0


@dataclass(frozen=True)
class StopStep:
    """`request`: ask the head to stop the job now; `wait_s`: look again after that long, holding the delete
    (None: delete now); `why` says which."""

    request: bool
    wait_s: float | None
    why: str


def job_live(rayjob: Mapping[str, Any] | None) -> bool:
    """Whether the RayJob's Ray job may still run: a RayJob not being deleted whose jobStatus is PENDING or RUNNING
    (KubeRay already stops the job itself when the RayJob is deleted)."""
    if rayjob is None or (rayjob.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return str((rayjob.get("status") or {}).get("jobStatus") or "") in LIVE_JOB_STATUSES


def window_s(graceful_stop_seconds: float, cap_s: float) -> float:
    """How long a stop may hold the delete: the sweep's gracefulStopSeconds plus the time KubeRay takes to see the
    job end, never above the operator's cap."""
    return max(0.0, min(float(graceful_stop_seconds) + OBSERVE_MARGIN_S, float(cap_s)))


def decide_graceful_stop(
    rayjob: Mapping[str, Any] | None,
    *,
    addressable: bool,
    requested_at: float | None,
    now: float,
    window: float,
    driver_stopped: bool = False,
) -> StopStep:
    """Before a delete of `rayjob`: nothing to stop (no live job, or the driver already recorded its end) -> delete;
    a live job not asked yet -> ask, then wait; asked -> wait until the job ends or `window` passed since the ask.
    `addressable`: the RayJob names its head's dashboard and job id (without them only KubeRay's hard stop is left)."""
    if not job_live(rayjob) or driver_stopped:
        return StopStep(False, None, "the Ray job is not running")
    if not addressable:
        return StopStep(False, None, "the RayJob names no dashboard URL or job id to stop it through")
    if requested_at is None:
        return StopStep(True, min(FIRST_LOOK_S, window) if window > 0 else None, "asking the head to stop the job")
    left = requested_at + window - now
    if left <= 0:
        return StopStep(False, None, f"the graceful window of {window:.0f} s has passed")
    # Most stops end within seconds (the next report); a long one is looked at less often, each look a fresh GET.
    wait = min(left, MAX_LOOK_S, max(FIRST_LOOK_S, (now - requested_at) / 2))
    return StopStep(False, wait, f"waiting up to {left:.0f} s for the job to stop")


def recorded_request(status: Mapping[str, Any], rayjob_uid: str) -> float | None:
    """When the operator asked this RayJob's job to stop, from the sweep's status (status.gracefulStop), so a
    restarted operator neither asks again (restarting the window) nor forgets the stop. Only the operator writes a
    sweep's status (tenants have no verb on trainingsweeps/status: docs/security.md)."""
    stop = status.get("gracefulStop")
    if not isinstance(stop, Mapping) or not rayjob_uid or stop.get("rayJobUid") != rayjob_uid:
        return None
    return epoch_seconds(stop.get("requestedAt"))


def idle_recorded(status: Mapping[str, Any], rayjob_uid: str) -> bool:
    """This RayJob's stop has its GPU time in status.idleGpuSeconds already (status.gracefulStop.idleRecorded): a
    restarted operator, which no longer remembers it, must not add it a second time."""
    stop = status.get("gracefulStop")
    return (
        isinstance(stop, Mapping)
        and bool(rayjob_uid)
        and stop.get("rayJobUid") == rayjob_uid
        and stop.get("idleRecorded") is True
    )


def with_idle_recorded(status: Mapping[str, Any], rayjob_uid: str) -> dict[str, Any]:
    """The status change that marks this RayJob's recorded stop as counted; nothing where status.gracefulStop is
    another RayJob's or absent (the stop was then asked by this process only, whose memory keeps it once)."""
    stop = status.get("gracefulStop")
    if not isinstance(stop, Mapping) or not rayjob_uid or stop.get("rayJobUid") != rayjob_uid:
        return {}
    return {"gracefulStop": {**stop, "idleRecorded": True}}


def request_status(rayjob_uid: str, now: float) -> dict[str, Any]:
    """The status change that records a stop's request (status.gracefulStop)."""
    return {"gracefulStop": {"rayJobUid": rayjob_uid, "requestedAt": rfc3339(now)}}


def evicted_by_kueue(rayjob: Mapping[str, Any], workloads: Sequence[Mapping[str, Any]]) -> bool:
    """Kueue evicted the RayJob's Workload (Evicted=True on the Workload it controls): a preemption, whose suspend
    makes KubeRay delete the cluster without stopping the job. Read from Kueue's own condition, never from the
    RayJob's spec.suspend, which a tenant may edit."""
    workload = kueue.workload_of(rayjob, workloads) if kueue.kueue_managed(rayjob) else None
    if workload is None:
        return False
    try:
        return kueue.WorkloadFacts.from_object(workload).evicted
    except kueue.KueueError:
        return False
