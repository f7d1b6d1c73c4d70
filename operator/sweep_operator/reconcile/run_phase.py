"""A run's phase (pure): one pass over the RayJob's state and the sweep's deadlines -> the new status and the actions,
as KubeRay's one switch on the deployment status.

A new run-phase rule is a named predicate here and one branch in `decide_run`; a new status field is set in the
`changes` dict it builds (and added to the CRD's status schema).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import DEFAULT_WARN_AFTER_REPORTS, WAITING_PHASES, Phase
from sweep_contracts.checkpoint_coverage import CONDITION as COVERAGE_CONDITION
from sweep_contracts.checkpoint_coverage import CheckpointCoverage, checkpoint_coverage
from sweep_contracts.status_models import SweepStatus, TrackingStatus, TrialCounts
from sweep_contracts.tracking import CONDITION as TRACKING_CONDITION
from sweep_contracts.tracking import REASON_CAUGHT_UP, TrackingState, tracking_uri_of

from ..phases import Fact, to, transition
from ..policy import demand_of
from ..run_metadata import GuardTarget, worker_cap
from ..status import (
    RayJobFacts,
    StatusChanges,
    conditions_with,
    get_condition,
    is_terminal,
    parse_time,
    phase_for,
    progress_patch,
    read_status,
    rfc3339,
    updated,
)
from ..status import (
    awaiting_verification as awaiting_verification,  # re-exported: the controller and ports ask the run phase
)
from .actions import Decision, DeleteRayJob, Diagnose, Event, Finish, ReleaseBudget, SetSuspend, SuspendWorkers
from .attempts import end_patch
from .attempts import pending as resume_pending
from .facts import SweepFacts
from .verdicts import decide_after_verification, verdict

Condition = tuple[str, bool | str, str, str]


# ------------------------------------------------------------------------------------------------ predicates


def deadline_passed(now: float, deadline: float, grace: float) -> bool:
    return now >= deadline + grace


def deadline_stop_while_held(facts: SweepFacts) -> bool:
    """A sweep whose deletion the guard holds keeps its clock: its RayJob still runs until the guard releases the
    sweep, so the operator's deadline stop (the deadline and its graceful window passed) still applies."""
    status, spec = facts.status, facts.admitted_spec
    deadline = parse_time(status.deadline_at)
    if deadline is None or facts.rayjob is None or facts.rayjob.deleting or facts.rayjob.finished:
        return False
    grace = spec.deadlines.graceful_stop_seconds if spec is not None else 0
    return deadline_passed(facts.now, deadline.timestamp(), grace)


def held_pass_due_in(facts: SweepFacts, interval: float, measuring: bool) -> float | None:
    """Seconds until a held sweep's next pass: its deadline stop, or the next measurement while its pods hold GPUs
    (every `interval`); None when nothing is left to watch (the RayJob has ended)."""
    if facts.rayjob is None or facts.rayjob.deleting or facts.rayjob.finished:
        return interval if measuring else None
    deadline = parse_time(facts.status.deadline_at)
    spec = facts.admitted_spec
    grace = spec.deadlines.graceful_stop_seconds if spec is not None else 0
    waits = [interval] if measuring else []
    if deadline is not None:
        waits.append(max(0.5, deadline.timestamp() + grace - facts.now))
    return min(waits) if waits else None


def trials_started(trials: TrialCounts | None) -> bool:
    return trials is not None and (trials.running > 0 or trials.terminated > 0 or trials.errored > 0)


def ever_ran(status: SweepStatus, rayjob: RayJobFacts) -> bool:
    """The Ray job reached Running once in this run (status.trainingStartedAt records it)."""
    return bool(status.training_started_at) or rayjob.running


