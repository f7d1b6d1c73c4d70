"""The TrainingSweep's spec as pydantic models: field names, types, defaults, descriptions (the CRD's spec schema is
generated from them, the validator and the entrypoint parse with them)."""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field
from pydantic.config import JsonDict

from . import constants
from .api_fields import (
    DEFAULT_GRACEFUL_STOP_SECONDS,
    DEFAULT_STARTUP_SECONDS,
    DEFAULT_VERIFICATION_TIMEOUT_SECONDS,
    DEFAULT_WARN_AFTER_REPORTS,
    DNS_SUBDOMAIN_PATTERN,
    ENDPOINT_PATTERN,
    MAX_NUM_SAMPLES,
    NAME_MAX,
    REGION_PATTERN,
    SELECTOR_KEY_MAX,
    SELECTOR_VALUE_MAX,
    STORAGE_URI_RULE,
    TRAIN_LOOP_PATTERN,
    ApiModel,
    Quantity,
)
from .paramspace import ParamValue


def _train_loop(value: str) -> str:
    module, sep, function = value.partition(":")
    ident = r"[A-Za-z_][A-Za-z0-9_]*"

    if not sep or not re.fullmatch(rf"{ident}(\.{ident})*", module) or not re.fullmatch(ident, function):
        raise ValueError(
            f"{value!r} is not 'module:function' (example: training_entrypoints.loops.digits_mlp:train_loop)"
        )
    return value


def _storage_uri(value: str) -> str:
    from .s3_layout import S3Uri

    uri = S3Uri.parse(value)  # ValueError says what is wrong
    if not uri.key:
        raise ValueError(f"{value!r} has no prefix; use s3://bucket/prefix so runs do not land at the bucket root")
    return str(uri)


class SearcherSpec(ApiModel):
    type: Literal["random", "grid", "optuna"] = Field(
        "random",
        description="How candidates are picked: random samples the space; grid enumerates grid "
        "values; optuna adapts to past results (needs optuna in the image, plus metric and mode).",
    )
    seed: int | None = Field(None, ge=0, description="Random seed for reproducible sampling; unset: random.")


# Scheduler parameters are defaulted by the parser, not by the API server: a sweep then shows (`kubectl describe`,
# `-o yaml`) the parameters its scheduler uses, never another scheduler's defaults. The CRD states each default.
PARSER_DEFAULT: Final[JsonDict] = {"parserDefault": True}
# pbt mutates a few named parameters; the bound keeps the list within what a spec sensibly names.
MAX_PBT_MUTATIONS: Final = 32


class SchedulerSpec(ApiModel):
    type: Literal["fifo", "asha", "hyperband", "median", "pbt"] = Field(
        "fifo",
        description="Trial scheduler: fifo runs every trial to the end; asha, hyperband and median stop "
        "poor trials early; pbt (population-based training) replaces the worst trials' weights and parameters by "
        "mutated copies of the best ones' every perturbationInterval. All but fifo need tune.metric and tune.mode. "
        "Under pbt every perturbation restarts each paused trial's Train run (worker group start, checkpoint "
        "reload) and every committed checkpoint is kept (checkpoints.numToKeep is not applied).",
    )
    time_attr: str = Field(
        "training_iteration",
        max_length=NAME_MAX,
        json_schema_extra=PARSER_DEFAULT,
        description="Metric used as time by the scheduler (asha, hyperband, median, pbt).",
    )
    max_t: int = Field(
        100, ge=1, json_schema_extra=PARSER_DEFAULT, description="asha/hyperband: maximum time units per trial."
    )
    grace_period: int = Field(
        1, ge=1, json_schema_extra=PARSER_DEFAULT, description="asha/median: time units before a trial may be stopped."
    )
    reduction_factor: float = Field(
        4.0, gt=1, json_schema_extra=PARSER_DEFAULT, description="asha/hyperband: halving rate (> 1)."
    )
    brackets: int = Field(1, ge=1, json_schema_extra=PARSER_DEFAULT, description="asha: number of brackets.")
    min_samples_required: int = Field(
        3, ge=1, json_schema_extra=PARSER_DEFAULT, description="median: trials needed before stopping any."
    )
    perturbation_interval: float = Field(
        2.0,
        gt=0,
        json_schema_extra=PARSER_DEFAULT,
        description="pbt: time units (timeAttr) between perturbations; each one pauses and restarts trials.",
    )
    hyperparam_mutations: list[Annotated[str, Field(max_length=NAME_MAX)]] = Field(
        [],
        max_length=MAX_PBT_MUTATIONS,
        json_schema_extra=PARSER_DEFAULT,
        description="pbt: paramSpace names that an exploiting trial mutates (required, at least one); each is "
        "resampled from or perturbed within its paramSpace distribution (choice, uniform, loguniform, randint or "
        "quniform; not grid).",
    )
    quantile_fraction: float = Field(
        0.25,
        gt=0,
        le=0.5,
        json_schema_extra=PARSER_DEFAULT,
        description="pbt: the fraction of trials (ranked by tune.metric) whose bottom copies the top (0 < q <= 0.5).",
    )
    resample_probability: float = Field(
        0.25,
        ge=0,
        le=1,
        json_schema_extra=PARSER_DEFAULT,
        description="pbt: the probability that a mutated parameter is resampled from its distribution rather than "
        "perturbed from the copied value.",
    )
    synch: bool = Field(
        False,
        json_schema_extra=PARSER_DEFAULT,
        description="pbt: perturb all trials at once, each waiting (paused, holding no workers) until every "
        "trial reached the perturbation point; false perturbs each trial as it gets there.",
    )


