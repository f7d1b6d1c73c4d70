"""A stand-in for the KubeRay v1.7 operator: RayJob -> RayCluster lifecycle on a Kubernetes API, with pluggable job runners.

Threads, not asyncio: two informer threads (list+watch RayJobs and RayClusters through the kubernetes client into a
cache) feed a keyed work queue drained by a few reconcile workers, like controller-runtime. `stop()` ends them all.
"""

from __future__ import annotations

import copy
import enum
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sweep_contracts import constants, runtime_env

from .controllers import Informer, Key, Obj, WorkQueue, event_body, resource_version
from .emulator import now_rfc3339, parse_rfc3339, random_suffix
from .pod_lifetimes import PodLifetimes
from .pod_logs import ContainerLogs
from .submitter_pods import SubmitterPods, container_id

logger = logging.getLogger(__name__)

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


# --------------------------------------------------------------------------------------------------------------------
# The runner seam: what runs a RayJob's entrypoint on its cluster


class RunPhase(str, enum.Enum):
    """Where a run is; the stand-in maps it onto the RayJob (jobDeploymentStatus, jobStatus)."""

    STARTING = "STARTING"  # the cluster's pods are not ready (the RayJob stays Initializing)
    PENDING = "PENDING"  # submitted, not started
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


class PendingReason(str, enum.Enum):
    """Why a cluster's pods do not start (what the operator must diagnose, R6/R20)."""

    INSUFFICIENT_GPU = "InsufficientGPU"  # kube-scheduler: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.
    UNSCHEDULABLE = "Unschedulable"  # kube-scheduler: no node matches the selector / tolerates the taints
    IMAGE_PULL = "ImagePullBackOff"  # kubelet: ErrImagePull, then ImagePullBackOff
    QUOTA = "ExceededQuota"  # the worker pods are refused by a ResourceQuota (KubeRay's FailedToCreateWorkerPod)


@dataclass(frozen=True)
class PendingPods:
    """Emulate a cluster whose pods stay Pending, with the pod conditions and Events Kubernetes would produce."""

    reason: PendingReason = PendingReason.INSUFFICIENT_GPU
    nodes: int = 3
    message: str = ""  # overrides the scheduler/kubelet/quota message
    workers: int | None = None  # worker pods to create (default: the worker groups' replicas, at least 1)


@dataclass(frozen=True)
class JobPoll:
    """What a run reports. `recheck_after`: seconds until it may change (None: poll; inf: only when stopped)."""

    phase: RunPhase
    message: str = ""
    recheck_after: float | None = None
    pending_pods: PendingPods | None = None


class RunHandle(Protocol):
    """One attempt of one RayJob. Called from the stand-in's worker threads: both must be quick and thread-safe."""

    def poll(self) -> JobPoll:
        """STARTING while the "cluster" is not ready, then PENDING/RUNNING, then a terminal phase."""
        ...

    def stop(self) -> None:
        """Stop the attempt (KubeRay's StopJob on a RayJob deletion, its cluster gone, stand-in stop); idempotent."""
        ...

    def driver_log(self) -> bytes:
        """What the driver printed so far (the submitter pod's log under `emulate_pods`)."""
        ...


class JobRunner(Protocol):
    """The seam for what runs a RayJob's entrypoint. `start` is called once per RayCluster object (uid): once per
    attempt, and again when a cluster is recreated under a Running RayJob (attempt = status.failed). A run lives as
    long as its cluster object, as the job on real pods would. The scripted runner follows a script;
    the sandbox's real runner runs spec.entrypoint with spec.runtimeEnvYAML's env_vars on a local Ray instance and
    reports STARTING until Ray is up, RUNNING while the process lives, SUCCEEDED/FAILED by its exit code."""

    def start(self, rayjob: Mapping[str, Any], cluster_name: str) -> RunHandle: ...


@dataclass(frozen=True)
class Outcome:
    """What one attempt of a RayJob does in the ScriptedRunner."""

    result: Literal["succeed", "fail", "hang", "pending"]
    run_seconds: float = 0.0  # RUNNING this long before the result
    startup_seconds: float = 0.0  # the cluster takes this long to become ready
    submit_seconds: float = 0.0  # the job stays PENDING this long once the cluster is ready
    message: str = ""
    pending_pods: PendingPods | None = None
    # After a stop the job stays RUNNING this long, then STOPPED: the driver's graceful stop on SIGTERM, which Ray's
    # supervisor allows RAY_JOB_STOP_WAIT_TIME_S for (JobSupervisor.run); 0 stops at once, as a driver without one.
    stop_seconds: float = 0.0
    # What the driver prints (the submitter pod's log, read through pods/log when pods are emulated)
    log: str = ""

    @classmethod
    def succeed(cls, after: float = 0.1, *, startup: float = 0.0, submit: float = 0.0) -> Outcome:
        return cls("succeed", after, startup, submit)

    @classmethod
    def fail(
        cls,
        after: float = 0.1,
        message: str = "Job entrypoint command failed with exit code 1",
        *,
        startup: float = 0.0,
    ) -> Outcome:
        return cls("fail", after, startup, 0.0, message)

    @classmethod
    def hang(cls, *, startup: float = 0.0, stop_seconds: float = 0.0) -> Outcome:
        """RUNNING until stopped: a RayJob deletion (StopJob), the Jobs API's stop or its cluster gone; a deadline
        alone does not. `stop_seconds`: how long the driver takes to stop gracefully once asked."""
        return cls("hang", math.inf, startup, stop_seconds=stop_seconds)

    @classmethod
    def pending(cls, reason: PendingReason = PendingReason.INSUFFICIENT_GPU, **pods: Any) -> Outcome:
        """The pods never start for `reason`. With workers desired (replicas > 0) the cluster never becomes ready
        and the RayJob stays Initializing; with replicas 0 (autoscaled from minReplicas 0) the head alone makes it
        ready, the RayJob runs (jobStatus RUNNING) and the workers the job asks for stay Pending, as in KubeRay."""
        return cls("pending", 0.0, math.inf, pending_pods=PendingPods(reason, **pods))


class ScriptedRun:
    """A scripted attempt: its phase follows the clock from start()."""

    def __init__(self, outcome: Outcome, rayjob_key: Key, cluster_name: str, attempt: int) -> None:
        self.outcome = outcome
        self.rayjob_key = rayjob_key
        self.cluster_name = cluster_name
        self.attempt = attempt
        self.started_at = time.monotonic()
        self.stopped = False
        self.stopped_at: float | None = None  # monotonic, the first stop
        self.stop_requests: list[float] = []  # wall clock of each stop asked (the Jobs API, a deletion, the cluster)

    def poll(self) -> JobPoll:
        o = self.outcome
        if self.stopped:
            assert self.stopped_at is not None
            left = self.stopped_at + o.stop_seconds - time.monotonic()
            if left > 0:  # Ray keeps the job RUNNING until its supervisor saw the driver exit
                return JobPoll(RunPhase.RUNNING, "stopping", recheck_after=left)
            return JobPoll(RunPhase.STOPPED, "Job was stopped", math.inf)
        if o.result == "pending":
            return JobPoll(RunPhase.STARTING, recheck_after=math.inf, pending_pods=o.pending_pods)
        elapsed = time.monotonic() - self.started_at
        marks = [
            (o.startup_seconds, RunPhase.STARTING),
            (o.startup_seconds + o.submit_seconds, RunPhase.PENDING),
            (o.startup_seconds + o.submit_seconds + o.run_seconds, RunPhase.RUNNING),
        ]
        for until, phase in marks:
            if elapsed < until:
                return JobPoll(phase, recheck_after=until - elapsed)
        if o.result == "succeed":
            return JobPoll(RunPhase.SUCCEEDED, "Job finished successfully.", math.inf)
        return JobPoll(RunPhase.FAILED, o.message, math.inf)

    def stop(self) -> None:
        self.stop_requests.append(time.time())
        if not self.stopped:
            self.stopped, self.stopped_at = True, time.monotonic()

    def driver_log(self) -> bytes:
        return self.outcome.log.encode()


class ScriptedRunner:
    """Per-RayJob scripted outcomes for fast tests; thread-safe.

        runner = ScriptedRunner(default=Outcome.succeed(0.2))
        runner.script("my-sweep", Outcome.fail(), Outcome.succeed())   # attempt 1 fails, the retry succeeds
        runner.script("flaky", *[Outcome.fail()] * 2, Outcome.succeed())  # fails twice (needs backoffLimit >= 2)
        runner.script("stuck", Outcome.pending(PendingReason.IMAGE_PULL))
        runner.script("slow", Outcome.hang())                          # until a deadline or a deletion stops it

    A script's key is a RayJob name or its `sweeps.dev/sweep` label; outcome i is for attempt i (counted from the
    RayJob's status.failed), the last repeats.
    """

    def __init__(self, default: Outcome | Iterable[Outcome] = Outcome.succeed()) -> None:
        self.default = [default] if isinstance(default, Outcome) else list(default)
        self._scripts: dict[str, list[Outcome]] = {}
        self._lock = threading.Lock()
        self.runs: list[ScriptedRun] = []

    def script(self, key: str, *outcomes: Outcome) -> None:
        if not outcomes:
            raise ValueError("a script needs at least one outcome")
        with self._lock:
            self._scripts[key] = list(outcomes)

    def outcome_for(self, rayjob: Mapping[str, Any], attempt: int) -> Outcome:
        meta = rayjob.get("metadata", {})
        keys = [meta.get("name", ""), (meta.get("labels") or {}).get(constants.LABEL_SWEEP, "")]
        with self._lock:
            script = next((self._scripts[k] for k in keys if k in self._scripts), self.default)
        return script[min(attempt, len(script) - 1)]

    def start(self, rayjob: Mapping[str, Any], cluster_name: str) -> ScriptedRun:
        attempt = int((rayjob.get("status") or {}).get("failed") or 0)
        meta = rayjob["metadata"]
        run = ScriptedRun(self.outcome_for(rayjob, attempt), (meta["namespace"], meta["name"]), cluster_name, attempt)
        with self._lock:
            self.runs.append(run)
        return run


# --------------------------------------------------------------------------------------------------------------------
# Pods and Events, as the RayCluster controller, kube-scheduler and the kubelet would leave them


def _owner_ref(obj: Mapping[str, Any]) -> Obj:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _first_image(template: Mapping[str, Any]) -> str:
    containers = (template.get("spec") or {}).get("containers") or [{}]
    return str(containers[0].get("image", "rayproject/ray:2.58.0"))


def _worker_count(group: Mapping[str, Any]) -> int:
    replicas = group.get("replicas", group.get("minReplicas", 0)) or 0
    return int(replicas)


@dataclass
class PodPlan:
    """One pod the RayCluster controller wants: its name, node type, group and template."""

    name: str
    node_type: str
    group: str
    template: Obj


def plan_pods(cluster: Mapping[str, Any], workers: int | None = None) -> list[PodPlan]:
    """KubeRay's pods for a cluster: `<cluster>-head-xxxxx` and `<cluster>-<group>-worker-xxxxx`."""
    name = cluster["metadata"]["name"]
    spec = cluster.get("spec") or {}
    plans = [
        PodPlan(
            f"{name}-head-{random_suffix()}",
            "head",
            HEAD_GROUP,
            (spec.get("headGroupSpec") or {}).get("template") or {},
        )
    ]
    for group in spec.get("workerGroupSpecs") or []:
        if group.get("suspend") is True:
            continue  # reconcilePods: a suspended group's pods are deleted and the group skipped
        count = _worker_count(group) if workers is None else workers
        for _ in range(count):
            plans.append(
                PodPlan(
                    f"{name}-{group['groupName']}-worker-{random_suffix()}",
                    "worker",
                    group["groupName"],
                    group.get("template") or {},
                )
            )
    return plans


# common/service.go getDefaultPorts (v1.7.0): the head Service's ports when the head container names none.
DEFAULT_HEAD_PORTS = {"client": 10001, "gcs-server": 6379, "dashboard": 8265, "metrics": 8080, "serve": 8000}
CLUSTER_DOMAIN = "cluster.local"  # utils.GetClusterDomainName without CLUSTER_DOMAIN set


