"""The TrainingSweep v1alpha1 API, the one import path of its models: the spec, the status and its phases, the
GPU-hour ledger.

They live in `spec_models`, `status_models`, `ledger_models` and `api_fields` (what they are built from). The CRDs in
`crds/` are generated from them (`python -m sweep_operator.crd`, compared by a test), and the validator and the
entrypoint parse with them. Checks that need more than one field live in `spec_checks`.
"""

from __future__ import annotations

from .api_fields import (
    DEFAULT_GRACEFUL_STOP_SECONDS as DEFAULT_GRACEFUL_STOP_SECONDS,
)
from .api_fields import (
    DEFAULT_STARTUP_SECONDS as DEFAULT_STARTUP_SECONDS,
)
from .api_fields import (
    DEFAULT_VERIFICATION_TIMEOUT_SECONDS as DEFAULT_VERIFICATION_TIMEOUT_SECONDS,
)
from .api_fields import (
    DEFAULT_WARN_AFTER_REPORTS as DEFAULT_WARN_AFTER_REPORTS,
)
from .api_fields import (
    DNS_SUBDOMAIN_PATTERN as DNS_SUBDOMAIN_PATTERN,
)
from .api_fields import (
    ENDPOINT_PATTERN as ENDPOINT_PATTERN,
)
from .api_fields import (
    MAX_NUM_SAMPLES as MAX_NUM_SAMPLES,
)
from .api_fields import (
    NAME_MAX as NAME_MAX,
)
from .api_fields import (
    REGION_PATTERN as REGION_PATTERN,
)
from .api_fields import (
    SELECTOR_KEY_MAX as SELECTOR_KEY_MAX,
)
from .api_fields import (
    SELECTOR_VALUE_MAX as SELECTOR_VALUE_MAX,
)
from .api_fields import (
    STORAGE_URI_PATTERN as STORAGE_URI_PATTERN,
)
from .api_fields import (
    STORAGE_URI_RULE as STORAGE_URI_RULE,
)
from .api_fields import (
    TRAIN_LOOP_PATTERN as TRAIN_LOOP_PATTERN,
)
from .api_fields import (
    ApiModel as ApiModel,
)
from .api_fields import (
    Quantity as Quantity,
)
from .api_fields import (
    parse_quantity as parse_quantity,
)
from .ledger_models import (
    LEDGER_MAX_ENTRIES as LEDGER_MAX_ENTRIES,
)
from .ledger_models import (
    LEDGER_MAX_INTERVALS as LEDGER_MAX_INTERVALS,
)
from .ledger_models import (
    LEDGER_MAX_RESERVATIONS as LEDGER_MAX_RESERVATIONS,
)
from .ledger_models import (
    LEDGER_MAX_SWEEPS as LEDGER_MAX_SWEEPS,
)
from .ledger_models import (
    GPUHourLedgerSpec as GPUHourLedgerSpec,
)
from .ledger_models import (
    GPUHourLedgerStatus as GPUHourLedgerStatus,
)
from .ledger_models import (
    LedgerIntervalStatus as LedgerIntervalStatus,
)
from .ledger_models import (
    LedgerReservationStatus as LedgerReservationStatus,
)
from .ledger_models import (
    LedgerSweepStatus as LedgerSweepStatus,
)
from .spec_models import (
    KUEUE_NAME_PATTERN as KUEUE_NAME_PATTERN,
)
from .spec_models import (
    MLFLOW_CREDENTIALS_RULE as MLFLOW_CREDENTIALS_RULE,
)
from .spec_models import (
    MLFLOW_EXPERIMENT_NAME_MAX as MLFLOW_EXPERIMENT_NAME_MAX,
)
from .spec_models import (
    PARSER_DEFAULT as PARSER_DEFAULT,
)
from .spec_models import (
    SECRET_KEY_PATTERN as SECRET_KEY_PATTERN,
)
from .spec_models import (
    TRACKING_URI_PATTERN as TRACKING_URI_PATTERN,
)
from .spec_models import (
    BudgetSpec as BudgetSpec,
)
from .spec_models import (
    CheckpointsSpec as CheckpointsSpec,
)
from .spec_models import (
    DeadlinesSpec as DeadlinesSpec,
)
from .spec_models import (
    DeletionSpec as DeletionSpec,
)
from .spec_models import (
    FailurePolicySpec as FailurePolicySpec,
)
from .spec_models import (
    HeadSpec as HeadSpec,
)
from .spec_models import (
    MlflowCredentialsSecret as MlflowCredentialsSecret,
)
from .spec_models import (
    MlflowTrackingSpec as MlflowTrackingSpec,
)
from .spec_models import (
    ResourcesPerWorker as ResourcesPerWorker,
)
from .spec_models import (
    ResumeSpec as ResumeSpec,
)
from .spec_models import (
    SchedulerSpec as SchedulerSpec,
)
from .spec_models import (
    SearcherSpec as SearcherSpec,
)
from .spec_models import (
    StorageSpec as StorageSpec,
)
from .spec_models import (
    SweepSpec as SweepSpec,
)
from .spec_models import (
    Toleration as Toleration,
)
from .spec_models import (
    TrackingSpec as TrackingSpec,
)
from .spec_models import (
    TrialSpec as TrialSpec,
)
from .spec_models import (
    TuneSpec as TuneSpec,
)
from .spec_models import (
    WorkerGroupSpec as WorkerGroupSpec,
)
from .status_models import (
    CONDITION_TYPES as CONDITION_TYPES,
)
from .status_models import (
    DRIVER_END_PHASES as DRIVER_END_PHASES,
)
from .status_models import (
    DRIVER_STOPPED as DRIVER_STOPPED,
)
from .status_models import (
    MAX_STOP_UPLOADS_LISTED as MAX_STOP_UPLOADS_LISTED,
)
from .status_models import (
    RESUMABLE_PHASES as RESUMABLE_PHASES,
)
from .status_models import (
    TERMINAL_PHASES as TERMINAL_PHASES,
)
from .status_models import (
    WAITING_PHASES as WAITING_PHASES,
)
from .status_models import (
    WARNING_PHASES as WARNING_PHASES,
)
from .status_models import (
    AttemptStatus as AttemptStatus,
)
from .status_models import (
    AttemptUsageStatus as AttemptUsageStatus,
)
from .status_models import (
    BestTrial as BestTrial,
)
from .status_models import (
    CheckpointProblem as CheckpointProblem,
)
from .status_models import (
    CheckpointsStatus as CheckpointsStatus,
)
from .status_models import (
    Condition as Condition,
)
from .status_models import (
    GracefulStopStatus as GracefulStopStatus,
)
from .status_models import (
    GuardStatus as GuardStatus,
)
from .status_models import (
    IdleGpuStatus as IdleGpuStatus,
)
from .status_models import (
    KueueStatus as KueueStatus,
)
from .status_models import (
    LastResumeStatus as LastResumeStatus,
)
from .status_models import (
    LastStopStatus as LastStopStatus,
)
from .status_models import (
    NamespaceUsageStatus as NamespaceUsageStatus,
)
from .status_models import (
    Phase as Phase,
)
from .status_models import (
    PodIntervalStatus as PodIntervalStatus,
)
from .status_models import (
    ReplicasStatus as ReplicasStatus,
)
from .status_models import (
    StatusModel as StatusModel,
)
from .status_models import (
    StopUploadStatus as StopUploadStatus,
)
from .status_models import (
    SweepStatus as SweepStatus,
)
from .status_models import (
    TrackingStatus as TrackingStatus,
)
from .status_models import (
    TrialCounts as TrialCounts,
)
from .status_models import (
    UsageStatus as UsageStatus,
)
