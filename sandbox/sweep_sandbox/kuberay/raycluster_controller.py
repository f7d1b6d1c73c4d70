"""The RayCluster controller's share of the KubeRay stand-in (raycluster_controller.go): a RayJob's cluster created,
its head Service, pods and status as the run reports its start, suspended worker groups, the cluster's deletion."""

from __future__ import annotations

import threading

from sweep_contracts import constants

from ..controllers import Informer, Key, Obj
from .builders import (
    cluster_for,
    head_service_body,
    head_service_name,
    head_service_url,
    ready_cluster_status,
    worker_count,
)
from .cluster_pods import ClusterPods
from .jobs_api import JobsApiServer
from .options import KubeRayOptions
from .ray_api import RayApi
from .rayjob_types import RAYCLUSTER_CONTROLLER
from .runners import PendingPods, PendingReason, RunPhase
from .runs import NO_RUN, RunRegistry


class RayClusterController:
    """The RayClusters of RayJobs, through the API; `rayclusters` is the informer's cache of them."""

    def __init__(
        self,
        api: RayApi,
        rayclusters: Informer,
        runs: RunRegistry,
        options: KubeRayOptions,
        jobs_api: JobsApiServer | None,
    ) -> None:
        self.api = api
        self.rayclusters = rayclusters
        self.runs = runs
        self.options = options
        self.jobs_api = jobs_api
        self.pods = ClusterPods(api)
        self._head_services: set[str] = set()  # clusters (uid) whose head Service exists
        self._lock = threading.Lock()

    def reconcile(self, key: Key) -> float | None:
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
        if not self.options.deletion_policy_gate:
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

    def get_or_create(self, rayjob: Obj, name: str) -> Obj | None:
        """getOrCreateRayClusterInstance: the cluster named in status.rayClusterName, created from the RayJob if
        missing (also under a Running RayJob, under the same name); with clusterSelector it must exist."""
        namespace = rayjob["metadata"]["namespace"]
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

    def reconcile_for_job(self, key: Key, rayjob: Obj, cluster: Obj) -> tuple[Obj, float | None]:
        """raycluster_controller.go's share: pods and status as the run reports the cluster's start. A cluster with
        a deletionTimestamp is not reconciled ("RayCluster is being deleted, just ignore"): nothing changes. Returns
        the cluster as it now is and when to look again (None: as usual)."""
        run = self.runs.run_for(key, rayjob, cluster)
        if cluster["metadata"].get("deletionTimestamp") or run is NO_RUN:
            return cluster, self.options.poll_interval
        self.ensure_head_service(cluster)
        poll = run.poll()
        if poll.phase is RunPhase.STARTING and ready_before_demand(cluster, poll.pending_pods):
            # calculateStatus: pods == desired workers (0) + head, all running -> ready; the workers the job needs
            # come later, from the autoscaler, and are stuck then (see the RayJob's Running branch)
            if (cluster.get("status") or {}).get("state") != "ready":
                cluster = self.set_status(cluster, ready_cluster_status(cluster))
            return cluster, None
        if poll.phase is RunPhase.STARTING:
            if poll.pending_pods is not None:
                stuck = self.pods.stuck(cluster, poll.pending_pods)
                if stuck is not None:
                    cluster = self.set_status(cluster, stuck)
            elif self.options.emulate_pods:
                self.pods.starting(cluster)
            return cluster, self.options.poll_interval if poll.recheck_after is None else poll.recheck_after
        if self.options.emulate_pods:
            self.pods.ready(cluster)
        if (cluster.get("status") or {}).get("state") != "ready":
            cluster = self.set_status(cluster, ready_cluster_status(cluster))
        return cluster, None

    def ensure_head_service(self, cluster: Obj) -> Obj | None:
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

    def dashboard_url(self, cluster: Obj) -> str | None:
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

    def autoscaler_demand(self, cluster: Obj, pending: PendingPods | None) -> Obj:
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
        return self.set_status(cluster, status)

    def set_status(self, cluster: Obj, status: Obj) -> Obj:
        patched = self.api.patch(constants.RAYCLUSTER_PLURAL, cluster, {"status": status}, status=True)
        self.rayclusters.remember(patched)
        return patched

    def delete(self, rayjob: Obj, name: str) -> bool:
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


def ready_before_demand(cluster: Obj, pending: PendingPods | None) -> bool:
    """Whether a start that the run reports stuck still makes the cluster `ready` first: no worker is desired yet
    (replicas 0, an autoscaled group at its minimum of 0) and the head pod runs (not an image-pull failure)."""
    if pending is None or pending.reason is PendingReason.IMAGE_PULL:
        return False
    groups = (cluster.get("spec") or {}).get("workerGroupSpecs") or []
    return sum(worker_count(g) for g in groups) == 0