def startup_overdue(rayjob: RayJobFacts, status: SweepStatus, now: float, startup_seconds: float) -> bool:
    """Per attempt: timed from the attempt's start (KubeRay's status.startTime, set at New -> Initializing). While
    KubeRay is Retrying, and in the New state after it, startTime still holds the failed attempt's value and the
    next attempt has not begun (rayjob_controller.go: the Retrying branch), so no startup clock runs then; the
    sweep-wide deadline still does."""
    if rayjob.deployment_status in ("Retrying", "") and rayjob.failed > 0:
        return False
    started = [t.timestamp() for t in (parse_time(status.started_at), parse_time(rayjob.start_time)) if t]
    return bool(started) and now - max(started) > startup_seconds


def tick_due(body: Mapping[str, Any], now: float, poll_due: bool, status: SweepStatus | None = None) -> bool:
    """Whether a timer tick has work: a deadline that may have passed, progress to poll (`poll_due`: the cache's
    answer, read by the caller), a queue or a failed create to retry, an end-of-run verification to finish. Events
    drive everything else. `status`: the body's status already parsed (`Cache.status`, once per resourceVersion:
    ticks come often); None: parsed here."""
    if status is None:
        status = read_status(body.get("status"))
    phase = status.phase
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        # Held by the guard, a run's RayJob still runs: its deadline still stops it (controller._held_pass).
        deadline = parse_time(status.deadline_at)
        return bool(status.run_id) and deadline is not None and now >= deadline.timestamp()
    if is_terminal(phase):
        return awaiting_verification(status) or resume_pending(body, status)
    if phase is None or phase in WAITING_PHASES:
        return True
    deadline = parse_time(status.deadline_at)
    if deadline is not None and now >= deadline.timestamp():
        return True
    return poll_due


def progress_wanted(facts: SweepFacts) -> bool:
    """Whether this pass reads the run's progress: while it runs and no deadline has passed (the poll's
    status_poll_seconds spacing is the controller's)."""
    if facts.rayjob is None or facts.sweep is None or is_terminal(facts.status.phase):
        return False
    deadline = parse_time(facts.status.deadline_at)
    passed = deadline is not None and deadline_passed(facts.now, deadline.timestamp(), 0)
    return phase_for(facts.rayjob) == Phase.RUNNING and not passed


def result_wanted(facts: SweepFacts) -> bool:
    """Whether this pass reads `_sweep/result.json`: a success may be Tune's budget stopping at the deadline."""
    return (
        facts.rayjob is not None and not is_terminal(facts.status.phase) and phase_for(facts.rayjob) == Phase.SUCCEEDED
    )


def phase_message(phase: str, rayjob: RayJobFacts) -> str:
    detail = f"RayJob {rayjob.name} {rayjob.deployment_status or 'New'}"
    if rayjob.job_status:
        detail += f", job {rayjob.job_status}"
    if rayjob.reason:
        detail += f", reason {rayjob.reason}"
    if rayjob.message:
        detail += f": {rayjob.message}"
    prefixes: dict[str, str] = {
        Phase.STARTING: "starting",
        Phase.RUNNING: "running",
        Phase.SUCCEEDED: "succeeded",
        Phase.FAILED: "failed",
        Phase.DEADLINE_EXCEEDED: "deadline exceeded",
        Phase.SUSPENDED: "suspended",
    }
    prefix = prefixes.get(phase)
    return f"{prefix}: {detail}" if prefix else detail


# ------------------------------------------------------------------------------------------------- decisions


def _without_active_seconds(spec: Mapping[str, Any]) -> dict[str, Any]:
    deadlines = {k: v for k, v in dict(spec.get("deadlines") or {}).items() if k != "activeSeconds"}
    return {**spec, "deadlines": deadlines}


