"""Kueue mode, decided from facts (pure): where Kueue has a sweep's RayJob, the text its status shows for it, and its
admitted time (its deadline counts only while admitted).

Kueue sources (kubernetes-sigs/kueue): pkg/controller/jobframework/reconciler.go `ReconcileGenericJob` (eviction ->
stopJob suspends the RayJob; admission -> startJob unsuspends it), pkg/workload/workload.go `SetQuotaReservation`,
`UnsetQuotaReservationWithCondition`, pkg/workload/admissionchecks.go `SyncAdmittedCondition`, pkg/workload/evict
`SetEvictedCondition`; site/content/en/docs/tasks/run/rayjobs.md.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sweep_contracts.api import TERMINAL_PHASES
from sweep_contracts.runtime_env import deadline_of
from sweep_contracts.runtime_env import encode as encode_runtime_env
from sweep_contracts.status_models import KueueStatus, SweepStatus

from ..phases import Fact, allowed, to, transition
from ..policy import Admit, Reject, bundle_fit_problems, cap_problems, demand_of, effective_active_seconds
from ..run_metadata import PRIORITY_CLASS_LABEL as PRIORITY_CLASS_LABEL
from ..run_metadata import QUEUE_LABEL as QUEUE_LABEL
from ..run_metadata import queue_name_for as queue_name_for
from ..status import StatusChanges, rfc3339, unreadable_fields, updated
from .actions import SetRuntimeEnv
from .facts import SweepFacts, meta_of
from .workloads import (
    ADMITTED,
    EVICTED,
    FINISHED,
    QUOTA_RESERVED,
    KueueError,
    WorkloadFacts,
    _seconds,
    workload_of,
)
from .workloads import kueue_managed as kueue_managed  # re-exported: the deletion pipeline names it here

# ----------------------------------------------------------------------------------------------------------- admission


def decide_kueue_admission(spec: Any, limits: Any) -> Admit | Reject:
    """Admission in Kueue mode: only what the sweep asks for itself is judged (caps, bundle fit); Kueue decides
    when it runs, so there is no Queue outcome."""
    # the namespace budget steps aside, so its "could never be admitted" check does too (Kueue's quota decides)
    per_sweep = dataclasses.replace(
        limits, max_gpus_per_namespace=max(limits.max_gpus_per_namespace, demand_of(spec).gpus, 1)
    )
    problems = cap_problems(spec, per_sweep) + bundle_fit_problems(spec)
    if problems:
        return Reject(tuple(problems))
    return Admit(demand_of(spec))


# ------------------------------------------------------------------------------------------------------------ where


class KueuePhase(enum.StrEnum):
    WAITING_FOR_WORKLOAD = "WaitingForWorkload"  # the RayJob exists, Kueue has not made its Workload yet
    QUEUED = "Queued"  # the Workload waits for quota
    ADMITTED = "Admitted"  # Admitted=True: Kueue unsuspends (or has unsuspended) the RayJob
    PREEMPTED = "Preempted"  # suspended again after an admission: stopping, or waiting to be readmitted
    FINISHED = "Finished"


@dataclass(frozen=True)
class KueueFacts:
    local_queue: str  # the RayJob's queue-name label
    rayjob_suspended: bool  # RayJob spec.suspend
    deployment_status: str  # RayJob status.jobDeploymentStatus
    workload: WorkloadFacts | None
    ever_admitted: bool = False  # the sweep's recorded clock has seen an admission


@dataclass(frozen=True)
class KueueView:
    phase: KueuePhase
    message: str
    admitted_at: float | None = None  # when the current admission began (Admitted's lastTransitionTime)
    stopped_at: float | None = None  # when the admission ended (Evicted's, else QuotaReserved False's transition)
    stop_reason: str = ""  # Evicted's reason (Preempted, PodsReadyTimeout, ...) or the QuotaReserved reason
    cluster_queue: str = ""

    @property
    def admitted(self) -> bool:
        return self.phase is KueuePhase.ADMITTED

    summary: str = ""  # the short form, for the printer column (`Queued (Kueue: <LocalQueue>)`)


def queued_text(local_queue: str) -> str:
    return f"Queued (Kueue: {local_queue})"


def kueue_view(facts: KueueFacts) -> KueueView:
    """Where Kueue has the sweep's RayJob and what its status says about it.

    Admitted: Admitted=True (reconciler.go step 7 then unsuspends the RayJob). Preempted: the RayJob was admitted
    before and is suspended again or its Workload evicted (step 6 stopJob suspends it; KubeRay then deletes the
    cluster, which the checkpoint guard holds until the checkpoints are verified). Queued: anything else before
    an admission, with Kueue's own reason (the QuotaReserved=False message the scheduler writes).
    """
    wl = facts.workload
    lq = facts.local_queue or (wl.queue_name if wl else "")
    if wl is None:
        return KueueView(
            KueuePhase.WAITING_FOR_WORKLOAD,
            f"{queued_text(lq)}: waiting for Kueue to create the Workload for the suspended RayJob",
            summary=queued_text(lq),
        )
    if wl.finished:  # Finish sets only Finished: an admission before it keeps Admitted=True (finish.go Finish)
        admitted, finished = wl.condition(ADMITTED), wl.condition(FINISHED)
        return KueueView(
            KueuePhase.FINISHED,
            f"Kueue: Workload {wl.name} finished",
            admitted_at=admitted.at if admitted is not None and admitted.status else None,
            stopped_at=finished.at if finished is not None else None,
            cluster_queue=wl.cluster_queue,
            summary="Finished (Kueue)",
        )
    if wl.evicted:  # until the next SetQuotaReservation resets it, even while Admitted is still True
        return _preempted(facts, wl, lq)
    if wl.admitted:
        admitted = wl.condition(ADMITTED)
        return KueueView(
            KueuePhase.ADMITTED,
            f"Admitted by Kueue: ClusterQueue {wl.cluster_queue} (LocalQueue {lq})",
            admitted_at=admitted.at if admitted else None,
            cluster_queue=wl.cluster_queue,
            summary=f"Admitted (Kueue: {lq})",
        )
    if facts.ever_admitted:
        return _preempted(facts, wl, lq)
    reserved = wl.condition(QUOTA_RESERVED)
    why = reserved.message if reserved is not None and not reserved.status and reserved.message else ""
    if reserved is not None and reserved.status:
        why = f"{reserved.message}; waiting for admission checks"
    return KueueView(
        KueuePhase.QUEUED,
        f"{queued_text(lq)}: {why or 'waiting for the ClusterQueue to evaluate it'}",
        stop_reason=reserved.reason if reserved else "",
        summary=queued_text(lq),
    )


def _preempted(facts: KueueFacts, wl: WorkloadFacts, lq: str) -> KueueView:
    evicted = wl.condition(EVICTED)
    reserved = wl.condition(QUOTA_RESERVED)
    if evicted is not None and evicted.status:
        stopped_at, reason, why = evicted.at, evicted.reason, evicted.message
    else:
        stopped_at = reserved.at if reserved is not None and not reserved.status else None
        reason, why = (reserved.reason, reserved.message) if reserved is not None else ("", "")
    if facts.deployment_status in ("Suspended", "New", ""):
        state = "waiting to be readmitted"
        if reserved is not None and not reserved.status and reserved.message and reserved.message != why:
            state += f" ({reserved.message})"
    else:
        state = "the RayCluster is released once its checkpoints are verified"
    text = f"Preempted (Kueue: {lq}): {why or 'the Workload lost its admission'}; {state}"
    admitted = wl.condition(ADMITTED)  # still True until Kueue unsets the reservation (evict.go, then requeue)
    return KueueView(
        KueuePhase.PREEMPTED,
        text,
        admitted_at=admitted.at if admitted is not None and admitted.status else None,
        stopped_at=stopped_at,
        stop_reason=reason,
        cluster_queue=wl.cluster_queue,
        summary=f"Preempted (Kueue: {lq})",
    )


# ------------------------------------------------------------------------------------------------------ admitted time


@dataclass(frozen=True)
class AdmittedTime:
    """The sweep's time under Kueue admission: closed intervals summed, plus the open one. Recorded in the sweep's
    status (status.kueue) so an operator restart keeps it."""

    seconds: float = 0.0  # sum of the closed admitted intervals
    since: float | None = None  # start of the open interval (None: not admitted now)
    admissions: int = 0
    preemptions: int = 0
    first_admitted_at: float | None = None
    last_admission_at: float | None = None  # Kueue's Admitted time of the last admission counted (its identity)

    def active_seconds(self, now: float) -> float:
        return self.seconds + (max(now - self.since, 0.0) if self.since is not None else 0.0)

    def remaining_seconds(self, budget: float, now: float) -> float:
        return budget - self.active_seconds(now)

    def deadline_at(self, budget: float, now: float) -> float | None:
        """When the sweep's active time runs out if it stays admitted; None while paused (not admitted)."""
        if self.since is None:
            return None
        return self.since + (budget - self.seconds)

    def startup_deadline_at(self, startup_seconds: float) -> float | None:
        """The startup deadline starts at (each) admission, not at the sweep's creation."""
        return None if self.since is None else self.since + startup_seconds

    def to_status(self) -> KueueStatus:
        """The clock's fields of status.kueue (unset: None, removed by the write)."""
        return KueueStatus(
            admitted_seconds=int(self.seconds),
            admitted_since=rfc3339(self.since) if self.since is not None else None,
            admissions=self.admissions,
            preemptions=self.preemptions,
            first_admitted_at=rfc3339(self.first_admitted_at) if self.first_admitted_at is not None else None,
            last_admission_at=rfc3339(self.last_admission_at) if self.last_admission_at is not None else None,
        )

    def counted(self, admitted_at: float) -> bool:
        """Whether the admission Kueue made at `admitted_at` is in the clock. A clock recorded before the field
        existed counts every admission it saw and says nothing of which: one with admissions is taken as complete."""
        if self.last_admission_at is None:
            return self.admissions > 0
        return admitted_at <= self.last_admission_at

    @classmethod
    def from_status(cls, kueue: KueueStatus | None) -> AdmittedTime:
        """The clock as status.kueue records it. The model has the types; what it cannot say (a count below zero, a
        time that does not read) names the field."""
        if kueue is None:
            return cls()
        where = "status.kueue"
        seconds = kueue.admitted_seconds or 0
        if seconds < 0:
            raise KueueError(f"{where}.admittedSeconds: got {seconds!r}; expected a number >= 0")
        for key, value in (("admissions", kueue.admissions or 0), ("preemptions", kueue.preemptions or 0)):
            if value < 0:
                raise KueueError(f"{where}.{key}: got {value!r}; expected an integer >= 0")
        return cls(
            float(seconds),
            _seconds(kueue.admitted_since, f"{where}.admittedSince"),
            kueue.admissions or 0,
            kueue.preemptions or 0,
            _seconds(kueue.first_admitted_at, f"{where}.firstAdmittedAt"),
            _seconds(kueue.last_admission_at, f"{where}.lastAdmissionAt"),
        )


