"""A run's attempts (pure): the status.attempts rows, how an attempt's RayJob ended and what a verification of its run
root found.

Also the last resume answered and the status patches that record an attempt's end; shared by resume (which decides on
them) and the run phase (which records an end).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import DRIVER_END_PHASES, RESUMABLE_PHASES, Phase
from sweep_contracts.status_models import AttemptStatus, LastResumeStatus, SweepStatus

from ..policy import Admit
from ..status import DEPLOYMENT_FAILED, StatusChanges, epoch_seconds, rfc3339
from .verdicts import reported_checkpoints

TRIGGER_INITIAL = "Initial"  # the sweep's first RayJob


TRIGGER_RESUME = "Resume"  # spec.resume.generation was raised


TRIGGER_CLUSTER_LOSS = "ClusterLoss"  # failurePolicy.resumeOnClusterLoss


OUTCOME_STARTED = "Started"


OUTCOME_REFUSED = "Refused"


OUTCOME_NOT_RESUMABLE = "NotResumable"


MAX_MISSING_NAMED = 20  # as CheckpointsStatus.problems


ATTEMPT_SUFFIX = "-a"


# KubeRay v1.7.0's RayJob failure reasons (ray-operator/apis/ray/v1/rayjob_types.go, JobFailedReason).
REASON_APP_FAILED = "AppFailed"


REASON_SUBMISSION_FAILED = "SubmissionFailed"


REASON_JOB_STATUS_CHECK_TIMEOUT = "JobStatusCheckTimeoutExceeded"


# Messages KubeRay sets with AppFailed when the head, not the application, went away (rayjob_controller.go).
HEAD_POD_NOT_FOUND = "Ray head pod not found."  # checkSubmitterAndUpdateStatusIfNeeded, SidecarMode


JOB_NOT_FOUND_ON_CLUSTER = "Submitter completed but Ray job not found in RayCluster."  # Reconcile, Running branch


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

    def to_status(self) -> AttemptStatus:
        """The row as `status.attempts[]` holds it (unset fields left out when written)."""
        return AttemptStatus(
            attempt=self.number,
            ray_job_name=self.ray_job_name or None,
            trigger=self.trigger,
            generation=self.generation,
            started_at=rfc3339(self.started_at) if self.started_at is not None else None,
            ended_at=rfc3339(self.ended_at) if self.ended_at is not None else None,
            outcome=self.outcome,
            reason=self.reason,
            active_seconds=self.active_seconds,
            ran_seconds=self.ran_seconds if self.ended_at is not None else None,
            deadline_at=rfc3339(self.deadline_at) if self.deadline_at is not None else None,
            num_samples=self.num_samples,
            checkpoints_at_start=self.checkpoints_at_start,
            checkpoints_verified=self.checkpoints_verified,
        )

    @classmethod
    def from_status(cls, row: AttemptStatus) -> Attempt:
        return cls(
            number=row.attempt or 1,
            ray_job_name=row.ray_job_name or "",
            trigger=row.trigger or TRIGGER_INITIAL,
            generation=row.generation,
            started_at=epoch_seconds(row.started_at),
            ended_at=epoch_seconds(row.ended_at),
            outcome=row.outcome or None,
            reason=row.reason or None,
            active_seconds=row.active_seconds,
            deadline_at=epoch_seconds(row.deadline_at),
            num_samples=row.num_samples,
            checkpoints_at_start=row.checkpoints_at_start,
            checkpoints_verified=row.checkpoints_verified,
        )


def attempts_of(status: SweepStatus, *, num_samples: int | None = None) -> tuple[Attempt, ...]:
    """`status.attempts[]`; for a run from before attempts were recorded, attempt 1 rebuilt from the status
    (its RayJob, startedAt, finishedAt, deadlineAt and phase), so the first resume can count its time."""
    if status.attempts:
        return tuple(Attempt.from_status(row) for row in status.attempts)
    if not status.run_id:
        return ()
    started, ended, deadline = (epoch_seconds(t) for t in (status.started_at, status.finished_at, status.deadline_at))
    phase = status.phase
    ended_phase = phase if phase in RESUMABLE_PHASES or phase == Phase.INVALID else None
    checkpoints = status.checkpoints
    return (
        Attempt(
            number=1,
            ray_job_name=status.ray_job_name or "",
            started_at=started,
            ended_at=ended if ended_phase else None,
            outcome=ended_phase,
            reason=status.reason or None,
            active_seconds=int(deadline - started) if started is not None and deadline is not None else None,
            deadline_at=deadline,
            num_samples=num_samples,
            checkpoints_verified=checkpoints.checked if checkpoints is not None and checkpoints.verified else None,
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
    def from_status(cls, last: LastResumeStatus | None) -> LastResume | None:
        if last is None:
            return None
        return cls(last.attempt, last.trigger or "", last.outcome or "", last.generation)


def attempt_rayjob_name(sweep_name: str, run_id: str, attempt: int) -> str:
    """The RayJob of attempt `attempt`: `<sweep>-<runId>` for the first (as rendering.rayjob_name), then
    `<sweep>-<runId>-a<N>`. KubeRay names the RayCluster after it, so every attempt's name is new; at most 47
    characters (KubeRay's MaxRayJobNameLength), DNS-1035, long names shortened with a hash as for attempt 1."""
    from ..rendering import rayjob_name  # the one shortening rule

    return rayjob_name(sweep_name, run_id, f"{ATTEMPT_SUFFIX}{attempt}" if attempt > 1 else "")


def total_ran_seconds(attempts: Sequence[Attempt]) -> int:
    return sum(a.ran_seconds for a in attempts)


def end_patch(
    status: SweepStatus,
    *,
    phase: str,
    now: float,
    reason: str | None = None,
    checkpoints_verified: int | None = None,
) -> StatusChanges:
    """Close the running attempt's row when the sweep reaches an ended phase ({} when there is none open): changes
    keyed by stored name, for `status.updated`."""
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
) -> LastResumeStatus:
    return LastResumeStatus(
        attempt=attempt,
        trigger=trigger,
        outcome=outcome,
        message=message[:2000],
        decided_at=rfc3339(now),
        generation=generation,
        missing=list(missing) or None,
    )


