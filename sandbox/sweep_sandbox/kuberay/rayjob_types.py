"""The names KubeRay v1.7 gives its RayJob states, failure reasons, labels and controllers, as rayjob_types.go and utils
spell them."""

from __future__ import annotations

import enum

from sweep_contracts import constants

RAYJOB_FINALIZER = "ray.io/rayjob-finalizer"
RAYJOB_CONTROLLER = "rayjob-controller"
RAYCLUSTER_CONTROLLER = "raycluster-controller"
RAYCLUSTER_KEY = "raycluster"  # the work queue's third key element: the RayCluster controller's share, not a RayJob
USER_AGENT = "kuberay-standin/1.7.0"
LABEL_CLUSTER = constants.RAY_LABEL_CLUSTER  # utils.RayClusterLabelKey
LABEL_NODE_TYPE = constants.RAY_LABEL_NODE_TYPE  # utils.RayNodeTypeLabelKey
LABEL_GROUP = "ray.io/group"
HEAD_GROUP = "headgroup"


class Deployment(str, enum.Enum):
    """RayJob status.jobDeploymentStatus (KubeRay's JobDeploymentStatus)."""

    NEW = ""
    INITIALIZING = "Initializing"
    RUNNING = "Running"
    COMPLETE = "Complete"
    FAILED = "Failed"
    SUSPENDING = "Suspending"
    SUSPENDED = "Suspended"
    RETRYING = "Retrying"
    VALIDATION_FAILED = "ValidationFailed"


class JobStatus(str, enum.Enum):
    """RayJob status.jobStatus (Ray's job status)."""

    NEW = ""
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


TERMINAL_JOB = {JobStatus.STOPPED.value, JobStatus.SUCCEEDED.value, JobStatus.FAILED.value}
# KubeRay's JobFailedReason values (ray-operator/apis/ray/v1/rayjob_types.go)
DEADLINE_EXCEEDED = "DeadlineExceeded"
PRE_RUNNING_DEADLINE_EXCEEDED = "PreRunningDeadlineExceeded"
APP_FAILED = "AppFailed"
SUBMISSION_FAILED = "SubmissionFailed"
VALIDATION_FAILED = "ValidationFailed"
JOB_STATUS_CHECK_TIMEOUT_EXCEEDED = "JobStatusCheckTimeoutExceeded"
# checkBackoffLimitAndUpdateStatusIfNeeded refuses a retry for exactly these two; PreRunningDeadlineExceeded IS retried.
NOT_RETRIED = {DEADLINE_EXCEEDED, JOB_STATUS_CHECK_TIMEOUT_EXCEEDED}
KUBERAY_MANAGED_BY = "ray.io/kuberay-operator"  # utils.KubeRayController; any other spec.managedBy is skipped
LABEL_SUBMISSION_MODE = "ray.io/job-submission-mode"  # utils.RayJobSubmissionModeLabelKey
LABEL_CREATED_BY = "app.kubernetes.io/created-by"
CREATED_BY = "kuberay-operator"  # utils.ComponentName
MAX_RAYJOB_NAME_LENGTH = 47  # utils.MaxRayJobNameLength = MaxRayClusterNameLength (53) - 6
DEFAULT_SUBMITTER_BACKOFF_LIMIT = 2  # createNewK8sJob
# tools/events names an instance `<reportingController>-<hostname>`; the hostname of a kuberay-operator pod
KUBERAY_POD = "kuberay-operator-5d8f9c7b6d-x2k7q"
