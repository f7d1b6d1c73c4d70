"""The graceful stop before the operator deletes a running RayJob (pure): ask the head to stop the job (Ray's Jobs API
SIGTERMs the driver), wait at most the window, delete."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep_contracts.api import MAX_STOP_UPLOADS_LISTED
from sweep_contracts.status_models import GracefulStopStatus, LastStopStatus, SweepStatus
from sweep_contracts.timestamps import epoch_seconds, rfc3339

from ..status import StatusChanges
from .workloads import KueueError, WorkloadFacts, kueue_managed, workload_of

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


def recorded_request(status: SweepStatus, rayjob_uid: str) -> float | None:
    """When the operator asked this RayJob's job to stop, from the sweep's status (status.gracefulStop), so a
    restarted operator neither asks again (restarting the window) nor forgets the stop. Only the operator writes a
    sweep's status (tenants have no verb on trainingsweeps/status: docs/security.md)."""
    stop = status.graceful_stop
    if stop is None or not rayjob_uid or stop.ray_job_uid != rayjob_uid:
        return None
    return epoch_seconds(stop.requested_at)


def idle_recorded(status: SweepStatus, rayjob_uid: str) -> bool:
    """This RayJob's stop has its GPU time in status.idleGpuSeconds already (status.gracefulStop.idleRecorded): a
    restarted operator, which no longer remembers it, must not add it a second time."""
    stop = status.graceful_stop
    return stop is not None and bool(rayjob_uid) and stop.ray_job_uid == rayjob_uid and stop.idle_recorded is True


def with_idle_recorded(status: SweepStatus, rayjob_uid: str) -> StatusChanges:
    """The status change that marks this RayJob's recorded stop as counted; nothing where status.gracefulStop is
    another RayJob's or absent (the stop was then asked by this process only, whose memory keeps it once)."""
    stop = status.graceful_stop
    if stop is None or not rayjob_uid or stop.ray_job_uid != rayjob_uid:
        return {}
    return {"gracefulStop": stop.model_copy(update={"idle_recorded": True})}


def request_status(rayjob_uid: str, now: float) -> StatusChanges:
    """The status change that records a stop's request (status.gracefulStop)."""
    return {"gracefulStop": GracefulStopStatus(ray_job_uid=rayjob_uid, requested_at=rfc3339(now))}


def evicted_by_kueue(rayjob: Mapping[str, Any], workloads: Sequence[Mapping[str, Any]]) -> bool:
    """Kueue evicted the RayJob's Workload (Evicted=True on the Workload it controls): a preemption, whose suspend
    makes KubeRay delete the cluster without stopping the job. Read from Kueue's own condition, never from the
    RayJob's spec.suspend, which a tenant may edit."""
    workload = workload_of(rayjob, workloads) if kueue_managed(rayjob) else None
    if workload is None:
        return False
    try:
        return WorkloadFacts.from_object(workload).evicted
    except KueueError:
        return False


# The head's address. KubeRay writes a RayJob's status.dashboardURL from its cluster's head Service
# (utils.FetchHeadServiceURL: `<service>.<namespace>.svc.<cluster domain>:<the port named dashboard>`), a Service a
# tenant may edit (type ExternalName, another port, no selector and hand-made endpoints): the operator's request would
# go to a host and port of the tenant's choosing. The URL is used only while the Service is still the one KubeRay made
# for the RayJob's own cluster (common/service.go BuildServiceForHeadPod).
DASHBOARD_PORT_NAME = "dashboard"  # utils.DashboardPortName


def head_service_name(cluster: Mapping[str, Any]) -> str:
    """utils.GenerateHeadServiceName for a RayCluster: headGroupSpec.headService's name if set, else
    `<cluster>-head-svc`."""
    head = (cluster.get("spec") or {}).get("headGroupSpec") or {}
    custom = ((head.get("headService") or {}).get("metadata") or {}).get("name")
    return custom if isinstance(custom, str) and custom else f"{(cluster.get('metadata') or {}).get('name')}-head-svc"


