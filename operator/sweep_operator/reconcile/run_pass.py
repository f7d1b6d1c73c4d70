"""A pass's one decision (pure), over facts read before deciding: this module alone combines the rules' answers into one
`Decision`, and says which wins where two meet.

An admission: the admission rules, then the namespace's budgets. An admitted sweep: a pending resume first, then the
run-phase rules, the GPU-hour measurement and Kueue mode, in this order; each rule returns data (a status, a
measurement, a Kueue outcome).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sweep_contracts.api import Phase
from sweep_contracts.status_models import NamespaceUsageStatus

from ..policy import AdmissionDecision, Admit
from ..rendering import RenderContext
from ..status import conditions_with, is_terminal, updated
from . import admission, attempts, hours_ledger, idle_gpus, kueue, resume, run_phase, usage
from .actions import (
    Action,
    CreateRayJob,
    Decision,
    DeleteRayJob,
    Diagnose,
    Event,
    Finish,
    RecordDeadlineStop,
    RecordGpuHours,
    RecordIdleGpus,
    ReleaseBudget,
    ReserveBudget,
    SetSuspend,
)
from .facts import SweepFacts, meta_of

INITIAL_ATTEMPT = "initial"  # a first admission's GPU-hour reservation; a resume's is "resume-<n>"


@dataclass(frozen=True)
class BudgetReads:
    """What the namespace's budgets answered, read for one attempt's spec: the GPU caps' (or Kueue's) answer, the
    namespace's GPUs in use, and its GPU-hour ledger (None: no namespace budget, or the caps did not admit)."""

    caps: Any  # policy.Admit, Queue or Reject
    in_use: str  # `<GPUs admitted>/<maxGpusPerNamespace>`
    hours: hours_ledger.HoursLedger | None
    limits: Any  # settings.OperatorLimits


@dataclass(frozen=True)
class PodsRead:
    """The run's GPU pods read this pass (docs/budgets.md), and the namespace's window they are judged against."""

    pods: Sequence[Mapping[str, Any]]
    clusters: frozenset[str]
    window: (
        NamespaceUsageStatus | None
    )  # the namespace ledger's view (status.usage.namespace); None: no namespace budget
    reservation: usage.ReservationFacts | None  # this attempt's reservation in that window
    record: bool  # the namespace has a GPU-hour budget: the sweep's record is copied into its ledger
    previous_look: float | None = None  # when the pass before this one read the pods (None: this is the first)


@dataclass(frozen=True)
class ResumeRead:
    """What an ended sweep's pending resume read: the run's records and verification (resume.ResumeReads), and the
    namespace's budgets for the attempt it would start (None: the decision does not get that far)."""

    records: resume.ResumeReads
    budgets: BudgetReads | None = None


@dataclass(frozen=True)
class RunReads:
    """What a run pass reads beside `SweepFacts`: where Kueue has the run, the pods measured (None: not due), a
    pending resume's reads (None: none pending) and the sweep's Kueue LocalQueue (None: not in Kueue mode)."""

    kueue: kueue.KueueRun | None = None
    pods: PodsRead | None = None
    resume: ResumeRead | None = None
    queue: str | None = None


# A budget stop replaces the run phase's own way of ending the run.
_ENDING = (DeleteRayJob, ReleaseBudget, Finish)


# ---------------------------------------------------------------------------------------------- an admission
def decide_admit_pass(facts: SweepFacts, budgets: BudgetReads | None, context: RenderContext) -> Decision:
    """A sweep without a run: decided before the budgets (`budgets` None: not read, `admission.asks_budgets`), or
    on their answer: a status, or the run's RayJob to create, after the record of the answer (a ReserveBudget)."""
    decision = admission.decide_before_budget(facts)
    if decision is not None:
        return decision
    assert facts.sweep is not None and budgets is not None, "admission.asks_budgets: the budgets are read"
    spec = facts.sweep.spec
    decision = admission.decide_after_budget(facts, budgets.caps, budgets.in_use, context)
    admitted = decision.wants(CreateRayJob) is not None
    hours = hours_decision(facts, budgets, spec, INITIAL_ATTEMPT, context) if admitted else None
    if hours is not None:  # GPU-hours: refused, or queued until the namespace's window frees up
        decision, admitted = hours, False
    return replace(decision, actions=(ReserveBudget(spec, INITIAL_ATTEMPT, admitted), *decision.actions))


