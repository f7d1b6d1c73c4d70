"""Kueue's Workload as the operator reads it (pure): its conditions and admission, which Workload is a RayJob's, and
whether a RayJob is Kueue's at all.

Shared by Kueue mode (kueue) and the graceful stop of an evicted run (graceful_stop).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..run_metadata import QUEUE_LABEL
from ..status import parse_time

# Kueue's API: the Workload lives in kueue.x-k8s.io/v1beta2.
KUEUE_GROUP = "kueue.x-k8s.io"


KUEUE_VERSION = "v1beta2"


WORKLOAD_PLURAL = "workloads"


WORKLOAD_KIND = "Workload"


# Workload condition types and reasons (apis/kueue/v1beta2/workload_types.go)
QUOTA_RESERVED = "QuotaReserved"


ADMITTED = "Admitted"


EVICTED = "Evicted"


PREEMPTED = "Preempted"


REQUEUED = "Requeued"


FINISHED = "Finished"


EVICTED_BY_PREEMPTION = "Preempted"  # WorkloadEvictedByPreemption


class KueueError(ValueError):
    """A Workload or a recorded clock that cannot be read; the message names the field."""


def _seconds(value: Any, where: str) -> float | None:
    """RFC 3339 (metav1.Time) or epoch seconds -> epoch seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        raise KueueError(f"{where}: got {value!r}; expected an RFC 3339 time")
    try:
        parsed = parse_time(value)
    except ValueError:
        raise KueueError(f"{where}: got {value!r}; expected an RFC 3339 time") from None
    return parsed.timestamp() if parsed is not None else None


@dataclass(frozen=True)
class Condition:
    """One metav1.Condition of a Workload."""

    type: str
    status: bool
    reason: str = ""
    message: str = ""
    at: float | None = None  # lastTransitionTime


@dataclass(frozen=True)
class WorkloadFacts:
    """What the operator reads from the Workload Kueue made for its RayJob."""

    name: str
    queue_name: str = ""
    cluster_queue: str = ""  # status.admission.clusterQueue: set while quota is reserved
    conditions: Mapping[str, Condition] = field(default_factory=dict)
    created_at: float | None = None

    def condition(self, type_: str) -> Condition | None:
        return self.conditions.get(type_)

    def true(self, type_: str) -> bool:
        c = self.conditions.get(type_)
        return c is not None and c.status

    @property
    def admitted(self) -> bool:
        """workload.IsAdmitted: the Admitted condition is True (quota reserved and every admission check ready)."""
        return self.true(ADMITTED)

    @property
    def evicted(self) -> bool:
        """evict.IsEvicted: Evicted=True until the next SetQuotaReservation resets it."""
        return self.true(EVICTED)

    @property
    def finished(self) -> bool:
        return self.true(FINISHED)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> WorkloadFacts:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise KueueError(f"metadata.name: got {name!r}; a Workload has a name")
        spec, workload_status = obj.get("spec") or {}, obj.get("status") or {}
        raw = workload_status.get("conditions") or []
        if not isinstance(raw, list):
            raise KueueError(f"workload {name}: status.conditions: got {type(raw).__name__}; expected a list")
        conditions: dict[str, Condition] = {}
        for i, c in enumerate(raw):
            where = f"workload {name}: status.conditions[{i}]"
            if not isinstance(c, Mapping) or not c.get("type") or c.get("status") not in ("True", "False", "Unknown"):
                raise KueueError(f"{where}: expected {{type, status: True|False|Unknown}}, got {c!r}")
            conditions[str(c["type"])] = Condition(
                str(c["type"]),
                c["status"] == "True",
                str(c.get("reason") or ""),
                str(c.get("message") or ""),
                _seconds(c.get("lastTransitionTime"), f"{where}.lastTransitionTime"),
            )
        admission = workload_status.get("admission") or {}
        return cls(
            name,
            str(spec.get("queueName") or ""),
            str(admission.get("clusterQueue") or ""),
            conditions,
            _seconds(meta.get("creationTimestamp"), f"workload {name}: metadata.creationTimestamp"),
        )


def workload_of(rayjob: Mapping[str, Any], workloads: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The Workload Kueue made for `rayjob`: the one it controls (ConstructWorkload sets a controller
    ownerReference to the job); the newest when a queue-name change left an older one being deleted."""
    uid = (rayjob.get("metadata") or {}).get("uid")
    owned = [
        w
        for w in workloads
        if any(
            r.get("uid") == uid and r.get("controller") for r in (w.get("metadata") or {}).get("ownerReferences") or []
        )
        and not (w.get("metadata") or {}).get("deletionTimestamp")
    ]
    if not owned:
        return None
    return max(owned, key=lambda w: ((w.get("metadata") or {}).get("creationTimestamp") or "", w["metadata"]["name"]))


def kueue_managed(rayjob: Mapping[str, Any]) -> bool:
    """A RayJob that Kueue manages: it carries the queue-name label (manageJobsWithoutQueueName off, the default)."""
    return bool(((rayjob.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL))


def our_queue_steps_aside(queue_name: str) -> bool:
    """Whether the operator's own namespace GPU budget and FIFO queue step aside for a sweep: they do when Kueue
    queues it (a queue name, from spec.queueName or the namespace default), so the two never fight over admission.
    The per-sweep caps and the bundle fit still hold."""
    return bool(queue_name)