def advance_admitted_time(clock: AdmittedTime, view: KueueView, now: float) -> AdmittedTime:
    """Open an interval at the admission, close it when the admission ends; a paused sweep's clock stands still.

    The interval's ends come from Kueue's own transition times (Admitted's, Evicted's) when they are known and
    plausible, so a reconcile that comes late does not stretch or shrink the admitted time; `now` otherwise."""
    if view.admitted:
        if clock.since is not None:
            return clock
        return _admitted(clock, view.admitted_at, now)
    if clock.since is None:
        missed = view.admitted_at if view.phase in (KueuePhase.FINISHED, KueuePhase.PREEMPTED) else None
        if missed is None or clock.counted(missed):
            return clock
        # Admitted, then finished or evicted, between two passes (a short attempt, a busy operator): the interval
        # Kueue's own times give, counted once (`last_admission_at`), so neither the admission nor its time is lost.
        clock = _admitted(clock, missed, now)
    since = clock.since if clock.since is not None else now
    end = view.stopped_at if view.stopped_at is not None and since <= view.stopped_at <= now else now
    preempted = view.phase is KueuePhase.PREEMPTED
    return replace(
        clock,
        seconds=clock.seconds + (end - since),
        since=None,
        preemptions=clock.preemptions + (1 if preempted else 0),
    )


