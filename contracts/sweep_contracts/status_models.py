"""The TrainingSweep's status as pydantic models (the CRD's status schema is generated from them), its phases and the
sets of them every module reads, and its condition types."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool
from pydantic.alias_generators import to_camel


class Phase(StrEnum):
    """A sweep's lifecycle phase. str-valued: stored statuses, the CRD's enum and comparisons with read strings are
    unchanged. The sets below are the one list of which phases end a run, warn, and may be resumed."""

    PENDING = "Pending"
    QUEUED = "Queued"
    STARTING = "Starting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    INVALID = "Invalid"
    DELETING = "Deleting"
    SUSPENDED = "Suspended"
    BUDGET_EXHAUSTED = "BudgetExhausted"


# A run is over: nothing more happens without a resume or a spec change.
TERMINAL_PHASES: frozenset[str] = frozenset(
    {Phase.SUCCEEDED, Phase.FAILED, Phase.DEADLINE_EXCEEDED, Phase.INVALID, Phase.BUDGET_EXHAUSTED}
)
# The phase Event is a Warning.
WARNING_PHASES: frozenset[str] = frozenset({Phase.FAILED, Phase.DEADLINE_EXCEEDED, Phase.INVALID})
# An ended run whose sweep may start another attempt (spec.resume, `sweepctl resume`); ordered for messages.
RESUMABLE_PHASES: tuple[str, ...] = (Phase.DEADLINE_EXCEEDED, Phase.FAILED, Phase.SUCCEEDED, Phase.BUDGET_EXHAUSTED)
# Before a run: no RayJob is ours yet, or it has not started.
WAITING_PHASES: frozenset[str] = frozenset({Phase.PENDING, Phase.QUEUED, Phase.STARTING, Phase.SUSPENDED})
# The driver's own end phases in its progress document: how the Ray job ended, "Stopped" when it was signalled.
DRIVER_STOPPED = "Stopped"
DRIVER_END_PHASES: frozenset[str] = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.DEADLINE_EXCEEDED, DRIVER_STOPPED})
CONDITION_TYPES: tuple[str, ...] = (
    "Admitted",
    "Running",
    "CheckpointsVerified",
    "DeadlineExceeded",
    "Ready",
    "BudgetExhausted",
    "Complete",
    "Failed",
)


class StatusModel(BaseModel):
    """Frozen: the operator parses a stored status once per resourceVersion and every pass shares that copy; a
    decision returns a changed copy (`model_copy`, `sweep_operator.status.updated`), never edits the one read."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class TrialCounts(StatusModel):
    total: int = Field(0, description="Trials known to Tune.")
    pending: int = Field(0, description="Trials waiting for resources.")
    running: int = Field(0, description="Trials running.")
    terminated: int = Field(0, description="Trials finished normally (including early-stopped).")
    errored: int = Field(0, description="Trials that failed.")


class BestTrial(StatusModel):
    id: str | None = Field(None, description="Tune trial id.")
    metric: str | None = Field(None, description="Metric name (tune.metric).")
    value: float | None = Field(None, description="Best value of the metric.")
    config: dict[str, Any] | None = Field(None, description="The trial's hyper-parameters.")
    checkpoint_uri: str | None = Field(None, description="s3:// URI of its best checkpoint.")


class CheckpointProblem(StatusModel):
    kind: str = Field(..., description="What is wrong (missing-file, size-mismatch, missing-manifest, s3-error, ...).")
    key: str = Field("", description="S3 key concerned.")
    detail: str = Field("", description="Explanation.")


class CheckpointsStatus(StatusModel):
    summary: str | None = Field(
        None,
        description="What verification proved, as the VERIFIED column shows it: how many checkpoints at which "
        "level (`4 full-state`, `4 committed`, `4 committed (2 full-state)`), `none`, or `failed: <reason>`. "
        "committed: every file Ray committed is there unchanged (any loop); full-state: the helpers' manifests "
        "prove model, optimizer, RNG and data position too.",
    )
    # Strict: what the guard and the Ready condition act on is a JSON boolean, never a string read as one.
    verified: StrictBool | None = Field(None, description="Whether every committed checkpoint is complete in S3.")
    full_state: int | None = Field(None, description="Verified checkpoints proven at the full-state level.")
    checked: int | None = Field(None, description="Checkpoints checked.")
    bytes: int | None = Field(None, description="Bytes the verified checkpoints hold.")
    problems: list[CheckpointProblem] | None = Field(None, description="Why verification failed (first 20).")
    verified_at: str | None = Field(None, description="When verification last ran (RFC 3339).")