def head_service_name(cluster: Mapping[str, Any]) -> str:
    """utils.GenerateHeadServiceName (RayClusterCRD): headGroupSpec.headService's name, else `<cluster>-head-svc`."""
    head = (cluster.get("spec") or {}).get("headGroupSpec") or {}
    custom = ((head.get("headService") or {}).get("metadata") or {}).get("name")
    return str(custom) if custom else f"{cluster['metadata']['name']}-head-svc"


def head_service_body(cluster: Mapping[str, Any]) -> Obj:
    """common/service.go BuildServiceForHeadPod with createService's controller reference (v1.7.0, without a custom
    headService beyond its name): HeadServiceLabels as labels and selector (app.kubernetes.io/name from the head
    template's labels if set), the head container's named ports (getPortsFromCluster; unnamed: `<port>-port`) or
    getDefaultPorts, metrics always, appProtocol tcp, sorted by name; headless (clusterIP None, not-ready addresses
    published) unless the type is other than ClusterIP."""
    name = cluster["metadata"]["name"]
    head = (cluster.get("spec") or {}).get("headGroupSpec") or {}
    template = head.get("template") or {}
    selector = {
        LABEL_CLUSTER: name,
        LABEL_NODE_TYPE: "head",
        "ray.io/identifier": f"{name}-head",
        "app.kubernetes.io/name": ((template.get("metadata") or {}).get("labels") or {}).get(
            "app.kubernetes.io/name", "kuberay"
        ),
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    containers = (template.get("spec") or {}).get("containers") or [{}]
    ports = {
        str(p.get("name") or f"{p.get('containerPort')}-port"): int(p["containerPort"])
        for p in containers[0].get("ports") or []
        if isinstance(p, Mapping) and "containerPort" in p
    } or dict(DEFAULT_HEAD_PORTS)
    ports.setdefault("metrics", DEFAULT_HEAD_PORTS["metrics"])
    kind = head.get("serviceType") or ""
    spec: Obj = {
        "selector": selector,
        "ports": [{"name": n, "port": port, "appProtocol": "tcp"} for n, port in sorted(ports.items())],
    }
    if kind:
        spec["type"] = kind
    if kind in ("", "ClusterIP"):
        spec.update(clusterIP="None", publishNotReadyAddresses=True)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": head_service_name(cluster),
            "namespace": cluster["metadata"]["namespace"],
            "labels": dict(selector),
            "annotations": dict(head.get("headServiceAnnotations") or {}),
            "ownerReferences": [_owner_ref(cluster)],
        },
        "spec": spec,
    }


def head_service_url(service: Mapping[str, Any]) -> str | None:
    """utils.FetchHeadServiceURL: `<service>.<namespace>.svc.<domain>:<the port named dashboard>`; None without
    that port ("dashboard port is not found")."""
    meta = service["metadata"]
    port = next(
        (p["port"] for p in (service.get("spec") or {}).get("ports") or [] if p.get("name") == "dashboard"), None
    )
    return None if port is None else f"{meta['name']}.{meta['namespace']}.svc.{CLUSTER_DOMAIN}:{port}"


def pod_body(cluster: Mapping[str, Any], plan: PodPlan) -> Obj:
    template = plan.template
    cluster_name = cluster["metadata"]["name"]
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels.update(
        {
            LABEL_CLUSTER: cluster_name,
            LABEL_NODE_TYPE: plan.node_type,
            LABEL_GROUP: plan.group,
            "ray.io/identifier": f"{cluster_name}-{plan.node_type}",
            "ray.io/is-ray-node": "yes",
            "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": plan.name,
            "namespace": cluster["metadata"]["namespace"],
            "labels": labels,
            "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
            "ownerReferences": [_owner_ref(cluster)],
        },
        "spec": copy.deepcopy(template.get("spec") or {"containers": [{"name": "ray", "image": "rayproject/ray"}]}),
    }


def _condition(type_: str, status: bool, reason: str = "", message: str = "") -> Obj:
    condition: Obj = {"type": type_, "status": "True" if status else "False", "lastTransitionTime": now_rfc3339()}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _cluster_condition(type_: str, status: bool, reason: str, message: str = "") -> Obj:
    """A metav1.Condition, as RayCluster status.conditions holds them: message and reason always present."""
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339(),
    }


def _container_statuses(pod: Mapping[str, Any], *, ready: bool, waiting: Obj | None = None) -> list[Obj]:
    statuses = []
    for container in pod["spec"].get("containers", []):
        state: Obj = {"running": {"startedAt": now_rfc3339()}} if ready else {"waiting": dict(waiting or {})}
        entry: Obj = {
            "name": container.get("name", "ray"),
            "image": container.get("image", ""),
            "imageID": "",
            "ready": ready,
            "restartCount": 0,
            "started": ready,
            "state": state,
        }
        if ready:  # a started container has the id the kubelet serves its log by
            entry["containerID"] = container_id(dict(pod), entry["name"])
        statuses.append(entry)
    return statuses


def running_pod_status(pod: Mapping[str, Any], index: int) -> Obj:
    """A pod's status once its containers run. A condition whose status does not change keeps its
    lastTransitionTime (kubelet pkg/kubelet/status/status_manager.go `updateLastTransitionTime`, which
    updateStatusInternal applies to PodScheduled too): PodScheduled stays the binding's time, which GPU-hour
    accounting reads as the moment the pod took its GPUs; startTime is set once (`generateAPIPodStatus`)."""
    before = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    conditions = []
    for type_ in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        condition, old = _condition(type_, True), before.get(type_) or {}
        if old.get("status") == "True" and old.get("lastTransitionTime"):
            condition["lastTransitionTime"] = old["lastTransitionTime"]
        conditions.append(condition)
    return {
        "phase": "Running",
        "podIP": f"10.0.{index // 250}.{index % 250 + 2}",
        "startTime": (pod.get("status") or {}).get("startTime") or now_rfc3339(),
        "conditions": conditions,
        "containerStatuses": _container_statuses(pod, ready=True),
    }


def unschedulable_message(pending: PendingPods) -> str:
    if pending.message:
        return pending.message
    n = pending.nodes
    if pending.reason is PendingReason.INSUFFICIENT_GPU:
        return (
            f"0/{n} nodes are available: {n} Insufficient {constants.GPU_RESOURCE}. preemption: 0/{n} nodes are "
            f"available: {n} No preemption victims found for incoming pod."
        )
    return (
        f"0/{n} nodes are available: {n} node(s) didn't match Pod's node affinity/selector. preemption: 0/{n} "
        f"nodes are available: {n} Preemption is not helpful for scheduling."
    )


# --------------------------------------------------------------------------------------------------------------------
# The stand-in


def _parse_time(value: str | None) -> float | None:
    return parse_rfc3339(value).timestamp() if value else None


def _attempt_counts(status: Obj, spec: Mapping[str, Any]) -> None:
    """KubeRay's checkBackoffLimitAndUpdateStatusIfNeeded: count the attempt, retry a failure if allowed."""
    failed = int(status.get("failed") or 0)
    succeeded = int(status.get("succeeded") or 0)
    deployment = status.get("jobDeploymentStatus", "")
    if deployment == Deployment.FAILED.value:
        failed += 1
    if status.get("jobStatus") == JobStatus.SUCCEEDED.value and deployment == Deployment.COMPLETE.value:
        succeeded += 1
    status["failed"], status["succeeded"] = failed, succeeded
    backoff = spec.get("backoffLimit")
    if deployment == Deployment.FAILED.value and backoff is not None and failed < int(backoff) + 1:
        if status.get("reason") not in NOT_RETRIED:
            status["jobDeploymentStatus"] = Deployment.RETRYING.value


@dataclass
class _Step:
    """The outcome of one reconcile: the new status and when to look again."""

    status: Obj
    requeue_after: float | None = None

    def wake_in(self, seconds: float | None) -> None:
        if seconds is None or math.isinf(seconds):
            return
        seconds = max(seconds, 0.0)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


