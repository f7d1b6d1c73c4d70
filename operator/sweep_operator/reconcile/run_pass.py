"""One run pass's decision (pure): the run-phase rules, then the GPU-hour measurement, then Kueue mode, applied in
this order to facts read before deciding. Each rule returns data (a status, a measurement, a Kueue outcome); this
module alone combines them into the pass's one `Decision`, and states which rule wins where two meet."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..status import conditions_with, is_terminal, updated
from . import kueue, run_phase, usage
from .actions import Action, Decision, DeleteRayJob, Diagnose, Event, Finish, RecordGpuHours, ReleaseBudget, SetSuspend
from .facts import SweepFacts


@dataclass(frozen=True)
class PodsRead:
    """The run's GPU pods read this pass (docs/budgets.md), and the namespace's window they are judged against."""

    pods: Sequence[Mapping[str, Any]]
    clusters: frozenset[str]
    window: dict[str, Any] | None  # the namespace ledger's view (status.usage.namespace); None: no namespace budget
    reservation: usage.ReservationFacts | None  # this attempt's reservation in that window
    record: bool  # the namespace has a GPU-hour budget: the sweep's record is copied into its ledger


@dataclass(frozen=True)
class RunReads:
    """What a run pass reads beside `SweepFacts`: where Kueue has the run, and the pods measured (None: not due)."""

    kueue: kueue.KueueRun | None = None
    pods: PodsRead | None = None


# A budget stop replaces the run phase's own way of ending the run.
_ENDING = (DeleteRayJob, ReleaseBudget, Finish)


def decide_run_pass(
    facts: SweepFacts, reads: RunReads, *, reconcile_seconds: float, refresh_seconds: float
) -> Decision:
    """The new status and actions of an admitted sweep. A Decision asking for `Diagnose` asks only that: the
    controller reads the startup diagnosis into `facts.diagnosis` and asks again (the one second ask)."""
    decision = run_phase.decide_run(facts)
    if decision.wants(Diagnose) is not None:
        return decision
    decision = decide_measured(facts, decision, reads.pods, refresh_seconds=refresh_seconds)
    if reads.kueue is None:
        return decision
    return in_kueue_mode(facts, decision, reads.kueue, reconcile_seconds=reconcile_seconds)


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
    if measured.facts.stop and not is_terminal(status.get("phase")) and facts.rayjob is not None:
        changes.update(run_phase.budget_exhausted(facts, status, measured.facts.stop_reason))
        actions = [a for a in actions if not isinstance(a, _ENDING)]
        actions.extend(run_phase.stop_actions(facts.rayjob.name))
    new = updated(status, changes) if changes or measured.events else decision.status
    if pods.record:  # every GPU-second into the namespace's ledger, which outlives the sweep
        recorded = new if new is not None else status
        actions.insert(0, RecordGpuHours(recorded.get("usage"), is_terminal(recorded.get("phase"))))
    return Decision(new, tuple(actions), (*decision.events, *(Event(*e) for e in measured.events)))


def in_kueue_mode(facts: SweepFacts, decision: Decision, run: kueue.KueueRun, *, reconcile_seconds: float) -> Decision:
    """Kueue's part: its phase, conditions and Events over the status decided so far; Kueue owns spec.suspend, so
    no SetSuspend (a Warning says so); a SetRuntimeEnv first keeps the waiting RayJob's SWEEP_DEADLINE_AT current."""
    decided = decision.status if decision.status is not None else facts.status
    outcome = kueue.outcome_of(facts, decided, run, reconcile_seconds=reconcile_seconds)
    status = dict(outcome.status)
    if outcome.conditions:
        status["conditions"] = conditions_with(status, facts.generation, facts.now, *outcome.conditions)
    events = [*decision.events, *(Event(*e) for e in outcome.events)]
    actions: list[Action] = [a for a in decision.actions if not isinstance(a, SetSuspend)]
    if len(actions) != len(decision.actions):
        message = kueue.SUSPEND_IN_KUEUE_MODE.format(workload=run.workload or "<workload>")
        events.append(Event("Warning", "SuspendIgnoredInKueueMode", message))
    env = kueue.driver_runtime_env(facts, outcome)
    if env is not None:  # sent before the other actions and the write
        actions.insert(0, env)
    return Decision(status, tuple(actions), tuple(events))


def decide_held_pass(facts: SweepFacts, pods: PodsRead | None, *, refresh_seconds: float) -> Decision:
    """A sweep whose deletion the guard holds keeps its GPU-hour budget, its deadline and its measuring (its RayJob
    runs until the guard releases the sweep): the usage record and the ledger's copy, and a stop (a spent budget,
    or the deadline and its graceful window passed) with a StoppedWhileHeld Event. Nothing else of the run phase."""
    measured = decide_measured(facts, Decision(None), pods, refresh_seconds=refresh_seconds)
    stops = [a for a in measured.actions if isinstance(a, DeleteRayJob)]
    why = "its GPU-hour budget is spent" if stops else ""
    if not stops and facts.rayjob is not None and run_phase.deadline_stop_while_held(facts):
        stops, why = [DeleteRayJob(facts.rayjob.name)], f"its deadline {facts.status.get('deadlineAt')} passed"
    events = tuple(
        Event("Warning", "StoppedWhileHeld", f"RayJob {stop.name} stopped while the sweep's deletion is held: {why}")
        for stop in stops
    )
    records = [a for a in measured.actions if isinstance(a, RecordGpuHours)]
    usage_now = (measured.status or {}).get("usage")
    changed = usage_now is not None and usage_now != facts.status.get("usage")
    return Decision(updated(facts.status, {"usage": usage_now}) if changed else None, (*records, *stops), events)