class ReplicasStatus(StatusModel):
    workers: int | None = Field(None, description="Worker pods the sweep may use (workers x maxConcurrentTrials).")
    gpus: int | None = Field(None, description="GPUs the sweep may use.")
    cap: int | None = Field(None, description="maxReplicas rendered on the worker group.")
    namespace_budget: str | None = Field(
        None,
        description="GPUs admitted in the sweep's namespace / its budget (maxGpusPerNamespace) at admission, e.g. 12/32.",
    )


class Condition(StatusModel):
    type: str = Field(
        ...,
        description="Admitted, Running, CheckpointsCommitted, CheckpointsVerified, DeadlineExceeded, BudgetExhausted, "
        "Complete (True once the sweep Succeeded), Failed (True once it ended Failed, DeadlineExceeded, "
        "BudgetExhausted or Invalid; the reason and message say why) or Ready (True once it Succeeded with its "
        "checkpoints verified).",
    )
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: str = Field(..., description="CamelCase reason.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: str = Field(..., description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="metadata.generation the condition reflects.")


class GuardStatus(StatusModel):
    run_root: str | None = Field(None, description="The run's S3 prefix: <storage.uri>/<namespace>/<sweep>-<runId>.")
    endpoint_url: str | None = Field(None, description="S3 endpoint the run writes to (empty: AWS).")
    region: str | None = Field(None, description="S3 region of the run's bucket.")
    # Strict: "false" (a string) must not switch verification off as a boolean false does.
    verify: StrictBool | None = Field(None, description="spec.deletion.verifyCheckpoints at admission.")
    timeout_seconds: int | None = Field(None, description="spec.deletion.verificationTimeoutSeconds at admission.")


class AttemptStatus(StatusModel):
    attempt: int = Field(..., description="1 for the sweep's first RayJob, then one more per resume.")
    ray_job_name: str | None = Field(None, description="The attempt's RayJob (<sweep>-<runId>, then -a<N>).")
    trigger: str | None = Field(
        None, description="Initial, Resume (spec.resume.generation) or ClusterLoss (failurePolicy.resumeOnClusterLoss)."
    )
    generation: int | None = Field(None, description="spec.resume.generation that asked for it.")
    started_at: str | None = Field(None, description="When the attempt started (RFC 3339).")
    ended_at: str | None = Field(None, description="When it ended (RFC 3339); unset while it runs.")
    outcome: str | None = Field(None, description="The phase it ended in (Succeeded, Failed, DeadlineExceeded, ...).")
    reason: str | None = Field(None, description="The RayJob's failure reason (KubeRay status.reason), if any.")
    active_seconds: int | None = Field(None, description="The attempt's own deadline, in seconds from its start.")
    ran_seconds: int | None = Field(None, description="Seconds it ran (endedAt - startedAt).")
    deadline_at: str | None = Field(None, description="Its deadline (RFC 3339).")
    num_samples: int | None = Field(None, description="tune.numSamples (the total over all attempts) it ran with.")
    checkpoints_at_start: int | None = Field(None, description="Checkpoints verified before it started.")
    checkpoints_verified: int | None = Field(None, description="Checkpoints verified at its end.")


class LastResumeStatus(StatusModel):
    attempt: int = Field(..., description="The attempt the resume started, or would have started.")
    trigger: str | None = Field(None, description="Resume or ClusterLoss.")
    generation: int | None = Field(None, description="spec.resume.generation it answers.")
    outcome: str | None = Field(None, description="Started, Refused (the run root is not verified) or NotResumable.")
    message: str | None = Field(None, description="Why, in words.")
    missing: list[str] | None = Field(None, description="What the verifier found missing or wrong (kind and key).")
    decided_at: str | None = Field(None, description="When (RFC 3339).")


class KueueStatus(StatusModel):
    local_queue: str | None = Field(None, description="The LocalQueue the sweep's RayJob is queued in.")
    cluster_queue: str | None = Field(None, description="The ClusterQueue that admitted it (while admitted).")
    workload: str | None = Field(None, description="The Kueue Workload of the RayJob.")
    state: str | None = Field(None, description="WaitingForWorkload, Queued, Admitted, Preempted or Finished.")
    summary: str | None = Field(
        None,
        description="The printer column's text, e.g. Queued (Kueue: team-a-gpu); "
        "status.message adds Kueue's own admission message.",
    )
    admitted_seconds: int | None = Field(
        None,
        description="Seconds admitted, over the closed admitted intervals: the "
        "sweep deadline counts only while Kueue admits it.",
    )
    admitted_since: str | None = Field(
        None,
        description="Start of the current admission (RFC 3339); unset while "
        "queued or preempted (the deadline is paused).",
    )
    first_admitted_at: str | None = Field(None, description="The first admission (RFC 3339).")
    last_admission_at: str | None = Field(
        None,
        description="Kueue's Admitted time of the last admission counted (RFC 3339): an attempt admitted and "
        "finished between two of the operator's looks is counted once, from the Workload's own times.",
    )
    admissions: int | None = Field(None, description="How many times Kueue admitted it.")
    preemptions: int | None = Field(None, description="How many times Kueue took the admission back (evicted it).")


class PodIntervalStatus(StatusModel):
    pod: str = Field(
        ..., description="The pod's uid (its name where no uid was seen); merged:<uid> for merged entries."
    )
    name: str | None = Field(None, description="The pod's name, where it differs from pod.")
    cluster: str = Field("", description="The RayCluster the pod belonged to (one per RayJob attempt).")
    gpus: float = Field(..., description="nvidia.com/gpu the pod held (a merged entry: their mean over its span).")
    start: str = Field(..., description="When the pod was scheduled (its PodScheduled condition), RFC 3339.")
    end: str | None = Field(None, description="When it stopped holding GPUs (RFC 3339); unset while it still does.")


class AttemptUsageStatus(StatusModel):
    ray_cluster_name: str = Field(..., description="The attempt's RayCluster.")
    gpu_hours: float = Field(..., description="GPU-hours its GPU pods held.")
    pods: int = Field(..., description="GPU pods (intervals) recorded for it.")
    started_at: str = Field(..., description="When its first GPU pod was scheduled.")
    ended_at: str | None = Field(None, description="When its last GPU pod stopped; unset while one still runs.")


class NamespaceUsageStatus(StatusModel):
    gpu_hours: float | None = Field(None, description="GPU-hours the namespace's sweeps held inside its window.")
    budget_gpu_hours: float | None = Field(None, description="The namespace's GPU-hour budget per window.")
    left_gpu_hours: float | None = Field(
        None, description="Budget left in the window (less running sweeps' reservations)."
    )
    window_seconds: int | None = Field(None, description="The rolling window the namespace budget counts over.")


class UsageStatus(StatusModel):
    gpu_hours: float | None = Field(
        None, description="GPU-hours the sweep's GPU pods held, scheduled to gone, at lastMeasuredAt."
    )
    gpus_held: float | None = Field(None, description="GPUs its pods held at lastMeasuredAt.")
    budget_gpu_hours: float | None = Field(None, description="spec.budget.gpuHours.")
    left_gpu_hours: float | None = Field(None, description="What is left of spec.budget.gpuHours.")
    last_measured_at: str | None = Field(None, description="When the pods were last read (RFC 3339).")
    attempts: list[AttemptUsageStatus] | None = Field(
        None, max_length=64, description="GPU-hours per RayCluster (attempt)."
    )
    pod_intervals: list[PodIntervalStatus] | None = Field(
        None, max_length=64, description="The record: one entry per GPU pod (older finished ones merge past 64)."
    )
    thresholds_reported: list[int] | None = Field(
        None, max_length=4, description="Budget thresholds (percent) already reported by an Event and a metric."
    )
    namespace: NamespaceUsageStatus | None = Field(
        None, description="The namespace's GPU-hour window, when it has a budget."
    )


class IdleGpuStatus(StatusModel):
    held_deletion: float | None = Field(
        None,
        description="GPU-seconds the workers of a RayCluster whose deletion the guard held kept before they were freed.",
    )
    preemption: float | None = Field(
        None,
        description="The same, for a cluster Kueue preempted: GPU-seconds from the eviction until its workers went.",
    )
    stopping: float | None = Field(
        None,
        description="GPU-seconds the workers held from a graceful stop's request until the operator suspended them.",
    )
    unscheduled_trials: float | None = Field(
        None,
        description=(
            "GPU-seconds GPU workers were up beyond what the running trials the driver's _sweep/status.json showed "
            "use (none running, or fewer than the workers hold)."
        ),
    )


class GracefulStopStatus(StatusModel):
    ray_job_uid: str = Field(..., description="The RayJob whose Ray job the operator asked to stop.")
    requested_at: str = Field(..., description="When the operator asked the head to stop it (RFC 3339).")
    idle_recorded: bool | None = Field(
        None, description="The stop's GPU time is in idleGpuSeconds.stopping (a restarted operator adds it once)."
    )


MAX_STOP_UPLOADS_LISTED = 20  # uploads a stop could not wait for that status.lastStop names (the count says the rest)


class StopUploadStatus(StatusModel):
    trial: str = Field(..., description="The trial whose upload it was.")
    checkpoint: str | None = Field(
        None, description="The checkpoint folder being uploaded (unset when the driver could not see its name)."
    )


class LastStopStatus(StatusModel):
    ray_job_uid: str | None = Field(None, description="The RayJob whose driver recorded the stop.")
    stopped_at: str | None = Field(None, description="When the driver recorded the stop (RFC 3339).")
    waited_seconds: float | None = Field(None, description="Seconds from the stop's request to its record.")
    uploads_waited_for: int | None = Field(
        None, description="Checkpoint uploads in flight at the stop that the driver waited for."
    )
    uploads_committed: int | None = Field(
        None, description="Of those, the ones Ray committed within the window (the guard, resume and report use them)."
    )
    uploads_not_waited_for: list[StopUploadStatus] | None = Field(
        None,
        max_length=MAX_STOP_UPLOADS_LISTED,
        description="Uploads the stop could not wait for (still in flight when its time for uploads ran out, or "
        "started after it): never committed, never used.",
    )
    uploads_not_waited_for_count: int | None = Field(
        None, description="How many uploads the stop could not wait for (uploadsNotWaitedFor lists the first ones)."
    )
    message: str | None = Field(None, description="What the stop did with the uploads in flight, in words.")


MAX_LINEAGE_ENTRIES = 20  # the newest exploits status.lineage lists (the run's status.json keeps 50, the count all)
MAX_LINEAGE_CHANGES = 8  # mutated parameters one exploit lists
MAX_LINEAGE_VALUE_CHARS = 64


class LineageChange(StatusModel):
    param: str | None = Field(None, description="The mutated parameter (spec.tune.scheduler.hyperparamMutations).")
    before: str | None = Field(None, description="The donor's value, as text.")
    after: str | None = Field(None, description="The value the trial continued with, as text.")


class LineageEntry(StatusModel):
    trial: str | None = Field(None, description="The trial that continued from the donor's checkpoint.")
    donor: str | None = Field(None, description="The trial whose committed checkpoint it continued from.")
    step: int | None = Field(None, description="The donor's step (tune.scheduler.timeAttr) at the exploit.")
    changes: list[LineageChange] | None = Field(
        None, max_length=MAX_LINEAGE_CHANGES, description="The config change from the donor's config."
    )
    at: str | None = Field(None, description="When the scheduler decided the exploit (RFC 3339).")


class LineageStatus(StatusModel):
    exploits: int | None = Field(None, description="Exploits so far, over every attempt of the run.")
    entries: list[LineageEntry] | None = Field(
        None, max_length=MAX_LINEAGE_ENTRIES, description="The newest exploits, oldest first."
    )


class TrackingStatus(StatusModel):
    url: str | None = Field(None, description="The sweep's parent run in the MLflow UI (spec.tracking.mlflow).")
    experiment_id: str | None = Field(None, description="The MLflow experiment id of the sweep's runs.")
    run_id: str | None = Field(None, description="The MLflow run id of the sweep's parent run.")
    available: bool | None = Field(
        None, description="Whether the driver's last call to the server succeeded (condition TrackingAvailable)."
    )
    pending: int | None = Field(None, description="Metric points, params and tags waiting to be logged.")
    dropped: int | None = Field(
        None, description="Metric points dropped because the server stayed unreachable past the driver's buffer."
    )
    last_error: str | None = Field(None, description="Why the last call to the server failed (while unavailable).")


class SweepStatus(StatusModel):
    phase: Phase | None = Field(None, description="Lifecycle phase.")
    run_id: str | None = Field(None, description="Run id: the run's S3 prefix is <sweep>-<runId>.")
    ray_job_name: str | None = Field(None, description="The RayJob of this run.")
    ray_cluster_name: str | None = Field(None, description="The RayCluster of the current attempt.")
    job_deployment_status: str | None = Field(None, description="RayJob status.jobDeploymentStatus.")
    job_status: str | None = Field(None, description="RayJob status.jobStatus.")
    reason: str | None = Field(None, description="RayJob status.reason.")
    queued_at: str | None = Field(None, description="When the sweep was queued for namespace capacity.")
    started_at: str | None = Field(None, description="When the sweep was admitted: its clock starts here.")
    training_started_at: str | None = Field(
        None, description="When the operator first saw the Ray job running: a record the guard reads (a run started)."
    )
    guard: GuardStatus | None = Field(
        None,
        description="What the checkpoint guard verifies for this run, fixed at admission (the spec may be edited later).",
    )
    attempt_started_at: str | None = Field(
        None, description="When the current RayJob attempt started (KubeRay status.startTime): the startup clock."
    )
    deadline_at: str | None = Field(None, description="startedAt + activeSeconds.")
    active_deadline_at: str | None = Field(
        None,
        description="deadlineAt while the run has not ended (the DEADLINE column); unset once it has (deadlineAt "
        "keeps the value).",
    )
    finished_at: str | None = Field(
        None, description="When the sweep reached a terminal phase (the FINISHED column); unset while a run goes on."
    )
    trials: TrialCounts | None = Field(None, description="Trial counts from the run's _sweep/status.json.")
    trials_summary: str | None = Field(
        None,
        description="Trials finished out of those the sweep asks for (tune.numSamples, times the grid's points), "
        "and how many run now: e.g. 3/8 (2 running).",
    )
    best_trial: BestTrial | None = Field(None, description="Best trial so far.")
    best_summary: str | None = Field(
        None,
        description="The BEST column: bestTrial.metric and its value to 4 significant digits, e.g. val_loss=0.1235 "
        "(the value alone when the metric is not named); bestTrial.value is exact.",
    )
    waiting_for: str | None = Field(
        None,
        description="While Running: why trials stay pending, as Ray reports it (trial count and oldest age, unmet resource bundles, pending placement groups, bundles no node can hold, failed node launches), from the run's _sweep/status.json.",
    )
    checkpoints: CheckpointsStatus | None = Field(
        None, description="The last verification of the run's checkpoints in S3."
    )
    replicas: ReplicasStatus | None = Field(None, description="Admitted demand and rendered cap.")
    usage: UsageStatus | None = Field(
        None, description="GPU-hours measured from the sweep's GPU pods (docs/budgets.md)."
    )
    message: str | None = Field(None, description="Latest human-readable message.")
    observed_generation: int | None = Field(None, description="metadata.generation last acted on.")
    conditions: list[Condition] | None = Field(None, description="Kubernetes-style conditions.")
    attempts: list[AttemptStatus] | None = Field(None, description="Every RayJob of the run, oldest first (resumes).")
    total_ran_seconds: int | None = Field(
        None, description="Seconds all attempts ran (the sum of attempts[].ranSeconds)."
    )
    resumed_generation: int | None = Field(None, description="The last spec.resume.generation the operator acted on.")
    last_resume: LastResumeStatus | None = Field(None, description="The operator's last resume decision.")
    kueue: KueueStatus | None = Field(
        None, description="Kueue mode: where Kueue has the sweep's RayJob (docs/kueue.md)."
    )
    idle_gpu_seconds: IdleGpuStatus | None = Field(
        None, description="GPU time held without training, by cause, as the operator saw it from the pods it freed."
    )
    tracking: TrackingStatus | None = Field(
        None, description="Where the sweep is tracked (spec.tracking), as the driver last reported it."
    )
    lineage: LineageStatus | None = Field(
        None,
        description="pbt: which trial continued from which trial's committed checkpoint, at which step, with which "
        "config change (the newest exploits), from the run's _sweep/status.json.",
    )
    graceful_stop: GracefulStopStatus | None = Field(
        None,
        description="The graceful stop the operator asked before deleting the RayJob: its window runs from "
        "requestedAt across operator restarts (only the operator writes status).",
    )
    last_stop: LastStopStatus | None = Field(
        None,
        description="The last graceful stop as the driver recorded it in the run's _sweep/status.json: the "
        "checkpoint uploads in flight it waited for and those it could not.",
    )
