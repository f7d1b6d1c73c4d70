"""Resuming an ended sweep (issue 16), as pure decisions: facts in, one decision out, no I/O.

A resume is asked for in the spec (`spec.resume.generation` above `status.resumedGeneration`: what
`kubectl apply` of an edited manifest and `sweepctl resume` both do) or, opted in with
`failurePolicy.resumeOnClusterLoss: N`, by the operator itself when KubeRay reports that the run's
cluster was lost. Either way it is fail-closed: the run root is verified afresh first and a resume
starts only from a verified one, reusing it (same run id, same S3 prefix). Each attempt gets its own
RayJob (`<sweep>-<runId>-a<N>`), guarded as any other. /work/notes/RESUME.md is the contract with
the entrypoint (the run spec's `attempt`, this attempt's deadlines).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import DRIVER_END_PHASES, RESUMABLE_PHASES, Phase

from ..policy import Admit
from ..status import DEPLOYMENT_FAILED, epoch_seconds, rfc3339
from .guard import EMPTY_RUN_ROOT, reported_checkpoints

# Phases a sweep can be resumed from. BudgetExhausted: the GPU-hour budget stopped it (raise the budget first).
TRIGGER_INITIAL = "Initial"  # the sweep's first RayJob
TRIGGER_RESUME = "Resume"  # spec.resume.generation was raised
TRIGGER_CLUSTER_LOSS = "ClusterLoss"  # failurePolicy.resumeOnClusterLoss
OUTCOME_STARTED = "Started"
OUTCOME_REFUSED = "Refused"
OUTCOME_NOT_RESUMABLE = "NotResumable"
MIN_ATTEMPT_SECONDS = 30  # DeadlinesSpec.active_seconds' minimum
MAX_MISSING_NAMED = 20  # as CheckpointsStatus.problems
ATTEMPT_SUFFIX = "-a"

# KubeRay v1.7.0's RayJob failure reasons (ray-operator/apis/ray/v1/rayjob_types.go, JobFailedReason).
REASON_APP_FAILED = "AppFailed"
REASON_SUBMISSION_FAILED = "SubmissionFailed"
REASON_JOB_STATUS_CHECK_TIMEOUT = "JobStatusCheckTimeoutExceeded"
# Messages KubeRay sets with AppFailed when the head, not the application, went away (rayjob_controller.go).
HEAD_POD_NOT_FOUND = "Ray head pod not found."  # checkSubmitterAndUpdateStatusIfNeeded, SidecarMode
JOB_NOT_FOUND_ON_CLUSTER = "Submitter completed but Ray job not found in RayCluster."  # Reconcile, Running branch


# ------------------------------------------------------------------------------------------------ facts


@dataclass(frozen=True)
class Attempt:
    """One row of `status.attempts[]`: one RayJob of the run."""

    number: int
    ray_job_name: str = ""
    trigger: str = TRIGGER_INITIAL
    generation: int | None = None  # spec.resume.generation that asked for it (None: not asked by a resume)
    started_at: float | None = None
    ended_at: float | None = None
    outcome: str | None = None  # the sweep phase the attempt ended in; None while it runs
    reason: str | None = None  # the RayJob's failure reason (KubeRay's status.reason), when it has one
    active_seconds: int | None = None  # the attempt's own budget
    deadline_at: float | None = None
    num_samples: int | None = None  # tune.numSamples (the total over all attempts) it ran with
    checkpoints_at_start: int | None = None  # checkpoints verified before it started
    checkpoints_verified: int | None = None  # checkpoints verified at its end

    @property
    def ran_seconds(self) -> int:
        if self.started_at is None or self.ended_at is None:
            return 0
        return max(0, round(self.ended_at - self.started_at))

    @property
    def ended(self) -> bool:
        return self.ended_at is not None or self.outcome is not None

    def to_status(self) -> dict[str, Any]:
        """The row as `status.attempts[]` holds it (api.AttemptStatus, camelCase, unset fields left out)."""
        row = {
            "attempt": self.number,
            "rayJobName": self.ray_job_name or None,
            "trigger": self.trigger,
            "generation": self.generation,
            "startedAt": rfc3339(self.started_at) if self.started_at is not None else None,
            "endedAt": rfc3339(self.ended_at) if self.ended_at is not None else None,
            "outcome": self.outcome,
            "reason": self.reason,
            "activeSeconds": self.active_seconds,
            "ranSeconds": self.ran_seconds if self.ended_at is not None else None,
            "deadlineAt": rfc3339(self.deadline_at) if self.deadline_at is not None else None,
            "numSamples": self.num_samples,
            "checkpointsAtStart": self.checkpoints_at_start,
            "checkpointsVerified": self.checkpoints_verified,
        }
        return {k: v for k, v in row.items() if v is not None}

    @classmethod
    def from_status(cls, row: Mapping[str, Any]) -> Attempt:
        def number(key: str) -> int | None:
            value = row.get(key)
            return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        return cls(
            number=number("attempt") or 1,
            ray_job_name=str(row.get("rayJobName") or ""),
            trigger=str(row.get("trigger") or TRIGGER_INITIAL),
            generation=number("generation"),
            started_at=epoch_seconds(row.get("startedAt")),
            ended_at=epoch_seconds(row.get("endedAt")),
            outcome=row.get("outcome") or None,
            reason=row.get("reason") or None,
            active_seconds=number("activeSeconds"),
            deadline_at=epoch_seconds(row.get("deadlineAt")),
            num_samples=number("numSamples"),
            checkpoints_at_start=number("checkpointsAtStart"),
            checkpoints_verified=number("checkpointsVerified"),
        )


def attempts_of(status: Mapping[str, Any], *, num_samples: int | None = None) -> tuple[Attempt, ...]:
    """`status.attempts[]`; for a run from before attempts were recorded, attempt 1 rebuilt from the status
    (its RayJob, startedAt, finishedAt, deadlineAt and phase), so the first resume can count its time."""
    rows = status.get("attempts")
    if isinstance(rows, list) and rows:
        return tuple(Attempt.from_status(r) for r in rows if isinstance(r, Mapping))
    if not status.get("runId"):
        return ()
    started, ended, deadline = (epoch_seconds(status.get(k)) for k in ("startedAt", "finishedAt", "deadlineAt"))
    phase = status.get("phase")
    ended_phase = phase if phase in RESUMABLE_PHASES or phase == Phase.INVALID else None
    return (
        Attempt(
            number=1,
            ray_job_name=str(status.get("rayJobName") or ""),
            started_at=started,
            ended_at=ended if ended_phase else None,
            outcome=ended_phase,
            reason=status.get("reason") or None,
            active_seconds=int(deadline - started) if started is not None and deadline is not None else None,
            deadline_at=deadline,
            num_samples=num_samples,
            checkpoints_verified=_int((status.get("checkpoints") or {}).get("checked"))
            if (status.get("checkpoints") or {}).get("verified")
            else None,
        ),
    )


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RayJobEnd:
    """How the last attempt's RayJob ended, as KubeRay reports it, and whether the driver recorded its own end."""

    deployment_status: str = ""
    reason: str = ""
    message: str = ""
    job_status: str = ""
    driver_phase: str | None = None  # `phase` of the run's _sweep/status.json (the driver's last word)