def _admitted(clock: AdmittedTime, admitted_at: float | None, now: float) -> AdmittedTime:
    """The clock with an admission opened at Kueue's Admitted time (`now` when unknown or in the future)."""
    start = admitted_at if admitted_at is not None and admitted_at <= now else now
    return replace(
        clock,
        since=start,
        admissions=clock.admissions + 1,
        first_admitted_at=clock.first_admitted_at if clock.first_admitted_at is not None else start,
        last_admission_at=admitted_at if admitted_at is not None else start,
    )


def driver_deadline_at(clock: AdmittedTime, budget: float, now: float) -> float:
    """SWEEP_DEADLINE_AT for the attempt that starts next: while the RayJob waits suspended (queued or preempted),
    `now` + what is left, refreshed by the reconcile, so a readmitted attempt never runs past the admitted budget
    (KubeRay starts it from the RayJob's runtimeEnvYAML the moment Kueue unsuspends it)."""
    deadline = clock.deadline_at(budget, now)
    return deadline if deadline is not None else now + max(clock.remaining_seconds(budget, now), 0.0)


# ------------------------------------------------------------------------------------------------ one reconcile pass


@dataclass(frozen=True)
class KueueRun:
    """A Kueue run as one pass sees it: where Kueue has it and the admitted clock after this pass."""

    local_queue: str
    workload: str
    view: KueueView
    before: AdmittedTime
    clock: AdmittedTime
    active_seconds: float  # the sweep's budget of admitted time (effective activeSeconds)

    def status(self) -> KueueStatus:
        """status.kueue."""
        return self.clock.to_status().model_copy(
            update={
                "local_queue": self.local_queue,
                "cluster_queue": self.view.cluster_queue or None,
                "workload": self.workload or None,
                "state": self.view.phase.value,
                "summary": self.view.summary,
            }
        )