class RayApi:
    """The stand-in's API calls: ray.io objects through CustomObjectsApi, core/v1 as plain JSON, Events."""

    def __init__(self, api_client: Any) -> None:
        import kubernetes.client

        api_client.user_agent = USER_AGENT  # lets tests aim injected errors at the stand-in (or away from it)
        self.api_client = api_client
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.ApiException = kubernetes.client.ApiException

    def create(self, plural: str, namespace: str, body: Obj) -> Obj:
        return dict(
            self.custom.create_namespaced_custom_object(
                constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, body
            )
        )

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        try:
            return dict(
                self.custom.get_namespaced_custom_object(
                    constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, name
                )
            )
        except self.ApiException as e:
            if e.status == 404:
                return None
            raise

    def delete(self, plural: str, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, name
        )

    def patch(self, plural: str, obj: Obj, patch: Obj, *, status: bool = False, guarded: bool = False) -> Obj:
        """A merge patch; `guarded` adds obj's resourceVersion, so a stale write fails with 409 as KubeRay's Update."""
        meta = obj["metadata"]
        if guarded:
            patch = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": meta["resourceVersion"]}}
        call = (
            self.custom.patch_namespaced_custom_object_status if status else self.custom.patch_namespaced_custom_object
        )
        return dict(
            call(constants.RAY_GROUP, constants.RAY_VERSION_API, meta["namespace"], plural, meta["name"], patch)
        )

    def core(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """A core/v1 call with plain JSON: the typed client validates pod templates stricter than the API server."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, payload, _ = self.api_client.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body
        )
        response = self.api_client.call_api(method, url, header_params=headers, body=payload)
        response.read()
        if not 200 <= response.status < 300:
            raise self.ApiException(http_resp=response)
        return dict(json.loads(response.data))

    def event(
        self,
        involved: Obj,
        type_: str,
        reason: str,
        message: str,
        component: str = RAYJOB_CONTROLLER,
        host: str | None = None,
        action: str | None = None,
    ) -> None:
        body = event_body(involved, type_, reason, message, component, host, action, instance=KUBERAY_POD)
        try:
            self.core("POST", f"/api/v1/namespaces/{body['metadata']['namespace']}/events", body)
        except self.ApiException as e:  # events are best effort, as client-go's recorder
            logger.debug("event %s on %s not recorded: %r", reason, involved["metadata"]["name"], e)


class ClusterPods:
    """A RayCluster's Pods as KubeRay creates them, and what kube-scheduler, the kubelet or a ResourceQuota make of
    them: Running pods for `emulate_pods`, or the Pending pods, conditions and Events of a stuck start (R6, R20)."""

    def __init__(self, api: RayApi) -> None:
        self.api = api
        self._done: set[str] = set()
        self._lock = threading.Lock()

    def starting(self, cluster: Obj) -> None:
        """Pods created and scheduled, containers still being created."""
        if not self._once(cluster, "created"):
            return
        for plan in self._missing(cluster, plan_pods(cluster)):
            pod = self._create(cluster, plan)
            waiting = {"reason": "ContainerCreating"}
            self._set_status(
                pod,
                {
                    "phase": "Pending",
                    "conditions": [_condition("PodScheduled", True)],
                    "containerStatuses": _container_statuses(pod, ready=False, waiting=waiting),
                },
            )

    def ready(self, cluster: Obj) -> None:
        self.starting(cluster)
        if self._once(cluster, "ready"):
            for index, pod in enumerate(self._list(cluster)):
                self._set_status(pod, running_pod_status(pod, index))

    def stuck(self, cluster: Obj, pending: PendingPods) -> Obj | None:
        """Make the cluster's start stuck for `pending.reason`; returns the RayCluster status to record (once)."""
        if not self._once(cluster, "pending"):
            return None
        plans = plan_pods(cluster, workers=pending.workers)
        if not any(p.node_type == "worker" for p in plans) and pending.workers is None:
            plans = plan_pods(cluster, workers=1)  # an autoscaled group at 0: the demand that cannot be met
        refusal = ""  # the cluster's status is returned last: once it shows the problem, pods and Events exist
        for plan in self._missing(cluster, plans):
            if plan.node_type == "worker" and pending.reason is PendingReason.QUOTA:
                refusal = self._quota_refusal(cluster, plan, pending)
            else:
                self._pending(self._create(cluster, plan), plan, pending)
        return self._provisioning_status(plans, pending, refusal)

    @staticmethod
    def _provisioning_status(plans: list[PodPlan], pending: PendingPods, refusal: str) -> Obj:
        """The RayCluster's view of a stuck start: no state, no available workers, provisioning conditions."""
        head_ready = pending.reason is not PendingReason.IMAGE_PULL
        conditions = [
            _cluster_condition(
                "HeadPodReady", head_ready, "HeadPodRunningAndReady" if head_ready else "HeadPodNotReady"
            ),
            _cluster_condition(
                "RayClusterProvisioned",
                False,
                "RayClusterPodsProvisioning",
                "RayCluster Pods are being provisioned for first time",
            ),
        ]
        if refusal:
            conditions.append(_cluster_condition("ReplicaFailure", True, "FailedCreateWorkerPod", refusal))
        workers = sum(1 for p in plans if p.node_type == "worker")
        return {
            "desiredWorkerReplicas": workers,
            "availableWorkerReplicas": 0,
            "readyWorkerReplicas": 0,
            "conditions": conditions,
        }

    def delete_group(self, cluster: Obj, group: str) -> int:
        """What reconcilePods does to a worker group with `suspend: true`: deleteAllPods of the group (its pods by
        RayClusterGroupPodsAssociationOptions: the cluster's and the group's labels); how many it deleted."""
        deleted = 0
        for pod in self._list(cluster):
            meta = pod["metadata"]
            labels = meta.get("labels") or {}
            if labels.get(LABEL_NODE_TYPE) != "worker" or labels.get(LABEL_GROUP) != group:
                continue
            try:
                self.api.core("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
                deleted += 1
            except self.api.ApiException as e:
                if e.status != 404:
                    raise
        return deleted

    def _once(self, cluster: Obj, what: str) -> bool:
        """Each step happens once per cluster; a retried reconcile does not double pods (see _missing)."""
        marker = f"{cluster['metadata']['uid']}/{what}"
        with self._lock:
            if marker in self._done:
                return False
            self._done.add(marker)
        return True

    def _list(self, cluster: Obj) -> list[Obj]:
        selector = f"{LABEL_CLUSTER}={cluster['metadata']['name']}"
        path = f"/api/v1/namespaces/{cluster['metadata']['namespace']}/pods"
        return list(self.api.core("GET", path, query=[("labelSelector", selector)])["items"])

    def _missing(self, cluster: Obj, plans: list[PodPlan]) -> list[PodPlan]:
        have: dict[tuple[str, str], int] = {}
        for pod in self._list(cluster):
            labels = pod["metadata"].get("labels") or {}
            group = (labels.get(LABEL_NODE_TYPE, ""), labels.get(LABEL_GROUP, ""))
            have[group] = have.get(group, 0) + 1
        missing = []
        for plan in plans:
            group = (plan.node_type, plan.group)
            if have.get(group, 0) > 0:
                have[group] -= 1
            else:
                missing.append(plan)
        return missing

    def _create(self, cluster: Obj, plan: PodPlan) -> Obj:
        namespace = cluster["metadata"]["namespace"]
        pod = self.api.core("POST", f"/api/v1/namespaces/{namespace}/pods", pod_body(cluster, plan))
        reason = "CreatedHeadPod" if plan.node_type == "head" else "CreatedWorkerPod"
        self.api.event(
            cluster,
            "Normal",
            reason,
            f"Created {plan.node_type} Pod {namespace}/{plan.name}",
            RAYCLUSTER_CONTROLLER,
            action="Create",
        )
        return pod

    def _patch(self, pod: Obj, suffix: str, body: Obj) -> None:
        meta = pod["metadata"]
        self.api.core(
            "PATCH",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}{suffix}",
            body,
            content_type="application/strategic-merge-patch+json",
        )

    def _set_status(self, pod: Obj, status: Obj) -> None:
        self._patch(pod, "/status", {"status": status})

    def _quota_refusal(self, cluster: Obj, plan: PodPlan, pending: PendingPods) -> str:
        """What the API server answers KubeRay's worker creation under a full ResourceQuota; returns the error."""
        gpu = f"requests.{constants.GPU_RESOURCE}"
        error = pending.message or (
            f'pods "{plan.name}" is forbidden: exceeded quota: gpu-quota, requested: {gpu}=1, '
            f"used: {gpu}={pending.nodes}, limited: {gpu}={pending.nodes}"
        )
        meta = cluster["metadata"]
        message = f"Failed to create worker Pod for the cluster {meta['namespace']}/{meta['name']}, {error}"
        self.api.event(cluster, "Warning", "FailedToCreateWorkerPod", message, RAYCLUSTER_CONTROLLER, action="Create")
        return error

    def _pending(self, pod: Obj, plan: PodPlan, pending: PendingPods) -> None:
        head_is_fine = plan.node_type == "head" and pending.reason is not PendingReason.IMAGE_PULL
        if head_is_fine or pending.reason is PendingReason.QUOTA:
            self._set_status(pod, running_pod_status(pod, 0))
        elif pending.reason in (PendingReason.INSUFFICIENT_GPU, PendingReason.UNSCHEDULABLE):
            self._unschedulable(pod, pending)
        else:
            self._image_pull_back_off(pod, _first_image(plan.template), pending)

    # The Events go first: a pod whose status shows the problem already has the Events that explain it.

    def _unschedulable(self, pod: Obj, pending: PendingPods) -> None:
        message = unschedulable_message(pending)
        self.api.event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
        self._set_status(
            pod, {"phase": "Pending", "conditions": [_condition("PodScheduled", False, "Unschedulable", message)]}
        )

    def _image_pull_back_off(self, pod: Obj, image: str, pending: PendingPods) -> None:
        node = "ip-10-0-1-23.ec2.internal"
        error = (
            pending.message or f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": not found'
        )
        waiting = {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}": ErrImagePull: {error}'}
        self._patch(pod, "", {"spec": {"nodeName": node}})
        for type_, reason, message in (
            ("Normal", "Pulling", f'Pulling image "{image}"'),
            ("Warning", "Failed", f'Failed to pull image "{image}": {error}'),
            ("Warning", "Failed", "Error: ErrImagePull"),
            ("Normal", "BackOff", f'Back-off pulling image "{image}"'),
            ("Warning", "Failed", "Error: ImagePullBackOff"),
        ):
            self.api.event(pod, type_, reason, message, "kubelet", host=node)
        self._set_status(
            pod,
            {
                "phase": "Pending",
                "conditions": [
                    _condition("PodScheduled", True),
                    _condition("Ready", False, "ContainersNotReady", "containers with unready status"),
                ],
                "containerStatuses": _container_statuses(pod, ready=False, waiting=waiting),
            },
        )


def ready_cluster_status(cluster: Obj) -> Obj:
    """A RayCluster's status once its pods run, as raycluster_controller.go's calculateStatus writes it (state `ready`,
    stateTransitionTimes, lastUpdateTime; every field in the v1.7.0 CRD's status schema)."""
    groups = (cluster.get("spec") or {}).get("workerGroupSpecs") or []
    desired = sum(_worker_count(g) for g in groups)
    name = cluster["metadata"]["name"]
    now = now_rfc3339()
    return {
        "state": "ready",
        "stateTransitionTimes": {"ready": now},
        "lastUpdateTime": now,
        "desiredWorkerReplicas": desired,
        "availableWorkerReplicas": desired,
        "readyWorkerReplicas": desired,
        "minWorkerReplicas": sum(int(g.get("minReplicas", 0) or 0) for g in groups),
        "maxWorkerReplicas": sum(int(g.get("maxReplicas", 0) or 0) for g in groups),
        "endpoints": {"client": "10001", "dashboard": "8265", "gcs-server": "6379", "metrics": "8080"},
        "head": {
            "podName": f"{name}-head-{random_suffix()}",
            "podIP": "10.0.0.2",
            "serviceName": f"{name}-head-svc",
            "serviceIP": "10.96.0.10",
        },
        "conditions": [
            _cluster_condition("HeadPodReady", True, "HeadPodRunningAndReady"),
            _cluster_condition(
                "RayClusterProvisioned",
                True,
                "AllPodRunningAndReadyFirstTime",
                "All Ray Pods are ready for the first time",
            ),
        ],
        "observedGeneration": cluster["metadata"].get("generation", 1),
    }


def submission_mode(spec: Mapping[str, Any]) -> str:
    """spec.submissionMode, with the default the API server applies from the v1.7.0 CRD (K8sJobMode)."""
    return str(spec.get("submissionMode") or "K8sJobMode")


def cluster_for(rayjob: Obj, name: str) -> Obj:
    """rayjob_controller.go constructRayClusterForRayJob: the RayJob's labels (maps.Copy) plus originated-from-cr-name,
    originated-from-crd and job-submission-mode; ALL its annotations (maps.Copy, v1.7.0 line 1005); a deep copy of
    spec.rayClusterSpec; a controller ownerReference to the RayJob (ctrl.SetControllerReference)."""
    meta, spec = rayjob["metadata"], rayjob.get("spec") or {}
    labels = dict(meta.get("labels") or {})
    labels[constants.RAY_LABEL_ORIGINATED_FROM_CR_NAME] = meta["name"]
    labels[constants.RAY_LABEL_ORIGINATED_FROM_CRD] = constants.RAYJOB_KIND
    labels[LABEL_SUBMISSION_MODE] = submission_mode(spec)
    annotations = dict(meta.get("annotations") or {})
    cluster_spec = copy.deepcopy(spec["rayClusterSpec"])
    if submission_mode(spec) == "SidecarMode":
        annotations["ray.io/disable-provisioned-head-restart"] = "true"
        cluster_spec.setdefault("headGroupSpec", {}).setdefault("template", {}).setdefault("spec", {})[
            "restartPolicy"
        ] = "Never"
    return {
        "apiVersion": constants.RAY_API_VERSION,
        "kind": constants.RAYCLUSTER_KIND,
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [_owner_ref(rayjob)],
        },
        "spec": cluster_spec,
    }


def submitter_job_for(rayjob: Obj, cluster: Obj) -> Obj:
    """rayjob_controller.go createNewK8sJob/getSubmitterTemplate (K8sJobMode): a batch/v1 Job named as the RayJob,
    owned by it, backoffLimit from submitterConfig (default 2), its pod template from submitterPodTemplate (or the
    head container's image) with KubeRay's labels and RAY_DASHBOARD_ADDRESS / RAY_JOB_SUBMISSION_ID."""
    meta, spec, status = rayjob["metadata"], rayjob.get("spec") or {}, rayjob.get("status") or {}
    kuberay_labels = {
        constants.RAY_LABEL_ORIGINATED_FROM_CR_NAME: meta["name"],
        constants.RAY_LABEL_ORIGINATED_FROM_CRD: constants.RAYJOB_KIND,
        LABEL_CREATED_BY: CREATED_BY,
    }
    template = copy.deepcopy(spec.get("submitterPodTemplate") or {})
    pod_spec = template.setdefault("spec", {})
    if not pod_spec.get("containers"):
        head = (((cluster.get("spec") or {}).get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
        image = ((head.get("containers") or [{}])[0]).get("image", "rayproject/ray")
        pod_spec["containers"] = [{"name": "ray-job-submitter", "image": image}]
        pod_spec["restartPolicy"] = "Never"
    container = pod_spec["containers"][0]
    if not container.get("command"):
        container["command"] = ["/bin/bash", "-ce", "--"]
        container["args"] = [
            f"ray job submit --address http://{status.get('dashboardURL', '')} "
            f"--submission-id {status.get('jobId', '')} --no-wait -- {spec.get('entrypoint', '')}"
        ]
    container["env"] = [
        *(container.get("env") or []),
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "RAY_DASHBOARD_ADDRESS", "value": status.get("dashboardURL", "")},
        {"name": "RAY_JOB_SUBMISSION_ID", "value": status.get("jobId", "")},
    ]
    template.setdefault("metadata", {}).setdefault("labels", {}).update(kuberay_labels)
    backoff = (spec.get("submitterConfig") or {}).get("backoffLimit", DEFAULT_SUBMITTER_BACKOFF_LIMIT)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": dict(kuberay_labels),
            "ownerReferences": [_owner_ref(rayjob)],
        },
        "spec": {"backoffLimit": backoff, "template": template},
    }


