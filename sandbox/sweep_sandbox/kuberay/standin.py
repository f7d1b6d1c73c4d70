"""The KubeRay stand-in as tests and the sandbox start it: informers on RayJobs and RayClusters feed one work queue
that a few workers drain into the RayJob and RayCluster controllers, as controller-runtime runs KubeRay."""

from __future__ import annotations

import logging
import threading
from typing import Any

from sweep_contracts import constants

from ..container_logs import ContainerLogs
from ..controllers import Informer, Key, Obj, WorkQueue
from ..pod_lifetimes import PodLifetimes
from .jobs_api import JobsApiServer
from .options import KubeRayOptions
from .ray_api import RayApi
from .raycluster_controller import RayClusterController
from .rayjob_controller import RayJobController
from .rayjob_types import RAYCLUSTER_KEY
from .runners import JobRunner, RunHandle, ScriptedRunner
from .runs import LookAgainAfterStop, RunRegistry
from .submitter_jobs import SubmitterJobs

logger = logging.getLogger(__name__)


class KubeRayStandIn:
    """Reconciles RayJobs as KubeRay v1.7.0 does, against any Kubernetes API (the emulator in practice).

        standin = KubeRayStandIn(server.api_client(), ScriptedRunner())
        standin.start()
        ...
        standin.stop()

    The options are `KubeRayOptions`' (`emulate_pods` may be switched while it runs). A run lives as long as its
    RayCluster object: it stops when KubeRay stops the job (a RayJob deletion) or when the cluster is gone from the API
    (its pods with it), never on a deadline, a suspend or a retry by itself. Each cluster gets its head Service as
    KubeRay makes it, and status.dashboardURL is that Service's in-cluster name and dashboard port. `dashboard=True`
    serves the heads' Jobs API on one loopback port (`JobsApiServer`), which those names reach through
    `jobs_api.stop_job`/`job_status` (the sandbox's cluster DNS), so the operator's real client can stop a job the way
    KubeRay's StopJob does. `cluster_api_client`: the identity of the cluster's own controllers the stand-in also plays
    (the Job controller and the kubelet for the submitter's pod), where the API authorizes KubeRay's by RBAC.
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
        cluster_api = RayApi(cluster_api_client) if cluster_api_client is not None else self.api
        self.options = KubeRayOptions(
            poll_interval, emulate_pods, delete_rayjob_after_job_finishes, deletion_policy_gate
        )
        self.jobs_api = JobsApiServer(self._job_by_id) if dashboard else None
        self.runner: JobRunner = runner if runner is not None else ScriptedRunner()
        self.runs = RunRegistry(self.runner)
        self.namespace = namespace
        self.pod_lifetimes: PodLifetimes | None = None
        self.queue = WorkQueue()
        ray = (self.api.custom, constants.RAY_GROUP, constants.RAY_VERSION_API)
        self.rayjobs = Informer(*ray, constants.RAYJOB_PLURAL, self._on_rayjob, namespace)
        self.rayclusters = Informer(
            *ray, constants.RAYCLUSTER_PLURAL, self._on_raycluster, namespace, on_delete=self._on_raycluster_gone
        )
        # per RayJob, the resourceVersion the last finished reconcile read: what "it has looked again" waits on
        self.reconciled: dict[Key, int] = {}
        self._reading: dict[Key, int] = {}
        self.clusters = RayClusterController(self.api, self.rayclusters, self.runs, self.options, self.jobs_api)
        submitters = SubmitterJobs(self.api, cluster_api, self.runs, self.options, container_logs)
        self.controller = RayJobController(
            self.api, self.rayjobs, self.clusters, submitters, self.runs, self.options, self.queue, self._reading
        )
        self._workers = [
            threading.Thread(target=self._work, name=f"kuberay-worker-{i}", daemon=True) for i in range(workers)
        ]
        self._failures: dict[Key, int] = {}
        self._lock = threading.Lock()

    @property
    def emulate_pods(self) -> bool:
        return self.options.emulate_pods

    @emulate_pods.setter
    def emulate_pods(self, value: bool) -> None:
        self.options.emulate_pods = value

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
        self.runs.stop_all()

    def __enter__(self) -> KubeRayStandIn:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def reconcile(self, key: Key) -> float | None:
        """One reconcile of one RayJob; returns when to look again (None: on the next change only)."""
        return self.controller.reconcile(key)

    def reconcile_cluster(self, key: Key) -> float | None:
        """The RayCluster controller's reconcile of one cluster (its suspended worker groups)."""
        return self.clusters.reconcile(key)

    def _job_by_id(self, job_id: str) -> tuple[RunHandle, str] | None:
        """The run whose RayJob's status.jobId is `job_id` (submission ids are unique) and that RayJob's jobStatus."""
        rayjob = self.rayjobs.find(lambda o: (o.get("status") or {}).get("jobId") == job_id)
        if rayjob is None:
            return None
        status = rayjob.get("status") or {}
        key = (rayjob["metadata"]["namespace"], rayjob["metadata"]["name"])
        current = self.runs.current(key)
        if current is None:
            return None
        return LookAgainAfterStop(current, lambda key=key: self.queue.add(key)), str(status.get("jobStatus") or "")

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
        self.runs.cluster_gone(cluster["metadata"].get("uid"))

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