def hours_decision(
    facts: SweepFacts, budgets: BudgetReads, spec: Any, attempt: str, context: RenderContext
) -> Decision | None:
    """The GPU-hour check beside the GPU caps, over the ledger read: None admits; else the Invalid or Queued
    decision (docs/budgets.md). `spec` is the attempt's: its deadlines make its worst case."""
    uid, ledger = str(meta_of(facts.body).get("uid") or ""), budgets.hours

    def reserve(ask: usage.GpuHourAsk) -> AdmissionDecision:
        assert ledger is not None
        answer, _ = reservation(ask, uid=uid, name=facts.ref.name, attempt=attempt, now=facts.now)(ledger)
        return answer

    answer = usage.decide_gpu_hour_answer(
        facts, budgets.caps, budgets.limits, reserve if ledger is not None and uid else None, spec=spec
    )
    return None if answer is None else admission.decide_after_budget(facts, answer, budgets.in_use, context)


def reservation(
    ask: usage.GpuHourAsk, *, uid: str, name: str, attempt: str, now: float
) -> Callable[[hours_ledger.HoursLedger], tuple[AdmissionDecision, hours_ledger.HoursLedger | None]]:
    """The namespace ledger's decision on an attempt's ask (hours_ledger.decide_reservation): decided over the ledger
    read for the pass's decision, and again over the ledger its record is written onto (`Budgets.reserve`)."""
    return lambda ledger: hours_ledger.decide_reservation(
        ledger,
        uid=uid,
        name=name,
        attempt=attempt,
        worst_case=ask.worst_case,
        run_until_exhausted=ask.run_until_exhausted,
        sweep_left=ask.sweep_left,
        now=now,
        worst_case_text=ask.worst_case_text,
    )


# ---------------------------------------------------------------------------------------------- an admitted sweep
def decide_run_pass(
    facts: SweepFacts,
    reads: RunReads,
    *,
    reconcile_seconds: float,
    refresh_seconds: float,
    context: RenderContext | None = None,
    max_active_seconds: int | None = None,
) -> Decision:
    """The new status and actions of an admitted sweep. A pending resume that starts an attempt (or is refused)
    is the pass's decision; one that waits for the namespace's budgets records their answer before the run pass's
    actions. A Decision asking for `Diagnose` asks only that: the controller reads the startup diagnosis into
    `facts.diagnosis` and asks again (the one second ask)."""
    reserve: tuple[ReserveBudget, ...] = ()
    if reads.resume is not None:
        resumed, reserve = decide_resume(
            facts, reads.resume, reads.queue, context=context or RenderContext(), max_active_seconds=max_active_seconds
        )
        if resumed is not None:
            return replace(resumed, actions=(*reserve, *resumed.actions))
    decision = run_phase.decide_run(facts)
    if decision.wants(Diagnose) is not None:
        return decision
    decision = decide_measured(facts, decision, reads.pods, refresh_seconds=refresh_seconds)
    if reads.kueue is not None:
        decision = in_kueue_mode(facts, decision, reads.kueue, reconcile_seconds=reconcile_seconds)
    decision = unscheduled_measured(facts, decision, reads.pods)
    return replace(decision, actions=(*reserve, *decision.actions)) if reserve else decision


def decide_resume(
    facts: SweepFacts, read: ResumeRead, queue: str | None, *, context: RenderContext, max_active_seconds: int | None
) -> tuple[Decision | None, tuple[ReserveBudget, ...]]:
    """An ended sweep's pending resume (resume.resume_step) over what was read, and the record of the budgets'
    answer when it asked them (the attempt's own deadline makes its worst case; its reservation is `resume-<n>`).
    In Kueue mode a started attempt waits Queued: Kueue admits it."""
    asked: list[ReserveBudget] = []

    def admit(sweep: Any, start: Any) -> str | None:
        assert read.budgets is not None, "the reads asked the budgets for the attempt the decision starts"
        spec = attempts.attempt_sweep(sweep, start).spec
        attempt = f"resume-{start.attempt}"
        caps = read.budgets.caps
        hours = hours_decision(facts, read.budgets, spec, attempt, context) if isinstance(caps, Admit) else None
        refusal = attempts.budget_refusal(caps, hours)
        asked.append(ReserveBudget(spec, attempt, admitted=refusal is None))
        return refusal

    resumed = resume.resume_step(
        facts.body,
        facts.sweep,
        read.records,
        admit,
        now=facts.now,
        context=context,
        max_active_seconds=max_active_seconds,
        status=facts.status,
    )
    if resumed is not None and queue and resumed.status and resumed.status.phase == Phase.STARTING:
        resumed = replace(resumed, status=kueue.kueue_created_status(resumed.status, queue))
    return resumed, tuple(asked[-1:])