def kueue_run(
    status: SweepStatus,
    rayjob: Mapping[str, Any] | None,
    workloads: Sequence[Mapping[str, Any]],
    now: float,
    active_seconds: float,
) -> KueueRun | None:
    """None unless the run's RayJob is Kueue's (the queue-name label decides, as it does for Kueue)."""
    if rayjob is None or not kueue_managed(rayjob):
        return None
    queue = str(((rayjob.get("metadata") or {}).get("labels") or {})[QUEUE_LABEL])
    body = workload_of(rayjob, workloads)
    wl = WorkloadFacts.from_object(body) if body is not None else None
    before = AdmittedTime.from_status(status.kueue)
    facts = KueueFacts(
        queue,
        bool((rayjob.get("spec") or {}).get("suspend")),
        str((rayjob.get("status") or {}).get("jobDeploymentStatus") or ""),
        wl,
        ever_admitted=before.admissions > 0,
    )
    view = kueue_view(facts)
    return KueueRun(
        queue, wl.name if wl else "", view, before, advance_admitted_time(before, view, now), active_seconds
    )


def workloads_wanted(facts: SweepFacts) -> str | None:
    """The namespace whose Workloads a pass must read: a Kueue RayJob's (None: not Kueue's, nothing to read)."""
    rayjob, spec = facts.rayjob_body, facts.admitted_spec
    if rayjob is None or spec is None or not kueue_managed(rayjob):
        return None
    return facts.ref.namespace


