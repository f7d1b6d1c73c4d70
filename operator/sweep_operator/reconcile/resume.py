"""Resuming an ended sweep, as pure decisions: facts in, one decision out, no I/O.

A resume is asked for in the spec (`spec.resume.generation` above `status.resumedGeneration`: what
`kubectl apply` of an edited manifest and `sweepctl resume` both do) or, opted in with
`failurePolicy.resumeOnClusterLoss: N`, by the operator itself when KubeRay reports that the run's
cluster was lost. Either way it is fail-closed: the run root is verified afresh first and a resume
starts only from a verified one, reusing it (same run id, same S3 prefix). Each attempt gets its own
RayJob (`<sweep>-<runId>-a<N>`), guarded as any other. The entrypoint's side of the contract (the run
spec's `attempt`, this attempt's deadlines) is training_entrypoints/resume.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sweep_contracts.api import RESUMABLE_PHASES, Phase
from sweep_contracts.status_models import SweepStatus

from ..phases import Fact, to
from ..status import StatusChanges, conditions_with, rfc3339, updated
from .actions import CreateRayJob, Decision, Event
from .attempts import (
    MAX_MISSING_NAMED,
    OUTCOME_NOT_RESUMABLE,
    OUTCOME_REFUSED,
    OUTCOME_STARTED,
    TRIGGER_CLUSTER_LOSS,
    TRIGGER_RESUME,
    Attempt,
    LastResume,
    RayJobEnd,
    RunRootCheck,
    attempt_rayjob,
    attempt_rayjob_name,
    attempts_of,
    cluster_loss,
    last_resume_status,
    rayjob_end_from,
    total_ran_seconds,
)
from .facts import status_of
from .verdicts import EMPTY_RUN_ROOT, status_target

MIN_ATTEMPT_SECONDS = 30  # DeadlinesSpec.active_seconds' minimum


# ------------------------------------------------------------------------------------------------ facts


@dataclass(frozen=True)
class ResumeFacts:
    """What a resume decision depends on, read before deciding."""

    sweep: str
    phase: str | None
    run_id: str | None
    now: float
    requested_generation: int = 0  # spec.resume.generation (0: no spec.resume)
    resumed_generation: int = 0  # status.resumedGeneration: the last generation acted on
    attempts: tuple[Attempt, ...] = ()
    resume_active_seconds: int | None = None  # spec.resume.activeSeconds
    num_samples: int = 1  # spec.tune.numSamples: the total over all attempts
    startup_seconds: int = 0
    graceful_stop_seconds: int = 0
    max_active_seconds: int | None = None  # the operator's cap
    resume_on_cluster_loss: int = 0  # failurePolicy.resumeOnClusterLoss
    rayjob_end: RayJobEnd | None = None  # None: the last attempt's RayJob is gone (or never reported)
    last_resume: LastResume | None = None
    deleting: bool = False
    verification: RunRootCheck | None = None  # None: not verified yet in this pass

    @property
    def next_attempt(self) -> int:
        return max((a.number for a in self.attempts), default=0) + 1

    @property
    def auto_resumes(self) -> int:
        return sum(1 for a in self.attempts if a.trigger == TRIGGER_CLUSTER_LOSS)


# -------------------------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Idle:
    """Nothing asks for a resume."""


@dataclass(frozen=True)
class NotResumable:
    """A resume was asked for but cannot start; the shell records it (status.lastResume, message, Warning Event
    `ResumeRefused`) and, for spec.resume, consumes the generation (status.resumedGeneration)."""

    reason: str
    trigger: str
    attempt: int
    generation: int | None = None


@dataclass(frozen=True)
class VerifyFirst:
    """A resume is asked for: verify the run root afresh, then decide again with `verification` set."""

    trigger: str
    attempt: int
    generation: int | None = None


@dataclass(frozen=True)
class AutoResume(VerifyFirst):
    """failurePolicy.resumeOnClusterLoss applies: emit `message` as a Normal Event `AutoResume`, then verify."""

    message: str = ""


@dataclass(frozen=True)
class Refuse:
    """The run root is not verified: the resume does not start. `missing` names the objects (kind and key)."""

    reason: str
    missing: tuple[str, ...]
    trigger: str
    attempt: int
    generation: int | None = None


@dataclass(frozen=True)
class StartAttempt:
    """Start attempt `attempt` of the run on the same run root: a RayJob `rayjob_name` whose run spec carries
    `attempt`, `deadlines.activeSeconds = active_seconds` and `tune.numSamples = num_samples`."""

    attempt: int
    trigger: str
    rayjob_name: str
    active_seconds: int
    deadline_at: float
    num_samples: int
    checkpoints_at_start: int
    message: str
    started_at: float
    generation: int | None = None
    warnings: tuple[str, ...] = field(default=())


ResumeDecision = Idle | NotResumable | VerifyFirst | AutoResume | Refuse | StartAttempt


def decide(facts: ResumeFacts) -> ResumeDecision:
    """The one resume decision for a sweep (see the module docstring)."""
    attempt = facts.next_attempt
    if facts.deleting:
        return Idle()
    if facts.requested_generation > facts.resumed_generation:
        trigger, generation, auto_message = TRIGGER_RESUME, facts.requested_generation, ""
        why_not = _manual_refusal(facts)
    else:
        loss = cluster_loss(facts.rayjob_end) if facts.phase == Phase.FAILED and facts.run_id else None
        if loss is None or facts.resume_on_cluster_loss <= 0:
            return Idle()
        last = facts.last_resume
        if last is not None and last.trigger == TRIGGER_CLUSTER_LOSS and last.attempt == attempt:
            return Idle()  # already decided for this loss (refused, or not resumable): say it once
        trigger, generation = TRIGGER_CLUSTER_LOSS, None
        done, allowed = facts.auto_resumes, facts.resume_on_cluster_loss
        why_not = None
        if done >= allowed:
            why_not = (
                f"the cluster was lost ({loss}), and the {allowed} automatic resume(s) "
                f"failurePolicy.resumeOnClusterLoss allows are spent; resume by hand: sweepctl resume {facts.sweep}"
            )
        auto_message = (
            f"cluster lost: {loss}; automatic resume {done + 1}/{allowed} "
            f"(failurePolicy.resumeOnClusterLoss) as attempt {attempt}, after verifying the run root"
        )
    if why_not is not None:
        return NotResumable(why_not, trigger, attempt, generation)
    budget = _attempt_budget(facts, trigger)
    if isinstance(budget, str):
        return NotResumable(budget, trigger, attempt, generation)
    if facts.verification is None:
        if trigger == TRIGGER_CLUSTER_LOSS:
            return AutoResume(trigger, attempt, generation, auto_message)
        return VerifyFirst(trigger, attempt, generation)
    check = facts.verification
    refusal = _run_root_refusal(check)
    if refusal is not None:
        reason, missing = refusal
        return Refuse(reason, missing, trigger, attempt, generation)
    warnings: tuple[str, ...] = ()
    if check.checked == 0:
        warnings = ("no committed checkpoint yet: unfinished trials start from their beginning",)
    name = attempt_rayjob_name(facts.sweep, facts.run_id or "", attempt)
    asked = f"spec.resume.generation {generation}" if generation is not None else "failurePolicy.resumeOnClusterLoss"
    message = (
        f"resuming ({asked}): attempt {attempt} of run {facts.run_id} on RayJob {name}, same run root "
        f"{check.root} ({check.checked} checkpoints verified); deadline in {budget}s, numSamples {facts.num_samples}"
    )
    return StartAttempt(
        attempt,
        trigger,
        name,
        budget,
        facts.now + budget,
        facts.num_samples,
        check.checked,
        message,
        facts.now,
        generation,
        warnings,
    )


def _manual_refusal(facts: ResumeFacts) -> str | None:
    phase = facts.phase or "not yet admitted"
    if facts.phase not in RESUMABLE_PHASES:
        if facts.phase == Phase.INVALID:
            return "the sweep is Invalid and never ran: fix the spec instead (nothing to resume)"
        return (
            f"the sweep is {phase}, not ended: only a {', '.join(RESUMABLE_PHASES[:-1])} or "
            f"{RESUMABLE_PHASES[-1]} sweep can be resumed"
        )
    if not facts.run_id:
        return "the sweep has no run (status.runId is unset): nothing to resume"
    if facts.phase == Phase.SUCCEEDED:
        last = facts.attempts[-1].num_samples if facts.attempts else None
        if last is not None and facts.num_samples <= last:
            return (
                f"the sweep Succeeded: all {last} trials of tune.numSamples finished; raise spec.tune.numSamples "
                f"(sweepctl resume {facts.sweep} --num-samples N) to run more"
            )
    return None


def _attempt_budget(facts: ResumeFacts, trigger: str) -> int | str:
    """Seconds the new attempt may run: spec.resume.activeSeconds for a resume that sets it, else what was left of
    the last attempt's budget when it stopped (the operator's cap applies); a reason when too little is left."""
    budget: int | None
    if trigger == TRIGGER_RESUME and facts.resume_active_seconds is not None:
        budget, source = facts.resume_active_seconds, "spec.resume.activeSeconds"
    else:
        last = facts.attempts[-1] if facts.attempts else None
        if last is None or last.active_seconds is None:
            return "the last attempt's deadline is unknown; set spec.resume.activeSeconds (sweepctl resume --active-seconds N)"
        budget, source = last.active_seconds - last.ran_seconds, f"the remainder of attempt {last.number}'s budget"
    if facts.max_active_seconds is not None and budget > facts.max_active_seconds:
        budget = facts.max_active_seconds
    floor = max(MIN_ATTEMPT_SECONDS, facts.graceful_stop_seconds + 1, facts.startup_seconds + 1)
    if budget < floor:
        return (
            f"{source} is {max(budget, 0)}s, less than the {floor}s an attempt needs (startupSeconds and "
            f"gracefulStopSeconds must fit); set spec.resume.activeSeconds (sweepctl resume {facts.sweep} "
            "--active-seconds N)"
        )
    return budget


def _run_root_refusal(check: RunRootCheck) -> tuple[str, tuple[str, ...]] | None:
    """Fail closed, by the guard's rules: a problem, an empty root, or checkpoints reported but not found."""
    kinds = {kind for kind, _, _ in check.problems}
    if kinds == {EMPTY_RUN_ROOT}:
        return (
            f"the run root {check.root} holds no object: nothing to resume from",
            (f"{EMPTY_RUN_ROOT} {check.root}",),
        )
    if check.problems or not check.verified:
        missing = tuple(f"{kind} {key}".strip() for kind, key, _ in check.problems[:MAX_MISSING_NAMED])
        more = len(check.problems) - MAX_MISSING_NAMED
        named = "; ".join(f"{kind} {key}: {detail}" for kind, key, detail in check.problems[:5]) or "not verified"
        if more > 0:
            named += f" (and {len(check.problems) - 5} more)"
        return (f"the run root {check.root} is not verified, so the resume does not start: {named}", missing)
    if check.checked == 0:
        if not check.records_readable:
            return (
                f"no committed checkpoint under {check.root}, and the run's status could not be read to confirm "
                "none was reported",
                (),
            )
        if check.reported:
            return (
                f"no committed checkpoint under {check.root}, but the run reported {len(check.reported)}: "
                "checkpoints were lost",
                tuple(f"missing-checkpoint {uri}" for uri in check.reported[:MAX_MISSING_NAMED]),
            )
    return None