class TuneSpec(ApiModel):
    metric: str | None = Field(
        None,
        min_length=1,
        max_length=NAME_MAX,
        description="Metric the train loop reports (e.g. val_loss). Required by every scheduler but fifo "
        "and by optuna; without it no best trial is chosen.",
    )
    mode: Literal["min", "max"] | None = Field(
        None, description="Whether the best trial minimises or maximises tune.metric. Required with metric."
    )
    num_samples: int = Field(
        1,
        ge=1,
        le=MAX_NUM_SAMPLES,
        description="Samples drawn from paramSpace (with grid values: repetitions of the whole grid). The trials "
        "this asks for (times the grid's points) must not exceed the operator's maxTrialsPerSweep (default 10000).",
    )
    max_concurrent_trials: int = Field(
        1,
        ge=1,
        description="Trials running at once. Each holds trial.workers workers; the head admits exactly "
        "this many trial drivers.",
    )
    searcher: SearcherSpec = Field(default_factory=SearcherSpec, description="Search algorithm.")
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec, description="Trial scheduler.")


class ResourcesPerWorker(ApiModel):
    cpu: Quantity = Field("1", description="CPU per train worker (Kubernetes quantity), requests = limits.")
    gpu: int = Field(0, ge=0, le=16, description="nvidia.com/gpu per train worker (0: CPU-only). Requests = limits.")
    memory: Quantity = Field("4Gi", description="Memory per train worker (Kubernetes quantity).")


class TrialSpec(ApiModel):
    workers: int = Field(1, ge=1, description="Ray Train workers per trial (ScalingConfig.num_workers).")
    resources_per_worker: ResourcesPerWorker = Field(
        default_factory=ResourcesPerWorker, description="Resources of one worker: one placement-group bundle."
    )


class Toleration(ApiModel):
    key: str = Field(
        "", max_length=317, description="Taint key the toleration applies to; empty with Exists matches all."
    )
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Equal or Exists.")
    value: str = Field("", max_length=63, description="Taint value (Equal only).")
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        "", description="Taint effect to match; empty matches all."
    )
    toleration_seconds: int | None = Field(None, ge=0, description="NoExecute only: seconds tolerated.")


class WorkerGroupSpec(ApiModel):
    instance_type: str = Field(
        "",
        max_length=64,
        description="EKS instance type of the GPU nodes (e.g. g5.2xlarge). Every worker must fit one node. "
        "Required when trial.resourcesPerWorker.gpu > 0.",
    )
    node_selector: dict[
        Annotated[str, Field(max_length=SELECTOR_KEY_MAX)], Annotated[str, Field(max_length=SELECTOR_VALUE_MAX)]
    ] = Field(
        default_factory=dict,
        max_length=32,
        description="Extra node labels for worker pods; node.kubernetes.io/instance-type is added from instanceType.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations for worker pods."
    )
    min_replicas: int = Field(0, ge=0, description="Worker pods kept even when idle (autoscaler minimum).")


class HeadSpec(ApiModel):
    cpu: Quantity = Field(
        "2", description="Head pod CPU. The head runs the Tune driver and trial drivers, no training."
    )
    memory: Quantity = Field("8Gi", description="Head pod memory.")