def kueue_run_of(facts: SweepFacts, workloads: Sequence[Mapping[str, Any]]) -> KueueRun | None:
    """Where Kueue has the run's RayJob (None: not Kueue's), from its namespace's Workloads as read at the edge
    (where `workloads_wanted` asked for them)."""
    rayjob, spec = facts.rayjob_body, facts.admitted_spec
    if rayjob is None or spec is None or workloads_wanted(facts) is None:
        return None
    if "kueue" in unreadable_fields(facts.body.get("status"), facts.status):
        # The admitted clock is what the deadline counts: one that cannot be read is never taken for none (zero).
        raise KueueError("status.kueue: does not parse as the status schema's kueue object; the run's clock is unknown")
    active = float(effective_active_seconds(spec, facts.limits))
    return kueue_run(facts.status, rayjob, workloads, facts.now, active)


def run_clock(run: KueueRun, now: float) -> StatusChanges:
    """The status fields the run-phase rules judge on Kueue's clock (`SweepFacts.clock`): `deadlineAt` from the
    admitted time (None, removed, while Kueue holds the sweep, so no deadline passes then), `startedAt` at the current
    admission (the startup clock starts there, not at the sweep's creation)."""
    deadline = run.clock.deadline_at(run.active_seconds, now)
    changes: dict[str, Any] = {"deadlineAt": rfc3339(deadline) if deadline is not None else None}
    if run.clock.since is not None:
        changes["startedAt"] = rfc3339(run.clock.since)
    return changes


def status_for_run_phase(status: SweepStatus, run: KueueRun, now: float) -> SweepStatus:
    """The status the run-phase decision judges in Kueue mode."""
    return updated(status, run_clock(run, now))


SUSPEND_IN_KUEUE_MODE = (
    "spec.suspend is not applied to a Kueue RayJob: Kueue controls its spec.suspend (it would undo the change). "
    "To hold the sweep, deactivate its Workload: kubectl patch workloads.kueue.x-k8s.io {workload} --type merge "
    '-p \'{{"spec":{{"active":false}}}}\''
)


@dataclass(frozen=True)
class KueueOutcome:
    """What Kueue mode makes of one pass's run-phase result."""

    status: SweepStatus
    conditions: tuple[tuple[str, bool, str, str], ...]  # for status.conditions_with
    events: tuple[tuple[str, str, str], ...]  # (type, reason, message)
    drop_suspend: bool  # Kueue controls spec.suspend: the operator's SetSuspend must not be sent
    driver_deadline_at: float | None  # rewrite the RayJob's SWEEP_DEADLINE_AT to this (None: leave it)


