"""A stand-in for the KubeRay v1.7 operator: RayJob -> RayCluster lifecycle on a Kubernetes API, with pluggable job runners.

Threads, not asyncio: two informer threads (list+watch RayJobs and RayClusters through the kubernetes client into a
cache) feed a keyed work queue drained by a few reconcile workers, like controller-runtime. `stop()` ends them all.
"""

from __future__ import annotations

import copy
import enum
import heapq
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .. import constants
from .emulator import now_rfc3339, parse_rfc3339, random_suffix

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)

logger = logging.getLogger(__name__)

RAYJOB_FINALIZER = "ray.io/rayjob-finalizer"
RAYJOB_CONTROLLER = "rayjob-controller"
RAYCLUSTER_CONTROLLER = "raycluster-controller"
USER_AGENT = "kuberay-standin/1.7.0"
LABEL_CLUSTER = "ray.io/cluster"
LABEL_NODE_TYPE = "ray.io/node-type"
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
DEADLINE_EXCEEDED = "DeadlineExceeded"
PRE_RUNNING_DEADLINE_EXCEEDED = "PreRunningDeadlineExceeded"
APP_FAILED = "AppFailed"
VALIDATION_FAILED = "ValidationFailed"
# KubeRay refuses to retry a RayJob that failed on its deadline; the stand-in treats the pre-running deadline alike.
NOT_RETRIED = {DEADLINE_EXCEEDED, PRE_RUNNING_DEADLINE_EXCEEDED}


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
        """Stop the attempt (suspend, retry, deadline, deletion, stand-in stop); idempotent."""
        ...