# ------------------------------------------------------------------------------------------ status patches


def facts_from_sweep(
    body: Mapping[str, Any],
    status: SweepStatus,
    *,
    spec: Any,
    now: float,
    max_active_seconds: int | None = None,
    rayjob_end: RayJobEnd | None = None,
    verification: RunRootCheck | None = None,
) -> ResumeFacts:
    """ResumeFacts from a TrainingSweep object, its status and its parsed spec (api.SweepSpec)."""
    meta = body.get("metadata") or {}
    resume = getattr(spec, "resume", None)
    return ResumeFacts(
        sweep=str(meta.get("name") or ""),
        phase=status.phase,
        run_id=status.run_id,
        now=now,
        requested_generation=int(resume.generation) if resume is not None else 0,
        resumed_generation=status.resumed_generation or 0,
        attempts=attempts_of(status, num_samples=spec.tune.num_samples),
        resume_active_seconds=resume.active_seconds if resume is not None else None,
        num_samples=spec.tune.num_samples,
        startup_seconds=spec.deadlines.startup_seconds,
        graceful_stop_seconds=spec.deadlines.graceful_stop_seconds,
        max_active_seconds=max_active_seconds,
        resume_on_cluster_loss=spec.failure_policy.resume_on_cluster_loss,
        rayjob_end=rayjob_end,
        last_resume=LastResume.from_status(status.last_resume),
        deleting=bool(meta.get("deletionTimestamp")),
        verification=verification,
    )