def decide_measured(
    facts: SweepFacts, decision: Decision, pods: PodsRead | None, *, refresh_seconds: float
) -> Decision:
    """The measurement's part: status.usage, the thresholds' Events, a spent budget's stop (phase BudgetExhausted,
    which wins over the run phase's own ending) and the record for the namespace's ledger. Also the whole decision
    of a sweep the guard holds (`decision` empty)."""
    if pods is None:
        return decision
    status = decision.status if decision.status is not None else facts.judged_status
    measured = usage.measure_pass(
        facts, status, pods.pods, pods.clusters, pods.window, pods.reservation, refresh_seconds=refresh_seconds
    )
    changes: dict[str, Any] = {} if measured.usage is None else {"usage": measured.usage}
    actions: list[Action] = list(decision.actions)
    if measured.facts.stop and not is_terminal(status.phase) and facts.rayjob is not None:
        changes.update(run_phase.budget_exhausted(facts, status, measured.facts.stop_reason))
        actions = [a for a in actions if not isinstance(a, _ENDING)]
        actions.extend(run_phase.stop_actions(facts.rayjob.name))
    new = updated(status, changes) if changes or measured.events else decision.status
    if pods.record:  # every GPU-second into the namespace's ledger, which outlives the sweep
        recorded = new if new is not None else status
        actions.insert(0, RecordGpuHours(recorded.usage, is_terminal(recorded.phase)))
    return Decision(new, tuple(actions), (*decision.events, *(Event(*e) for e in measured.events)))


def in_kueue_mode(facts: SweepFacts, decision: Decision, run: kueue.KueueRun, *, reconcile_seconds: float) -> Decision:
    """Kueue's part: its phase, conditions and Events over the status decided so far; Kueue owns spec.suspend, so
    no SetSuspend (a Warning says so); a SetRuntimeEnv first keeps the waiting RayJob's SWEEP_DEADLINE_AT current."""
    decided = decision.status if decision.status is not None else facts.status
    outcome = kueue.outcome_of(facts, decided, run, reconcile_seconds=reconcile_seconds)
    status = outcome.status
    if outcome.conditions:
        status = updated(status, conditions=conditions_with(status, facts.generation, facts.now, *outcome.conditions))
    events = [*decision.events, *(Event(*e) for e in outcome.events)]
    actions: list[Action] = [a for a in decision.actions if not isinstance(a, SetSuspend)]
    if len(actions) != len(decision.actions):
        message = kueue.SUSPEND_IN_KUEUE_MODE.format(workload=run.workload or "<workload>")
        events.append(Event("Warning", "SuspendIgnoredInKueueMode", message))
    env = kueue.driver_runtime_env(facts, outcome)
    if env is not None:  # sent before the other actions and the write
        actions.insert(0, env)
    return Decision(status, tuple(actions), tuple(events))


def unscheduled_measured(facts: SweepFacts, decision: Decision, pods: PodsRead | None) -> Decision:
    """GPU workers up beyond what the running trials the driver's status shows use (`unscheduled-trials`: none
    running, or fewer than the workers hold), counted between this look at the pods and the one before, into
    status.idleGpuSeconds and the idle-GPU metric."""
    if pods is None:
        return decision
    status = decision.status if decision.status is not None else facts.status
    spec = facts.admitted_spec
    per_trial = spec.trial.workers * spec.trial.resources_per_worker.gpu if spec is not None else 0
    held = idle_gpus.unscheduled_gpu_seconds(
        status, pods.pods, pods.previous_look, facts.now, gpus_per_trial=float(per_trial)
    )
    if held <= 0:
        return decision
    changes = idle_gpus.idle_status(status, idle_gpus.UNSCHEDULED_TRIALS, held)
    record = RecordIdleGpus(idle_gpus.UNSCHEDULED_TRIALS, held)
    return replace(decision, status=updated(status, changes), actions=(*decision.actions, record))


def decide_held_pass(facts: SweepFacts, pods: PodsRead | None, *, refresh_seconds: float) -> Decision:
    """A sweep whose deletion the guard holds keeps its GPU-hour budget, its deadline and its measuring (its RayJob
    runs until the guard releases the sweep): the usage record and the ledger's copy, and a stop (a spent budget,
    or the deadline and its graceful window passed) with a StoppedWhileHeld Event. Nothing else of the run phase."""
    measured = decide_measured(facts, Decision(None), pods, refresh_seconds=refresh_seconds)
    stops = [a for a in measured.actions if isinstance(a, DeleteRayJob)]
    why = "its GPU-hour budget is spent" if stops else ""
    counted: tuple[Action, ...] = ()
    if not stops and facts.rayjob is not None and run_phase.deadline_stop_while_held(facts):
        stops, why = [DeleteRayJob(facts.rayjob.name)], f"its deadline {facts.status.deadline_at} passed"
        counted = (RecordDeadlineStop(),)
    events = tuple(
        Event("Warning", "StoppedWhileHeld", f"RayJob {stop.name} stopped while the sweep's deletion is held: {why}")
        for stop in stops
    )
    records = [a for a in measured.actions if isinstance(a, RecordGpuHours)]
    usage_now = measured.status.usage if measured.status is not None else None
    changed = usage_now is not None and usage_now != facts.status.usage
    return Decision(updated(facts.status, usage=usage_now) if changed else None, (*records, *stops, *counted), events)
