"""What a decision depends on, gathered before deciding: the objects read, the clock, today's limits (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sweep_contracts.api import SweepSpec
from sweep_contracts.checkpoint_coverage import CheckpointCoverage
from sweep_contracts.runspec import RunSpec
from sweep_contracts.status_models import SweepStatus

from ..settings import OperatorLimits
from ..status import RayJobFacts, read_status, updated
from ..validation import Sweep


def meta_of(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def status_of(body: Mapping[str, Any]) -> SweepStatus:
    """The sweep's status as the contracts' model (`status.read_status`: a field that does not parse is left out)."""
    return read_status(body.get("status"))


@dataclass(frozen=True, order=True)
class ObjectRef:
    """One object by namespace and name: the work queue's key, the caches' key, the log's name."""

    namespace: str
    name: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> ObjectRef:
        meta = meta_of(body)
        return cls(meta.get("namespace") or "default", meta.get("name", ""))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class RunRef:
    """One run of a sweep (its RayJob and RayClusters carry these labels)."""

    sweep: ObjectRef
    run_id: str


@dataclass(frozen=True)
class SweepFacts:
    """One reconcile pass's view of a sweep: read once, before any decision."""

    body: Mapping[str, Any]
    now: float
    limits: OperatorLimits
    sweep: Sweep | None = None  # parsed with today's limits; None when it does not parse
    problems: tuple[str, ...] = ()  # why it does not parse
    create_retry_at: float | None = None  # the last RayJob create failed; not before this time again
    rayjob: RayJobFacts | None = None  # None: the run's RayJob does not exist
    rayjob_body: Mapping[str, Any] | None = None
    # An ended sweep's RayJob as the watch last saw it (no request is made for an ended sweep): a stop the operator
    # decided but never carried out shows here as a RayJob still running (run_phase.unstopped_rayjob).
    ended_rayjob: Mapping[str, Any] | None = None
    run_spec: RunSpec | None = None  # the spec the run was admitted with (it travels on the RayJob)
    progress: Mapping[str, Any] | None = None  # status fields from the run's _sweep/status.json, polled this pass
    # Trials of that document past spec.checkpoints.warnAfterReports or ended, and those without a committed checkpoint.
    coverage: CheckpointCoverage | None = None
    stopped_at_deadline: bool = False  # _sweep/result.json says Tune's budget ended the run
    diagnosis: str | None = None  # why the cluster does not start (read only when a decision asks: Diagnose)
    # Status fields the run phase judges by another clock (Kueue mode: deadlineAt and startedAt from the time Kueue
    # admitted the run; a None value removes the field). The status as read stays `status`.
    clock: Mapping[str, Any] | None = None

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef.of(self.body)

    # The status as read, parsed once per resourceVersion by the cache (reads.Reads); None: parsed here, once.
    read_status: SweepStatus | None = None

    @cached_property
    def status(self) -> SweepStatus:
        return self.read_status if self.read_status is not None else status_of(self.body)

    @property
    def judged_status(self) -> SweepStatus:
        """The status the run-phase rules judge: the status as read, on `clock` when another clock applies."""
        return updated(self.status, self.clock) if self.clock else self.status

    @property
    def generation(self) -> int | None:
        return meta_of(self.body).get("generation")

    @property
    def admitted_spec(self) -> SweepSpec | None:
        """The run's spec as admitted; today's spec only for runs whose RayJob carries none."""
        if self.run_spec is not None:
            return self.run_spec.spec
        return self.sweep.spec if self.sweep is not None else None


@dataclass(frozen=True)
class DeletionFacts:
    """An object being deleted and what it belongs to, read fresh (the guard never uses cached copies)."""

    kind: str
    body: Mapping[str, Any]
    attempt: int
    sweep: Mapping[str, Any] | None = None  # the TrainingSweep it belongs to (the body itself for a sweep)
    rayjob: Mapping[str, Any] | None = None  # the sweep's RayJob, or the cluster's