class JobRunner(Protocol):
    """The seam for what runs a RayJob's entrypoint. `start` is called once per attempt, when the attempt's
    RayCluster exists (the RayJob is Initializing; attempt = status.failed). The scripted runner follows a script;
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

    @classmethod
    def succeed(cls, after: float = 0.1, *, startup: float = 0.0, submit: float = 0.0) -> Outcome:
        return cls("succeed", after, startup, submit)

    @classmethod
    def fail(cls, after: float = 0.1, message: str = "Job entrypoint command failed with exit code 1",
             *, startup: float = 0.0) -> Outcome:
        return cls("fail", after, startup, 0.0, message)

    @classmethod
    def hang(cls, *, startup: float = 0.0) -> Outcome:
        """RUNNING until stopped (a deadline, a suspend, a deletion)."""
        return cls("hang", math.inf, startup)

    @classmethod
    def pending(cls, reason: PendingReason = PendingReason.INSUFFICIENT_GPU, **pods: Any) -> Outcome:
        """The cluster never becomes ready; its pods stay Pending for `reason`."""
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

    def poll(self) -> JobPoll:
        o = self.outcome
        if self.stopped:
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
        self.stopped = True


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
# Controller machinery: a keyed work queue and list+watch informers


class WorkQueue:
    """controller-runtime's queue: a key is never processed twice at once; re-adds while processing run after."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: deque[Hashable] = deque()
        self._queued: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._dirty: set[Hashable] = set()
        self._timers: list[tuple[float, int, Hashable]] = []
        self._due: dict[Hashable, float] = {}
        self._seq = 0
        self._closed = False

    def add(self, key: Hashable) -> None:
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: Hashable) -> None:
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.append(key)
            self._cond.notify()

    def add_after(self, key: Hashable, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        due = time.monotonic() + delay
        with self._cond:
            if key in self._due and self._due[key] <= due:
                return
            self._due[key] = due
            self._seq += 1
            heapq.heappush(self._timers, (due, self._seq, key))
            self._cond.notify()

    def get(self) -> Hashable | None:
        """The next key to process, or None once closed."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    due, _, key = heapq.heappop(self._timers)
                    if self._due.get(key) == due:
                        del self._due[key]
                        self._add_locked(key)
                if self._ready:
                    key = self._ready.popleft()
                    self._queued.discard(key)
                    self._processing.add(key)
                    return key
                self._cond.wait(self._timers[0][0] - now if self._timers else None)
            return None

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self._add_locked(key)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, ValueError, TypeError):
        return 0


class Informer:
    """Lists and watches one custom resource into a cache; calls `on_change(obj)` for every change."""

    def __init__(
        self,
        api: Any,
        group: str,
        version: str,
        plural: str,
        on_change: Callable[[Obj], None],
        namespace: str | None = None,
    ) -> None:
        self.api, self.group, self.version, self.plural = api, group, version, plural
        self.namespace = namespace
        self.on_change = on_change
        self.synced = threading.Event()
        self._cache: dict[Key, Obj] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{plural}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # unblocks the thread's read at once
            except Exception:  # the stream may already be closed
                pass
        self._thread.join(timeout)

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            obj = self._cache.get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def items(self) -> list[Obj]:
        with self._lock:
            return [copy.deepcopy(o) for o in self._cache.values()]

    def remember(self, obj: Obj) -> None:
        """Write-through after our own writes, so the next reconcile does not act on a stale copy."""
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        with self._lock:
            cached = self._cache.get(key)
            if cached is None or _rv(obj) >= _rv(cached):
                self._cache[key] = obj

    def _apply(self, event_type: str, obj: Obj) -> None:
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        with self._lock:
            if event_type == "DELETED":
                self._cache.pop(key, None)
            else:
                cached = self._cache.get(key)
                if cached is None or _rv(obj) >= _rv(cached) or cached["metadata"].get("uid") != obj["metadata"].get("uid"):
                    self._cache[key] = obj
        self.on_change(obj)

    def _list(self, **kwargs: Any) -> Any:
        if self.namespace:
            return self.api.list_namespaced_custom_object(self.group, self.version, self.namespace, self.plural, **kwargs)
        return self.api.list_cluster_custom_object(self.group, self.version, self.plural, **kwargs)

    def _run(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        while not self._stopping.is_set():
            try:
                listed = self._list()
                with self._lock:
                    self._cache = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in listed["items"]}
                for obj in listed["items"]:
                    self.on_change(obj)
                self.synced.set()
                rv = listed["metadata"]["resourceVersion"]
                while not self._stopping.is_set():
                    self._response = self._list(
                        watch=True, resource_version=rv, timeout_seconds=60, _preload_content=False
                    )
                    expired = False
                    for line in iter_resp_lines(self._response):
                        if not line:
                            continue
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            expired = event["object"].get("code") == 410
                            break
                        if event["type"] == "BOOKMARK":
                            rv = event["object"]["metadata"]["resourceVersion"]
                            continue
                        rv = event["object"]["metadata"]["resourceVersion"]
                        self._apply(event["type"], event["object"])
                    self._response.release_conn()
                    if expired:
                        break  # relist
            except Exception as e:
                if self._stopping.is_set():
                    return
                logger.debug("informer %s: %r; relisting", self.plural, e)
                self._stopping.wait(0.2)


# --------------------------------------------------------------------------------------------------------------------
# Pods and Events, as the RayCluster controller, kube-scheduler and the kubelet would leave them


def event_body(involved: Mapping[str, Any], type_: str, reason: str, message: str, component: str,
               host: str | None = None) -> Obj:
    """A core v1 Event about `involved`, named as client-go's recorder names them."""
    meta = involved["metadata"]
    now = now_rfc3339()
    source: Obj = {"component": component}
    if host:
        source["host"] = host
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta.get("namespace", "default")},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion", "v1"),
            "kind": involved.get("kind", ""),
            "name": meta["name"],
            "namespace": meta.get("namespace", "default"),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "source": source,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": host or "",
    }


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
    plans = [PodPlan(f"{name}-head-{random_suffix()}", "head", HEAD_GROUP, (spec.get("headGroupSpec") or {}).get("template") or {})]
    for group in spec.get("workerGroupSpecs") or []:
        count = _worker_count(group) if workers is None else workers
        for _ in range(count):
            plans.append(PodPlan(f"{name}-{group['groupName']}-worker-{random_suffix()}", "worker",
                                 group["groupName"], group.get("template") or {}))
    return plans


