"""GPU time (pure): what a sweep's GPU pods held, as intervals folded into `status.usage`, and the sums over a
namespace's window that the budgets are judged by.

A pod holds its GPUs from the moment kube-scheduler binds it (its `PodScheduled` condition turns True: the
scheduler's binding sets it, `pkg/scheduler/schedule_one.go` `bind` -> `podutil.UpdatePodCondition`) until it is
gone: its containers all terminated (kubelet's `containerStatuses[].state.terminated.finishedAt`), its phase
`Succeeded`/`Failed`, or its deletion's grace period ended (`deletionTimestamp` is the request time plus the
grace period: `k8s.io/apiserver/pkg/registry/rest/delete.go` `BeforeDelete`). A pod still running counts up to
`now`. A pod missing from a listing (selected by a label its editors can change) is read by name; one gone, or
replaced by another of its name, is closed when the operator notices (an upper bound: a budget that undercounts is
the failure it exists to prevent).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import TERMINAL_PHASES, Phase
from sweep_contracts.status_models import SweepStatus, UsageStatus

from .status import epoch_seconds, read_status, rfc3339

GPU_RESOURCE = constants.GPU_RESOURCE


# status.usage.podIntervals is a bounded record: past this many, the oldest finished intervals of one attempt are
# merged (their GPU-seconds and span kept exactly; only where inside the span they fell is lost).
MAX_POD_INTERVALS = 64


HOUR = 3600.0


epoch = epoch_seconds  # the one reader (sweep_contracts.timestamps); the short name reads well in the folds


def _gpu_count(resources: Mapping[str, Any] | None) -> int:
    """nvidia.com/gpu of one container: its limit (extended resources may not be overcommitted, so a request, when
    given, equals the limit: `pkg/apis/core/validation` `validateResourceRequirements`)."""
    resources = resources or {}
    value = (resources.get("limits") or {}).get(GPU_RESOURCE, (resources.get("requests") or {}).get(GPU_RESOURCE))
    if value is None or isinstance(value, bool):
        return 0
    try:
        return max(int(Decimal(str(value))), 0)
    except (InvalidOperation, ValueError):
        return 0


def _containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    found = spec.get(key)
    return [c for c in found if isinstance(c, Mapping)] if isinstance(found, list) else []


def pod_spec_gpus(spec: Mapping[str, Any], count: Callable[[Mapping[str, Any]], int]) -> int:
    """GPUs a pod of `spec` asks for, as Kubernetes sizes a pod for the scheduler and quota
    (`k8s.io/component-helpers/resource/helpers.go` `PodRequests` -> `aggregateContainerResourcesByFn`): the app
    containers' sum plus every native sidecar (an init container with `restartPolicy: Always`), or, when larger, the
    most one init container needs while it runs (its own and the sidecars started before it). `count` reads one
    container."""
    total = sum(count(c) for c in _containers(spec, "containers"))
    sidecars = most_init = 0
    for container in _containers(spec, "initContainers"):
        gpus = count(container)
        if is_sidecar(container):
            total += gpus
            sidecars += gpus
            most_init = max(most_init, sidecars)
        else:
            most_init = max(most_init, sidecars + gpus)
    return max(total, most_init)


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """A native sidecar: an init container that keeps running beside the app containers (`isRestartableInitContainer`)."""
    return container.get("restartPolicy") == "Always"


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod holds, as the scheduler sizes it (`pod_spec_gpus`)."""
    return pod_spec_gpus(pod.get("spec") or {}, lambda c: _gpu_count(c.get("resources")))


def _condition(pod: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    conditions: list[Mapping[str, Any]] = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), None)


def pod_scheduled_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod was bound to a node: its PodScheduled=True condition's lastTransitionTime."""
    condition = _condition(pod, "PodScheduled")
    if condition is None or condition.get("status") != "True":
        return None
    return epoch(condition.get("lastTransitionTime"))


