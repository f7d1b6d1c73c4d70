"""GPU-hour budgets (pure): a sweep's budget spent, the 80%/100% thresholds, the namespace's rolling window, the
admission worst case, and which clusters a pass measures.

Decided over the GPU time of a sweep's pods (`gpu_time`); data in, data out: no kopf, no Kubernetes client, no clock of
its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sweep_contracts.problems import Problem
from sweep_contracts.status_models import NamespaceUsageStatus, SweepStatus, UsageStatus

from ..gpu_time import (
    HOUR,
    NamespaceBudget,
    UsageLedger,
    clusters_to_read,
    epoch,
    fold,
    format_hours,
    holding_gpus,
    observe_pod,
    worst_case_gpu_hours,
)
from ..policy import AdmissionDecision, Admit, Queue, Reject, effective_active_seconds
from .facts import SweepFacts

THRESHOLDS: tuple[int, ...] = (80, 100)


# ----------------------------------------------------------------------------------------------- decisions


def decide_budget_admission(
    *,
    worst_case: float,
    sweep_budget: float | None,
    run_until_exhausted: bool,
    sweep_used: float = 0.0,
    now: float,
    worst_case_text: str = "",
) -> AdmissionDecision:
    """Whether a valid spec fits its own budget (the namespace's window is the ledger's: hours_ledger).

    Without runUntilExhausted the whole worst case must fit what is left of the sweep's budget over all its attempts;
    with it, any budget left admits and the budget stops the sweep when spent.
    """
    shown = worst_case_text or f"{format_hours(worst_case)} GPU-hours"
    opt_in = "or set spec.budget.runUntilExhausted: true to run until the budget stops the sweep"
    if sweep_budget is not None:
        left = sweep_budget - sweep_used
        if left <= 0:
            return _over_budget(
                f"the sweep has used {format_hours(sweep_used)} of its {format_hours(sweep_budget)} GPU-hours",
            )
        if worst_case > left + 1e-9 and not run_until_exhausted:
            return _over_budget(
                f"worst case {shown} exceeds the {format_hours(left)} GPU-hours left of spec.budget.gpuHours "
                f"{format_hours(sweep_budget)}; raise it, lower trial.workers, tune.maxConcurrentTrials or "
                f"deadlines.activeSeconds, {opt_in}",
            )
    return Admit(gpu_hours=worst_case)


def _over_budget(reason: str) -> Reject:
    return Reject((Problem("spec.budget.gpuHours", reason),))


@dataclass(frozen=True)
class BudgetFacts:
    """A running sweep's budget state after a fold."""

    used_gpu_hours: float
    budget_gpu_hours: float | None
    gpus_held: float
    crossed: tuple[int, ...] = ()  # thresholds newly crossed (an Event and a metric each, once)
    stop: bool = False
    stop_reason: str = ""
    exhausts_at: float | None = None  # at the current rate


@dataclass(frozen=True)
class ReservationFacts:
    """The attempt's reservation in its namespace's ledger: GPU-hours granted at `since` (its admission)."""

    gpu_hours: float
    since: float
    run_until_exhausted: bool = False


def decide_reservation_stop(
    ledger: UsageLedger, reservation: ReservationFacts | None, now: float, *, graceful_stop_seconds: float = 0.0
) -> str:
    """Why the attempt must stop because its namespace reservation is spent ("" : it need not). A runUntilExhausted
    attempt reserved what was left of the window: its stop begins `graceful_stop_seconds` early, as a sweep budget's
    does. Any other attempt reserved its worst case, which its deadline bounds; past it (the guard's verification
    keeps the pods) it is stopped too, so no namespace uses more than its window."""
    if reservation is None:
        return ""
    spent = sum(i.overlap_gpu_seconds(reservation.since, now) for i in ledger.intervals) / HOUR
    early = ledger.gpus_held() * graceful_stop_seconds / HOUR if reservation.run_until_exhausted else 0.0
    if spent + early < reservation.gpu_hours - 1e-9:
        return ""
    granted = f"the {format_hours(reservation.gpu_hours)} GPU-hours of the namespace budget reserved at its admission"
    if spent >= reservation.gpu_hours - 1e-9:
        return f"namespace GPU budget spent: {granted} are used ({format_hours(spent)})"
    return (
        f"namespace GPU budget nearly spent: {format_hours(spent)} of {granted} used; at "
        f"{format_hours(ledger.gpus_held())} GPUs held it runs out within gracefulStopSeconds ({graceful_stop_seconds:g}s)"
    )


