"""Admission (pure): a sweep without a run is Invalid, Suspended, Queued for its namespace's GPU budget, or admitted
with a CreateRayJob whose outcome decides the status."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants, s3_layout
from sweep_contracts.api import Phase
from sweep_contracts.runtime_env import deadline_of
from sweep_contracts.status_models import GuardStatus, ReplicasStatus, SweepStatus, TrialCounts, UsageStatus

from ..phases import Fact, to, transition
from ..policy import AdmissionDecision, Admit, Queue, Reject, effective_active_seconds
from ..rendering import RenderContext, build_rayjob, guard_target, new_run_id, run_id_for
from ..run_metadata import GuardTarget, worker_cap
from ..status import (
    conditions_with,
    is_terminal,
    parse_time,
    planned_trials,
    read_status,
    rfc3339,
    trials_summary,
    updated,
)
from .actions import CreateRayJob, Decision, Event, ReleaseBudget
from .facts import SweepFacts, meta_of
from .verdicts import target_of


def spec_is_settled(facts: SweepFacts) -> bool:
    """Invalid, and nothing new since we said why."""
    status = facts.status
    return status.phase == Phase.INVALID and status.observed_generation == facts.generation


def creating_backs_off(facts: SweepFacts) -> bool:
    """The last create failed and its backoff has not passed (its timer, or a later tick, comes back)."""
    return facts.create_retry_at is not None and facts.now < facts.create_retry_at


def _status(
    facts: SweepFacts, phase: Phase, message: str, *conditions: tuple[str, bool | str, str, str], **fields: Any
) -> SweepStatus:
    return updated(
        facts.status,
        {
            "phase": phase,
            "message": message,
            **fields,
            "observedGeneration": facts.generation,
            "conditions": conditions_with(facts.status, facts.generation, facts.now, *conditions),
        },
    )


def _condition(fact: Fact, message: str, holds: bool = False) -> tuple[str, bool, str, str]:
    """The condition the phase table names for `fact`, with its reason."""
    row = transition(fact)
    return (row.condition or "", holds, row.reason, message)


def _took(fact: Fact, message: str) -> tuple[Phase, str, tuple[str, bool, str, str]]:
    """The phase table's answer to `fact`: its phase, the message, its condition (not holding)."""
    return to(fact), message, _condition(fact, message)


def decide_before_budget(facts: SweepFacts) -> Decision | None:
    """The decision before the budget is asked; None: ask the ledger, then `decide_after_budget`."""
    if spec_is_settled(facts):
        return Decision()
    if facts.sweep is None:
        message = "; ".join(facts.problems)
        return Decision(
            _status(facts, *_took(Fact.SPEC_INVALID, message)),
            (ReleaseBudget(admit_next=False),),
        )
    if facts.sweep.spec.suspend:
        return Decision(
            _status(
                facts,
                to(Fact.SUSPEND_ASKED),
                "spec.suspend is true: the sweep waits and holds no budget",
                _condition(Fact.SUSPEND_ASKED, "spec.suspend is true"),
            ),
            (ReleaseBudget(admit_next=False),),
        )
    if creating_backs_off(facts):
        return Decision()
    return None


def asks_budgets(facts: SweepFacts) -> bool:
    """Whether the admission is decided on the namespace's budgets' answer (read before deciding)."""
    return decide_before_budget(facts) is None


def decide_after_budget(
    facts: SweepFacts, budget: AdmissionDecision, namespace_budget: str, render: RenderContext
) -> Decision:
    """The ledger's answer: Reject and Queue are a status; Admit creates the run's RayJob."""
    if isinstance(budget, Reject):
        return Decision(_status(facts, *_took(Fact.OVER_CAP, budget.reason)))
    if isinstance(budget, Queue):
        message = f"queued: {budget.reason}"
        # a wait an administrator must end is said once as a Warning Event, where `kubectl describe` shows it
        said = facts.status.message == message
        events = (Event("Warning", budget.cause, budget.reason),) if budget.cause and not said else ()
        return Decision(
            _status(
                facts,
                to(Fact.NO_ROOM),
                message,
                ("Admitted", False, budget.cause or transition(Fact.NO_ROOM).reason, budget.reason),
                queuedAt=facts.status.queued_at or rfc3339(facts.now),
                replicas=ReplicasStatus(
                    workers=budget.demand.workers, gpus=budget.demand.gpus, namespace_budget=namespace_budget
                ),
            ),
            events=events,
        )
    sweep = facts.sweep
    assert sweep is not None
    run_id = run_id_for(sweep.uid) if sweep.uid else new_run_id()
    deadline_at = int(facts.now + effective_active_seconds(sweep.spec, facts.limits))
    return Decision(
        actions=(
            CreateRayJob(
                build_rayjob(sweep, run_id, render, deadline_at=deadline_at), run_id, deadline_at, demand=budget.demand
            ),
        )
    )


@dataclass(frozen=True)
class CreateOutcome:
    rayjob: Mapping[str, Any] | None = None
    created: bool = False
    error: str = ""  # the API's refusal, when the create failed
    failures: int = 0  # failed creates in a row, with this one
    retry_in: float = 0.0


def api_error_text(exc: Exception) -> str:
    """The API server's own message (a metav1.Status body) when there is one, else the exception."""
    body = getattr(exc, "body", None)
    if body:
        try:
            doc = json.loads(body)
            return f"HTTP {getattr(exc, 'status', '?')} {doc.get('reason', '')}: {doc.get('message', '')}".strip()
        except (TypeError, ValueError):
            pass
    return f"{type(exc).__name__}: {exc}"