def kueue_outcome(
    previous: SweepStatus,
    decided: SweepStatus,
    run: KueueRun,
    now: float,
    *,
    rayjob_deadline_at: float | None = None,
    tolerance_seconds: float = 30.0,
) -> KueueOutcome:
    """Kueue mode over the run-phase result `decided` (the status the pass would write):

    - queued (no Workload yet, or waiting for quota): phase Queued, `Queued (Kueue: <LocalQueue>): <Kueue's
      admission message>`; preempted: phase Suspended, `Preempted (Kueue: ...)` and a Warning Event once; admitted
      while KubeRay has not started yet: Starting;
    - `deadlineAt` from the admitted time (absent while paused), `startedAt` at the first admission,
      status.kueue with the clock;
    - the RayJob's SWEEP_DEADLINE_AT kept at now + the admitted time left while it waits suspended.
    A terminal phase is left as decided (only status.kueue is refreshed)."""
    view, clock = run.view, run.clock
    changes: dict[str, Any] = {"kueue": run.status()}  # a clock field unset is removed by the write
    deadline = clock.deadline_at(run.active_seconds, now)
    terminal = decided.phase in TERMINAL_PHASES
    conditions: list[tuple[str, bool, str, str]] = []
    events: list[tuple[str, str, str]] = []
    was = (previous.kueue.state if previous.kueue else None) or ""
    if not terminal:
        changes["deadlineAt"] = rfc3339(deadline) if deadline is not None else None
        first = clock.first_admitted_at
        changes["startedAt"] = rfc3339(first) if first is not None else None
        if view.phase in (KueuePhase.WAITING_FOR_WORKLOAD, KueuePhase.QUEUED):
            queued = transition(Fact.KUEUE_QUEUED)
            changes.update(phase=queued.to, message=view.message)
            conditions += [
                (queued.condition or "", False, queued.reason, view.message),
                ("Running", False, queued.reason, view.summary),
            ]
        elif view.phase is KueuePhase.PREEMPTED:
            preempted = transition(Fact.KUEUE_PREEMPTED)
            changes.update(phase=preempted.to, message=view.message)
            conditions.append((preempted.condition or "", False, preempted.reason, view.message))
            if was != KueuePhase.PREEMPTED.value:
                events.append(("Warning", "PreemptedByKueue", view.message))
        elif view.phase is KueuePhase.ADMITTED:
            text = f"admitted by Kueue: ClusterQueue {view.cluster_queue} (LocalQueue {run.local_queue})"
            conditions.append(("Admitted", True, "AdmittedByKueue", text))
            if was != KueuePhase.ADMITTED.value:
                events.append(("Normal", "AdmittedByKueue", text))
            if allowed(decided.phase, Fact.KUEUE_ADMITTED):  # KubeRay has not unsuspended it yet
                changes.update(phase=to(Fact.KUEUE_ADMITTED), message=f"{text}; KubeRay is starting the RayCluster")
    elif previous.deadline_at and not decided.deadline_at:
        changes["deadlineAt"] = previous.deadline_at  # the deadline it ran under (the run-phase pass saw none)
    refresh: float | None = None
    if not terminal and not view.admitted:
        wanted = driver_deadline_at(clock, run.active_seconds, now)
        if rayjob_deadline_at is None or abs(rayjob_deadline_at - wanted) > tolerance_seconds:
            refresh = wanted
    return KueueOutcome(
        updated(decided, changes), tuple(conditions), tuple(events), drop_suspend=True, driver_deadline_at=refresh
    )


def outcome_of(facts: SweepFacts, decided: SweepStatus, run: KueueRun, *, reconcile_seconds: float) -> KueueOutcome:
    """`kueue_outcome` for this pass: the status as read before, the status the other rules `decided`, and the
    driver's deadline as the RayJob carries it."""
    return kueue_outcome(
        facts.status,
        decided,
        run,
        facts.now,
        rayjob_deadline_at=deadline_of(facts.rayjob_body or {}),
        tolerance_seconds=max(3 * reconcile_seconds, 5.0),
    )


def driver_runtime_env(facts: SweepFacts, outcome: KueueOutcome) -> SetRuntimeEnv | None:
    """The rewrite that keeps the waiting RayJob's SWEEP_DEADLINE_AT current (None: none is due): KubeRay starts the
    readmitted attempt from the RayJob's runtimeEnvYAML the moment Kueue unsuspends it."""
    rayjob = facts.rayjob_body or {}
    run_spec = facts.run_spec  # the operator's, checked against its digest (never a rewritten one re-encoded)
    if outcome.driver_deadline_at is None or run_spec is None:
        return None
    return SetRuntimeEnv(meta_of(rayjob)["name"], encode_runtime_env(run_spec, int(outcome.driver_deadline_at)))


def kueue_created_status(status: SweepStatus, local_queue: str) -> SweepStatus:
    """Right after the operator created a Kueue RayJob: Queued, no deadline yet (it starts at admission)."""
    text = f"{queued_text(local_queue)}: waiting for Kueue to create the Workload for the suspended RayJob"
    return updated(
        status,
        deadline_at=None,
        started_at=None,
        phase=to(Fact.KUEUE_QUEUED),
        message=text,
        kueue=KueueStatus(
            local_queue=local_queue,
            state=KueuePhase.WAITING_FOR_WORKLOAD.value,
            summary=queued_text(local_queue),
            admitted_seconds=0,
            admissions=0,
            preemptions=0,
        ),
    )