def cluster_loss(end: RayJobEnd | None) -> str | None:
    """Why the RayJob's cluster, not the application, is what failed (None: not a cluster loss).

    KubeRay v1.7.0 has no reason of its own for a lost cluster; in K8sJobMode (what the operator renders) a head
    pod that is gone (node lost, spot interruption, deleted) shows as one of these, read from
    ray-operator/controllers/ray/rayjob_controller.go:
    - `JobStatusCheckTimeoutExceeded`: the dashboard on the head did not answer GetJobInfo for
      RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS (300 s by default) (`recordJobStatusCheckFailure`,
      `checkJobStatusCheckTimeoutAndUpdateStatusIfNeeded`); never retried (`checkBackoffLimitAndUpdateStatusIfNeeded`);
    - `SubmissionFailed` while the Ray job was RUNNING: the submitter (`ray job submit`, following the logs) lost the
      head and its Job failed (`checkSubmitterAndUpdateStatusIfNeeded`, K8sJobMode; AppFailed only if the job had
      been seen FAILED);
    - `AppFailed` with "Ray head pod not found." (SidecarMode) or "Submitter completed but Ray job not found in
      RayCluster." (a head that restarted without GCS fault tolerance lost its job table; the Running branch of
      `Reconcile`).
    A driver that recorded its own end (its _sweep/status.json says so) ended by itself: not a cluster loss. A
    `Retrying` RayJob is still KubeRay's to retry (backoffLimit); only `Failed` is final.
    """
    if end is None or end.deployment_status != DEPLOYMENT_FAILED:
        return None
    if end.driver_phase in DRIVER_END_PHASES:
        return None
    if end.reason == REASON_JOB_STATUS_CHECK_TIMEOUT:
        return f"KubeRay could not reach the Ray head ({end.reason}: {end.message or 'job status checks kept failing'})"
    if end.reason == REASON_SUBMISSION_FAILED and end.job_status == "RUNNING":
        return f"the submitter lost the running Ray job's head ({end.reason}: {end.message or 'submission failed'})"
    if end.reason == REASON_APP_FAILED and end.message.strip() in (HEAD_POD_NOT_FOUND, JOB_NOT_FOUND_ON_CLUSTER):
        return f"the Ray head went away ({end.reason}: {end.message.strip()})"
    return None