def pod_ended_at(pod: Mapping[str, Any]) -> float | None:
    """The earliest record that the pod no longer holds its GPUs, or None while it may still hold them."""
    status = pod.get("status") or {}
    ends: list[float] = []
    deletion = epoch((pod.get("metadata") or {}).get("deletionTimestamp"))
    if deletion is not None:
        ends.append(deletion)  # the grace period's end: the kubelet kills what still runs then
    containers = status.get("containerStatuses") or []
    finished = [epoch(((c.get("state") or {}).get("terminated") or {}).get("finishedAt")) for c in containers]
    if containers and all(f is not None for f in finished):
        ends.append(max(f for f in finished if f is not None))
    if status.get("phase") in (Phase.SUCCEEDED, Phase.FAILED):
        known = [f for f in finished if f is not None]
        ready = _condition(pod, "Ready")
        if known:
            ends.append(max(known))
        elif ready is not None and ready.get("status") == "False" and epoch(ready.get("lastTransitionTime")):
            ends.append(epoch(ready.get("lastTransitionTime")) or 0.0)
    return min(ends) if ends else None


@dataclass(frozen=True)
class PodInterval:
    """One pod's hold on its GPUs: [start, end), end None while it still holds them."""

    pod: str  # the pod's uid where known (names are reused across attempts), else its name
    cluster: str  # the RayCluster (one per RayJob attempt)
    gpus: float  # a float: merged intervals carry their mean
    start: float
    end: float | None = None
    name: str = ""  # the pod's name, for people

    def gpu_seconds(self, now: float) -> float:
        end = now if self.end is None else min(self.end, now)
        return self.gpus * max(end - self.start, 0.0)

    def overlap_gpu_seconds(self, lo: float, hi: float) -> float:
        """GPU-seconds inside [lo, hi] (a merged interval's spread evenly over its span)."""
        end = hi if self.end is None else min(self.end, hi)
        return self.gpus * max(end - max(self.start, lo), 0.0)

    def to_status(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "pod": self.pod,
            "cluster": self.cluster,
            "gpus": round(self.gpus, 6),
            "start": rfc3339(self.start),
        }
        if self.name and self.name != self.pod:
            doc["name"] = self.name
        if self.end is not None:
            doc["end"] = rfc3339(math.ceil(self.end))  # rounded outward: a stored ledger never loses a second
        return doc

    @classmethod
    def from_status(cls, doc: Mapping[str, Any]) -> PodInterval | None:
        start = epoch(doc.get("start"))
        gpus = doc.get("gpus")
        if start is None or isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not doc.get("pod"):
            return None  # a hand-edited entry the ledger cannot read is dropped, not guessed at
        return cls(
            str(doc["pod"]),
            str(doc.get("cluster") or ""),
            float(gpus),
            start,
            epoch(doc.get("end")),
            str(doc.get("name") or ""),
        )


def observe_pod(pod: Mapping[str, Any]) -> PodInterval | None:
    """The GPU interval a pod's object shows, or None for a pod that holds no GPUs or was never scheduled. An end
    in the future (a deletion's grace period still running) is kept: usage counts up to min(end, now)."""
    gpus = pod_gpus(pod)
    start = pod_scheduled_at(pod)
    if gpus == 0 or start is None:
        return None
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    name = str(meta.get("name") or "")
    return PodInterval(
        str(meta.get("uid") or name),
        str(labels.get(constants.RAY_LABEL_CLUSTER) or ""),
        float(gpus),
        start,
        pod_ended_at(pod),
        name,
    )


@dataclass(frozen=True)
class AttemptUsage:
    cluster: str
    gpu_seconds: float
    pods: int
    started_at: float
    ended_at: float | None  # None while a pod of the attempt still holds GPUs

    def to_status(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "rayClusterName": self.cluster,
            "gpuHours": round(self.gpu_seconds / HOUR, 4),
            "pods": self.pods,
            "startedAt": rfc3339(self.started_at),
        }
        if self.ended_at is not None:
            doc["endedAt"] = rfc3339(math.ceil(self.ended_at))
        return doc