def unowned_or_owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    owners = meta_of(obj).get("ownerReferences") or []
    return not owners or any(o.get("uid") == uid for o in owners)


def after_create(
    facts: SweepFacts,
    create: CreateRayJob,
    budget: Admit,
    outcome: CreateOutcome,
    namespace_budget: str,
    render: RenderContext,
) -> Decision:
    """The RayJob's name follows from the sweep's uid (`run_id_for`), so a create that finds it existing is the
    adoption check: an operator that crashed between creating it and writing the status (or a peer that got there
    first) left exactly that RayJob. One that is not this sweep's is never adopted."""
    sweep = facts.sweep
    assert sweep is not None
    if outcome.error:  # the API refused or is unreachable: the budget must not leak, and the user must know
        message = (
            f"creating the RayJob failed ({outcome.failures} in a row): {outcome.error}; "
            f"retrying in {outcome.retry_in:g}s"
        )
        return Decision(
            _status(facts, *_took(Fact.CREATE_FAILED, message)),
            (ReleaseBudget(admit_next=False),),
            (Event("Warning", "RayJobCreateFailed", message),),
        )
    rayjob = outcome.rayjob
    assert rayjob is not None
    name = meta_of(rayjob)["name"]
    started_at, deadline_at, how = facts.now, create.deadline_at, "created"
    if not outcome.created:
        if (
            not unowned_or_owned_by(rayjob, sweep.uid)
            or (meta_of(rayjob).get("labels") or {}).get(constants.LABEL_RUN_ID) != create.run_id
        ):
            return _name_taken(facts, name)
        created_at = parse_time(meta_of(rayjob).get("creationTimestamp"))
        started_at = created_at.timestamp() if created_at else facts.now
        deadline_at = int(deadline_of(rayjob) or started_at + effective_active_seconds(sweep.spec, facts.limits))
        how = "adopted"
    target = target_of(rayjob) or guard_target(
        sweep,
        s3_layout.run_root(sweep.spec.storage.uri, sweep.namespace, sweep.name, create.run_id),
        create.run_id,
        render,
    )
    workers, gpus = budget.demand.workers, budget.demand.gpus
    message = f"admitted ({workers} worker{'s' * (workers != 1)}, {gpus} GPU{'s' * (gpus != 1)}); RayJob {name} {how}"
    return Decision(_started(facts, create, budget, name, target, started_at, deadline_at, namespace_budget, message))


def _name_taken(facts: SweepFacts, name: str) -> Decision:
    """Held by an object that is not this run's: hold no budget, wait (ticks retry, queued sweeps may go first), say
    why once."""
    message = (
        f"RayJob {name} exists and is not this sweep's run; the sweep starts once it is gone "
        f"(or re-create the sweep: a new sweep gets a new run id)"
    )
    events = (Event("Warning", "RayJobNameTaken", message),) if facts.status.message != message else ()
    return Decision(
        _status(facts, *_took(Fact.NAME_TAKEN, message)),
        (ReleaseBudget(admit_next=False),),
        events,
    )


def _started(
    facts: SweepFacts,
    create: CreateRayJob,
    budget: Admit,
    name: str,
    target: GuardTarget,
    started_at: float,
    deadline_at: float,
    namespace_budget: str,
    message: str,
) -> SweepStatus:
    """The status of a run whose RayJob was created or adopted: Starting, with what the run was admitted with."""
    sweep, demand = facts.sweep, budget.demand
    assert sweep is not None
    return _status(
        facts,
        to(Fact.RAYJOB_CREATED),
        message,
        _condition(Fact.RAYJOB_CREATED, message, True),
        ("Running", False, "Starting", "waiting for the RayCluster and the Ray job"),
        runId=create.run_id,
        rayJobName=name,
        guard=GuardStatus(
            run_root=target.run_root,
            endpoint_url=target.endpoint_url,
            region=target.region,
            verify=target.verify,
            timeout_seconds=target.timeout_seconds,
        ),
        startedAt=rfc3339(started_at),
        deadlineAt=rfc3339(deadline_at),
        replicas=ReplicasStatus(
            workers=demand.workers,
            gpus=demand.gpus,
            cap=worker_cap(sweep.spec, facts.limits),
            namespace_budget=namespace_budget,
        ),
        trials=TrialCounts(total=0, pending=0, running=0, terminated=0, errored=0),
        trialsSummary=trials_summary({}, planned_trials(sweep.spec)),
        usage=UsageStatus(gpu_hours=0),  # the GPU-HOURS column reads 0, not blank, until a GPU pod is measured
        # Created with spec.resume set: that generation is its baseline, nothing to resume yet.
        resumedGeneration=sweep.spec.resume.generation if sweep.spec.resume else None,
    )


def spec_change_problems(body: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
    """The webhook's rule beside a valid spec: while a run is active only spec.suspend may change."""
    if old is None:
        return []
    old_status = read_status(old.get("status"))
    if not old_status.run_id or is_terminal(old_status.phase):
        return []
    before = {k: v for k, v in (old.get("spec") or {}).items() if k != "suspend"}
    after = {k: v for k, v in (body.get("spec") or {}).items() if k != "suspend"}
    return [
        f"spec.{k}: cannot change while run {old_status.run_id} is active; only spec.suspend may "
        "change (delete and re-create the sweep for a new run)"
        for k in sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    ]