def decide_budget_stop(
    ledger: UsageLedger,
    budget_gpu_hours: float | None,
    now: float,
    *,
    graceful_stop_seconds: float = 0.0,
    reservation: ReservationFacts | None = None,
) -> BudgetFacts:
    """Thresholds newly crossed, and whether to stop the sweep now: its own budget or its namespace reservation spent.

    The stop begins `graceful_stop_seconds` before the budget runs out at the current rate: the checkpoint guard
    keeps the cluster's pods (and their GPUs) until the checkpoints are verified, and that time is billed too.
    """
    used = ledger.gpu_hours(now)
    held = ledger.gpus_held()
    namespace_stop = decide_reservation_stop(ledger, reservation, now, graceful_stop_seconds=graceful_stop_seconds)
    if budget_gpu_hours is None:
        return BudgetFacts(used, None, held, stop=bool(namespace_stop), stop_reason=namespace_stop)
    percent = 100.0 * used / budget_gpu_hours if budget_gpu_hours > 0 else math.inf
    crossed = tuple(t for t in THRESHOLDS if percent >= t and t not in ledger.thresholds_reported)
    left = budget_gpu_hours - used
    exhausts_at = now + left * HOUR / held if held > 0 and left > 0 else (now if left <= 0 else None)
    projected = used + held * graceful_stop_seconds / HOUR
    stop = projected >= budget_gpu_hours - 1e-9
    reason = ""
    if stop:
        reason = (
            f"GPU budget spent: {format_hours(used)} of spec.budget.gpuHours {format_hours(budget_gpu_hours)} GPU-hours used"
            if left <= 0
            else f"GPU budget nearly spent: {format_hours(used)} of spec.budget.gpuHours {format_hours(budget_gpu_hours)} "
            f"GPU-hours used; at {format_hours(held)} GPUs held it runs out within gracefulStopSeconds "
            f"({graceful_stop_seconds:g}s)"
        )
    if not stop and namespace_stop:
        stop, reason = True, namespace_stop
    return BudgetFacts(used, budget_gpu_hours, held, crossed, stop, reason, exhausts_at)


def needs_write(stored: UsageStatus | None, new: UsageStatus, refresh_seconds: float) -> bool:
    """Whether a freshly folded status.usage is worth a status write: the record changed (an interval opened or
    closed, a threshold reported), or the stored totals are older than `refresh_seconds` (a running pod's hours
    grow continuously; readers recompute them from the intervals up to their own now)."""
    stored = stored or UsageStatus()
    if (
        stored.pod_intervals != new.pod_intervals
        or stored.thresholds_reported != new.thresholds_reported
        or stored.budget_gpu_hours != new.budget_gpu_hours
    ):
        return True
    last, measured = epoch(stored.last_measured_at), epoch(new.last_measured_at)
    return last is None or measured is None or measured - last >= refresh_seconds


def with_thresholds(ledger: UsageLedger, crossed: Iterable[int]) -> UsageLedger:
    return replace(ledger, thresholds_reported=tuple(sorted(set(ledger.thresholds_reported) | set(crossed))))


def threshold_message(threshold: int, facts: BudgetFacts) -> str:
    return (
        f"the sweep has used {threshold}% of its GPU budget: {format_hours(facts.used_gpu_hours)} of "
        f"{format_hours(facts.budget_gpu_hours or 0)} GPU-hours"
    )


# ----------------------------------------------------------------------------------------------- one reconcile pass


@dataclass(frozen=True)
class Measurement:
    """One pass's measurement of a sweep: the usage record to write (None: nothing worth a write) and the budget
    facts; `events` are (type, reason, message) for the thresholds newly crossed."""

    usage: UsageStatus | None
    facts: BudgetFacts
    events: tuple[tuple[str, str, str], ...] = ()


THRESHOLD_REASONS = {80: "GpuBudget80", 100: "GpuBudget100"}


def measure(
    status: SweepStatus,
    pods: Iterable[Mapping[str, Any]],
    listed_clusters: Iterable[str],
    now: float,
    *,
    budget_gpu_hours: float | None,
    graceful_stop_seconds: float = 0.0,
    refresh_seconds: float = 60.0,
    namespace: NamespaceUsageStatus | None = None,
    reservation: ReservationFacts | None = None,
) -> Measurement:
    """Fold a read of the sweep's pods into its status.usage and decide what the budget asks for."""
    stored = status.usage
    ledger = fold(
        UsageLedger.from_status(stored),
        [i for i in (observe_pod(p) for p in pods) if i is not None],
        now,
        listed_clusters=listed_clusters,
    )
    facts = decide_budget_stop(
        ledger, budget_gpu_hours, now, graceful_stop_seconds=graceful_stop_seconds, reservation=reservation
    )
    ledger = with_thresholds(ledger, facts.crossed)
    new = UsageStatus.model_validate({**ledger.to_status(now, budget_gpu_hours), "namespace": namespace})
    changed = needs_write(stored, new, refresh_seconds) or (stored.namespace if stored else None) != new.namespace
    if (
        not ledger.intervals
        and not (stored.pod_intervals if stored else None)
        and budget_gpu_hours is None
        and namespace is None
    ):
        changed = False  # nothing measured, nothing to say
    events = tuple(("Warning", THRESHOLD_REASONS[t], threshold_message(t, facts)) for t in facts.crossed)
    return Measurement(new if changed else None, facts, events)