@dataclass(frozen=True)
class UsageLedger:
    """The sweep's usage record (status.usage): the intervals are the ledger; totals are derived from them."""

    intervals: tuple[PodInterval, ...] = ()
    last_measured_at: float | None = None
    thresholds_reported: tuple[int, ...] = ()

    @classmethod
    def from_status(cls, usage: UsageStatus | Mapping[str, Any] | None) -> UsageLedger:
        """The record in status.usage, the model as parsed or the stored document (the CLI reads documents)."""
        if isinstance(usage, UsageStatus):
            return cls.from_model(usage)
        usage = usage or {}
        intervals = tuple(i for i in (PodInterval.from_status(d) for d in usage.get("podIntervals") or []) if i)
        reported = tuple(
            sorted(
                {
                    int(t)
                    for t in usage.get("thresholdsReported") or []
                    if isinstance(t, int) and not isinstance(t, bool)
                }
            )
        )
        return cls(intervals, epoch(usage.get("lastMeasuredAt")), reported)

    @classmethod
    def from_model(cls, usage: UsageStatus) -> UsageLedger:
        """The record as parsed (its types already checked): no document in between."""
        intervals = tuple(
            PodInterval(i.pod, i.cluster, float(i.gpus), start, epoch(i.end), i.name or "")
            for i in usage.pod_intervals or ()
            if i.pod and (start := epoch(i.start)) is not None
        )
        reported = tuple(sorted(set(usage.thresholds_reported or ())))
        return cls(intervals, epoch(usage.last_measured_at), reported)

    def gpu_seconds(self, now: float) -> float:
        return sum(i.gpu_seconds(now) for i in self.intervals)

    def gpu_hours(self, now: float) -> float:
        return self.gpu_seconds(now) / HOUR

    def window_gpu_seconds(self, now: float, window_seconds: float) -> float:
        return sum(i.overlap_gpu_seconds(now - window_seconds, now) for i in self.intervals)

    def gpus_held(self) -> float:
        """GPUs the sweep holds now (its open intervals): the rate its usage grows at."""
        return sum(i.gpus for i in self.intervals if i.end is None)

    def attempts(self, now: float) -> list[AttemptUsage]:
        by_cluster: dict[str, list[PodInterval]] = {}
        for interval in self.intervals:
            by_cluster.setdefault(interval.cluster, []).append(interval)
        attempts = []
        for cluster, intervals in by_cluster.items():
            ends = [i.end for i in intervals]
            attempts.append(
                AttemptUsage(
                    cluster,
                    sum(i.gpu_seconds(now) for i in intervals),
                    len(intervals),
                    min(i.start for i in intervals),
                    None if any(e is None for e in ends) else max(e for e in ends if e is not None),
                )
            )
        return sorted(attempts, key=lambda a: (a.started_at, a.cluster))

    def to_status(self, now: float, budget_gpu_hours: float | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "gpuHours": round(self.gpu_hours(now), 4),
            "gpusHeld": round(self.gpus_held(), 6),
            "lastMeasuredAt": rfc3339(now),
            "attempts": [a.to_status() for a in self.attempts(now)],
            "podIntervals": [i.to_status() for i in sorted(self.intervals, key=lambda i: (i.start, i.pod))],
        }
        if budget_gpu_hours is not None:
            doc["budgetGpuHours"] = budget_gpu_hours
            doc["leftGpuHours"] = round(max(budget_gpu_hours - self.gpu_hours(now), 0.0), 4)
        if self.thresholds_reported:
            doc["thresholdsReported"] = list(self.thresholds_reported)
        return doc


def _merge_same_pod(known: PodInterval, seen: PodInterval) -> PodInterval:
    """One pod seen twice: the same interval; a known end only ever moves earlier (better evidence)."""
    ends = [e for e in (known.end, seen.end) if e is not None]
    return replace(
        known,
        gpus=max(known.gpus, seen.gpus),
        start=min(known.start, seen.start),
        end=min(ends) if ends else None,
        cluster=known.cluster or seen.cluster,
        name=known.name or seen.name,
    )