def pod_body(cluster: Mapping[str, Any], plan: PodPlan) -> Obj:
    template = plan.template
    cluster_name = cluster["metadata"]["name"]
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels.update({
        LABEL_CLUSTER: cluster_name,
        LABEL_NODE_TYPE: plan.node_type,
        LABEL_GROUP: plan.group,
        "ray.io/identifier": f"{cluster_name}-{plan.node_type}",
        "ray.io/is-ray-node": "yes",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    })
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


def _container_statuses(pod: Mapping[str, Any], *, ready: bool, waiting: Obj | None = None) -> list[Obj]:
    statuses = []
    for container in pod["spec"].get("containers", []):
        state: Obj = {"running": {"startedAt": now_rfc3339()}} if ready else {"waiting": dict(waiting or {})}
        statuses.append({
            "name": container.get("name", "ray"),
            "image": container.get("image", ""),
            "imageID": "",
            "ready": ready,
            "restartCount": 0,
            "started": ready,
            "state": state,
        })
    return statuses


def running_pod_status(pod: Mapping[str, Any], index: int) -> Obj:
    return {
        "phase": "Running",
        "podIP": f"10.0.{index // 250}.{index % 250 + 2}",
        "startTime": now_rfc3339(),
        "conditions": [_condition(t, True) for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
        "containerStatuses": _container_statuses(pod, ready=True),
    }


def unschedulable_message(pending: PendingPods) -> str:
    if pending.message:
        return pending.message
    n = pending.nodes
    if pending.reason is PendingReason.INSUFFICIENT_GPU:
        return (f"0/{n} nodes are available: {n} Insufficient {constants.GPU_RESOURCE}. preemption: 0/{n} nodes are "
                f"available: {n} No preemption victims found for incoming pod.")
    return (f"0/{n} nodes are available: {n} node(s) didn't match Pod's node affinity/selector. preemption: 0/{n} "
            f"nodes are available: {n} Preemption is not helpful for scheduling.")


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
        return dict(self.custom.create_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, body))

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        try:
            return dict(self.custom.get_namespaced_custom_object(
                constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, name))
        except self.ApiException as e:
            if e.status == 404:
                return None
            raise

    def delete(self, plural: str, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, name)

    def patch(self, plural: str, obj: Obj, patch: Obj, *, status: bool = False, guarded: bool = False) -> Obj:
        """A merge patch; `guarded` adds obj's resourceVersion, so a stale write fails with 409 as KubeRay's Update."""
        meta = obj["metadata"]
        if guarded:
            patch = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": meta["resourceVersion"]}}
        call = self.custom.patch_namespaced_custom_object_status if status else self.custom.patch_namespaced_custom_object
        return dict(call(constants.RAY_GROUP, constants.RAY_VERSION_API, meta["namespace"], plural, meta["name"], patch))

    def core(self, method: str, path: str, body: Any = None, *, query: list[tuple[str, str]] | None = None,
             content_type: str = "application/json") -> Obj:
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

    def event(self, involved: Obj, type_: str, reason: str, message: str, component: str = RAYJOB_CONTROLLER,
              host: str | None = None) -> None:
        body = event_body(involved, type_, reason, message, component, host)
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
            self._set_status(pod, {"phase": "Pending", "conditions": [_condition("PodScheduled", True)],
                                   "containerStatuses": _container_statuses(pod, ready=False, waiting=waiting)})

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
            _condition("HeadPodReady", head_ready, "HeadPodRunningAndReady" if head_ready else "HeadPodNotReady"),
            _condition("RayClusterProvisioned", False, "RayClusterPodsProvisioning",
                       "RayCluster Pods are being provisioned for first time"),
        ]
        if refusal:
            conditions.append(_condition("ReplicaFailure", True, "FailedCreateWorkerPod", refusal))
        workers = sum(1 for p in plans if p.node_type == "worker")
        return {"desiredWorkerReplicas": workers, "availableWorkerReplicas": 0, "readyWorkerReplicas": 0,
                "conditions": conditions}

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
        self.api.event(cluster, "Normal", reason, f"Created {plan.node_type} Pod {namespace}/{plan.name}",
                       RAYCLUSTER_CONTROLLER)
        return pod

    def _patch(self, pod: Obj, suffix: str, body: Obj) -> None:
        meta = pod["metadata"]
        self.api.core("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}{suffix}", body,
                      content_type="application/strategic-merge-patch+json")

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
        self.api.event(cluster, "Warning", "FailedToCreateWorkerPod", message, RAYCLUSTER_CONTROLLER)
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
        self._set_status(pod, {"phase": "Pending",
                               "conditions": [_condition("PodScheduled", False, "Unschedulable", message)]})

    def _image_pull_back_off(self, pod: Obj, image: str, pending: PendingPods) -> None:
        node = "ip-10-0-1-23.ec2.internal"
        error = pending.message or f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": not found'
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
        self._set_status(pod, {
            "phase": "Pending",
            "conditions": [_condition("PodScheduled", True),
                           _condition("Ready", False, "ContainersNotReady", "containers with unready status")],
            "containerStatuses": _container_statuses(pod, ready=False, waiting=waiting),
        })