def _spec_change(facts: SweepFacts, changes: dict[str, Any], actions: list[Any], events: list[Event]) -> None:
    """Only `suspend` may change while a run exists; other edits are refused (status message + Event)."""
    changes["observedGeneration"] = facts.generation
    sweep, rayjob = facts.sweep, facts.rayjob
    if sweep is not None and rayjob is not None and rayjob.suspended != sweep.spec.suspend:
        actions.append(SetSuspend(rayjob.name, sweep.spec.suspend))
        events.append(
            Event(
                "Normal",
                "Suspend" if sweep.spec.suspend else "Resume",
                f"spec.suspend set to {sweep.spec.suspend} on RayJob {rayjob.name}",
            )
        )
    if facts.run_spec is None:
        return
    admitted = facts.run_spec.spec.model_dump(by_alias=True, mode="json")
    wanted = sweep.spec.model_dump(by_alias=True, mode="json") if sweep else (facts.body.get("spec") or {})
    if facts.run_spec.attempt > 1:
        # A resumed attempt runs with its own deadline, set by spec.resume (resume.attempt_sweep), while
        # spec.deadlines.activeSeconds still holds the first attempt's: that difference is not an edit.
        admitted, wanted = (_without_active_seconds(spec) for spec in (admitted, wanted))
    changed = sorted(k for k in set(admitted) | set(wanted) if k != "suspend" and admitted.get(k) != wanted.get(k))
    if sweep is None:
        changed = changed or ["spec"]
    if changed:
        message = (
            f"spec change refused: {', '.join('spec.' + k for k in changed)} changed after run "
            f"{facts.status.run_id} was admitted; only spec.suspend may change while a run exists. "
            "The run continues with its admitted spec; delete and re-create the sweep to start a new run."
        )
        changes["message"] = message
        events.append(Event("Warning", "SpecChangeRefused", message))


# The ended phases an operator's stop leaves (the deadline, a spent budget, the startup deadline): the RayJob's
# deletion follows them. A Succeeded sweep's job ended by itself; KubeRay's own deletion follows it.
STOPPED_BY_OPERATOR = frozenset({Phase.FAILED, Phase.DEADLINE_EXCEEDED, Phase.BUDGET_EXHAUSTED})


def unstopped_rayjob(status: SweepStatus, rayjob: Mapping[str, Any] | None) -> str | None:
    """The RayJob to stop again: an ended sweep's own RayJob (status.rayJobName, carrying the guard record only the
    operator may write, of this run) still running, neither deleting nor finished. The stop's delete never went out
    (its pass failed for good, or the operator restarted before it ran), and a live job would hold its GPUs until
    KubeRay's active deadline. A finished job is KubeRay's to clean up; a deleting one is the guard's."""
    if rayjob is None or status.phase not in STOPPED_BY_OPERATOR:
        return None
    meta = rayjob.get("metadata") or {}
    if not meta.get("name") or meta.get("name") != status.ray_job_name or meta.get("deletionTimestamp"):
        return None
    target = GuardTarget.from_annotation((meta.get("annotations") or {}).get(constants.ANNOTATION_GUARD))
    if target is None or not target.run_id or target.run_id != status.run_id:
        return None
    return None if RayJobFacts.from_object(rayjob).finished else str(meta["name"])


def _stopping(status: SweepStatus, rayjob: Mapping[str, Any] | None) -> bool:
    """The operator is stopping this RayJob (status.gracefulStop names it): its stop suspends the workers and
    records the GPU time the stop held, so nothing else suspends them first."""
    stop, uid = status.graceful_stop, ((rayjob or {}).get("metadata") or {}).get("uid")
    return stop is not None and bool(uid) and stop.ray_job_uid == uid


def finished_workers(status: SweepStatus, rayjob: Mapping[str, Any] | None) -> SuspendWorkers | None:
    """An ended sweep's own RayJob (as in unstopped_rayjob) whose job finished: its cluster's worker groups go now,
    not when KubeRay deletes the cluster ttlSecondsAfterFinished later (the head stays until then)."""
    if rayjob is None or not is_terminal(status.phase):
        return None
    meta, facts = rayjob.get("metadata") or {}, RayJobFacts.from_object(rayjob)
    if meta.get("name") != status.ray_job_name or facts.deleting or not facts.finished or not facts.cluster_name:
        return None
    if _stopping(status, rayjob):
        return None
    target = GuardTarget.from_annotation((meta.get("annotations") or {}).get(constants.ANNOTATION_GUARD))
    if target is None or not target.run_id or target.run_id != status.run_id:
        return None
    return SuspendWorkers(facts.name, facts.cluster_name)