def fold(
    ledger: UsageLedger, observed: Iterable[PodInterval], now: float, *, listed_clusters: Iterable[str] = ()
) -> UsageLedger:
    """Fold a read of the sweep's pods into the ledger. Idempotent: folding the same read twice, or an older read
    after a newer one, changes nothing. `listed_clusters` are the clusters whose pods were all listed in this read:
    an open interval of one of them whose pod is absent has ended (closed at `now`, see the module's note)."""
    by_pod = {i.pod: i for i in ledger.intervals}
    seen: set[str] = set()
    for interval in observed:
        seen.add(interval.pod)
        by_pod[interval.pod] = _merge_same_pod(by_pod[interval.pod], interval) if interval.pod in by_pod else interval
    listed = set(listed_clusters)
    for pod, interval in list(by_pod.items()):
        if interval.end is None and pod not in seen and interval.cluster in listed:
            by_pod[pod] = replace(interval, end=max(now, interval.start))
    last = now if ledger.last_measured_at is None else max(ledger.last_measured_at, now)
    return replace(ledger, intervals=compact(tuple(by_pod.values())), last_measured_at=last)


def compact(intervals: tuple[PodInterval, ...], limit: int = MAX_POD_INTERVALS) -> tuple[PodInterval, ...]:
    """Keep at most `limit` intervals: merge the two finished intervals of one attempt that ended first (GPU-seconds
    and span exact), across attempts only when no attempt has two. Open intervals are never merged."""
    items = sorted(intervals, key=lambda i: (i.start, i.pod))
    while len(items) > limit:
        closed = sorted((i for i in items if i.end is not None), key=lambda i: (i.end or 0.0, i.start, i.pod))
        if len(closed) < 2:
            break
        pair = None
        for index, first in enumerate(closed):
            second = next((c for c in closed[index + 1 :] if c.cluster == first.cluster), None)
            if second is not None:
                pair = (first, second)
                break
        first, second = pair or (closed[0], closed[1])
        start = min(first.start, second.start)
        end = max(first.end or 0.0, second.end or 0.0)
        seconds = first.gpu_seconds(end) + second.gpu_seconds(end)
        merged = PodInterval(
            f"merged:{first.pod}", first.cluster, seconds / (end - start) if end > start else 0.0, start, end, "merged"
        )
        items = sorted([i for i in items if i not in (first, second)] + [merged], key=lambda i: (i.start, i.pod))
    return tuple(items)


@dataclass(frozen=True)
class NamespaceBudget:
    """GPU-hours a namespace may use over a rolling window (e.g. 500 per 7 days)."""

    gpu_hours: float
    window_seconds: float

    def describe(self) -> str:
        return f"{format_hours(self.gpu_hours)} GPU-hours per {format_duration(self.window_seconds)}"


def worst_case_gpu_hours(
    workers: int, gpus_per_worker: int, max_concurrent_trials: int, active_seconds: float
) -> float:
    """What a sweep could use if every worker held its GPUs for the whole active deadline."""
    return workers * gpus_per_worker * max_concurrent_trials * active_seconds / HOUR


@dataclass(frozen=True)
class SweepUsage:
    """What the namespace computations need of one sweep."""

    name: str
    ledger: UsageLedger
    reserved_gpu_hours: float = 0.0  # an admitted sweep's worst case not yet used (0 once it ended)


def reserved_gpu_hours(worst_case: float, budget: float | None, used: float) -> float:
    """What an admitted, unfinished sweep may still use: its worst case, or its own budget if lower, less its use."""
    cap = worst_case if budget is None else min(worst_case, budget)
    return max(cap - used, 0.0)


