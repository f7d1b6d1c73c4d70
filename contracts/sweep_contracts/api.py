"""The TrainingSweep v1alpha1 API as pydantic models: field names, types, defaults, descriptions.

These models are the one source of the API: the CRD in `crds/` is generated from them
(`python -m sweep_operator.crd`, compared by a test), and the validator and the entrypoint parse with them.
Checks that need more than one field live in `validation`.
"""

from __future__ import annotations

import re
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from . import constants
from .paramspace import ParamValue

# Defaults that the CRD also carries; changing one here changes the CRD (regenerate it).
DEFAULT_STARTUP_SECONDS = 1800
DEFAULT_GRACEFUL_STOP_SECONDS = 300
DEFAULT_VERIFICATION_TIMEOUT_SECONDS = 900
# Reports after which a trial with no committed checkpoint is warned about (a loop that checkpoints every epoch has
# one at its first report; a few more leave room for one that checkpoints every other epoch or so).
DEFAULT_WARN_AFTER_REPORTS = 3


# apimachinery's grammar (pkg/api/resource/quantity.go, parseQuantityString): a signed decimal, then one binary
# suffix, one decimal SI suffix or a decimal exponent. Stricter than the Python client, which also takes "1K",
# "1_000" or "NaN": the API server refuses those, so a spec must not carry them.
_QUANTITY_RE = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
_BINARY_POWER = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_DECIMAL_EXPONENT = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ("500m", "24Gi", "1e3", 4) as an exact Decimal; ValueError naming the accepted forms."""
    if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        return Decimal(value)
    match = _QUANTITY_RE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f'{value!r} is not a Kubernetes quantity (examples: 4, "500m", "24Gi", "512Mi")')
    number = Decimal(match["number"])
    if match["binary"]:
        return number * Decimal(1024) ** _BINARY_POWER[match["binary"][0]]
    if match["decimal"]:
        return number.scaleb(_DECIMAL_EXPONENT[match["decimal"]])
    if match["exponent"]:
        return number.scaleb(int(match["exponent"]))
    return number


def _quantity(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f'{value!r} is not a Kubernetes quantity (examples: 4, "500m", "24Gi")')
    text = str(value).strip()
    if parse_quantity(text) <= 0:
        raise ValueError(f"{value!r} must be greater than zero")
    return text


# A positive Kubernetes quantity, kept as the user wrote it (ints become strings).
Quantity = Annotated[str, BeforeValidator(_quantity), Field(max_length=64, json_schema_extra={"x-quantity": True})]

# Size limits on every spec string, list and map: the API server refuses an oversized object before
# any controller or CEL rule spends time on it. Patterns here go to the CRD only; the validators below check
# the same forms in the parser with messages that name what is allowed.
TRAIN_LOOP_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
STORAGE_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+$"
# A CEL rule, not a schema pattern: the API server answers a failed pattern with the regex itself; a rule's message
# is what `kubectl apply` prints. The parser (_storage_uri) checks the same form and says what is wrong in detail.
_STORAGE_URI_EXPECTED = (
    "expected s3://bucket/prefix: a bucket name (3-63 lowercase letters, digits, '.' and '-'), then a prefix under "
    "which each run writes <namespace>/<sweep>-<runId>/"
)
# The API server prints a failed rule as `Invalid value: "string": <message>` (the type, never the value), so the
# message itself quotes what was given.
STORAGE_URI_RULE: Final[JsonDict] = {
    "rule": f"self.matches('{STORAGE_URI_PATTERN}')",
    "message": _STORAGE_URI_EXPECTED,
    "messageExpression": f'"got \'" + self + "\'; {_STORAGE_URI_EXPECTED}"',
}
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
REGION_PATTERN = r"^([a-z]{2}(-[a-z]+)+-[0-9]+)?$"
ENDPOINT_PATTERN = r"^(https?://[^\s/]+(:[0-9]+)?/?)?$"
NAME_MAX = 128  # metric and attribute names
# The most trials any sweep may ask for (tune.numSamples, the CRD's maximum): Tune's driver keeps every trial in
# memory and in its experiment state. The operator's maxTrialsPerSweep (default 10000) sets the bound in force, at
# most this one.
MAX_NUM_SAMPLES: Final = 1_000_000
# A node label as Kubernetes bounds it: a key of an optional DNS-subdomain prefix (253) and '/' before a name of 63;
# a value of 63 (apimachinery validation.IsQualifiedName, IsValidLabelValue).
SELECTOR_KEY_MAX: Final = 317
SELECTOR_VALUE_MAX: Final = 63


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


class ApiModel(BaseModel):
    """camelCase on the wire, unknown fields rejected (a typo must not be silently dropped)."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        validate_default=True,
        # Kubernetes semantics: "yes" is not a boolean and 2.0 is not an integer.
        strict=True,
    )