def _controlled_by(obj: Mapping[str, Any], kind: str, uid: Any) -> bool:
    """A controller ownerReference to the object of `uid` (set by its maker at creation; a name is anyone's)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(
        isinstance(r, Mapping) and r.get("controller") is True and r.get("kind") == kind and r.get("uid") == uid
        for r in refs
    )


def head_address_refusal(
    rayjob: Mapping[str, Any],
    cluster: Mapping[str, Any] | None,
    service: Mapping[str, Any] | None,
    dashboard_url: str,
) -> str:
    """Why the operator must not send Jobs API requests to `dashboard_url`, "" when it may: the RayJob's cluster is
    the one KubeRay made for it, its head Service the one KubeRay made for that cluster (a ClusterIP Service with
    KubeRay's controller reference and its head selector), and the URL that Service's name and dashboard port."""
    meta = rayjob.get("metadata") or {}
    namespace, name = meta.get("namespace") or "default", str((rayjob.get("status") or {}).get("rayClusterName") or "")
    if cluster is None:
        return f"its RayCluster {name or '(none named)'} is not there"
    cluster_meta = cluster.get("metadata") or {}
    if not _controlled_by(cluster, "RayJob", meta.get("uid")):
        return f"RayCluster {name} is not the one KubeRay made for the RayJob (no controller reference to it)"
    service_name = head_service_name(cluster)
    if service is None:
        return f"its head Service {service_name} does not exist"
    spec = service.get("spec") or {}
    kind = spec.get("type") or "ClusterIP"
    if kind != "ClusterIP":
        return f"its head Service {service_name} is of type {kind}, not the ClusterIP Service KubeRay makes"
    if not _controlled_by(service, "RayCluster", cluster_meta.get("uid")):
        return f"its head Service {service_name} is not the one KubeRay made for RayCluster {name}"
    selector = spec.get("selector") or {}
    if not isinstance(selector, Mapping) or (
        selector.get("ray.io/cluster") != name or selector.get("ray.io/node-type") != "head"
    ):
        return f"its head Service {service_name} does not select the head pod of RayCluster {name}"
    ports = [p for p in spec.get("ports") or [] if isinstance(p, Mapping) and p.get("name") == DASHBOARD_PORT_NAME]
    if not ports:
        return f"its head Service {service_name} has no port named {DASHBOARD_PORT_NAME}"
    host, _, port = dashboard_url.strip().removeprefix("http://").rstrip("/").rpartition(":")
    if not host.startswith(f"{service_name}.{namespace}.svc.") or port != str(ports[0].get("port")):
        return (
            f"the RayJob's dashboard URL is not port {ports[0].get('port')} of its head Service "
            f"{service_name}.{namespace}.svc"
        )
    return ""


# A driver's record of a stop is this one's when it was asked no earlier than the operator's request, less this much
# (the head's clock and the operator's differ).
CLOCK_SKEW_S = 60.0
MAX_STOP_TEXT_CHARS = 256  # a trial id or a checkpoint folder name in status.lastStop
MAX_STOP_MESSAGE_CHARS = 1024


def _text(value: Any, limit: int) -> str | None:
    if not isinstance(value, str):
        return None
    return value if len(value) <= limit else value[: limit - 3] + "..."


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def last_stop_status(progress: Mapping[str, Any] | None, rayjob_uid: str) -> LastStopStatus | None:
    """status.lastStop from the driver's stop record (`stop` in the run's _sweep/status.json, written when its Ray job
    stopped gracefully): the uploads in flight it waited for, how many committed, and each it could not wait for.
    None when the document records no stop. Every part is bounded and of its schema type (the document is the
    tenant's code's: a wrong type is left out, a long text cut)."""
    stop = (progress or {}).get("stop")
    if not isinstance(stop, Mapping):
        return None
    found = stop.get("uploads")
    uploads: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    missed_raw = uploads.get("notWaitedFor")
    missed = [
        {k: v for k, v in {"trial": _text(m.get("trial"), MAX_STOP_TEXT_CHARS),
                           "checkpoint": _text(m.get("checkpoint"), MAX_STOP_TEXT_CHARS)}.items() if v is not None}
        for m in (missed_raw if isinstance(missed_raw, list) else [])
        if isinstance(m, Mapping) and isinstance(m.get("trial"), str)
    ][:MAX_STOP_UPLOADS_LISTED]  # fmt: skip
    waited = stop.get("waitedSeconds")
    record = {
        "rayJobUid": rayjob_uid or None,
        "stoppedAt": _text(stop.get("stoppedAt"), 64),
        "waitedSeconds": float(waited)
        if isinstance(waited, (int, float)) and not isinstance(waited, bool) and math.isfinite(waited)
        else None,
        "uploadsWaitedFor": _count(uploads.get("waitedFor")),
        "uploadsCommitted": _count(uploads.get("committed")),
        "uploadsNotWaitedFor": missed if uploads else None,
        "uploadsNotWaitedForCount": _count(uploads.get("notWaitedForCount")),
        "message": _text(uploads.get("message"), MAX_STOP_MESSAGE_CHARS),
    }
    return LastStopStatus.model_validate({k: v for k, v in record.items() if v is not None})