def budget_frees_at(
    intervals: Iterable[PodInterval],
    budget: NamespaceBudget,
    now: float,
    needed_gpu_hours: float,
    reserved_gpu_hours: float = 0.0,
) -> float | None:
    """The earliest time >= now at which `needed_gpu_hours` fit the window: used + reserved + needed <= budget.

    Open intervals count as ending now: what they use from here on is already in `reserved_gpu_hours` (their
    sweeps' worst case). Usage in the window only falls after now, piecewise linearly with breakpoints where an
    interval's start or end leaves the window, so the answer is found between two breakpoints exactly. None when
    it never fits (the reservations alone leave too little; they free as their sweeps end).
    """
    window = budget.window_seconds
    closed = [replace(i, end=now if i.end is None else min(i.end, now)) for i in intervals]
    target = (budget.gpu_hours - reserved_gpu_hours - needed_gpu_hours) * HOUR
    if target < 0:
        return None

    def used(t: float) -> float:
        return sum(i.overlap_gpu_seconds(t - window, t) for i in closed)

    if used(now) <= target + 1e-9:
        return now
    points = sorted({p for i in closed for p in (i.start + window, (i.end or now) + window) if p > now})
    if not points:
        return None
    # Every interval ends by now, so the window's use only falls as t grows: the first breakpoint where it fits is
    # found by bisection (a namespace's ledger holds thousands of intervals; a scan would be quadratic).
    lo, hi = 0, len(points) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if used(points[mid]) <= target + 1e-9:
            hi = mid
        else:
            lo = mid + 1
    point, value = points[lo], used(points[lo])
    previous = points[lo - 1] if lo > 0 else now
    previous_used = used(previous)
    if previous_used == value:
        return point
    # linear between breakpoints: previous_used + (point - previous) * slope
    return previous + (previous_used - target) * (point - previous) / (previous_used - value)


def format_hours(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value < 100 else f"{value:.0f}"


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def clusters_to_read(status: SweepStatus) -> set[str]:
    """The RayClusters whose pods a pass lists: the current attempt's, and any with a pod still open in the record
    (a retried attempt's cluster may still be going while the next one starts)."""
    ledger = UsageLedger.from_status(status.usage)
    clusters = {i.cluster for i in ledger.intervals if i.end is None and i.cluster}
    if status.ray_cluster_name:
        clusters.add(status.ray_cluster_name)
    return clusters


def unlisted_open_pods(
    status: SweepStatus, pods: Iterable[Mapping[str, Any]], listed_clusters: Iterable[str]
) -> list[tuple[str, str]]:
    """(name, uid) of each pod the record has open in a listed cluster that this listing did not show. The listing
    selects by the pod's `ray.io/cluster` label, which anyone who may edit the pod can change: such a pod is looked
    up by name before `fold` would close its interval, and its GPUs stay counted while it holds them."""
    listed, seen = set(listed_clusters), {str((p.get("metadata") or {}).get("uid") or "") for p in pods}
    return [
        (i.name or i.pod, i.pod)
        for i in UsageLedger.from_status(status.usage).intervals
        if i.end is None and i.cluster in listed and i.pod not in seen
    ]


def still_holding(pod: Mapping[str, Any] | None, uid: str) -> bool:
    """The pod read by name is the one the record has open (its uid: a name is reused by a later pod)."""
    return pod is not None and (pod.get("metadata") or {}).get("uid") == uid


def holding_gpus(status: SweepStatus) -> bool:
    """The record has a pod still holding GPUs: an ended sweep keeps being measured (and ticked) until it is gone."""
    return any(i.end is None for i in UsageLedger.from_status(status.usage).intervals)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def sweep_usage_of(body: Mapping[str, Any], now: float) -> SweepUsage:
    """What the namespace computations need of one sweep object: its record, and while its run is admitted and
    unfinished, its reservation (GPUs admitted x its deadline span, capped by its own budget, less its use)."""
    meta, status = body.get("metadata") or {}, read_status(body.get("status"))
    ledger = UsageLedger.from_status(status.usage)
    reserved = 0.0
    terminal = status.phase in TERMINAL_PHASES
    if status.run_id and not terminal and not meta.get("deletionTimestamp"):
        gpus = _number(status.replicas.gpus if status.replicas is not None else None) or 0.0
        start, deadline = epoch(status.started_at), epoch(status.deadline_at)
        worst = gpus * (deadline - start) / HOUR if start is not None and deadline is not None else 0.0
        budget = _number(((body.get("spec") or {}).get("budget") or {}).get("gpuHours"))
        reserved = reserved_gpu_hours(worst, budget, ledger.gpu_hours(now))
    return SweepUsage(str(meta.get("name") or ""), ledger, reserved)