# ---------------------------------------------------------------------------------------- spec


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


class SchedulerSpec(ApiModel):
    type: Literal["fifo", "asha", "hyperband", "median", "pbt"] = Field(
        "fifo",
        description="Trial scheduler: fifo runs every trial to the end; asha, hyperband and median stop "
        "poor trials early. All but fifo need tune.metric and tune.mode. pbt is refused with the reason: under "
        "Tune over Ray Train V2 (ray 2.58) Tune receives each checkpoint's path, not a checkpoint it can clone, "
        "so PBT could never exploit and every trial would train as under fifo.",
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
        description="pbt (refused, see type): time units between perturbations.",
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


# -------------------------------------------------------------------------------------- status


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
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


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
    verified: bool | None = Field(None, description="Whether every committed checkpoint is complete in S3.")
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
    verify: bool | None = Field(None, description="spec.deletion.verifyCheckpoints at admission.")
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


# ---------------------------------------------------------------------------------------- the GPU-hour ledger

LEDGER_MAX_SWEEPS = 128  # entries past which the oldest that reserve nothing merge into one (docs/budgets.md)
# Admitted GPU attempts one namespace's ledger holds reservations for at once; a further attempt waits Queued until
# one ends. Entries that reserve cannot merge (each is its attempt's promise), so the object must hold them all: this
# many beside LEDGER_MAX_SWEEPS others, each at most 17 intervals, stay under 1 MiB (tests/unit/test_hours_ledger.py).
LEDGER_MAX_RESERVATIONS = 256
LEDGER_MAX_ENTRIES = LEDGER_MAX_SWEEPS + LEDGER_MAX_RESERVATIONS  # the CRD's bound on status.sweeps
LEDGER_MAX_INTERVALS = 64  # per entry; finished ones merge past 16 (a sweep's own record holds at most 64)


class LedgerIntervalStatus(StatusModel):
    pod: str = Field(..., description="The pod's uid; merged:<uid> for finished intervals merged into one.")
    gpus: float = Field(..., description="nvidia.com/gpu held (a merged entry: their mean over its span).")
    start: str = Field(..., description="When the pod was scheduled, RFC 3339.")
    end: str | None = Field(None, description="When it stopped holding GPUs, RFC 3339; unset while it still does.")


class LedgerReservationStatus(StatusModel):
    gpu_hours: float = Field(..., description="GPU-hours granted to the attempt at its admission (its worst case).")
    since: str = Field(..., description="The admission; the attempt's use from here on spends the reservation.")
    attempt: str = Field(..., description="Which admission of the sweep: initial, or resume-<n>.")
    run_until_exhausted: bool | None = Field(
        None, description="The attempt reserved what was left of the window; it is stopped when that is spent."
    )


class LedgerSweepStatus(StatusModel):
    name: str = Field(..., description="The sweep's name (a re-created sweep of the same name is another entry).")
    uid: str = Field(..., description="The sweep's uid.")
    deleted: bool | None = Field(None, description="The sweep is gone; its hours stay until they leave the window.")
    used_gpu_hours: float | None = Field(None, description="GPU-hours it used inside the window, at updatedAt.")
    reserved_gpu_hours: float | None = Field(
        None, description="What is left of its reservation at updatedAt (0 once its run ended)."
    )
    reservation: LedgerReservationStatus | None = Field(None, description="The admitted attempt's reservation.")
    intervals: list[LedgerIntervalStatus] | None = Field(
        None, max_length=LEDGER_MAX_INTERVALS, description="Its GPU pods' intervals (the record itself)."
    )


class GPUHourLedgerSpec(StatusModel):
    gpu_hours: float = Field(..., description="The namespace's GPU-hour budget per window (the platform team's).")
    window_seconds: int = Field(..., description="The rolling window the budget counts over, in seconds.")


class GPUHourLedgerStatus(StatusModel):
    used_gpu_hours: float | None = Field(None, description="GPU-hours used inside the window, at updatedAt.")
    reserved_gpu_hours: float | None = Field(
        None, description="GPU-hours promised to admitted attempts and not yet used, at updatedAt."
    )
    left_gpu_hours: float | None = Field(None, description="The budget less use and reservations, at updatedAt.")
    window: str | None = Field(None, description="The window, for people (7d).")
    frees_at: str | None = Field(
        None, description="When the window's use falls enough for one more GPU-hour (unset: there is room now)."
    )
    updated_at: str | None = Field(None, description="When the operator last wrote the ledger (RFC 3339).")
    sweeps: list[LedgerSweepStatus] | None = Field(
        None,
        max_length=LEDGER_MAX_ENTRIES,
        description="Every sweep (deleted ones too) with GPU-hours in the window or a reservation.",
    )