class StorageSpec(ApiModel):
    uri: Annotated[str, AfterValidator(_storage_uri)] = Field(
        ...,
        max_length=1024,
        json_schema_extra={"x-kubernetes-validations": [STORAGE_URI_RULE]},
        description="s3://bucket/prefix where every run gets <namespace>/<sweep>-<runId>/.",
    )
    region: str = Field(
        "",
        max_length=32,
        json_schema_extra={"pattern": REGION_PATTERN},
        description="AWS region of the bucket; empty: the SDK's default chain.",
    )
    endpoint_url: str = Field(
        "",
        max_length=512,
        json_schema_extra={"pattern": ENDPOINT_PATTERN},
        description="S3-compatible endpoint (MinIO, a local test server); empty: AWS S3. The operator may "
        "allow only some hosts (its allowedEndpointHosts setting).",
    )
    service_account_name: str = Field(
        "sweep-runner",
        max_length=253,
        json_schema_extra={"pattern": DNS_SUBDOMAIN_PATTERN},
        description="Service account of the head, worker and submitter pods (its IRSA role grants the bucket).",
    )


class CheckpointsSpec(ApiModel):
    num_to_keep: int = Field(2, ge=1, description="Checkpoints kept per trial (the latest is always kept).")
    score_attribute: str | None = Field(
        None, min_length=1, max_length=NAME_MAX, description="Metric that ranks checkpoints; unset: tune.metric."
    )
    score_order: Literal["min", "max"] | None = Field(
        None, description="min or max for scoreAttribute; unset: tune.mode."
    )
    warn_after_reports: int = Field(
        DEFAULT_WARN_AFTER_REPORTS,
        ge=1,
        le=100_000,
        description="A trial that has reported this many times, or ended, with no committed checkpoint gets a "
        "Warning Event and the condition CheckpointsCommitted=False (its work could not be resumed or protected). "
        "A loop that checkpoints every N reports sets N or more.",
    )


class DeadlinesSpec(ApiModel):
    active_seconds: int | None = Field(
        None,
        ge=30,
        description="Wall-clock budget of the whole sweep, one clock across RayJob retries. Unset: the "
        "operator's defaultActiveSeconds; never above its maxActiveSeconds.",
    )
    startup_seconds: int = Field(
        DEFAULT_STARTUP_SECONDS,
        ge=10,
        description="The RayJob must be Running within this many seconds, else Failed with a diagnosis.",
    )
    graceful_stop_seconds: int = Field(
        DEFAULT_GRACEFUL_STOP_SECONDS,
        ge=0,
        description="Trials stop this many seconds before the deadline so their last checkpoints land.",
    )


class FailurePolicySpec(ApiModel):
    worker_failures: int = Field(1, ge=-1, description="Train FailureConfig.max_failures per trial (-1: unlimited).")
    controller_failures: int = Field(
        3, ge=-1, description="Train FailureConfig.controller_failure_limit (Ray's default -1 retries forever)."
    )
    preemption_failures: int = Field(
        5, ge=-1, description="Train FailureConfig.max_preemption_failures (Ray's default -1 is unlimited)."
    )
    trial_failures: int = Field(0, ge=-1, description="Tune FailureConfig.max_failures per trial.")
    job_retries: int = Field(0, ge=0, description="RayJob backoffLimit: whole-job retries, each on a new RayCluster.")
    resume_on_cluster_loss: int = Field(
        0,
        ge=0,
        le=10,
        description="Opt-in: when the RayJob fails because its cluster was lost (KubeRay could not reach the head: "
        "JobStatusCheckTimeoutExceeded, or the submitter lost a running job: SubmissionFailed) and jobRetries are "
        "spent, resume the sweep by itself up to this many times (an Event each time), from the verified run root "
        "with what was left of the attempt's deadline. 0: never.",
    )


class DeletionSpec(ApiModel):
    verify_checkpoints: bool = Field(
        True, description="Verify checkpoints in S3 before the sweep, its RayJob or RayCluster may go."
    )
    verification_timeout_seconds: int = Field(
        DEFAULT_VERIFICATION_TIMEOUT_SECONDS, ge=10, description="Time allowed for one verification pass."
    )
    retry_backoff_seconds: int = Field(30, ge=1, description="First wait before a failed verification is retried.")
    max_retry_backoff_seconds: int = Field(600, ge=1, description="Longest wait between verification retries.")


class ResumeSpec(ApiModel):
    generation: int = Field(
        ...,
        ge=1,
        description="Raise by one to resume the ended sweep (DeadlineExceeded, Failed, BudgetExhausted; Succeeded "
        "with tune.numSamples raised): the operator verifies the run root, then starts the next attempt on it "
        "(`sweepctl resume NAME` makes the same change). It may only go up; status.resumedGeneration is the last "
        "one acted on.",
    )
    active_seconds: int | None = Field(
        None,
        ge=30,
        description="Deadline of each resumed attempt, in seconds from its start (never above maxActiveSeconds). "
        "Unset: what was left of the last attempt's budget when it stopped.",
    )