_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def validate_rayjob(rayjob: Mapping[str, Any]) -> tuple[str, str] | None:
    """rayjob_controller.go validateRayJob -> utils/validation.go ValidateRayJobMetadata, ValidateRayJobSpec (with
    validateDeletionConfiguration, validateDeletionRules, validateLegacyDeletionPolicies) and ValidateRayJobStatus.
    Returns (Event reason, error text) for the first rule broken, None if valid. ValidateRayClusterSpec's checks of
    the cluster template are not modelled (beyond its presence)."""
    meta, spec, status = rayjob["metadata"], rayjob.get("spec") or {}, rayjob.get("status") or {}
    name = meta.get("name", "")
    if len(name) > MAX_RAYJOB_NAME_LENGTH:
        return "InvalidRayJobMetadata", (
            f"The RayJob metadata is invalid: RayJob name should be no more than {MAX_RAYJOB_NAME_LENGTH} characters"
        )
    if not _DNS1035.match(name) or len(name) > 63:
        return "InvalidRayJobMetadata", (
            "The RayJob metadata is invalid: RayJob name should be a valid DNS1035 "
            "label: [a DNS-1035 label must consist of lower case alphanumeric characters "
            "or '-', start with an alphabetic character, and end with an alphanumeric "
            "character]"
        )
    spec_error = _rayjob_spec_error(spec)
    if spec_error:
        return "InvalidRayJobSpec", spec_error
    if status.get("jobDeploymentStatus") == "Waiting" and submission_mode(spec) != "InteractiveMode":
        return "InvalidRayJobStatus", (
            "The RayJob status is invalid: JobDeploymentStatus cannot be `Waiting` when "
            "SubmissionMode is not InteractiveMode"
        )
    return None