def rayjob_end_from(
    status: SweepStatus, rayjob: Mapping[str, Any] | None = None, driver_phase: str | None = None
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
    if not status.job_deployment_status:
        return None
    return RayJobEnd(status.job_deployment_status, status.reason or "", "", status.job_status or "", driver_phase)


def pending(body: Mapping[str, Any], status: SweepStatus) -> bool:
    """Whether an ended sweep has a resume to act on (the timer tick asks it, no reads; the spec unparsed, `status`
    the body's as parsed): a spec.resume generation not acted on, or a cluster loss the automatic policy has not
    answered yet."""
    spec = body.get("spec") or {}
    if not status.run_id or (body.get("metadata") or {}).get("deletionTimestamp"):
        return False
    asked = _int((spec.get("resume") or {}).get("generation")) or 0
    if asked > (status.resumed_generation or 0):
        return True
    policy = _int((spec.get("failurePolicy") or {}).get("resumeOnClusterLoss")) or 0
    if policy <= 0 or status.phase != Phase.FAILED:
        return False
    end = rayjob_end_from(status)
    lost = cluster_loss(end) is not None or (end is not None and end.reason == REASON_APP_FAILED)  # message unread
    last = LastResume.from_status(status.last_resume)
    answered = (
        last is not None and last.trigger == TRIGGER_CLUSTER_LOSS and last.attempt == len(attempts_of(status)) + 1
    )
    return lost and not answered


def attempt_sweep(sweep: Any, decision: Any) -> Any:
    """The parsed sweep (validation.Sweep) as attempt `decision.attempt` runs it: its deadlines are the attempt's
    (training_entrypoints/resume.py: the run spec's spec.deadlines and SWEEP_DEADLINE_AT are THIS attempt's), numSamples the total."""
    spec = sweep.spec
    deadlines = spec.deadlines.model_copy(update={"active_seconds": decision.active_seconds})
    tune = spec.tune.model_copy(update={"num_samples": decision.num_samples})
    return replace(sweep, spec=spec.model_copy(update={"deadlines": deadlines, "tune": tune}))


def attempt_rayjob(sweep: Any, run_id: str, context: Any, decision: Any, target: Any) -> dict[str, Any]:
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
    attempt_spec = replace(run_spec, attempt=decision.attempt)
    rayjob["spec"]["runtimeEnvYAML"] = runtime_env.encode(attempt_spec, int(decision.deadline_at))
    rayjob["metadata"]["annotations"][constants.ANNOTATION_RUN_SPEC] = runtime_env.run_spec_digest(attempt_spec)
    return rayjob


def adoptable(rayjob: Mapping[str, Any], run_id: str, owner_uid: str) -> bool:
    """An existing RayJob of an attempt's name is adopted only when an earlier pass of this run created it: it
    carries the run's id and no owner other than the sweep."""
    meta = rayjob.get("metadata") or {}
    owners = [o.get("uid") for o in meta.get("ownerReferences") or []]
    return (meta.get("labels") or {}).get(constants.LABEL_RUN_ID) == run_id and (not owners or owner_uid in owners)


def budget_refusal(budget: Any, hours: Any = None) -> str | None:
    """A resume step's `admit` answer: why the namespace keeps the attempt waiting, None when it admits. `budget` is
    the GPU caps' answer (Admit, Queue, Reject), `hours` the GPU-hour check's decision (None admits)."""
    if not isinstance(budget, Admit):
        return str(getattr(budget, "reason", budget))
    if hours is None:
        return None
    return (hours.status.message if hours.status is not None else None) or "the GPU-hour budget"