def ready_cluster_status(cluster: Obj) -> Obj:
    """A RayCluster's status once its pods run (KubeRay's state `ready`)."""
    groups = (cluster.get("spec") or {}).get("workerGroupSpecs") or []
    desired = sum(_worker_count(g) for g in groups)
    name = cluster["metadata"]["name"]
    return {
        "state": "ready",
        "readyTimestamp": now_rfc3339(),
        "desiredWorkerReplicas": desired,
        "availableWorkerReplicas": desired,
        "readyWorkerReplicas": desired,
        "minWorkerReplicas": sum(int(g.get("minReplicas", 0) or 0) for g in groups),
        "maxWorkerReplicas": sum(int(g.get("maxReplicas", 0) or 0) for g in groups),
        "endpoints": {"client": "10001", "dashboard": "8265", "gcs-server": "6379"},
        "head": {"serviceName": f"{name}-head-svc", "podIP": "10.0.0.2", "serviceIP": "10.96.0.10"},
        "conditions": [_condition("HeadPodReady", True, "HeadPodRunningAndReady"),
                       _condition("RayClusterProvisioned", True, "AllPodRunningAndReadyFirstTime")],
        "observedGeneration": cluster["metadata"].get("generation", 1),
    }


def cluster_for(rayjob: Obj, name: str) -> Obj:
    """KubeRay's constructRayClusterForRayJob: the RayJob's labels and annotations, its rayClusterSpec, owned by it."""
    labels = dict(rayjob["metadata"].get("labels") or {})
    labels[constants.RAY_LABEL_ORIGINATED_FROM_CR_NAME] = rayjob["metadata"]["name"]
    labels[constants.RAY_LABEL_ORIGINATED_FROM_CRD] = constants.RAYJOB_KIND
    return {
        "apiVersion": constants.RAY_API_VERSION,
        "kind": constants.RAYCLUSTER_KIND,
        "metadata": {
            "name": name,
            "namespace": rayjob["metadata"]["namespace"],
            "labels": labels,
            "annotations": dict(rayjob["metadata"].get("annotations") or {}),
            "ownerReferences": [_owner_ref(rayjob)],
        },
        "spec": copy.deepcopy(rayjob["spec"]["rayClusterSpec"]),
    }