def start_patch(status: SweepStatus, decision: StartAttempt, *, num_samples: int | None = None) -> StatusChanges:
    """The status fields that record attempt `decision.attempt` as started, keyed by stored name (None deletes).

    `checkpoints` is cleared: the end-of-run verification runs when an ended sweep has no `verifiedAt`, and the
    new attempt's end must be verified again (the check that allowed the start is in the attempt row)."""
    attempts = list(attempts_of(status, num_samples=num_samples))
    attempts.append(
        Attempt(
            number=decision.attempt,
            ray_job_name=decision.rayjob_name,
            trigger=decision.trigger,
            generation=decision.generation,
            started_at=decision.started_at,
            active_seconds=decision.active_seconds,
            deadline_at=decision.deadline_at,
            num_samples=decision.num_samples,
            checkpoints_at_start=decision.checkpoints_at_start,
        )
    )
    patch: dict[str, Any] = {
        "phase": to(Fact.RESUME_STARTED),
        "rayJobName": decision.rayjob_name,
        "rayClusterName": None,
        "jobDeploymentStatus": None,
        "jobStatus": None,
        "reason": None,
        "attemptStartedAt": None,
        "finishedAt": None,
        # The startup clock and the deadline are the attempt's (attempts[0].startedAt keeps the admission time).
        "startedAt": rfc3339(decision.started_at),
        "deadlineAt": rfc3339(decision.deadline_at),
        "checkpoints": None,
        "attempts": [a.to_status() for a in attempts],
        "totalRanSeconds": total_ran_seconds(attempts),
        "lastResume": last_resume_status(
            decision.attempt,
            decision.trigger,
            OUTCOME_STARTED,
            decision.message,
            decision.generation,
            now=decision.started_at,
        ),
        "message": decision.message,
    }
    if decision.generation is not None:
        patch["resumedGeneration"] = decision.generation
    return patch