def decide_run(facts: SweepFacts) -> Decision:
    """The new status and actions of an admitted sweep. A Decision with a Diagnose action only asks for the
    startup diagnosis: the controller reads it into `facts.diagnosis` and decides again. The status judged is the
    one on the run's clock (`facts.judged_status`: Kueue mode counts admitted time only)."""
    status, generation, now = facts.judged_status, facts.generation, facts.now
    phase = status.phase
    if is_terminal(phase):
        ending = (ReleaseBudget(), Finish()) if awaiting_verification(status) else (ReleaseBudget(),)
        unstopped = unstopped_rayjob(facts.status, facts.ended_rayjob)
        if unstopped:
            return Decision(actions=(DeleteRayJob(unstopped), *ending))
        idle = finished_workers(facts.status, facts.ended_rayjob)
        return Decision(actions=(idle, *ending) if idle else ending)
    changes: dict[str, Any] = {}
    actions: list[Any] = []
    events: list[Event] = []
    if generation != status.observed_generation:
        _spec_change(facts, changes, actions, events)
    rayjob = facts.rayjob
    if rayjob is None:
        return _rayjob_gone(facts, status, changes, actions, events)
    _attempt_changes(facts, status, rayjob, changes)
    judged = _judge_phase(facts, status, rayjob, changes.get("message") or status.message or "", changes)
    if judged is None:
        return _diagnose(facts)
    new_phase, message, conditions, stops = judged
    actions.extend(stops)
    if new_phase != phase and not conditions:
        message = phase_message(new_phase, rayjob)
    changes.update(
        {
            "phase": new_phase,
            "message": message,
            "rayClusterName": rayjob.cluster_name or status.ray_cluster_name,
            "jobDeploymentStatus": rayjob.deployment_status or None,
            "jobStatus": rayjob.job_status or None,
            "reason": rayjob.reason or None,
        }
    )
    conditions.extend(_phase_conditions(new_phase, rayjob, message, conditions))
    coverage_conditions, coverage_events = coverage_changes(status, facts.coverage)
    conditions.extend(coverage_conditions)
    events.extend(coverage_events)
    tracking_conditions, tracking_events = tracking_changes(status, changes.get("tracking"), facts.admitted_spec)
    conditions.extend(tracking_conditions)
    events.extend(tracking_events)
    if is_terminal(new_phase):
        changes["finishedAt"] = rfc3339(now)
        actions.extend((ReleaseBudget(), Finish()))
        ended_by_itself = not stops and not _stopping(status, facts.rayjob_body)
        if ended_by_itself and rayjob.finished and rayjob.cluster_name and not rayjob.deleting:
            actions.append(SuspendWorkers(rayjob.name, rayjob.cluster_name))
    if conditions:
        changes["conditions"] = conditions_with(status, generation, now, *conditions)
    return Decision(updated(status, changes), tuple(actions), tuple(events))


def _rayjob_gone(
    facts: SweepFacts, status: SweepStatus, changes: dict[str, Any], actions: list[Any], events: list[Event]
) -> Decision:
    """The run's RayJob was deleted outside the operator: the run failed."""
    message = f"RayJob {status.ray_job_name} no longer exists (deleted outside the operator)"
    gone = transition(Fact.RAYJOB_GONE)
    changes.update(
        {
            "phase": gone.to,
            "message": message,
            "finishedAt": rfc3339(facts.now),
            "conditions": conditions_with(
                status,
                facts.generation,
                facts.now,
                (gone.condition or "", False, gone.reason, message),
            ),
        }
    )
    return Decision(updated(status, changes), (*actions, ReleaseBudget()), tuple(events))


