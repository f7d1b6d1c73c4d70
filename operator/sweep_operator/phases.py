"""A sweep's phase transitions in one table (from phases, an observed fact -> phase, reason, condition).

The decisions propose the fact they observed and take the table's answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sweep_contracts.api import RESUMABLE_PHASES, Phase


class Fact(StrEnum):
    """What a decision observed that moves a sweep's phase."""

    # Before a run (the admission): the spec, the caps and budgets, the RayJob's create.
    SPEC_INVALID = "SpecInvalid"
    SUSPEND_ASKED = "SuspendAsked"
    OVER_CAP = "OverCap"
    NO_ROOM = "NoRoom"
    CREATE_FAILED = "CreateFailed"
    NAME_TAKEN = "NameTaken"
    RAYJOB_CREATED = "RayJobCreated"
    # A run: KubeRay's state of its RayJob (the one switch on its deployment status: `kuberay_fact`).
    RAYJOB_STARTING = "RayJobStarting"
    RAYJOB_RUNNING = "RayJobRunning"
    RAYJOB_SUSPENDED = "RayJobSuspended"
    RAYJOB_SUCCEEDED = "RayJobSucceeded"
    RAYJOB_FAILED = "RayJobFailed"
    RAYJOB_DEADLINE = "RayJobDeadline"
    RAYJOB_GONE = "RayJobGone"
    # A run: the operator's own rules over it.
    STOPPED_AT_DEADLINE = "StoppedAtDeadline"
    SWEEP_DEADLINE_PASSED = "SweepDeadlinePassed"
    STARTUP_OVERDUE = "StartupOverdue"
    BUDGET_SPENT = "BudgetSpent"
    # Kueue mode: where Kueue has the run's RayJob.
    KUEUE_QUEUED = "KueueQueued"
    KUEUE_PREEMPTED = "KueuePreempted"
    KUEUE_ADMITTED = "KueueAdmitted"
    # An ended run started again on its run root, and a deletion the guard holds.
    RESUME_STARTED = "ResumeStarted"
    DELETION_STARTED = "DeletionStarted"


@dataclass(frozen=True)
class Transition:
    """One row: `fact` observed in any of `sources` (None: no phase yet) moves the sweep to `to`; `condition` is the
    condition type the decision sets with `reason` (None: the phase alone)."""

    sources: frozenset[Phase | None]
    fact: Fact
    to: Phase
    reason: str
    condition: str | None


# Where each group of facts is observed. An admission decides for a sweep without a run (a fixed spec admits an
# Invalid sweep again); the run's facts, Kueue's and a spent budget only while the run has not ended.
BEFORE_RUN: frozenset[Phase | None] = frozenset({None, Phase.PENDING, Phase.QUEUED, Phase.SUSPENDED, Phase.INVALID})
LIVE: frozenset[Phase | None] = frozenset(
    {None, Phase.PENDING, Phase.QUEUED, Phase.STARTING, Phase.RUNNING, Phase.SUSPENDED, Phase.DELETING}
)
EVERY: frozenset[Phase | None] = frozenset({None, *Phase})
RESUMABLE: frozenset[Phase | None] = frozenset(Phase(p) for p in RESUMABLE_PHASES)


def _rows(sources: frozenset[Phase | None], *rows: tuple[Fact, Phase, str, str | None]) -> tuple[Transition, ...]:
    return tuple(Transition(sources, fact, to, reason, condition) for fact, to, reason, condition in rows)


TABLE: tuple[Transition, ...] = (
    *_rows(
        BEFORE_RUN,
        (Fact.SPEC_INVALID, Phase.INVALID, "Invalid", "Admitted"),
        (Fact.SUSPEND_ASKED, Phase.SUSPENDED, "Suspended", "Admitted"),
        (Fact.OVER_CAP, Phase.INVALID, "OverCap", "Admitted"),
        (Fact.NO_ROOM, Phase.QUEUED, "Queued", "Admitted"),
        (Fact.CREATE_FAILED, Phase.PENDING, "RayJobCreateFailed", "Admitted"),
        (Fact.NAME_TAKEN, Phase.PENDING, "RayJobNameTaken", "Admitted"),
        (Fact.RAYJOB_CREATED, Phase.STARTING, "Admitted", "Admitted"),
    ),
    *_rows(
        LIVE,
        (Fact.RAYJOB_STARTING, Phase.STARTING, "Starting", "Running"),
        (Fact.RAYJOB_RUNNING, Phase.RUNNING, "Running", "Running"),
        (Fact.RAYJOB_SUSPENDED, Phase.SUSPENDED, "Suspended", "Running"),
        (Fact.RAYJOB_SUCCEEDED, Phase.SUCCEEDED, "Succeeded", "Running"),
        (Fact.RAYJOB_FAILED, Phase.FAILED, "Failed", "Running"),
        (Fact.RAYJOB_DEADLINE, Phase.DEADLINE_EXCEEDED, "ActiveDeadlineSeconds", "DeadlineExceeded"),
        (Fact.RAYJOB_GONE, Phase.FAILED, "RayJobDeleted", "Running"),
        (Fact.STOPPED_AT_DEADLINE, Phase.DEADLINE_EXCEEDED, "GracefulStop", "DeadlineExceeded"),
        (Fact.SWEEP_DEADLINE_PASSED, Phase.DEADLINE_EXCEEDED, "SweepDeadline", "DeadlineExceeded"),
        (Fact.STARTUP_OVERDUE, Phase.FAILED, "StartupDeadlineExceeded", "Running"),
        (Fact.BUDGET_SPENT, Phase.BUDGET_EXHAUSTED, "GpuBudgetSpent", "BudgetExhausted"),
        (Fact.KUEUE_QUEUED, Phase.QUEUED, "QueuedByKueue", "Admitted"),
        (Fact.KUEUE_PREEMPTED, Phase.SUSPENDED, "PreemptedByKueue", "Running"),
    ),
    # Kueue admitted a suspended RayJob that KubeRay has not started yet.
    *_rows(frozenset({Phase.SUSPENDED}), (Fact.KUEUE_ADMITTED, Phase.STARTING, "AdmittedByKueue", "Admitted")),
    *_rows(RESUMABLE, (Fact.RESUME_STARTED, Phase.STARTING, "Resumed", None)),
    *_rows(EVERY, (Fact.DELETION_STARTED, Phase.DELETING, "Deleting", None)),
)
# The ways out of an ended run the design allows: a fixed spec (an Invalid sweep admitted again), a resume, a deletion.
TERMINAL_EXITS: frozenset[Fact] = frozenset(
    {
        Fact.SPEC_INVALID,
        Fact.SUSPEND_ASKED,
        Fact.OVER_CAP,
        Fact.NO_ROOM,
        Fact.CREATE_FAILED,
        Fact.NAME_TAKEN,
        Fact.RAYJOB_CREATED,
        Fact.RESUME_STARTED,
        Fact.DELETION_STARTED,
    }
)
_BY_FACT: dict[Fact, Transition] = {row.fact: row for row in TABLE}


def transition(fact: Fact) -> Transition:
    """The table's row for `fact` (each fact has one)."""
    return _BY_FACT[fact]


def to(fact: Fact) -> Phase:
    """The phase `fact` moves a sweep to."""
    return _BY_FACT[fact].to


def allowed(current: str | None, fact: Fact) -> bool:
    """Whether the table lets `fact` move a sweep out of `current`."""
    return (Phase(current) if current else None) in _BY_FACT[fact].sources