@dataclass(frozen=True)
class RunRootCheck:
    """A fresh verification of the run root (verification.VerificationResult, reduced to what deciding needs)."""

    root: str
    verified: bool
    checked: int = 0
    problems: tuple[tuple[str, str, str], ...] = ()  # (kind, key, detail)
    reported: tuple[str, ...] = ()  # checkpoint URIs the run's _sweep/status.json / result.json report
    records_readable: bool = True

    @classmethod
    def from_result(
        cls,
        result: Any,
        *,
        progress: Mapping[str, Any] | None = None,
        final: Mapping[str, Any] | None = None,
        records_readable: bool = True,
        root: str | None = None,
    ) -> RunRootCheck:
        problems = tuple((str(p.kind), str(p.key), str(p.detail)) for p in result.problems)
        return cls(
            root if root is not None else str(result.root),
            bool(result.verified),
            int(result.checked),
            problems,
            tuple(reported_checkpoints(progress, final)),
            records_readable,
        )


@dataclass(frozen=True)
class LastResume:
    """`status.lastResume`: the operator's last resume decision (what stops a refused one being retried forever)."""

    attempt: int  # the attempt it would start (or started)
    trigger: str
    outcome: str
    generation: int | None = None

    @classmethod
    def from_status(cls, doc: Mapping[str, Any] | None) -> LastResume | None:
        if not isinstance(doc, Mapping) or not isinstance(doc.get("attempt"), int):
            return None
        return cls(
            int(doc["attempt"]),
            str(doc.get("trigger") or ""),
            str(doc.get("outcome") or ""),
            _int(doc.get("generation")),
        )


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


# --------------------------------------------------------------------------------------------- naming


def attempt_rayjob_name(sweep_name: str, run_id: str, attempt: int) -> str:
    """The RayJob of attempt `attempt`: `<sweep>-<runId>` for the first (as rendering.rayjob_name), then
    `<sweep>-<runId>-a<N>`. KubeRay names the RayCluster after it, so every attempt's name is new; at most 47
    characters (KubeRay's MaxRayJobNameLength), DNS-1035, long names shortened with a hash as for attempt 1."""
    from ..rendering import rayjob_name  # the one shortening rule

    return rayjob_name(sweep_name, run_id, f"{ATTEMPT_SUFFIX}{attempt}" if attempt > 1 else "")


# ------------------------------------------------------------------------------------------ status patches


def facts_from_sweep(
    body: Mapping[str, Any],
    *,
    spec: Any,
    now: float,
    max_active_seconds: int | None = None,
    rayjob_end: RayJobEnd | None = None,
    verification: RunRootCheck | None = None,
) -> ResumeFacts:
    """ResumeFacts from a TrainingSweep object and its parsed spec (api.SweepSpec)."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    resume = getattr(spec, "resume", None)
    return ResumeFacts(
        sweep=str(meta.get("name") or ""),
        phase=status.get("phase"),
        run_id=status.get("runId"),
        now=now,
        requested_generation=int(resume.generation) if resume is not None else 0,
        resumed_generation=_int(status.get("resumedGeneration")) or 0,
        attempts=attempts_of(status, num_samples=spec.tune.num_samples),
        resume_active_seconds=resume.active_seconds if resume is not None else None,
        num_samples=spec.tune.num_samples,
        startup_seconds=spec.deadlines.startup_seconds,
        graceful_stop_seconds=spec.deadlines.graceful_stop_seconds,
        max_active_seconds=max_active_seconds,
        resume_on_cluster_loss=spec.failure_policy.resume_on_cluster_loss,
        rayjob_end=rayjob_end,
        last_resume=LastResume.from_status(status.get("lastResume")),
        deleting=bool(meta.get("deletionTimestamp")),
        verification=verification,
    )


def total_ran_seconds(attempts: Sequence[Attempt]) -> int:
    return sum(a.ran_seconds for a in attempts)


def start_patch(status: Mapping[str, Any], decision: StartAttempt, *, num_samples: int | None = None) -> dict[str, Any]:
    """The status fields that record attempt `decision.attempt` as started (merge-patch: None deletes).

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
        "phase": Phase.STARTING,
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