class KubeRayStandIn:
    """Reconciles RayJobs as KubeRay v1.7 does, against any Kubernetes API (the emulator in practice).

        standin = KubeRayStandIn(server.api_client(), ScriptedRunner())
        standin.start()
        ...
        standin.stop()

    `poll_interval` bounds how long a running job goes unpolled when its runner gives no hint; `emulate_pods`
    creates every cluster's Pods (Running once ready). Pending pods are created whenever a run reports them.
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
    ) -> None:
        self.api = RayApi(api_client)
        self.runner: JobRunner = runner if runner is not None else ScriptedRunner()
        self.namespace = namespace
        self.poll_interval = poll_interval
        self.emulate_pods = emulate_pods
        self.pods = ClusterPods(self.api)
        self.queue = WorkQueue()
        ray = (self.api.custom, constants.RAY_GROUP, constants.RAY_VERSION_API)
        self.rayjobs = Informer(*ray, constants.RAYJOB_PLURAL, self._on_rayjob, namespace)
        self.rayclusters = Informer(*ray, constants.RAYCLUSTER_PLURAL, self._on_raycluster, namespace)
        self._workers = [threading.Thread(target=self._work, name=f"kuberay-worker-{i}", daemon=True)
                         for i in range(workers)]
        self._runs: dict[Key, tuple[str, RunHandle]] = {}  # RayJob -> (cluster name, its run)
        self._failures: dict[Key, int] = {}
        self._lock = threading.Lock()

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
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching and reconciling, and stop every run it started."""
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

    # ---- events into the queue

    def _on_rayjob(self, rayjob: Obj) -> None:
        self.queue.add((rayjob["metadata"]["namespace"], rayjob["metadata"]["name"]))

    def _on_raycluster(self, cluster: Obj) -> None:
        for ref in cluster["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == constants.RAYJOB_KIND and ref.get("controller"):
                self.queue.add((cluster["metadata"]["namespace"], ref["name"]))

    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            assert isinstance(key, tuple)
            try:
                delay = self.reconcile(key)
                self._failures.pop(key, None)
            except Exception as e:
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                delay = min(0.05 * 2 ** failures, 2.0)
                expected = isinstance(e, self.api.ApiException) and e.status in (404, 409)
                logger.log(logging.DEBUG if expected else logging.WARNING,
                           "reconcile %s/%s failed (%r); retrying in %.2fs", *key, e, delay)
            finally:
                self.queue.done(key)
            if delay is not None:
                self.queue.add_after(key, delay)

    # ---- the RayJob state machine (KubeRay's rayjob_controller.go Reconcile)

    def reconcile(self, key: Key) -> float | None:
        """One reconcile of one RayJob; returns when to look again (None: on the next change only)."""
        rayjob = self.rayjobs.get(*key)
        if rayjob is None:
            self._stop_run(key)
            return None
        if rayjob["metadata"].get("deletionTimestamp"):
            return self._on_deleting(key, rayjob)
        spec = rayjob.get("spec") or {}
        original = dict(rayjob.get("status") or {})
        step = _Step(copy.deepcopy(original))
        deployment = original.get("jobDeploymentStatus", "")
        if deployment == Deployment.NEW.value:
            with_finalizer = self._ensure_finalizer(rayjob)
            if with_finalizer is None:
                return 0.05  # a conflict: look again at the fresh object
            rayjob = with_finalizer
            self._init_status(rayjob, step)
        elif deployment == Deployment.INITIALIZING.value:
            self._initializing(key, rayjob, step)
        elif deployment == Deployment.RUNNING.value:
            self._running(key, rayjob, step)
        elif deployment in (Deployment.SUSPENDING.value, Deployment.RETRYING.value):
            self._release_cluster(key, rayjob, step)
        elif deployment == Deployment.SUSPENDED.value:
            if not spec.get("suspend"):
                step.status.update(jobStatus=JobStatus.NEW.value, jobDeploymentStatus=Deployment.NEW.value)
        elif deployment in (Deployment.COMPLETE.value, Deployment.FAILED.value):
            self._finished(key, rayjob, step)
        _attempt_counts(step.status, spec)
        self._write_status(rayjob, original, step)
        return step.requeue_after

    def _on_deleting(self, key: Key, rayjob: Obj) -> float | None:
        if (rayjob.get("status") or {}).get("jobStatus", "") not in TERMINAL_JOB:
            self._stop_run(key)
        finalizers = rayjob["metadata"].get("finalizers") or []
        if RAYJOB_FINALIZER in finalizers:
            remaining = [f for f in finalizers if f != RAYJOB_FINALIZER]
            self._remember_rayjob(self.api.patch(constants.RAYJOB_PLURAL, rayjob,
                                                 {"metadata": {"finalizers": remaining or None}}, guarded=True))
        return None  # the cluster goes with the RayJob through ownerReference garbage collection

    def _ensure_finalizer(self, rayjob: Obj) -> Obj | None:
        """KubeRay's stop-job finalizer; returns the RayJob as it now is (None on a write conflict)."""
        finalizers = rayjob["metadata"].get("finalizers") or []
        if RAYJOB_FINALIZER in finalizers:
            return rayjob
        try:
            patched = self.api.patch(constants.RAYJOB_PLURAL, rayjob,
                                     {"metadata": {"finalizers": [*finalizers, RAYJOB_FINALIZER]}}, guarded=True)
        except self.api.ApiException as e:
            if e.status == 409:
                return None
            raise
        return self._remember_rayjob(patched)

    def _init_status(self, rayjob: Obj, step: _Step) -> None:
        """KubeRay's initRayJobStatusIfNeed: job id, cluster name and start time, then Initializing."""
        name, spec, status = rayjob["metadata"]["name"], rayjob.get("spec") or {}, step.status
        if not status.get("jobId"):
            status["jobId"] = spec.get("jobId") or f"{name}-{random_suffix()}"
        if not status.get("rayClusterName"):
            selector = spec.get("clusterSelector") or {}
            status["rayClusterName"] = selector.get(LABEL_CLUSTER) or f"{name}-{random_suffix()}"
        status["jobStatus"] = status.get("jobStatus") or JobStatus.NEW.value
        status["jobDeploymentStatus"] = Deployment.INITIALIZING.value
        status["startTime"] = now_rfc3339()
        step.wake_in(0)

    def _deadline_passed(self, rayjob: Obj, step: _Step, *, pre_running: bool) -> bool:
        """activeDeadlineSeconds (and, before Running, preRunningDeadlineSeconds) from status.startTime."""
        spec, status = rayjob.get("spec") or {}, step.status
        start = _parse_time(status.get("startTime"))
        if start is None:
            return False
        checks = [("activeDeadlineSeconds", DEADLINE_EXCEEDED)]
        if pre_running:
            checks.append(("preRunningDeadlineSeconds", PRE_RUNNING_DEADLINE_EXCEEDED))
        for field_name, reason in checks:
            seconds = spec.get(field_name)
            if not seconds:
                continue
            remaining = start + int(seconds) - time.time()
            if remaining <= 0:
                status["jobDeploymentStatus"] = Deployment.FAILED.value
                status["reason"] = reason
                status["message"] = (f"The RayJob has passed the {field_name}. StartTime: {status.get('startTime')}. "
                                     f"{field_name[0].upper()}{field_name[1:]}: {seconds}")
                return True
            step.wake_in(remaining + 0.01)
        return False

    def _initializing(self, key: Key, rayjob: Obj, step: _Step) -> None:
        spec, status = rayjob.get("spec") or {}, step.status
        if spec.get("suspend"):
            status["jobDeploymentStatus"] = Deployment.SUSPENDING.value
            return
        if self._deadline_passed(rayjob, step, pre_running=True):
            self._stop_run(key)
            return
        if not spec.get("rayClusterSpec") and not spec.get("clusterSelector"):
            status.update(jobDeploymentStatus=Deployment.VALIDATION_FAILED.value, reason=VALIDATION_FAILED,
                          message="The RayJob spec is invalid: rayClusterSpec or clusterSelector is required")
            return
        cluster = self._get_or_create_cluster(rayjob, step)
        if cluster is None:
            step.wake_in(self.poll_interval)
            return
        poll = self._run_for(key, rayjob, cluster).poll()
        if poll.phase is RunPhase.STARTING:
            if poll.pending_pods is not None:
                stuck = self.pods.stuck(cluster, poll.pending_pods)
                if stuck is not None:
                    self._set_cluster_status(cluster, stuck)
            elif self.emulate_pods:
                self.pods.starting(cluster)
            step.wake_in(self.poll_interval if poll.recheck_after is None else poll.recheck_after)
            return
        if self.emulate_pods:
            self.pods.ready(cluster)
        if (cluster.get("status") or {}).get("state") != "ready":
            cluster = self._set_cluster_status(cluster, ready_cluster_status(cluster))
        meta = cluster["metadata"]
        status["rayClusterStatus"] = cluster.get("status") or {}
        status["dashboardURL"] = f"{meta['name']}-head-svc.{meta['namespace']}.svc.cluster.local:8265"
        status["jobDeploymentStatus"] = Deployment.RUNNING.value
        step.wake_in(0)

    def _running(self, key: Key, rayjob: Obj, step: _Step) -> None:
        spec, status = rayjob.get("spec") or {}, step.status
        if spec.get("suspend"):
            status["jobDeploymentStatus"] = Deployment.SUSPENDING.value
            return
        if self._deadline_passed(rayjob, step, pre_running=False):
            self._stop_run(key)
            return
        cluster = self._get_or_create_cluster(rayjob, step)
        if cluster is None:
            step.wake_in(self.poll_interval)
            return
        poll = self._run_for(key, rayjob, cluster).poll()
        info = dict(status.get("rayJobInfo") or {})
        if poll.phase in (RunPhase.PENDING, RunPhase.STARTING):
            status["jobStatus"] = JobStatus.PENDING.value
        elif poll.phase is RunPhase.RUNNING:
            status["jobStatus"] = JobStatus.RUNNING.value
            info.setdefault("startTime", now_rfc3339())
        else:
            status["jobStatus"] = {RunPhase.SUCCEEDED: JobStatus.SUCCEEDED, RunPhase.FAILED: JobStatus.FAILED,
                                   RunPhase.STOPPED: JobStatus.STOPPED}[poll.phase].value
            info.setdefault("startTime", now_rfc3339())
            info["endTime"] = now_rfc3339()
            failed = poll.phase is RunPhase.FAILED
            status["jobDeploymentStatus"] = (Deployment.FAILED if failed else Deployment.COMPLETE).value
            if failed:
                status["reason"] = APP_FAILED
            self._forget_run(key)
        if poll.message:
            status["message"] = poll.message
        if info:
            status["rayJobInfo"] = info
        status["rayClusterStatus"] = cluster.get("status") or {}
        step.wake_in(self.poll_interval if poll.recheck_after is None else poll.recheck_after)

    def _release_cluster(self, key: Key, rayjob: Obj, step: _Step) -> None:
        """Suspending / Retrying: stop the run, delete the cluster, wait until it is gone, reset the status."""
        self._stop_run(key)
        if not self._delete_cluster(rayjob, step):
            step.wake_in(self.poll_interval)
            return
        status = step.status
        for reset in ("rayClusterStatus", "rayClusterName", "dashboardURL", "jobId", "message", "reason",
                      "rayJobInfo"):
            status.pop(reset, None)
        status["jobStatus"] = JobStatus.NEW.value
        suspending = status.get("jobDeploymentStatus") == Deployment.SUSPENDING.value
        status["jobDeploymentStatus"] = (Deployment.SUSPENDED if suspending else Deployment.NEW).value
        step.wake_in(0)

    def _finished(self, key: Key, rayjob: Obj, step: _Step) -> None:
        """Complete / Failed: with shutdownAfterJobFinishes, delete the RayCluster ttlSecondsAfterFinished later."""
        self._stop_run(key)
        spec = rayjob.get("spec") or {}
        if not spec.get("shutdownAfterJobFinishes") or spec.get("clusterSelector"):
            return
        end = _parse_time(step.status.get("endTime")) or time.time()
        remaining = end + int(spec.get("ttlSecondsAfterFinished") or 0) - time.time()
        if remaining > 0:
            step.wake_in(remaining + 0.01)
            return
        self._delete_cluster(rayjob, step)

    # ---- the RayCluster

    def _get_or_create_cluster(self, rayjob: Obj, step: _Step) -> Obj | None:
        namespace, name = rayjob["metadata"]["namespace"], step.status.get("rayClusterName", "")
        cluster = self.rayclusters.get(namespace, name)
        if cluster is not None:
            return cluster
        if (rayjob.get("spec") or {}).get("clusterSelector"):
            return None  # an existing cluster is selected; KubeRay waits for it
        try:
            cluster = self.api.create(constants.RAYCLUSTER_PLURAL, namespace, cluster_for(rayjob, name))
        except self.api.ApiException as e:
            if e.status != 409:
                self.api.event(rayjob, "Warning", "FailedToCreateRayCluster",
                               f"Failed to create RayCluster {namespace}/{name}: {e.reason}")
                raise
            cluster = self.api.get(constants.RAYCLUSTER_PLURAL, namespace, name)
        else:
            self.api.event(rayjob, "Normal", "CreatedRayCluster", f"Created RayCluster {namespace}/{name}")
        if cluster is not None:
            self.rayclusters.remember(cluster)
        return cluster

    def _set_cluster_status(self, cluster: Obj, status: Obj) -> Obj:
        patched = self.api.patch(constants.RAYCLUSTER_PLURAL, cluster, {"status": status}, status=True)
        self.rayclusters.remember(patched)
        return patched

    def _delete_cluster(self, rayjob: Obj, step: _Step) -> bool:
        """KubeRay's deleteClusterResources: delete once (a real delete: finalizers hold it); True once it is gone."""
        namespace, name = rayjob["metadata"]["namespace"], step.status.get("rayClusterName", "")
        cluster = self.api.get(constants.RAYCLUSTER_PLURAL, namespace, name) if name else None
        if cluster is None:
            return True
        if cluster["metadata"].get("deletionTimestamp"):
            return False  # its deletion is ongoing (held by finalizers)
        try:
            self.api.delete(constants.RAYCLUSTER_PLURAL, namespace, name)
        except self.api.ApiException as e:
            if e.status == 404:
                return True
            self.api.event(rayjob, "Warning", "FailedToDeleteRayCluster",
                           f"Failed to delete cluster {namespace}/{name}: {e.reason}")
            raise
        self.api.event(rayjob, "Normal", "DeletedRayCluster", f"Deleted cluster {namespace}/{name}")
        return False  # gone only when the API says so (the next reconcile looks again)

    # ---- runs

    def _run_for(self, key: Key, rayjob: Obj, cluster: Obj) -> RunHandle:
        cluster_name = cluster["metadata"]["name"]
        with self._lock:
            current = self._runs.get(key)
        if current is not None and current[0] == cluster_name:
            return current[1]
        if current is not None:
            current[1].stop()
        handle = self.runner.start(rayjob, cluster_name)
        with self._lock:
            self._runs[key] = (cluster_name, handle)
        return handle

    def _stop_run(self, key: Key) -> None:
        with self._lock:
            current = self._runs.pop(key, None)
        if current is not None:
            current[1].stop()

    def _forget_run(self, key: Key) -> None:
        with self._lock:
            self._runs.pop(key, None)

    # ---- writes

    def _remember_rayjob(self, rayjob: Obj) -> Obj:
        self.rayjobs.remember(rayjob)
        return rayjob

    def _write_status(self, rayjob: Obj, original: Obj, step: _Step) -> None:
        """KubeRay writes the status only when jobStatus or jobDeploymentStatus change (updateRayJobStatus)."""
        status = step.status
        changed = any(status.get(k, "") != original.get(k, "") for k in ("jobStatus", "jobDeploymentStatus"))
        if not changed:
            return
        if status.get("jobDeploymentStatus") in (Deployment.COMPLETE.value, Deployment.FAILED.value):
            status["endTime"] = now_rfc3339()
        status["observedGeneration"] = rayjob["metadata"].get("generation", 1)
        patch = {k: status.get(k) for k in set(status) | set(original) if status.get(k) != original.get(k)}
        self._remember_rayjob(self.api.patch(constants.RAYJOB_PLURAL, rayjob, {"status": patch},
                                             status=True, guarded=True))