# A LocalQueue / WorkloadPriorityClass name as a label value: a DNS-1123 subdomain of at most 63 characters.
KUEUE_NAME_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"


def _kueue_name(value: str) -> str:
    if not re.fullmatch(KUEUE_NAME_PATTERN, value):
        raise ValueError(
            f"{value!r} is not a Kueue object name (lowercase letters, digits, '-' and '.'; example: team-a-gpu)"
        )
    return value


class BudgetSpec(ApiModel):
    gpu_hours: float | None = Field(
        None,
        gt=0,
        le=10_000_000,
        description="GPU-hours this sweep may use over all its attempts, measured from its GPU pods (scheduled to "
        "gone). Its worst case (trial.workers x resourcesPerWorker.gpu x tune.maxConcurrentTrials x "
        "deadlines.activeSeconds) must fit what is left, unless runUntilExhausted. When spent, the sweep stops "
        "gracefully, checkpoints verified: phase BudgetExhausted. Unset: no sweep budget (its namespace's applies).",
    )
    run_until_exhausted: bool = Field(
        False,
        description="true: start even when the worst case exceeds what is left of the sweep's budget or its "
        "namespace's window, and run until the budget stops it.",
    )


# An MLflow tracking server's base URL: http(s), a host, an optional port and path; no query, fragment or whitespace.
TRACKING_URI_PATTERN = r"^https?://[^\s/?#]+(/[^\s?#]*)?$"
# A Secret's data key (apimachinery validation.IsConfigMapKey).
SECRET_KEY_PATTERN = r"^([-._a-zA-Z0-9]+)?$"
MLFLOW_EXPERIMENT_NAME_MAX = 256


def _tracking_uri(value: str) -> str:
    if not re.fullmatch(TRACKING_URI_PATTERN, value):
        raise ValueError(
            f"{value!r} is not an MLflow tracking server URL (expected http(s)://host[:port][/path], e.g. "
            "https://mlflow.example.com; no query or fragment)"
        )
    return value


class MlflowCredentialsSecret(ApiModel):
    name: str = Field(
        ...,
        min_length=1,
        max_length=253,
        json_schema_extra={"pattern": DNS_SUBDOMAIN_PATTERN},
        description="A Secret in the sweep's namespace. The Ray head pod (where the Tune driver logs to MLflow) "
        "gets its keys as MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD; the "
        "kubelet reads it, the spec never carries a credential.",
    )
    token_key: str = Field(
        "",
        max_length=253,
        json_schema_extra={"pattern": SECRET_KEY_PATTERN},
        description="Key of the Secret holding a bearer token (MLFLOW_TRACKING_TOKEN). Set this, or usernameKey "
        "and passwordKey.",
    )
    username_key: str = Field(
        "",
        max_length=253,
        json_schema_extra={"pattern": SECRET_KEY_PATTERN},
        description="Key of the Secret holding the basic-auth user name (MLFLOW_TRACKING_USERNAME); with passwordKey.",
    )
    password_key: str = Field(
        "",
        max_length=253,
        json_schema_extra={"pattern": SECRET_KEY_PATTERN},
        description="Key of the Secret holding the basic-auth password (MLFLOW_TRACKING_PASSWORD); with usernameKey.",
    )


# The API server's form of the credentials rule; spec_checks says the same with the field named.
MLFLOW_CREDENTIALS_RULE: Final[JsonDict] = {
    "rule": "(self.tokenKey != '') != (self.usernameKey != '' || self.passwordKey != '') && "
    "(self.usernameKey != '') == (self.passwordKey != '')",
    "message": "set tokenKey, or usernameKey and passwordKey together (not both kinds)",
}


class MlflowTrackingSpec(ApiModel):
    tracking_uri: Annotated[str, AfterValidator(_tracking_uri)] = Field(
        ...,
        max_length=512,
        json_schema_extra={"pattern": TRACKING_URI_PATTERN},
        description="Base URL of the MLflow tracking server (http(s)://host[:port][/path]), as the Ray head pod "
        "reaches it. status.tracking.url links to the sweep's parent run there.",
    )
    experiment_name: str = Field(
        "",
        max_length=MLFLOW_EXPERIMENT_NAME_MAX,
        description="MLflow experiment the sweep's runs go to (created when missing). Empty: <namespace>/<sweep>.",
    )
    credentials_secret: MlflowCredentialsSecret | None = Field(
        None,
        json_schema_extra={"x-kubernetes-validations": [MLFLOW_CREDENTIALS_RULE]},
        description="Where the server's credentials are (unset: the server needs none).",
    )