def refusal_patch(decision: NotResumable | Refuse, *, now: float) -> dict[str, Any]:
    """The status fields that record a resume that did not start (the phase stays what it was)."""
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


def end_patch(
    status: Mapping[str, Any],
    *,
    phase: str,
    now: float,
    reason: str | None = None,
    checkpoints_verified: int | None = None,
) -> dict[str, Any]:
    """Close the running attempt's row when the sweep reaches an ended phase ({} when there is none open)."""
    attempts = list(attempts_of(status))
    if not attempts or (attempts[-1].ended_at is not None and checkpoints_verified is None):
        return {}
    last = attempts[-1]
    attempts[-1] = replace(
        last,
        ended_at=last.ended_at if last.ended_at is not None else now,
        outcome=last.outcome or phase,
        reason=last.reason or reason or None,
        checkpoints_verified=checkpoints_verified if checkpoints_verified is not None else last.checkpoints_verified,
    )
    return {"attempts": [a.to_status() for a in attempts], "totalRanSeconds": total_ran_seconds(attempts)}


def last_resume_status(
    attempt: int,
    trigger: str,
    outcome: str,
    message: str,
    generation: int | None,
    *,
    now: float,
    missing: Sequence[str] = (),
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "attempt": attempt,
        "trigger": trigger,
        "outcome": outcome,
        "message": message[:2000],
        "decidedAt": rfc3339(now),
    }
    if generation is not None:
        doc["generation"] = generation
    if missing:
        doc["missing"] = list(missing)
    return doc


def event_for(decision: ResumeDecision) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event a decision is announced with (None: no Event)."""
    if isinstance(decision, AutoResume):
        return "Normal", "AutoResume", decision.message
    if isinstance(decision, StartAttempt):
        return "Normal", "Resumed", decision.message
    if isinstance(decision, Refuse | NotResumable):
        return "Warning", "ResumeRefused", f"resume refused: {decision.reason}"
    return None


# --------------------------------------------------------------------------------------------- rendering


def attempt_sweep(sweep: Any, decision: StartAttempt) -> Any:
    """The parsed sweep (validation.Sweep) as attempt `decision.attempt` runs it: its deadlines are the attempt's
    (RESUME.md: the run spec's spec.deadlines and SWEEP_DEADLINE_AT are THIS attempt's), numSamples the total."""
    spec = sweep.spec
    deadlines = spec.deadlines.model_copy(update={"active_seconds": decision.active_seconds})
    tune = spec.tune.model_copy(update={"num_samples": decision.num_samples})
    return replace(sweep, spec=spec.model_copy(update={"deadlines": deadlines, "tune": tune}))


def attempt_rayjob(sweep: Any, run_id: str, context: Any, decision: StartAttempt, target: Any) -> dict[str, Any]:
    """The RayJob of attempt N > 1: rendered as any (finalizer, labels, owner), named `decision.rayjob_name`, its run
    spec carrying `attempt` and the attempt's deadline. Its guard annotation is `target` (guard.GuardTarget), the
    one the first attempt recorded (status.guard), never re-read from today's spec: the run root holds the earlier
    attempts' checkpoints, and a spec edit (spec.deletion.verifyCheckpoints: false) must not unguard them.
    ValueError when the rendered run root is not the target's (a resume never moves it)."""
    from dataclasses import replace as replace_fields

    from sweep_contracts import runtime_env

    from ..rendering import build_rayjob

    rayjob = build_rayjob(attempt_sweep(sweep, decision), run_id, context, deadline_at=int(decision.deadline_at))
    run_spec = runtime_env.run_spec_of(rayjob)
    if run_spec is None or run_spec.run_root != target.run_root:
        rendered = run_spec.run_root if run_spec else "none"
        raise ValueError(f"attempt {decision.attempt} would write to {rendered}, not the run root {target.run_root}")
    rayjob["metadata"]["name"] = decision.rayjob_name
    recorded = replace_fields(target, sweep=sweep.name, run_id=run_id)
    rayjob["metadata"]["annotations"][constants.ANNOTATION_GUARD] = recorded.to_annotation()
    rayjob["spec"]["runtimeEnvYAML"] = runtime_env.encode(
        replace(run_spec, attempt=decision.attempt), int(decision.deadline_at)
    )
    return rayjob