def refusal_patch(decision: NotResumable | Refuse, *, now: float) -> StatusChanges:
    """The status fields that record a resume that did not start, keyed by stored name (the phase stays)."""
    missing = decision.missing if isinstance(decision, Refuse) else ()
    outcome = OUTCOME_REFUSED if isinstance(decision, Refuse) else OUTCOME_NOT_RESUMABLE
    text = f"resume refused: {decision.reason}"
    patch: dict[str, Any] = {
        "lastResume": last_resume_status(
            decision.attempt, decision.trigger, outcome, text, decision.generation, now=now, missing=missing
        ),
        "message": text,
    }
    if decision.generation is not None:
        patch["resumedGeneration"] = decision.generation
    return patch


def event_for(decision: ResumeDecision) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event a decision is announced with (None: no Event)."""
    if isinstance(decision, AutoResume):
        return "Normal", "AutoResume", decision.message
    if isinstance(decision, StartAttempt):
        return "Normal", "Resumed", decision.message
    if isinstance(decision, Refuse | NotResumable):
        return "Warning", "ResumeRefused", f"resume refused: {decision.reason}"
    return None


# ------------------------------------------------------------------------------------ the decision as data


def as_decision(
    status: SweepStatus, decision: ResumeDecision, *, generation: int | None, now: float, num_samples: int | None = None
) -> Decision | None:
    """A resume decision as the controller's `actions.Decision` (the whole new status and the Events), for the
    outcomes that write: a start (after its RayJob was created or adopted), a refusal. None for the others
    (Idle; VerifyFirst and AutoResume ask the controller to verify and decide again)."""
    if isinstance(decision, StartAttempt):
        return _started(status, decision, generation=generation, now=now, num_samples=num_samples)
    if isinstance(decision, Refuse | NotResumable):
        return _refused(status, decision, generation=generation, now=now)
    return None


def _started(
    status: SweepStatus, decision: StartAttempt, *, generation: int | None, now: float, num_samples: int | None
) -> Decision:
    changes = start_patch(status, decision, num_samples=num_samples)
    updates: list[tuple[str, bool | str, str, str]] = [
        ("Admitted", True, "Resumed", decision.message),
        ("Running", False, "Starting", f"attempt {decision.attempt}: waiting for the RayCluster and the Ray job"),
    ]
    if any(c.type == "DeadlineExceeded" for c in status.conditions or []):
        updates.append(("DeadlineExceeded", False, "Resumed", f"attempt {decision.attempt} has its own deadline"))
    conditions = conditions_with(status, generation, now, *updates)
    new = updated(status, changes, conditions=conditions, observed_generation=generation)
    return Decision(new, events=_announced(decision))


def _refused(status: SweepStatus, decision: NotResumable | Refuse, *, generation: int | None, now: float) -> Decision:
    changes = refusal_patch(decision, now=now)
    return Decision(updated(status, changes, observed_generation=generation), events=_announced(decision))


def _announced(decision: ResumeDecision) -> tuple[Event, ...]:
    said = event_for(decision)
    return (Event(*said),) if said else ()


def may_resume(status: SweepStatus, spec: Any) -> bool:
    """Whether an ended sweep's pass should ask `decide` at all (no reads otherwise): a spec.resume generation not
    acted on yet, or the automatic policy on a Failed sweep."""
    resume = getattr(spec, "resume", None)
    asked = resume is not None and resume.generation > (status.resumed_generation or 0)
    automatic = spec.failure_policy.resume_on_cluster_loss > 0 and status.phase == Phase.FAILED
    return bool(status.run_id) and (asked or automatic)


# ------------------------------------------------------------------------------ one resume step, reads lent


@dataclass(frozen=True)
class ResumeReads:
    """What a resume step decides on, read before it: the run's RayJob, the driver's phase from status.json (a Failed
    run only), and the run root's fresh verification with its records (None: `planned` did not ask for one)."""

    rayjob: Mapping[str, Any] | None = None
    driver: str | None = None
    verification: RunRootCheck | None = None