def _attempt_changes(facts: SweepFacts, status: SweepStatus, rayjob: RayJobFacts, changes: dict[str, Any]) -> None:
    """When training and this attempt started, and the progress polled this pass."""
    if rayjob.running and not status.training_started_at:
        changes["trainingStartedAt"] = rfc3339(facts.now)
    if (
        rayjob.start_time
        and rayjob.deployment_status not in ("Retrying", "")
        and rayjob.start_time != status.attempt_started_at
    ):
        changes["attemptStartedAt"] = rayjob.start_time
    if facts.progress:
        changes.update(facts.progress)


def _judge_phase(
    facts: SweepFacts, status: SweepStatus, rayjob: RayJobFacts, message: str, changes: Mapping[str, Any]
) -> tuple[str, str, list[Condition], list[Any]] | None:
    """The phase KubeRay's state implies, overruled by the deadline and startup rules: (phase, message, conditions,
    the RayJob's stop if one is due). None: the startup diagnosis is needed first."""
    now, admitted, phase = facts.now, facts.admitted_spec, status.phase
    conditions: list[Condition] = []
    stops: list[Any] = []
    new_phase: str = phase_for(rayjob)
    deadline = parse_time(status.deadline_at)
    graceful = admitted.deadlines.graceful_stop_seconds if admitted is not None else 0
    trials = _polled_trials(changes.get("trials")) or status.trials
    if new_phase == Phase.SUCCEEDED and facts.stopped_at_deadline:
        # Tune's time budget stopped the trials before the deadline and the driver exited 0: a deadline stop,
        # not a finished sweep (the checkpoints so far are verified as for any end).
        row = transition(Fact.STOPPED_AT_DEADLINE)
        new_phase = row.to
        message = f"the driver stopped the trials gracefully at the sweep deadline {status.deadline_at}"
        conditions.append((row.condition or "", True, row.reason, message))
    elif deadline and not is_terminal(new_phase) and deadline_passed(now, deadline.timestamp(), graceful):
        row = transition(Fact.SWEEP_DEADLINE_PASSED)
        new_phase = row.to
        message = (
            f"sweep deadline {status.deadline_at} and its {graceful}s graceful window passed; stopping "
            f"RayJob {rayjob.name} through the checkpoint guard"
        )
        conditions.append((row.condition or "", True, row.reason, message))
        stops.append(DeleteRayJob(rayjob.name))
    elif deadline and not is_terminal(new_phase) and deadline_passed(now, deadline.timestamp(), 0):
        # The driver stops its trials gracefully at the deadline; deleting the RayJob now would stop the Ray job at
        # once (KubeRay's deletion path) and cut the last checkpoints short.
        conditions.append(
            (
                "DeadlineExceeded",
                True,
                "GracefulStop",
                f"sweep deadline {status.deadline_at} passed; the driver is stopping its trials; "
                f"the operator stops RayJob {rayjob.name} if it still runs {graceful}s after it",
            )
        )
    elif (
        new_phase in (Phase.STARTING, Phase.RUNNING)
        and admitted is not None
        and not trials_started(trials)
        and startup_overdue(rayjob, status, now, admitted.deadlines.startup_seconds)
    ):
        # KubeRay reports Running once the head is up and the submitter exists (K8sJobMode), with the GPU workers
        # still Pending: the attempt has started only when a trial runs.
        if facts.diagnosis is None:
            return None
        row = transition(Fact.STARTUP_OVERDUE)
        new_phase = row.to
        message = f"not Running within startupSeconds={admitted.deadlines.startup_seconds}: {facts.diagnosis}"
        conditions.append((row.condition or "", False, row.reason, message))
        stops.append(DeleteRayJob(rayjob.name))
    if (
        new_phase == Phase.FAILED
        and phase != Phase.FAILED
        and not conditions
        and not ever_ran(status, rayjob)
        and admitted is not None
    ):
        # KubeRay gave up before the job ever ran (e.g. its preRunningDeadlineSeconds): say why (R6, R20).
        if facts.diagnosis is None:
            return None
        message = f"{phase_message(new_phase, rayjob)}; never reached Running: {facts.diagnosis}"
        conditions.append(("Running", False, "StartupFailed", message))
    kuberay = transition(Fact.RAYJOB_DEADLINE)
    if (
        new_phase == kuberay.to
        and rayjob.reason == "DeadlineExceeded"
        and not any(c[0] == kuberay.condition for c in conditions)
    ):
        message = f"KubeRay stopped RayJob {rayjob.name}: activeDeadlineSeconds exceeded"
        conditions.append((kuberay.condition or "", True, kuberay.reason, message))
    return new_phase, message, conditions, stops