# ------------------------------------------------------------------------------------ the decision as data


def as_decision(
    status: Mapping[str, Any],
    decision: ResumeDecision,
    *,
    generation: int | None,
    now: float,
    num_samples: int | None = None,
) -> Any:
    """A resume decision as the controller's `actions.Decision` (the whole new status and the Events), for the
    outcomes that write: a start (after its RayJob was created or adopted), a refusal. None for the others
    (Idle; VerifyFirst and AutoResume ask the controller to verify and decide again)."""
    from ..status import conditions_with, updated
    from .actions import Decision, Event

    announced = event_for(decision)
    events = (Event(*announced),) if announced else ()
    if isinstance(decision, StartAttempt):
        changes = start_patch(status, decision, num_samples=num_samples)
        updates: list[tuple[str, bool | str, str, str]] = [
            ("Admitted", True, "Resumed", decision.message),
            ("Running", False, "Starting", f"attempt {decision.attempt}: waiting for the RayCluster and the Ray job"),
            ("Ready", False, "Starting", "the sweep has not finished"),
        ]
        if any(c.get("type") == "DeadlineExceeded" for c in status.get("conditions") or []):
            updates.append(("DeadlineExceeded", False, "Resumed", f"attempt {decision.attempt} has its own deadline"))
        changes["conditions"] = conditions_with(status, generation, now, *updates)
        changes["observedGeneration"] = generation
        return Decision(updated(status, changes), events=events)
    if isinstance(decision, Refuse | NotResumable):
        changes = refusal_patch(decision, now=now)
        changes["observedGeneration"] = generation
        return Decision(updated(status, changes), events=events)
    return None


def rayjob_end_from(
    status: Mapping[str, Any], rayjob: Mapping[str, Any] | None = None, driver_phase: str | None = None
) -> RayJobEnd | None:
    """How the last attempt's RayJob ended: from the RayJob when it is still there, else from what the sweep's
    status recorded of it at the end (jobDeploymentStatus, jobStatus, reason). None: nothing recorded."""
    if rayjob is not None:
        seen = rayjob.get("status") or {}
        return RayJobEnd(
            str(seen.get("jobDeploymentStatus") or ""),
            str(seen.get("reason") or ""),
            str(seen.get("message") or ""),
            str(seen.get("jobStatus") or ""),
            driver_phase,
        )
    if not status.get("jobDeploymentStatus"):
        return None
    return RayJobEnd(
        str(status.get("jobDeploymentStatus") or ""),
        str(status.get("reason") or ""),
        "",
        str(status.get("jobStatus") or ""),
        driver_phase,
    )


def may_resume(status: Mapping[str, Any], spec: Any) -> bool:
    """Whether an ended sweep's pass should ask `decide` at all (no reads otherwise): a spec.resume generation not
    acted on yet, or the automatic policy on a Failed sweep."""
    resume = getattr(spec, "resume", None)
    asked = resume is not None and resume.generation > (_int(status.get("resumedGeneration")) or 0)
    automatic = spec.failure_policy.resume_on_cluster_loss > 0 and status.get("phase") == Phase.FAILED
    return bool(status.get("runId")) and (asked or automatic)


# ------------------------------------------------------------------------------ one resume step, I/O injected


@dataclass(frozen=True)
class ResumePorts:
    """What the controller lends a resume step (the only I/O it does, all injected)."""

    verify: Any  # (GuardTarget) -> verification.VerificationResult, afresh
    documents: Any  # (GuardTarget) -> (status.json, result.json, readable): reads.Reads.run_documents
    rayjob: Any  # (name) -> the RayJob object or None
    admit: Any  # (parsed sweep, StartAttempt) -> None when the namespace budgets admit the attempt, else why it waits
    create: Any  # (rayjob dict) -> (object, created): kube.KubeApi.create_rayjob
    emit: Any  # (type, reason, message) -> None: an Event on the sweep


def budget_refusal(budget: Any, hours: Any = None) -> str | None:
    """`ResumePorts.admit`'s answer: why the namespace keeps the attempt waiting, None when it admits. `budget` is
    the GPU caps' answer (Admit, Queue, Reject), `hours` the GPU-hour check's decision (None admits)."""
    if not isinstance(budget, Admit):
        return str(getattr(budget, "reason", budget))
    if hours is None:
        return None
    return str((hours.status or {}).get("message") or "the GPU-hour budget")