def clusters_to_measure(facts: SweepFacts, namespace_budget: NamespaceBudget | None) -> set[str] | None:
    """The RayClusters whose pods this pass reads for GPU-hours (the record's open ones and the RayJob's current
    cluster); None: nothing to measure (no cluster, and neither the sweep nor its namespace has a GPU-hour budget
    to keep current)."""
    status = facts.judged_status
    if facts.rayjob is not None and facts.rayjob.cluster_name:
        status = status.model_copy(update={"ray_cluster_name": facts.rayjob.cluster_name})
    spec = facts.admitted_spec
    clusters = clusters_to_read(status)
    if not clusters and (spec is None or spec.budget.gpu_hours is None) and namespace_budget is None:
        return None
    return clusters


def measure_pass(
    facts: SweepFacts,
    status: SweepStatus,
    pods: Iterable[Mapping[str, Any]],
    clusters: Iterable[str],
    namespace: NamespaceUsageStatus | None,
    reservation: ReservationFacts | None,
    *,
    refresh_seconds: float,
) -> Measurement:
    """This pass's read of the run's GPU pods folded into `status`'s usage record (`measure`), against the sweep's
    budget as admitted and its reservation in the namespace's ledger (`namespace`: the ledger's view of the window,
    None without a namespace budget)."""
    spec = facts.admitted_spec
    return measure(
        status,
        pods,
        clusters,
        facts.now,
        budget_gpu_hours=spec.budget.gpu_hours if spec is not None else None,
        graceful_stop_seconds=spec.deadlines.graceful_stop_seconds if spec is not None else 0,
        refresh_seconds=refresh_seconds,
        namespace=namespace,
        reservation=reservation,
    )


def usage_open(status: SweepStatus) -> bool:
    """An ended run's GPU pods are measured (and ticked) until they are gone, a sweep being deleted included: the
    guard may hold it while its pods still hold GPUs."""
    return holding_gpus(status)


def decide_gpu_hour_answer(
    facts: SweepFacts,
    budget: Any,
    limits: Any,
    reserve: Callable[[GpuHourAsk], AdmissionDecision] | None = None,
    *,
    spec: Any = None,
) -> Any:
    """The GPU-hour check beside the GPU caps: None admits; else the policy's Reject or Queue (docs/budgets.md).

    `spec` is the attempt's (a resume's deadlines are its own); the sweep's budget is checked here, the namespace's
    window by `reserve`, which reserves the attempt's hours in the namespace's ledger (None: no namespace budget)."""
    spec = spec if spec is not None else (facts.sweep.spec if facts.sweep else None)
    now = facts.now
    if spec is None or not isinstance(budget, Admit) or spec.trial.resources_per_worker.gpu == 0:
        return None
    active = effective_active_seconds(spec, limits)
    workers, gpus, trials = spec.trial.workers, spec.trial.resources_per_worker.gpu, spec.tune.max_concurrent_trials
    worst = worst_case_gpu_hours(workers, gpus, trials, active)
    text = (
        f"{workers} worker{'s' * (workers != 1)} x {gpus} GPU x {trials} trial{'s' * (trials != 1)} x {active}s = "
        f"{format_hours(worst)} GPU-hours"
    )
    used = UsageLedger.from_status(facts.status.usage).gpu_hours(now)
    decided = decide_budget_admission(
        worst_case=worst,
        sweep_budget=spec.budget.gpu_hours,
        run_until_exhausted=spec.budget.run_until_exhausted,
        sweep_used=used,
        now=now,
        worst_case_text=text,
    )
    if isinstance(decided, Admit) and reserve is not None:
        left = spec.budget.gpu_hours - used if spec.budget.gpu_hours is not None else None
        decided = reserve(GpuHourAsk(worst, text, spec.budget.run_until_exhausted, left))
    if isinstance(decided, Reject):
        return decided
    if isinstance(decided, Queue):
        return Queue(budget.demand, decided.reason, decided.frees_at, decided.cause)
    return None


@dataclass(frozen=True)
class GpuHourAsk:
    """What an attempt asks of its namespace's window: its worst case (and how it was computed), whether it runs
    until the budget stops it, and what is left of its own budget (None: it has none)."""

    worst_case: float
    worst_case_text: str
    run_until_exhausted: bool
    sweep_left: float | None