def _polled_trials(polled: TrialCounts | Mapping[str, Any] | None) -> TrialCounts | None:
    """The trial counts polled this pass (`progress_patch`'s document, or the model); None when none were."""
    if polled is None or isinstance(polled, TrialCounts):
        return polled
    return TrialCounts.model_validate(polled) if polled else None


def _phase_conditions(new_phase: str, rayjob: RayJobFacts, message: str, judged: list[Condition]) -> list[Condition]:
    """The Running condition the phase implies (unless a rule set it already)."""
    if new_phase == Phase.RUNNING:
        return [("Running", True, "Running", f"Ray job {rayjob.job_status or 'RUNNING'} on {rayjob.cluster_name}")]
    if new_phase == Phase.STARTING:
        return [("Running", False, "Starting", phase_message(new_phase, rayjob))]
    if new_phase == Phase.SUSPENDED:
        return [("Running", False, "Suspended", "spec.suspend is true")]
    if is_terminal(new_phase) and not any(c[0] == "Running" for c in judged):
        return [("Running", False, new_phase, message)]
    return []


def budget_exhausted(facts: SweepFacts, status: SweepStatus, reason: str) -> StatusChanges:
    """The status changes of a run stopped because a GPU budget (the sweep's, or its namespace reservation) is spent:
    stopped through the checkpoint guard like a deadline stop (the RayJob deleted, the guard verifies before
    releasing the cluster, phase BudgetExhausted, checkpoints verified at the end); the one place a graceful stop
    of a running sweep would be asked for instead. Its actions are `stop_actions`."""
    assert facts.rayjob is not None
    now = facts.now
    message = f"{reason}; stopping RayJob {facts.rayjob.name} through the checkpoint guard"
    return {
        "phase": to(Fact.BUDGET_SPENT),
        "message": message,
        "finishedAt": rfc3339(now),
        "conditions": conditions_with(
            status,
            facts.generation,
            now,
            ("BudgetExhausted", True, "GpuBudgetSpent", message),
            ("Running", False, "BudgetExhausted", message),
        ),
    }


def coverage_changes(status: SweepStatus, coverage: CheckpointCoverage | None) -> tuple[list[Condition], list[Event]]:
    """CheckpointsCommitted from the trials' coverage, and a Warning Event when trials without a committed
    checkpoint are first seen or change: said while the sweep runs, not at its deletion."""
    if coverage is None:
        return [], []
    condition: Condition = (COVERAGE_CONDITION, coverage.ok, coverage.reason, coverage.message)
    previous = get_condition(status.conditions, COVERAGE_CONDITION)
    said = previous is not None and previous.status == "False" and previous.message == coverage.message
    events = [] if coverage.ok or said else [Event("Warning", coverage.reason, coverage.message)]
    return [condition], events