def _rayjob_spec_error(spec: Mapping[str, Any]) -> str | None:
    invalid = "The RayJob spec is invalid: "
    shutdown = bool(spec.get("shutdownAfterJobFinishes"))
    ttl = int(spec.get("ttlSecondsAfterFinished") or 0)
    selector = spec.get("clusterSelector") or {}
    mode = submission_mode(spec)
    backoff = spec.get("backoffLimit")
    if spec.get("suspend") and not shutdown:
        return invalid + "a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended"
    if ttl < 0:
        return invalid + "TTLSecondsAfterFinished must be a non-negative integer"
    deletion_error = _deletion_configuration_error(spec)
    if deletion_error:
        return deletion_error
    if spec.get("suspend") and selector:
        return invalid + "the ClusterSelector mode doesn't support the suspend operation"
    if not spec.get("rayClusterSpec") and not selector:
        return invalid + "one of RayClusterSpec or ClusterSelector must be set"
    if selector:
        if not selector.get(LABEL_CLUSTER):
            return "cluster name in ClusterSelector should not be empty"
        if mode == "SidecarMode":
            return "ClusterSelector is not supported in SidecarMode"
        if backoff is not None and int(backoff) > 0:
            return invalid + "BackoffLimit is incompatible with ClusterSelector mode"
    if mode == "InteractiveMode" and backoff is not None and int(backoff) > 0:
        return invalid + "BackoffLimit is incompatible with InteractiveMode"
    if mode == "SidecarMode":
        if spec.get("submitterPodTemplate") is not None:
            return "Currently, SidecarMode doesn't support SubmitterPodTemplate"
        if spec.get("submitterConfig") is not None:
            return "Currently, SidecarMode doesn't support SubmitterConfig"
        head_policy = (
            (((spec.get("rayClusterSpec") or {}).get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
        ).get("restartPolicy", "")
        if head_policy not in ("", "Never"):
            return "restartPolicy for head Pod should be Never or unset when using SidecarMode"
    # utils/validation.go ValidateRayJobSpec -> utils/dashboardclient/dashboard_httpclient.go UnmarshalRuntimeEnvYAML
    # (v1.7.0): sigs.k8s.io/yaml into map[string]any, so YAML that is not a mapping fails like YAML that does not
    # parse. Read with the contract's decoder (the one codec), under KubeRay's prefix.
    text = spec.get("runtimeEnvYAML") or ""
    try:
        runtime_env.decode(text)
    except ValueError as e:
        return f"failed to unmarshal RuntimeEnvYAML: {text}: {e}"
    for field_name in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if spec.get(field_name) is not None and int(spec[field_name]) <= 0:
            return invalid + f"{field_name} must be a positive integer"
    if backoff is not None and int(backoff) < 0:
        return invalid + "backoffLimit must be a positive integer"
    return None


_POLICY_ORDER = ("DeleteWorkers", "DeleteCluster", "DeleteSelf")  # validateTTLConsistency: TTLs non-decreasing


def _deletion_configuration_error(spec: Mapping[str, Any]) -> str | None:
    """validation.go validateDeletionConfiguration (feature gate RayJobDeletionPolicy: on by default in v1.7.0)."""
    invalid = "The RayJob spec is invalid: "
    shutdown = bool(spec.get("shutdownAfterJobFinishes"))
    if not shutdown and int(spec.get("ttlSecondsAfterFinished") or 0) > 0:
        return invalid + "a RayJob with shutdownAfterJobFinishes set to false cannot have TTLSecondsAfterFinished"
    strategy = spec.get("deletionStrategy")
    if strategy is None:
        return None
    legacy = strategy.get("onSuccess") is not None or strategy.get("onFailure") is not None
    rules = strategy.get("deletionRules") or []
    if rules and shutdown:
        return invalid + "spec.shutdownAfterJobFinishes and spec.deletionStrategy.deletionRules are mutually exclusive"
    if rules and legacy:
        return invalid + "Cannot use both legacy onSuccess/onFailure fields and deletionRules simultaneously"
    if legacy:
        return _legacy_deletion_error(spec, strategy, shutdown)
    if rules:
        return _deletion_rules_error(spec, rules)
    return invalid + (
        "DeletionStrategy requires either BOTH onSuccess and onFailure, OR the deletionRules field (cannot be empty)"
    )


def _autoscaling(spec: Mapping[str, Any]) -> bool:
    return bool((spec.get("rayClusterSpec") or {}).get("enableInTreeAutoscaling"))


def _legacy_deletion_error(spec: Mapping[str, Any], strategy: Mapping[str, Any], shutdown: bool) -> str | None:
    on_success, on_failure = strategy.get("onSuccess"), strategy.get("onFailure")
    if on_success is None or on_failure is None:
        return (
            "both DeletionStrategy.OnSuccess and DeletionStrategy.OnFailure must be set when using the legacy "
            "deletion policy fields of DeletionStrategy"
        )
    success, failure = on_success.get("policy"), on_failure.get("policy")
    if success is None:
        return "the DeletionPolicyType field of DeletionStrategy.OnSuccess cannot be unset when DeletionStrategy is enabled"
    if failure is None:
        return "the DeletionPolicyType field of DeletionStrategy.OnFailure cannot be unset when DeletionStrategy is enabled"
    if spec.get("clusterSelector"):
        if success in ("DeleteCluster", "DeleteWorkers"):
            return f"the ClusterSelector mode doesn't support DeletionStrategy={success} on success"
        if failure in ("DeleteCluster", "DeleteWorkers"):
            return f"the ClusterSelector mode doesn't support DeletionStrategy={failure} on failure"
    if "DeleteWorkers" in (success, failure) and _autoscaling(spec):
        return "DeletionStrategy=DeleteWorkers currently does not support RayCluster with autoscaling enabled"
    if shutdown and "DeleteNone" in (success, failure):
        return (
            "The RayJob spec is invalid: shutdownAfterJobFinshes is set to 'true' while deletion policy is 'DeleteNone'"
        )
    return None


def _deletion_rules_error(spec: Mapping[str, Any], rules: list[Mapping[str, Any]]) -> str | None:
    """validateDeletionRules: every error, joined with newlines (errors.Join)."""
    errors: list[str] = []
    by_condition: dict[tuple[str, str], dict[str, int]] = {}
    for i, rule in enumerate(rules):
        condition, policy = rule.get("condition") or {}, rule.get("policy", "")
        has_job, has_deployment = "jobStatus" in condition, "jobDeploymentStatus" in condition
        if has_job and has_deployment:
            errors.append(f"deletionRules[{i}]: cannot set both JobStatus and JobDeploymentStatus at the same time")
            continue
        if not has_job and not has_deployment:
            errors.append(f"deletionRules[{i}]: exactly one of JobStatus and JobDeploymentStatus must be set")
            continue
        ttl = int(condition.get("ttlSeconds") or 0)
        if ttl < 0:
            errors.append(f"deletionRules[{i}]: TTLSeconds must be non-negative")
            continue
        if spec.get("clusterSelector") and policy in ("DeleteCluster", "DeleteWorkers"):
            errors.append(
                f"deletionRules[{i}]: DeletionPolicyType '{policy}' not supported when ClusterSelector is set"
            )
            continue
        if _autoscaling(spec) and policy == "DeleteWorkers":
            errors.append(
                f"deletionRules[{i}]: DeletionPolicyType 'DeleteWorkers' not supported with autoscaling enabled"
            )
            continue
        kind = (
            ("JobStatus", condition["jobStatus"])
            if has_job
            else ("JobDeploymentStatus", condition["jobDeploymentStatus"])
        )
        policies = by_condition.setdefault(kind, {})
        if policy in policies:
            errors.append(
                f"deletionRules[{i}]: duplicate rule for DeletionPolicyType '{policy}' and {kind[0]} '{kind[1]}'"
            )
            continue
        policies[policy] = ttl
    for (kind, value), policies in by_condition.items():
        previous: tuple[str, int] | None = None
        for policy in _POLICY_ORDER:
            if policy not in policies:
                continue
            if previous is not None and policies[policy] < previous[1]:
                errors.append(
                    f"for {kind} '{value}': {policy} TTL ({policies[policy]}) must be >= {previous[0]} TTL "
                    f"({previous[1]})"
                )
            previous = (policy, policies[policy])
    return "\n".join(errors) or None


class JobsApiServer:
    """The heads' dashboards, as far as the operator uses them: Ray's Jobs API stop and job info on one loopback port
    (ray 2.58 `dashboard/modules/job/job_head.py`: `POST /api/jobs/{id}/stop` answers `{"stopped": bool}`, whether
    the job was still running, 404 for an unknown job; `GET /api/jobs/{id}` its JobDetails with `status`, the run's
    own phase, which stays current while KubeRay suspends the RayJob and no longer copies it).
    `find(job_id)` returns the run and its RayJob's jobStatus, or None."""

    def __init__(self, find: Callable[[str], tuple[RunHandle, str] | None]) -> None:
        import http.server

        self.find = find
        self.requests: list[tuple[str, str, float]] = []  # (method, path, wall clock): what reached a head
        self._routes: set[str] = set()  # dashboard URLs (host:port) that reach this server
        self._routes_lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def _answer(self, code: int, body: Any) -> None:
                data = (json.dumps(body) if not isinstance(body, str) else body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _job(self) -> tuple[str, tuple[RunHandle, str] | None] | None:
                match = re.fullmatch(r"/api/jobs/([^/]+)(/stop)?", self.path.split("?")[0])
                if match is None:
                    return None
                return match.group(1), outer.find(match.group(1))

            def do_POST(self) -> None:
                outer.requests.append(("POST", self.path, time.time()))
                found = self._job()
                if found is None or not self.path.endswith("/stop"):
                    self._answer(404, "Not Found")
                elif found[1] is None:
                    self._answer(404, f"Job {found[0]} does not exist")
                elif found[1][0].poll().phase.value in TERMINAL_JOB:  # the job's own state, as the supervisor's
                    self._answer(200, {"stopped": False})
                else:
                    found[1][0].stop()  # JobManager.stop_job: the supervisor SIGTERMs the driver, fire and forget
                    self._answer(200, {"stopped": True})

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.path, time.time()))
                found = self._job()
                if found is None or found[1] is None:
                    self._answer(404, "Not Found")
                else:  # the head knows the job as it is now, whatever KubeRay last copied into the RayJob
                    phase = found[1][0].poll().phase
                    status = JobStatus.PENDING.value if phase is RunPhase.STARTING else phase.value
                    self._answer(200, {"submission_id": found[0], "status": status})

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="kuberay-jobs-api", daemon=True)

    @property
    def address(self) -> str:
        """`host:port` of the one loopback server that stands for every head's dashboard."""
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def serve(self, url: str) -> None:
        """`url` (a head Service's `name.namespace.svc.cluster.local:port`, as KubeRay writes status.dashboardURL)
        now reaches this server: the sandbox's cluster DNS and Service routing for the heads."""
        with self._routes_lock:
            self._routes.add(url.removeprefix("http://").rstrip("/"))

    def route(self, url: str) -> str | None:
        """The loopback address a dashboard URL reaches in the sandbox; None for a name no head Service has."""
        with self._routes_lock:
            known = url.strip().removeprefix("http://").rstrip("/") in self._routes
        return self.address if known else None

    def stop_job(self, url: str, job_id: str) -> Any:
        """`ray_jobs.stop_job` as the operator's pod would send it, through the sandbox's routing."""
        from sweep_operator import ray_jobs

        address = self.route(url)
        if address is None:
            return ray_jobs.StopOutcome(asked=False, error="gaierror: the name does not resolve (sandbox)")
        return ray_jobs.stop_job(address, job_id)

    def job_status(self, url: str, job_id: str) -> str | None:
        """`ray_jobs.job_status` through the sandbox's routing (None for a name no head Service has)."""
        from sweep_operator import ray_jobs

        address = self.route(url)
        return ray_jobs.job_status(address, job_id) if address is not None else None

    def start(self) -> JobsApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class KubeRayStandIn:
    """Reconciles RayJobs as KubeRay v1.7.0 does, against any Kubernetes API (the emulator in practice).

        standin = KubeRayStandIn(server.api_client(), ScriptedRunner())
        standin.start()
        ...
        standin.stop()

    `poll_interval` stands for KubeRay's fixed 3 s requeue (RayJobDefaultRequeueDuration) where the stand-in has no
    better wake-up; `emulate_pods` creates every cluster's Pods (Running once ready; pending pods are created whenever
    a run reports them). `delete_rayjob_after_job_finishes` is KubeRay's DELETE_RAYJOB_CR_AFTER_JOB_FINISHES=true.
    A run lives as long as its RayCluster object: it stops when KubeRay stops the job (a RayJob deletion) or when
    the cluster is gone from the API (its pods with it), never on a deadline, a suspend or a retry by itself.
    Each cluster gets its head Service as KubeRay makes it (`head_service_body`), and status.dashboardURL is that
    Service's in-cluster name and dashboard port (FetchHeadServiceURL). `dashboard=True` serves the heads' Jobs API
    on one loopback port (`JobsApiServer`), which those names reach through `jobs_api.stop_job`/`job_status` (the
    sandbox's cluster DNS), so the operator's real client can stop a job the way KubeRay's StopJob does. `deletion_policy_gate` is KubeRay's
    RayJobDeletionPolicy feature gate (on by default in v1.7.0), which a suspended worker group needs.
    `cluster_api_client`: the identity of the cluster's own controllers the stand-in also plays (the Job controller
    and the kubelet for the submitter's pod), where the API authorizes KubeRay's by RBAC.
    """

    def __init__(
        self,
        api_client: Any,
        runner: JobRunner | None = None,
        *,
        namespace: str | None = None,
        workers: int = 2,
        poll_interval: float = 0.5,
        emulate_pods: bool = False,
        delete_rayjob_after_job_finishes: bool = False,
        dashboard: bool = False,
        deletion_policy_gate: bool = True,
        container_logs: ContainerLogs | None = None,
        cluster_api_client: Any = None,
    ) -> None:
        self.api = RayApi(api_client)
        # What the cluster's own controllers write (the Job controller and the kubelet: the submitter's pod and the
        # Job's status) goes through their identity where one is given, not KubeRay's: RBAC grants KubeRay neither
        self.cluster_api = RayApi(cluster_api_client) if cluster_api_client is not None else self.api
        self.jobs_api = JobsApiServer(self._job_by_id) if dashboard else None
        self.runner: JobRunner = runner if runner is not None else ScriptedRunner()
        self.namespace = namespace
        self.poll_interval = poll_interval
        self.emulate_pods = emulate_pods
        self.delete_rayjob_after_job_finishes = delete_rayjob_after_job_finishes
        self.deletion_policy_gate = deletion_policy_gate  # features.RayJobDeletionPolicy (Beta, on by default)
        self.pod_lifetimes: PodLifetimes | None = None
        self.pods = ClusterPods(self.api)
        # The submitter Job's pod under `emulate_pods`; its log (the emulator's `container_logs`) is the driver's
        self.submitter_pods = SubmitterPods(self.cluster_api.core, container_logs)
        self._submitter_pods: set[tuple[str, str]] = set()  # (Job uid, step) done once each
        self._driver_runs: dict[Key, RunHandle] = {}  # the latest run of each RayJob, kept after its cluster goes
        self.queue = WorkQueue()
        ray = (self.api.custom, constants.RAY_GROUP, constants.RAY_VERSION_API)
        self.rayjobs = Informer(*ray, constants.RAYJOB_PLURAL, self._on_rayjob, namespace)
        self.rayclusters = Informer(
            *ray, constants.RAYCLUSTER_PLURAL, self._on_raycluster, namespace, on_delete=self._on_raycluster_gone
        )
        self._workers = [
            threading.Thread(target=self._work, name=f"kuberay-worker-{i}", daemon=True) for i in range(workers)
        ]
        self._runs: dict[Key, tuple[str, RunHandle]] = {}  # RayJob -> (its cluster's uid, the run on it)
        self._head_services: set[str] = set()  # clusters (uid) whose head Service exists
        self._gone: set[str] = set()  # uids of clusters the watch saw deleted (a stale cache read starts no run)
        self._failures: dict[Key, int] = {}
        self._lock = threading.Lock()
        # per RayJob, the resourceVersion the last finished reconcile read: what "it has looked again" waits on
        self.reconciled: dict[Key, int] = {}
        self._reading: dict[Key, int] = {}

    # ---- lifecycle

    def start(self, timeout: float = 10.0) -> KubeRayStandIn:
        """List and watch (returns once both caches are filled), then reconcile."""
        self.rayjobs.start()
        self.rayclusters.start()
        for informer in (self.rayjobs, self.rayclusters):
            if not informer.synced.wait(timeout):
                self.stop()
                raise RuntimeError(f"the KubeRay stand-in could not list {informer.plural}")
        for worker in self._workers:
            worker.start()
        if self.jobs_api is not None:
            self.jobs_api.start()
        return self

    def record_pods(self) -> PodLifetimes:
        """Start (once) recording every pod's life, GPUs included, as the API server shows it: what tests sum the
        GPU-seconds held after a moment with (`PodLifetimes.gpu_seconds_after`)."""
        with self._lock:
            if self.pod_lifetimes is None:
                self.pod_lifetimes = PodLifetimes(self.api.custom.api_client, self.namespace).start()
            return self.pod_lifetimes

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching and reconciling, and stop every run it started."""
        if self.jobs_api is not None:
            self.jobs_api.stop()
        if self.pod_lifetimes is not None:
            self.pod_lifetimes.stop(timeout)
        self.rayjobs.stop(timeout)
        self.rayclusters.stop(timeout)
        self.queue.close()
        for worker in self._workers:
            if worker.is_alive():
                worker.join(timeout)
        with self._lock:
            runs, self._runs = list(self._runs.values()), {}
        for _, handle in runs:
            handle.stop()

    def __enter__(self) -> KubeRayStandIn:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _job_by_id(self, job_id: str) -> tuple[RunHandle, str] | None:
        """The run whose RayJob's status.jobId is `job_id` (submission ids are unique) and that RayJob's jobStatus."""
        rayjob = self.rayjobs.find(lambda o: (o.get("status") or {}).get("jobId") == job_id)
        if rayjob is None:
            return None
        status = rayjob.get("status") or {}
        key = (rayjob["metadata"]["namespace"], rayjob["metadata"]["name"])
        with self._lock:
            current = self._runs.get(key)
        if current is None:
            return None
        return _LookAgainAfterStop(current[1], lambda key=key: self.queue.add(key)), str(status.get("jobStatus") or "")

    # ---- events into the queue (SetupWithManager: For RayJob, Owns RayCluster)

    def _on_rayjob(self, rayjob: Obj) -> None:
        self.queue.add((rayjob["metadata"]["namespace"], rayjob["metadata"]["name"]))

    def _on_raycluster(self, cluster: Obj) -> None:
        self.queue.add((cluster["metadata"]["namespace"], cluster["metadata"]["name"], RAYCLUSTER_KEY))
        for ref in cluster["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == constants.RAYJOB_KIND and ref.get("controller"):
                self.queue.add((cluster["metadata"]["namespace"], ref["name"]))

    def _on_raycluster_gone(self, cluster: Obj) -> None:
        """The cluster object is gone, so are its pods (ownerReference GC): the run on it ends."""
        uid = cluster["metadata"].get("uid")
        with self._lock:
            self._gone.add(uid)
            gone = [key for key, (cluster_uid, _) in self._runs.items() if cluster_uid == uid]
            handles = [self._runs.pop(key)[1] for key in gone]
        for handle in handles:
            handle.stop()

    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            assert isinstance(key, tuple)
            try:
                delay = self.reconcile_cluster(key[:2]) if key[2:] == (RAYCLUSTER_KEY,) else self.reconcile(key)
                self._failures.pop(key, None)
            except Exception as e:
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                delay = min(0.05 * 2**failures, 2.0)
                expected = isinstance(e, self.api.ApiException) and e.status in (404, 409)
                logger.log(
                    logging.DEBUG if expected else logging.WARNING,
                    "reconcile %s/%s failed (%r); retrying in %.2fs",
                    *key[:2],
                    e,
                    delay,
                )
            finally:
                if key in self._reading:
                    self.reconciled[key] = self._reading.pop(key)
                self.queue.done(key)
            if delay is not None:
                self.queue.add_after(key, delay)

    # ---- the RayCluster controller's share that runs whatever its RayJob's state (raycluster_controller.go)

    def reconcile_cluster(self, key: Key) -> float | None:
        """rayClusterReconcile for worker groups with `suspend: true`. A cluster being deleted is not reconciled
        ("RayCluster is being deleted, just ignore"). utils/validation.go ValidateRayClusterSpec refuses a suspended
        group unless the RayJobDeletionPolicy feature gate is on (features.go: on by default in v1.7.0) and refuses
        it with the in-tree autoscaler on; an invalid spec is a Warning Event and no reconcile at all. Then
        reconcilePods deletes every pod of a suspended group (deleteAllPods, `DeletedWorkerPod`) and skips it."""
        cluster = self.rayclusters.get(*key)
        if cluster is None or cluster["metadata"].get("deletionTimestamp"):
            return None
        spec = cluster.get("spec") or {}
        suspended = [str(g.get("groupName")) for g in spec.get("workerGroupSpecs") or [] if g.get("suspend") is True]
        if not suspended:
            return None
        error = ""
        if not self.deletion_policy_gate:
            error = f"worker group {suspended[0]} can be suspended only when the RayJobDeletionPolicy feature gate is enabled"
        elif spec.get("enableInTreeAutoscaling"):
            error = f"worker group {suspended[0]} cannot be suspended with Autoscaler enabled"
        if error:
            message = f"The RayCluster spec is invalid {key[0]}/{key[1]}: {error}"
            self.api.event(
                cluster, "Warning", "InvalidRayClusterSpec", message, RAYCLUSTER_CONTROLLER, action="Validate"
            )
            return None
        for group in suspended:
            if self.pods.delete_group(cluster, group):
                message = f"Deleted all pods for suspended worker group {group} in RayCluster {key[0]}/{key[1]}"
                self.api.event(cluster, "Normal", "DeletedWorkerPod", message, RAYCLUSTER_CONTROLLER, action="Delete")
        return None

    # ---- the RayJob state machine (rayjob_controller.go Reconcile)

    def reconcile(self, key: Key) -> float | None:
        """One reconcile of one RayJob; returns when to look again (None: on the next change only)."""
        rayjob = self.rayjobs.get(*key)
        if rayjob is None:
            return None  # "RayJob resource not found": its cluster goes by ownerReference GC, the run with it
        self._reading[key] = resource_version(rayjob)
        meta, spec = rayjob["metadata"], rayjob.get("spec") or {}
        if spec.get("managedBy") not in (None, "", KUBERAY_MANAGED_BY):
            return None  # ManagedByExternalController: "Skipping RayJob managed by a custom controller"
        if meta.get("deletionTimestamp"):
            return self._on_deleting(key, rayjob)
        original = rayjob.get("status") or {}
        step = _Step(copy.deepcopy(original))
        problem = validate_rayjob(rayjob)
        if problem is not None:
            reason, error = problem
            self.api.event(rayjob, "Warning", reason, f"{meta['namespace']}/{meta['name']}: {error}", action="Validate")
            step.status.update(
                jobDeploymentStatus=Deployment.VALIDATION_FAILED.value, reason=VALIDATION_FAILED, message=error
            )
            self._write_status(rayjob, original, step)
            return None
        deployment = original.get("jobDeploymentStatus", "")
        if deployment == Deployment.NEW.value:
            with_finalizer = self._ensure_finalizer(rayjob)
            if with_finalizer is None:
                return 0.05  # a conflict: look again at the fresh object
            rayjob = with_finalizer
            self._init_status(rayjob, step)
            proceed = True
        elif deployment == Deployment.INITIALIZING.value:
            proceed = self._initializing(key, rayjob, step)
        elif deployment == "Waiting":
            proceed = self._waiting(rayjob, step)
        elif deployment == Deployment.RUNNING.value:
            proceed = self._running(key, rayjob, step)
        elif deployment in (Deployment.SUSPENDING.value, Deployment.RETRYING.value):
            proceed = self._release(key, rayjob, step)
        elif deployment == Deployment.SUSPENDED.value:
            if spec.get("suspend"):
                return None  # "The RayJob is already suspended, we should not requeue it."
            step.status.update(jobStatus=JobStatus.NEW.value, jobDeploymentStatus=Deployment.NEW.value)
            proceed = True
        elif deployment in (Deployment.COMPLETE.value, Deployment.FAILED.value):
            return self._finished(rayjob)  # returns before checkBackoffLimit: the counters move only on transitions
        else:
            return self.poll_interval  # "Unknown JobDeploymentStatus" (ValidationFailed after a fix lands here)
        if not proceed:
            return step.requeue_after
        _attempt_counts(step.status, spec)
        self._write_status(rayjob, original, step)
        return step.requeue_after if step.requeue_after is not None else self.poll_interval

    def _on_deleting(self, key: Key, rayjob: Obj) -> float | None:
        """The deletion branch: StopJob when jobStatus is not terminal, then drop ray.io/rayjob-finalizer, whatever
        other finalizers remain; no wait for anything. The cluster stays until the RayJob is gone (background GC)."""
        if (rayjob.get("status") or {}).get("jobStatus", "") not in TERMINAL_JOB:
            with self._lock:
                current = self._runs.get(key)
            if current is not None:
                current[1].stop()
        finalizers = rayjob["metadata"].get("finalizers") or []
        if RAYJOB_FINALIZER in finalizers:
            remaining = [f for f in finalizers if f != RAYJOB_FINALIZER]
            self._remember_rayjob(
                self.api.patch(
                    constants.RAYJOB_PLURAL, rayjob, {"metadata": {"finalizers": remaining or None}}, guarded=True
                )
            )
        return None

    def _ensure_finalizer(self, rayjob: Obj) -> Obj | None:
        """The New branch adds KubeRay's stop-job finalizer; returns the RayJob as it now is (None on a conflict)."""
        finalizers = rayjob["metadata"].get("finalizers") or []
        if RAYJOB_FINALIZER in finalizers:
            return rayjob
        try:
            patched = self.api.patch(
                constants.RAYJOB_PLURAL,
                rayjob,
                {"metadata": {"finalizers": [*finalizers, RAYJOB_FINALIZER]}},
                guarded=True,
            )
        except self.api.ApiException as e:
            if e.status == 409:
                return None
            raise
        return self._remember_rayjob(patched)

    def _init_status(self, rayjob: Obj, step: _Step) -> None:
        """initRayJobStatusIfNeed: a job id, a new cluster name and startTime (once per attempt), then Initializing."""
        name, spec, status = rayjob["metadata"]["name"], rayjob.get("spec") or {}, step.status
        if not (not status.get("jobId") or not status.get("rayClusterName") or not status.get("jobStatus")):
            return
        if submission_mode(spec) != "InteractiveMode" and not status.get("jobId"):
            status["jobId"] = spec.get("jobId") or f"{name}-{random_suffix()}"
        if not status.get("rayClusterName"):
            selector = spec.get("clusterSelector") or {}
            status["rayClusterName"] = selector.get(LABEL_CLUSTER) or f"{name}-{random_suffix()}"
        status["jobStatus"] = status.get("jobStatus") or JobStatus.NEW.value
        status["jobDeploymentStatus"] = Deployment.INITIALIZING.value
        status["startTime"] = now_rfc3339()

    @staticmethod
    def _to_suspending(spec: Mapping[str, Any], status: Obj) -> bool:
        """updateStatusToSuspendingIfNeeded: only Running and Initializing may go to Suspending."""
        if spec.get("suspend") and status.get("jobDeploymentStatus") in (
            Deployment.RUNNING.value,
            Deployment.INITIALIZING.value,
        ):
            status["jobDeploymentStatus"] = Deployment.SUSPENDING.value
            return True
        return False

    @staticmethod
    def _deadline_passed(rayjob: Obj, step: _Step, field_name: str, reason: str) -> bool:
        """checkActiveDeadlineAndUpdateStatusIfNeeded / checkPreRunningDeadlineAndUpdateStatusIfNeeded: Failed with
        `reason` once `field_name` seconds have passed since status.startTime (this attempt's). Nothing is stopped."""
        seconds = (rayjob.get("spec") or {}).get(field_name)
        start_text = step.status.get("startTime")
        if seconds is None or not start_text:
            return False
        remaining = _parse_time(start_text) + int(seconds) - time.time()
        if remaining > 0:
            step.wake_in(remaining + 0.01)
            return False
        start = parse_rfc3339(start_text).strftime("%Y-%m-%d %H:%M:%S +0000 UTC")
        label = field_name[0].upper() + field_name[1:]
        step.status.update(
            jobDeploymentStatus=Deployment.FAILED.value,
            reason=reason,
            message=f"The RayJob has passed the {field_name}. StartTime: {start}. {label}: {seconds}",
        )
        return True

    def _initializing(self, key: Key, rayjob: Obj, step: _Step) -> bool:
        spec, status = rayjob.get("spec") or {}, step.status
        if self._to_suspending(spec, status):
            return True
        if self._deadline_passed(rayjob, step, "activeDeadlineSeconds", DEADLINE_EXCEEDED):
            return True
        if self._deadline_passed(rayjob, step, "preRunningDeadlineSeconds", PRE_RUNNING_DEADLINE_EXCEEDED):
            return True
        cluster = self._get_or_create_cluster(rayjob, step)
        if cluster is None:
            step.wake_in(self.poll_interval)
            return False
        if not status.get("dashboardURL"):
            cluster = self._reconcile_cluster(key, rayjob, cluster, step)
            if (cluster.get("status") or {}).get("state") != "ready":
                status["rayClusterStatus"] = cluster.get("status") or {}
                return True
            url = self._head_service_url(cluster)
            if url is None:  # FetchHeadServiceURL failed: the reconcile is retried
                step.wake_in(self.poll_interval)
                return True
            status["dashboardURL"] = url
        mode = submission_mode(spec)
        if mode == "InteractiveMode":
            status["jobDeploymentStatus"] = "Waiting"
            return True
        if mode == "K8sJobMode":
            self._ensure_submitter({**rayjob, "status": status}, cluster)
        status["jobDeploymentStatus"] = Deployment.RUNNING.value
        step.wake_in(0)
        return True

    def _waiting(self, rayjob: Obj, step: _Step) -> bool:
        """InteractiveMode: wait for spec.jobId (the pre-running deadline still applies)."""
        if self._deadline_passed(rayjob, step, "preRunningDeadlineSeconds", PRE_RUNNING_DEADLINE_EXCEEDED):
            return True
        job_id = (rayjob.get("spec") or {}).get("jobId")
        if not job_id:
            step.wake_in(self.poll_interval)
            return False
        step.status.update(jobId=job_id, jobDeploymentStatus=Deployment.RUNNING.value)
        return True

    def _running(self, key: Key, rayjob: Obj, step: _Step) -> bool:
        spec, status = rayjob.get("spec") or {}, step.status
        if self._to_suspending(spec, status):
            return True
        if self._deadline_passed(rayjob, step, "activeDeadlineSeconds", DEADLINE_EXCEEDED):
            return True  # the Ray job keeps running (KR#2314): only a cluster deletion or a RayJob deletion ends it
        cluster = self._get_or_create_cluster(rayjob, step)  # a cluster gone under a Running RayJob is recreated
        if cluster is None:
            step.wake_in(self.poll_interval)
            return False
        mode = submission_mode(spec)
        submitter: Obj | None = None
        if mode == "K8sJobMode":
            submitter = self._get_submitter(rayjob)
            if submitter is None:
                step.wake_in(self.poll_interval)  # checkSubmitterAndUpdateStatusIfNeeded: Get failed, requeue
                return False
            failed = _job_condition(submitter, "Failed")
            if failed is not None:
                status["jobDeploymentStatus"] = Deployment.FAILED.value
                if status.get("jobStatus") == JobStatus.FAILED.value:
                    status["reason"] = APP_FAILED
                else:
                    status["reason"] = SUBMISSION_FAILED
                    status["message"] = (
                        f"Job submission has failed. Reason: {failed.get('reason', '')}. "
                        f"Message: {failed.get('message', '')}"
                    )
                return True
        run = self._run_for(key, rayjob, cluster)
        poll = run.poll()
        phase = poll.phase
        if phase is RunPhase.STARTING and _ready_before_demand(cluster, poll.pending_pods):
            # The driver runs on the head (Ray job RUNNING); the workers its trials ask for stay Pending
            cluster = self._autoscaler_demand(cluster, poll.pending_pods)
            phase = RunPhase.RUNNING
        elif phase is RunPhase.STARTING:
            # GetJobInfo: the Ray job is not on the cluster yet (not submitted, or the cluster is new): requeue
            step.wake_in(self.poll_interval if poll.recheck_after is None else poll.recheck_after)
            return False
        job_status = {
            RunPhase.PENDING: JobStatus.PENDING,
            RunPhase.RUNNING: JobStatus.RUNNING,
            RunPhase.SUCCEEDED: JobStatus.SUCCEEDED,
            RunPhase.FAILED: JobStatus.FAILED,
            RunPhase.STOPPED: JobStatus.STOPPED,
        }[phase].value
        terminal = job_status in TERMINAL_JOB
        finished_at = None
        if submitter is not None:
            # `ray job logs --follow` returns once the job ends, whatever its status: the submitter Job completes
            done = _job_condition(submitter, "Complete")
            finished_at = (
                self._finish_submitter(submitter) if terminal else done and str(done.get("lastTransitionTime"))
            )
        if terminal and (submitter is None or finished_at is not None):
            failed = job_status == JobStatus.FAILED.value  # STOPPED is Complete, as SUCCEEDED
            status["jobDeploymentStatus"] = (Deployment.FAILED if failed else Deployment.COMPLETE).value
            status["reason"] = APP_FAILED if failed else ""
        else:
            status["jobDeploymentStatus"] = Deployment.RUNNING.value
            status["reason"] = ""
        info = dict(status.get("rayJobInfo") or {})
        info.setdefault("startTime", now_rfc3339())
        if terminal:
            info.setdefault("endTime", now_rfc3339())
        status.update(
            rayClusterStatus=cluster.get("status") or {}, jobStatus=job_status, message=poll.message, rayJobInfo=info
        )
        status.pop("jobStatusCheckFailureStartTime", None)
        step.wake_in(self.poll_interval if poll.recheck_after is None else poll.recheck_after)
        return True

    def _release(self, key: Key, rayjob: Obj, step: _Step) -> bool:
        """Suspending / Retrying: delete the cluster and the submitter Job, wait until both are really gone (a
        finalizer on the cluster holds this branch), then reset the attempt's fields; Suspended, or New for a retry.
        startTime, endTime and the counters stay. The job is not stopped first (pods go with the cluster)."""
        cluster_gone = self._delete_cluster(rayjob, step.status.get("rayClusterName", ""))
        job_gone = self._delete_submitter(rayjob)
        if not (cluster_gone and job_gone):
            step.wake_in(self.poll_interval)
            return False
        self._stop_run(key)
        status = step.status
        for reset in (
            "rayClusterName",
            "dashboardURL",
            "jobId",
            "message",
            "reason",
            "rayJobInfo",
            "jobStatusCheckFailureStartTime",
        ):
            status.pop(reset, None)
        status["rayClusterStatus"] = {}
        status["jobStatus"] = JobStatus.NEW.value
        suspending = status.get("jobDeploymentStatus") == Deployment.SUSPENDING.value
        status["jobDeploymentStatus"] = (Deployment.SUSPENDED if suspending else Deployment.NEW).value
        step.wake_in(0)
        return True

    def _finished(self, rayjob: Obj) -> float | None:
        """Complete / Failed: deletionStrategy (rules or legacy) if set, else shutdownAfterJobFinishes; no status
        write. Returns when to look again."""
        spec = rayjob.get("spec") or {}
        if spec.get("clusterSelector"):
            return None  # "using an existing RayCluster via clusterSelector; skipping resource deletion"
        strategy = spec.get("deletionStrategy")
        if strategy is not None:
            if strategy.get("deletionRules"):
                return self._deletion_rules(rayjob, strategy["deletionRules"])
            return self._legacy_deletion(rayjob, strategy)
        if spec.get("shutdownAfterJobFinishes"):
            return self._shutdown_after_job_finishes(rayjob)
        return None

    def _end_time(self, rayjob: Obj) -> float:
        return _parse_time((rayjob.get("status") or {}).get("endTime")) or time.time()

    def _shutdown_after_job_finishes(self, rayjob: Obj) -> float | None:
        """handleShutdownAfterJobFinishes: ttlSecondsAfterFinished after status.endTime, delete the RayCluster once
        (the RayJob stays, Complete/Failed; with DELETE_RAYJOB_CR_AFTER_JOB_FINISHES=true the RayJob is deleted
        instead); no requeue after the delete (a held cluster is looked at again only on its own changes)."""
        ttl = int((rayjob.get("spec") or {}).get("ttlSecondsAfterFinished") or 0)
        remaining = self._end_time(rayjob) + ttl - time.time()
        if remaining > 0:
            return remaining + 0.01
        if self.delete_rayjob_after_job_finishes:
            self._delete_rayjob(rayjob)
        else:
            self._delete_cluster(rayjob, (rayjob.get("status") or {}).get("rayClusterName", ""))
        return None

    def _legacy_deletion(self, rayjob: Obj, strategy: Mapping[str, Any]) -> float | None:
        """handleLegacyDeletionPolicy: onSuccess / onFailure by jobStatus, after the global ttlSecondsAfterFinished."""
        job_status = (rayjob.get("status") or {}).get("jobStatus", "")
        side = {"SUCCEEDED": "onSuccess", "FAILED": "onFailure"}.get(job_status)
        if side is None:
            return None
        policy = (strategy.get(side) or {}).get("policy", "DeleteNone")
        if policy == "DeleteNone":
            return None
        ttl = int((rayjob.get("spec") or {}).get("ttlSecondsAfterFinished") or 0)
        remaining = self._end_time(rayjob) + ttl - time.time()
        if remaining > 0:
            return remaining + 0.01
        self._execute_deletion_policy(rayjob, policy)
        return None

    def _deletion_rules(self, rayjob: Obj, rules: list[Mapping[str, Any]]) -> float | None:
        """handleDeletionRules: of the matching rules whose ttlSeconds (from status.endTime) has passed and whose
        action is not done yet, execute the most destructive one; look again at the next pending rule."""
        status, now = rayjob.get("status") or {}, time.time()
        overdue: list[str] = []
        next_due: float | None = None
        for rule in rules:
            condition = rule.get("condition") or {}
            if "jobStatus" in condition:
                matched = condition["jobStatus"] == status.get("jobStatus", "")
            else:
                matched = condition.get("jobDeploymentStatus") == status.get("jobDeploymentStatus", "")
            if not matched:
                continue
            due = self._end_time(rayjob) + int(condition.get("ttlSeconds") or 0)
            if now < due:
                next_due = due if next_due is None else min(next_due, due)
                continue
            if not self._deletion_done(rayjob, rule.get("policy", "")):
                overdue.append(rule.get("policy", ""))
        if overdue:
            order = {"DeleteSelf": 4, "DeleteCluster": 3, "DeleteWorkers": 2, "DeleteNone": 1}
            self._execute_deletion_policy(rayjob, max(overdue, key=lambda p: order.get(p, 0)))
        return None if next_due is None else next_due - now + 0.01

    def _deletion_done(self, rayjob: Obj, policy: str) -> bool:
        """isDeletionActionCompleted."""
        if policy == "DeleteNone":
            return True
        if policy == "DeleteSelf":
            return False
        cluster = self.api.get(
            constants.RAYCLUSTER_PLURAL,
            rayjob["metadata"]["namespace"],
            (rayjob.get("status") or {}).get("rayClusterName", ""),
        )
        if cluster is None or cluster["metadata"].get("deletionTimestamp"):
            return True
        if policy == "DeleteWorkers":
            return all((g.get("suspend") is True) for g in (cluster.get("spec") or {}).get("workerGroupSpecs") or [])
        return False

    def _execute_deletion_policy(self, rayjob: Obj, policy: str) -> None:
        if policy == "DeleteCluster":
            self._delete_cluster(rayjob, (rayjob.get("status") or {}).get("rayClusterName", ""))
        elif policy == "DeleteWorkers":
            self._suspend_worker_groups(rayjob)
        elif policy == "DeleteSelf":
            self._delete_rayjob(rayjob)

    def _suspend_worker_groups(self, rayjob: Obj) -> None:
        """suspendWorkerGroups: every workerGroupSpecs[].suspend = true; the RayCluster controller then deletes the
        worker pods (unless the cluster is being deleted: then nothing reconciles it)."""
        namespace, name = rayjob["metadata"]["namespace"], (rayjob.get("status") or {}).get("rayClusterName", "")
        cluster = self.api.get(constants.RAYCLUSTER_PLURAL, namespace, name)
        if cluster is None:
            raise self.api.ApiException(status=404, reason=f"RayCluster {namespace}/{name} not found")
        groups = [{**g, "suspend": True} for g in (cluster.get("spec") or {}).get("workerGroupSpecs") or []]
        updated = self.api.patch(
            constants.RAYCLUSTER_PLURAL, cluster, {"spec": {"workerGroupSpecs": groups}}, guarded=True
        )
        self.rayclusters.remember(updated)
        self.api.event(
            rayjob,
            "Normal",
            "UpdatedRayCluster",
            f"Set the `suspend` field to true for all worker groups in cluster {namespace}/{name}",
            action="Update",
        )
        self.queue.add((namespace, name, RAYCLUSTER_KEY))  # the RayCluster controller deletes the pods (if valid)

    def _delete_rayjob(self, rayjob: Obj) -> None:
        meta = rayjob["metadata"]
        try:
            self.api.delete(constants.RAYJOB_PLURAL, meta["namespace"], meta["name"])
        except self.api.ApiException as e:
            if e.status != 404:
                raise

    # ---- the RayCluster

    def _get_or_create_cluster(self, rayjob: Obj, step: _Step) -> Obj | None:
        """getOrCreateRayClusterInstance: the cluster named in status.rayClusterName, created from the RayJob if
        missing (also under a Running RayJob, under the same name); with clusterSelector it must exist."""
        namespace, name = rayjob["metadata"]["namespace"], step.status.get("rayClusterName", "")
        cluster = self.rayclusters.get(namespace, name)
        if cluster is not None:
            return cluster
        if (rayjob.get("spec") or {}).get("clusterSelector"):
            cluster = self.api.get(constants.RAYCLUSTER_PLURAL, namespace, name)
            if cluster is None:
                self.api.event(
                    rayjob,
                    "Warning",
                    "RayClusterNotFound",
                    f"RayCluster {namespace}/{name} set in the clusterSelector is not found. It must be "
                    "created manually",
                    action="Validate",
                )
            return cluster
        try:
            cluster = self.api.create(constants.RAYCLUSTER_PLURAL, namespace, cluster_for(rayjob, name))
        except self.api.ApiException as e:
            if e.status != 409:
                self.api.event(
                    rayjob,
                    "Warning",
                    "FailedToCreateRayCluster",
                    f"Failed to create RayCluster {namespace}/{name}: {e.reason}",
                    action="Create",
                )
                raise
            cluster = self.api.get(constants.RAYCLUSTER_PLURAL, namespace, name)
        else:
            self.api.event(
                rayjob, "Normal", "CreatedRayCluster", f"Created RayCluster {namespace}/{name}", action="Create"
            )
        if cluster is not None:
            self.rayclusters.remember(cluster)
        return cluster

    def _reconcile_cluster(self, key: Key, rayjob: Obj, cluster: Obj, step: _Step) -> Obj:
        """raycluster_controller.go's share: pods and status as the run reports the cluster's start. A cluster with
        a deletionTimestamp is not reconciled ("RayCluster is being deleted, just ignore"): nothing changes."""
        run = self._run_for(key, rayjob, cluster)
        if cluster["metadata"].get("deletionTimestamp") or run is _NO_RUN:
            step.wake_in(self.poll_interval)
            return cluster
        self._ensure_head_service(cluster)
        poll = run.poll()
        if poll.phase is RunPhase.STARTING and _ready_before_demand(cluster, poll.pending_pods):
            # calculateStatus: pods == desired workers (0) + head, all running -> ready; the workers the job needs
            # come later, from the autoscaler, and are stuck then (see _running)
            if (cluster.get("status") or {}).get("state") != "ready":
                cluster = self._set_cluster_status(cluster, ready_cluster_status(cluster))
            return cluster
        if poll.phase is RunPhase.STARTING:
            if poll.pending_pods is not None:
                stuck = self.pods.stuck(cluster, poll.pending_pods)
                if stuck is not None:
                    cluster = self._set_cluster_status(cluster, stuck)
            elif self.emulate_pods:
                self.pods.starting(cluster)
            step.wake_in(self.poll_interval if poll.recheck_after is None else poll.recheck_after)
            return cluster
        if self.emulate_pods:
            self.pods.ready(cluster)
        if (cluster.get("status") or {}).get("state") != "ready":
            cluster = self._set_cluster_status(cluster, ready_cluster_status(cluster))
        return cluster

    def _ensure_head_service(self, cluster: Obj) -> Obj | None:
        """reconcileHeadService: the head Service created (with an Event) when none exists; a Service found is left
        as it is (whatever a tenant made of it). The Service, None when it was seen before."""
        meta = cluster["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/services"
        name = head_service_name(cluster)
        with self._lock:
            if meta.get("uid") in self._head_services:  # seen: no GET on every poll (KubeRay lists from its cache)
                return None
        try:
            found = self.api.core("GET", f"{path}/{name}")
        except self.api.ApiException as e:
            if e.status != 404:
                raise
        else:
            with self._lock:
                self._head_services.add(meta["uid"])
            return found
        try:
            service = self.api.core("POST", path, head_service_body(cluster))
        except self.api.ApiException as e:
            if e.status != 409:
                self.api.event(
                    cluster,
                    "Warning",
                    "FailedToCreateService",
                    f"Failed creating service {meta['namespace']}/{name}, {e.reason}",
                    component=RAYCLUSTER_CONTROLLER,
                    action="Create",
                )
                raise
            return self.api.core("GET", f"{path}/{name}")
        self.api.event(
            cluster,
            "Normal",
            "CreatedService",
            f"Created service {meta['namespace']}/{name}",
            component=RAYCLUSTER_CONTROLLER,
            action="Create",
        )
        with self._lock:
            self._head_services.add(meta["uid"])
        return service

    def _head_service_url(self, cluster: Obj) -> str | None:
        """FetchHeadServiceURL, on the Service as it is now; with `dashboard`, its name reaches the Jobs API."""
        meta = cluster["metadata"]
        try:
            service = self.api.core(
                "GET", f"/api/v1/namespaces/{meta['namespace']}/services/{head_service_name(cluster)}"
            )
        except self.api.ApiException as e:
            if e.status != 404:
                raise
            return None
        url = head_service_url(service)
        if url is not None and self.jobs_api is not None:
            self.jobs_api.serve(url)
        return url

    def _autoscaler_demand(self, cluster: Obj, pending: PendingPods | None) -> Obj:
        """The autoscaler asks for workers that do not start: pending pods and their Events; the cluster stays
        `ready` (calculateStatus never takes it back) and RayClusterProvisioned stays True (set once)."""
        if pending is None or cluster["metadata"].get("deletionTimestamp"):
            return cluster
        stuck = self.pods.stuck(cluster, pending)
        if stuck is None:
            return cluster
        status = dict(cluster.get("status") or {})
        status.update(
            desiredWorkerReplicas=stuck["desiredWorkerReplicas"], availableWorkerReplicas=0, readyWorkerReplicas=0
        )
        failures = [c for c in stuck["conditions"] if c["type"] == "ReplicaFailure"]
        status["conditions"] = [c for c in status.get("conditions") or [] if c["type"] != "ReplicaFailure"] + failures
        return self._set_cluster_status(cluster, status)

    def _set_cluster_status(self, cluster: Obj, status: Obj) -> Obj:
        patched = self.api.patch(constants.RAYCLUSTER_PLURAL, cluster, {"status": status}, status=True)
        self.rayclusters.remember(patched)
        return patched

    def _delete_cluster(self, rayjob: Obj, name: str) -> bool:
        """deleteClusterResources: delete once (a real delete: finalizers hold it); True once it is gone."""
        namespace = rayjob["metadata"]["namespace"]
        cluster = self.api.get(constants.RAYCLUSTER_PLURAL, namespace, name) if name else None
        if cluster is None:
            return True
        if cluster["metadata"].get("deletionTimestamp"):
            return False  # "The deletion of the associated RayCluster for RayJob is ongoing."
        try:
            self.api.delete(constants.RAYCLUSTER_PLURAL, namespace, name)
        except self.api.ApiException as e:
            if e.status == 404:
                return True
            self.api.event(
                rayjob,
                "Warning",
                "FailedToDeleteRayCluster",
                f"Failed to delete cluster {namespace}/{name}: {e.reason}",
                action="Delete",
            )
            raise
        self.api.event(rayjob, "Normal", "DeletedRayCluster", f"Deleted cluster {namespace}/{name}", action="Delete")
        return False  # gone only when the API says so (the next reconcile looks again)

    # ---- the submitter Job (K8sJobMode)

    def _job_path(self, rayjob: Obj) -> str:
        meta = rayjob["metadata"]
        return f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs/{meta['name']}"

    def _get_submitter(self, rayjob: Obj) -> Obj | None:
        try:
            return self.api.core("GET", self._job_path(rayjob))
        except self.api.ApiException as e:
            if e.status == 404:
                return None
            raise

    def _ensure_submitter(self, rayjob: Obj, cluster: Obj) -> None:
        """createK8sJobIfNeed: create the submitter Job unless one of that name exists. Under `emulate_pods` the
        Job controller's pod follows, its log the driver's output."""
        meta = rayjob["metadata"]
        existing = self._get_submitter(rayjob)
        if existing is not None:
            self._start_submitter_pod(existing, (meta["namespace"], meta["name"]))
            return
        try:
            created = self.api.core(
                "POST", f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs", submitter_job_for(rayjob, cluster)
            )
        except self.api.ApiException as e:
            if e.status == 409:
                return
            self.api.event(
                rayjob,
                "Warning",
                "FailedToCreateRayJobSubmitter",
                f"Failed to create new Kubernetes Job {meta['namespace']}/{meta['name']}: {e.reason}",
                action="Create",
            )
            raise
        self.api.event(
            rayjob,
            "Normal",
            "CreatedRayJobSubmitter",
            f"Created Kubernetes Job {meta['namespace']}/{meta['name']}",
            action="Create",
        )
        self._start_submitter_pod(created, (meta["namespace"], meta["name"]))

    def _start_submitter_pod(self, job: Obj, key: Key) -> None:
        if not self._submitter_pod_once(job, "start"):
            return
        try:
            self.submitter_pods.start(job, lambda: self._driver_log(key))
        except BaseException:
            with self._lock:  # the next reconcile tries again
                self._submitter_pods.discard((str(job["metadata"].get("uid")), "start"))
            raise

    def _finish_submitter(self, job: Obj) -> str:
        """What the Job controller records when the submitter pod exits 0; returns the Complete condition's time."""
        if self._submitter_pod_once(job, "succeed"):
            self.submitter_pods.succeed(job)
        done = _job_condition(job, "Complete")
        if done is not None:
            return str(done.get("lastTransitionTime", ""))
        now = now_rfc3339()
        meta = job["metadata"]
        status = {
            "succeeded": 1,
            "startTime": (job.get("status") or {}).get("startTime") or now,
            "completionTime": now,
            "conditions": [
                _condition(
                    "SuccessCriteriaMet", True, "CompletionsReached", "Reached expected number of succeeded pods"
                ),
                _condition("Complete", True, "CompletionsReached", "Reached expected number of succeeded pods"),
            ],
        }
        self.cluster_api.core(
            "PATCH",
            f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs/{meta['name']}/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )
        return now

    def _delete_submitter(self, rayjob: Obj) -> bool:
        """deleteSubmitterJob: HTTPMode and SidecarMode have none; else delete it (Background) and wait until gone."""
        if submission_mode(rayjob.get("spec") or {}) in ("HTTPMode", "SidecarMode"):
            return True
        job = self._get_submitter(rayjob)
        if job is None:
            return True
        if job["metadata"].get("deletionTimestamp"):
            return False
        meta = rayjob["metadata"]
        try:
            self.api.core("DELETE", self._job_path(rayjob), {"propagationPolicy": "Background"})
        except self.api.ApiException as e:
            if e.status == 404:
                return True
            self.api.event(
                rayjob,
                "Warning",
                "FailedToDeleteRayJobSubmitter",
                f"Failed to delete submitter K8s Job {meta['namespace']}/{meta['name']}: {e.reason}",
                action="Delete",
            )
            raise
        self.api.event(
            rayjob,
            "Normal",
            "DeletedRayJobSubmitter",
            f"Deleted submitter K8s Job {meta['namespace']}/{meta['name']}",
            action="Delete",
        )
        return False

    # ---- runs

    def _run_for(self, key: Key, rayjob: Obj, cluster: Obj) -> RunHandle:
        """The run on this cluster object (by uid): a cluster recreated under the same name gets a new run, as the
        submitter resubmits the job to it."""
        cluster_uid = cluster["metadata"].get("uid", cluster["metadata"]["name"])
        with self._lock:
            current = self._runs.get(key)
            gone = cluster_uid in self._gone
        if current is not None and current[0] == cluster_uid:
            return current[1]
        if gone:
            return _NO_RUN  # the cache still had a cluster that is gone: no pods, no job; the next reconcile recreates
        if current is not None:
            current[1].stop()
        handle = self.runner.start(rayjob, cluster["metadata"]["name"])
        with self._lock:
            self._runs[key] = (cluster_uid, handle)
            self._driver_runs[key] = handle
        return handle

    def _driver_log(self, key: Key) -> bytes:
        """The output of the RayJob's latest run (empty before it starts): the submitter pod's log."""
        with self._lock:
            handle = self._driver_runs.get(key)
        read = getattr(handle, "driver_log", None)  # a test's own runner may not keep its output
        return read() if read is not None else b""

    def _submitter_pod_once(self, job: Obj, step: str) -> bool:
        mark = (str(job["metadata"].get("uid")), step)
        with self._lock:
            if not self.emulate_pods or mark in self._submitter_pods:
                return False
            self._submitter_pods.add(mark)
        return True

    def _stop_run(self, key: Key) -> None:
        with self._lock:
            current = self._runs.pop(key, None)
        if current is not None:
            current[1].stop()

    # ---- writes

    def _remember_rayjob(self, rayjob: Obj) -> Obj:
        self.rayjobs.remember(rayjob)
        return rayjob

    def _write_status(self, rayjob: Obj, original: Obj, step: _Step) -> None:
        """updateRayJobStatus: a write only when jobStatus, jobDeploymentStatus, the RayCluster status (as
        InconsistentRayClusterStatus compares it) or jobStatusCheckFailureStartTime changed; endTime is set when the
        new jobDeploymentStatus is Complete or Failed. Empty strings are left out, as Go's omitempty does."""
        status = _omit_empty(step.status)
        before = _omit_empty(original)
        changed = (
            any(status.get(k, "") != before.get(k, "") for k in ("jobStatus", "jobDeploymentStatus"))
            or _cluster_status_differs(before.get("rayClusterStatus") or {}, status.get("rayClusterStatus") or {})
            or status.get("jobStatusCheckFailureStartTime") != before.get("jobStatusCheckFailureStartTime")
        )
        if not changed:
            return
        if status.get("jobDeploymentStatus") in (Deployment.COMPLETE.value, Deployment.FAILED.value):
            status["endTime"] = now_rfc3339()
        patch = {k: status.get(k) for k in set(status) | set(before) if status.get(k) != before.get(k)}
        self._remember_rayjob(
            self.api.patch(constants.RAYJOB_PLURAL, rayjob, {"status": patch}, status=True, guarded=True)
        )


class _LookAgainAfterStop:
    """A run whose stop also queues its RayJob: KubeRay polls a running job's info on each reconcile, so it sees the
    job end however it was stopped; a scripted run that only ends when stopped would otherwise never be looked at."""

    def __init__(self, run: RunHandle, look_again: Callable[[], None]) -> None:
        self._run, self._look_again = run, look_again

    def poll(self) -> JobPoll:
        return self._run.poll()

    def stop(self) -> None:
        self._run.stop()
        self._look_again()


class _NoRun:
    """The run on a cluster that is already gone: its job is not found (GetJobInfo fails), nothing to stop."""

    def poll(self) -> JobPoll:
        return JobPoll(RunPhase.STARTING)

    def stop(self) -> None:
        return None


_NO_RUN = _NoRun()


def _ready_before_demand(cluster: Obj, pending: PendingPods | None) -> bool:
    """Whether a start that the run reports stuck still makes the cluster `ready` first: no worker is desired yet
    (replicas 0, an autoscaled group at its minimum of 0) and the head pod runs (not an image-pull failure)."""
    if pending is None or pending.reason is PendingReason.IMAGE_PULL:
        return False
    groups = (cluster.get("spec") or {}).get("workerGroupSpecs") or []
    return sum(_worker_count(g) for g in groups) == 0


def _omit_empty(status: Mapping[str, Any]) -> Obj:
    return {k: v for k, v in status.items() if v is not None and v != ""}


_CLUSTER_STATUS_COMPARED = (
    "state",
    "reason",
    "readyWorkerReplicas",
    "availableWorkerReplicas",
    "desiredWorkerReplicas",
    "minWorkerReplicas",
    "maxWorkerReplicas",
    "endpoints",
    "head",
    "conditions",
)


def _cluster_status_differs(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """utils/consistency.go InconsistentRayClusterStatus (lastUpdateTime and observedGeneration do not count)."""
    return any(old.get(k) != new.get(k) for k in _CLUSTER_STATUS_COMPARED)


def _job_condition(job: Mapping[str, Any], type_: str) -> Obj | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            return dict(condition)
    return None