def planned(
    body: Mapping[str, Any],
    sweep: Any,
    reads: ResumeReads,
    *,
    now: float,
    max_active_seconds: int | None = None,
    status: SweepStatus | None = None,
) -> ResumeDecision:
    """The resume decision over what is read so far: the reads' plan (a `VerifyFirst` asks for the verification, a
    `StartAttempt` for the namespace's budgets of its attempt). `resume_step` decides on the same reads. `status`:
    the body's already parsed (`SweepFacts.status`); None: parsed from the body here."""
    status = status if status is not None else status_of(body)
    facts = _step_facts(body, status, sweep, reads, now, max_active_seconds)
    decision = decide(replace(facts, verification=None))
    if isinstance(decision, VerifyFirst):
        return _verified(facts, decision, status_target(body, status))
    return decision


def resume_step(
    body: Mapping[str, Any],
    sweep: Any,
    reads: ResumeReads,
    admit: Any,
    *,
    now: float,
    context: Any,
    max_active_seconds: int | None = None,
    status: SweepStatus | None = None,
) -> Decision | None:
    """One resume pass for an ended sweep whose end-of-run verification is recorded: the controller's Decision
    (a started attempt with its `CreateRayJob`, whose `taken` is the refusal to write instead when the name is held
    by an object that is not this run's; a refusal), or None (nothing asked, or the verification not read; or it
    waits for namespace capacity, said in the returned Decision's message). `sweep` is the parsed sweep
    (validation.Sweep), `status` the body's already parsed (None: parsed here); `admit(sweep, StartAttempt)` is the namespace budgets' answer
    over what was read (None admits, else why it waits). It reads nothing, creates nothing and posts no Event
    itself."""
    status = status if status is not None else status_of(body)
    if not may_resume(status, sweep.spec):
        return None
    generation = (body.get("metadata") or {}).get("generation")
    target = status_target(body, status)
    facts = _step_facts(body, status, sweep, reads, now, max_active_seconds)
    decision = decide(replace(facts, verification=None))
    said: tuple[Event, ...] = ()
    if isinstance(decision, VerifyFirst):
        if isinstance(decision, AutoResume):
            said = (Event("Normal", "AutoResume", decision.message),)
        if target is not None and reads.verification is None:
            return None  # not read this pass: nothing is decided without it
        decision = _verified(facts, decision, target)
    if isinstance(decision, StartAttempt):
        assert target is not None  # a start follows a verification of the recorded run root
        return _start(status, sweep, facts, decision, target, admit, context, generation, now, said)
    decided = as_decision(status, decision, generation=generation, now=now, num_samples=sweep.spec.tune.num_samples)
    if decided is None:
        return Decision(events=said) if said else None
    return replace(decided, events=(*said, *decided.events))