def tracking_changes(
    status: SweepStatus, tracking: TrackingStatus | Mapping[str, Any] | None, spec: Any
) -> tuple[list[Condition], list[Event]]:
    """TrackingAvailable from what the driver last said about its tracking server (status.tracking, as polled this
    pass: a model or its stored document): a Warning Event when the server stops answering, a Normal one when it
    answers again; never a change of phase."""
    if isinstance(tracking, TrackingStatus):
        tracking = tracking.model_dump(by_alias=True, exclude_none=True, mode="json")
    state = TrackingState.from_status(tracking, tracking_uri_of(spec))
    if state is None:
        return [], []
    condition: Condition = (TRACKING_CONDITION, state.available, state.reason, state.message)
    said = get_condition(status.conditions, TRACKING_CONDITION)
    previous = said.status if said is not None else None
    events: list[Event] = []
    if not state.available and previous != "False":
        events.append(Event("Warning", state.reason, state.message))
    elif state.available and previous == "False":
        events.append(Event("Normal", REASON_CAUGHT_UP, state.message))
    return [condition], events


def stop_actions(rayjob: str) -> tuple[DeleteRayJob, ReleaseBudget, Finish]:
    """What ends a run the operator stops: the RayJob deleted (gracefully), the budget freed, the end verified."""
    return DeleteRayJob(rayjob), ReleaseBudget(), Finish()


def _diagnose(facts: SweepFacts) -> Decision:
    rayjob, spec = facts.rayjob, facts.admitted_spec
    assert rayjob is not None and spec is not None
    return Decision(
        actions=(Diagnose(rayjob.cluster_name, rayjob.name, demand_of(spec).workers, worker_cap(spec, facts.limits)),)
    )


def decide_finish(
    facts: SweepFacts, verification: Any, progress: Mapping[str, Any] | None, result: Mapping[str, Any] | None
) -> Decision:
    """At a terminal phase: the final result from `_sweep/result.json`, and the end-of-run verification judged by
    the guard's own rules (so the status says what a deletion would do)."""
    status, generation = facts.status, facts.generation
    changes: dict[str, Any] = {}
    if result:
        changes.update(progress_patch(result, facts.admitted_spec))
    elif progress:
        changes.update(progress_patch(progress, facts.admitted_spec))
    said = (progress or {}).get("message") if status.phase == Phase.FAILED else None
    if isinstance(said, str) and said and said not in (status.message or ""):
        # The driver records why it stopped (a pre-flight refusal naming the S3 action, a trainLoop that does not
        # import): KubeRay only knows the exit code.
        changes["message"] = f"{status.message or 'failed'}; the driver says: {said}"[:2000]
    judged = decide_after_verification(
        verification, attempt=0, base_backoff=1, max_backoff=1, progress=progress, final=result
    )
    said = verdict(verification, judged)  # the guard's rule, so the status says what a deletion would do
    verified, reason, text = said.verified, said.reason, said.message
    changes["checkpoints"] = verification.to_status()
    # The attempt's row in status.attempts (resume): when it ended, how, what it left verified.
    changes.update(
        end_patch(
            status,
            phase=status.phase or "",
            now=facts.now,
            reason=status.reason,
            checkpoints_verified=verification.checked if verified else None,
        )
    )
    spec = facts.admitted_spec
    warn_after = spec.checkpoints.warn_after_reports if spec is not None else DEFAULT_WARN_AFTER_REPORTS
    coverage_conditions, coverage_events = coverage_changes(status, checkpoint_coverage(result or progress, warn_after))
    tracking_conditions, tracking_events = tracking_changes(status, changes.get("tracking"), spec)
    coverage_events = [*coverage_events, *tracking_events]
    changes["conditions"] = conditions_with(
        status,
        generation,
        facts.now,
        *coverage_conditions,
        *tracking_conditions,
        ("CheckpointsVerified", verified, reason, text),
    )
    events = (
        ()
        if verified
        else (Event("Warning", "CheckpointsNotVerified" if reason == "NotVerified" else "NothingToProtect", text),)
    )
    return Decision(updated(status, changes), events=(*coverage_events, *events))