def resume_step(
    body: Mapping[str, Any],
    sweep: Any,
    ports: ResumePorts,
    *,
    now: float,
    context: Any,
    max_active_seconds: int | None = None,
) -> Any:
    """One resume pass for an ended sweep whose end-of-run verification is recorded: the controller's Decision
    to write (a started attempt, a refusal), or None (nothing asked; or it waits for namespace capacity, said in
    the returned Decision's message). `sweep` is the parsed sweep (validation.Sweep)."""
    from ..status import updated
    from .actions import Decision
    from .guard import status_target

    status = dict(body.get("status") or {})
    if not may_resume(status, sweep.spec):
        return None
    generation = (body.get("metadata") or {}).get("generation")
    rayjob = ports.rayjob(status.get("rayJobName") or "") if status.get("rayJobName") else None
    target = status_target(body)
    driver = None
    if target is not None and status.get("phase") == Phase.FAILED:
        progress, _, _ = ports.documents(target)
        driver = (progress or {}).get("phase") if isinstance((progress or {}).get("phase"), str) else None
    facts = facts_from_sweep(
        body,
        spec=sweep.spec,
        now=now,
        max_active_seconds=max_active_seconds,
        rayjob_end=rayjob_end_from(status, rayjob, driver),
    )
    decision = decide(facts)
    if isinstance(decision, VerifyFirst):
        if isinstance(decision, AutoResume):
            ports.emit("Normal", "AutoResume", decision.message)
        if target is None:
            decision = NotResumable(
                "the run root is unknown (status.guard is unset): nothing can be verified",
                decision.trigger,
                decision.attempt,
                decision.generation,
            )
        else:
            result = ports.verify(target)
            progress, final, readable = ports.documents(target)
            check = RunRootCheck.from_result(
                result, progress=progress, final=final, records_readable=readable, root=target.run_root
            )
            decision = decide(replace(facts, verification=check))
    if isinstance(decision, StartAttempt):
        assert target is not None  # a start follows a verification of the recorded run root
        waits = ports.admit(sweep, decision)  # the attempt's own deadline is its worst case
        if waits:
            message = f"resume of attempt {decision.attempt} waits for namespace capacity: {waits}"
            return Decision(updated(status, {"message": message})) if status.get("message") != message else None
        try:
            wanted = attempt_rayjob(sweep, facts.run_id or "", context, decision, target)
        except ValueError as exc:
            decision = NotResumable(str(exc), decision.trigger, decision.attempt, decision.generation)
        else:
            created, fresh = ports.create(wanted)
            meta = created.get("metadata") or {}
            owners = [o.get("uid") for o in meta.get("ownerReferences") or []]
            ours = (meta.get("labels") or {}).get(constants.LABEL_RUN_ID) == facts.run_id and (
                not owners or sweep.uid in owners
            )
            if not fresh and not ours:  # adopted only when an earlier pass created it
                decision = NotResumable(
                    f"RayJob {decision.rayjob_name} exists and is not this run's",
                    decision.trigger,
                    decision.attempt,
                    decision.generation,
                )
    return as_decision(status, decision, generation=generation, now=now, num_samples=sweep.spec.tune.num_samples)


def pending(body: Mapping[str, Any]) -> bool:
    """Whether an ended sweep has a resume to act on, from the raw object (the timer tick asks it, no parse, no
    reads): a spec.resume generation not acted on, or a cluster loss the automatic policy has not answered yet."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    if not status.get("runId") or (body.get("metadata") or {}).get("deletionTimestamp"):
        return False
    asked = _int((spec.get("resume") or {}).get("generation")) or 0
    if asked > (_int(status.get("resumedGeneration")) or 0):
        return True
    policy = _int((spec.get("failurePolicy") or {}).get("resumeOnClusterLoss")) or 0
    if policy <= 0 or status.get("phase") != Phase.FAILED:
        return False
    end = rayjob_end_from(status)
    lost = cluster_loss(end) is not None or (end is not None and end.reason == REASON_APP_FAILED)  # message unread
    last = LastResume.from_status(status.get("lastResume"))
    answered = (
        last is not None and last.trigger == TRIGGER_CLUSTER_LOSS and last.attempt == len(attempts_of(status)) + 1
    )
    return lost and not answered