def _step_facts(
    body: Mapping[str, Any],
    status: SweepStatus,
    sweep: Any,
    reads: ResumeReads,
    now: float,
    max_active_seconds: int | None,
) -> ResumeFacts:
    return facts_from_sweep(
        body,
        status,
        spec=sweep.spec,
        now=now,
        max_active_seconds=max_active_seconds,
        rayjob_end=rayjob_end_from(status, reads.rayjob, reads.driver),
        verification=reads.verification,
    )


def _verified(facts: ResumeFacts, decision: VerifyFirst, target: Any) -> ResumeDecision:
    """The decision again, on the fresh verification of the recorded run root (none recorded: not resumable)."""
    if target is None:
        return NotResumable(
            "the run root is unknown (status.guard is unset): nothing can be verified",
            decision.trigger,
            decision.attempt,
            decision.generation,
        )
    if facts.verification is None:
        return decision  # the verification is still to be read
    return decide(facts)


def _start(
    status: SweepStatus,
    sweep: Any,
    facts: ResumeFacts,
    decision: StartAttempt,
    target: Any,
    admit: Any,
    context: Any,
    generation: int | None,
    now: float,
    said: tuple[Event, ...],
) -> Decision | None:
    """A verified start: it waits for the namespace's capacity, or its RayJob is to be created (a `CreateRayJob`)."""
    waits = admit(sweep, decision)  # the attempt's own deadline is its worst case
    if waits:
        message = f"resume of attempt {decision.attempt} waits for namespace capacity: {waits}"
        if status.message != message:
            return Decision(updated(status, message=message), events=said)
        return Decision(events=said) if said else None
    samples = sweep.spec.tune.num_samples
    try:
        wanted = attempt_rayjob(sweep, facts.run_id or "", context, decision, target)
    except ValueError as exc:
        refusal = NotResumable(str(exc), decision.trigger, decision.attempt, decision.generation)
        refused = _refused(status, refusal, generation=generation, now=now)
        return replace(refused, events=(*said, *refused.events))
    held = f"RayJob {decision.rayjob_name} exists and is not this run's"
    taken = NotResumable(held, decision.trigger, decision.attempt, decision.generation)
    started = _started(status, decision, generation=generation, now=now, num_samples=samples)
    refused = _refused(status, taken, generation=generation, now=now)
    create = CreateRayJob(
        wanted,
        facts.run_id or "",
        int(decision.deadline_at),
        attempt=decision.attempt,
        owner_uid=sweep.uid,
        taken=replace(refused, events=(*said, *refused.events)),
    )
    return Decision(started.status, (create,), (*said, *started.events))