class TrackingSpec(ApiModel):
    mlflow: MlflowTrackingSpec | None = Field(
        None,
        description="Track the sweep in MLflow: the sweep is a parent run and every trial a child run with its "
        "hyper-parameters, its metrics per report and its committed checkpoint URIs as tags; a resume or a "
        "restarted driver continues the same runs. A slow or unreachable server never fails or holds up "
        "training: the sweep gets the condition TrackingAvailable=False and a Warning Event, and what could not "
        "be logged is logged once the server answers (up to a bound, docs/tracking.md).",
    )


class SweepSpec(ApiModel):
    image: str = Field(
        ..., min_length=1, max_length=512, description="Training image with ray 2.58.0 and this package."
    )
    ray_version: Literal["2.58.0"] = Field(
        constants.SUPPORTED_RAY_VERSION, description="Ray version of the image; only 2.58.0 is supported."
    )
    train_loop: Annotated[str, AfterValidator(_train_loop)] = Field(
        ...,
        max_length=256,
        json_schema_extra={"pattern": TRAIN_LOOP_PATTERN},
        description="module:function of the per-worker train loop in the image.",
    )
    param_space: dict[str, ParamValue] = Field(
        default_factory=dict,
        max_length=64,
        description="Hyper-parameters: a constant, or one of {choice: [..]}, {grid: [..]}, {uniform: [lo, hi]}, "
        "{loguniform: [lo, hi]}, {randint: [lo, hi]}, {quniform: [lo, hi, q]}.",
    )
    tune: TuneSpec = Field(default_factory=TuneSpec, description="Ray Tune settings.")
    trial: TrialSpec = Field(default_factory=TrialSpec, description="One trial: a Ray Train run.")
    worker_group: WorkerGroupSpec = Field(default_factory=WorkerGroupSpec, description="The GPU worker group.")
    head: HeadSpec = Field(default_factory=HeadSpec, description="The Ray head pod (no GPUs).")
    storage: StorageSpec = Field(..., description="Where checkpoints and results go.")
    checkpoints: CheckpointsSpec = Field(default_factory=CheckpointsSpec, description="Checkpoint retention.")
    deadlines: DeadlinesSpec = Field(default_factory=DeadlinesSpec, description="Sweep deadlines.")
    failure_policy: FailurePolicySpec = Field(
        default_factory=FailurePolicySpec,
        description="Every retry class of Ray Train, Ray Tune and the RayJob, each with a finite default.",
    )
    deletion: DeletionSpec = Field(
        default_factory=DeletionSpec,
        description="The checkpoint guard: the sweep, its RayJob and its RayCluster are deleted only once the run's "
        "checkpoints are verified complete in S3.",
    )
    budget: BudgetSpec = Field(
        default_factory=BudgetSpec, description="GPU-hour budget, measured from the GPU pods (docs/budgets.md)."
    )
    suspend: bool = Field(False, description="true: do not start (or stop, through the guard) the sweep's RayJob.")
    queue_name: Annotated[str, AfterValidator(_kueue_name)] = Field(
        "",
        max_length=63,
        json_schema_extra={"pattern": KUEUE_NAME_PATTERN},
        description="Kueue mode (docs/kueue.md): the Kueue LocalQueue in the sweep's namespace its RayJob is queued "
        "in (label kueue.x-k8s.io/queue-name). Empty: the chart's default queue for the namespace, if any. In Kueue "
        "mode the operator's namespace GPU budget and queue step aside; the per-sweep caps still hold.",
    )
    priority_class_name: Annotated[str, AfterValidator(_kueue_name)] = Field(
        "",
        max_length=63,
        json_schema_extra={"pattern": KUEUE_NAME_PATTERN},
        description="Kueue mode: a Kueue WorkloadPriorityClass for the sweep's RayJob (label "
        "kueue.x-k8s.io/priority-class). Empty: Kueue's default priority.",
    )
    tracking: TrackingSpec | None = Field(
        None, description="Experiment tracking outside the cluster (MLflow; docs/tracking.md)."
    )
    resume: ResumeSpec | None = Field(
        None,
        description="Continue an ended sweep on its run root. Once the sweep has run, trainLoop, "
        "paramSpace, storage.uri/endpointUrl/region and tune.metric/mode/searcher cannot change and "
        "tune.numSamples (the total over all attempts) may only go up.",
    )
