"""A RayCluster's Pods as KubeRay creates them, and what kube-scheduler, the kubelet or a ResourceQuota make of them:
Running pods, or the Pending pods, conditions and Events of a start that is stuck."""

from __future__ import annotations

import threading

from sweep_contracts import constants

from ..controllers import Obj
from .builders import (
    PodPlan,
    cluster_condition,
    container_statuses,
    first_image,
    plan_pods,
    pod_body,
    running_pod_status,
    status_condition,
    unschedulable_message,
)
from .ray_api import RayApi
from .rayjob_types import LABEL_CLUSTER, LABEL_GROUP, LABEL_NODE_TYPE, RAYCLUSTER_CONTROLLER
from .runners import PendingPods, PendingReason


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
                    "conditions": [status_condition("PodScheduled", True)],
                    "containerStatuses": container_statuses(pod, ready=False, waiting=waiting),
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
            cluster_condition(
                "HeadPodReady", head_ready, "HeadPodRunningAndReady" if head_ready else "HeadPodNotReady"
            ),
            cluster_condition(
                "RayClusterProvisioned",
                False,
                "RayClusterPodsProvisioning",
                "RayCluster Pods are being provisioned for first time",
            ),
        ]
        if refusal:
            conditions.append(cluster_condition("ReplicaFailure", True, "FailedCreateWorkerPod", refusal))
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
            self._image_pull_back_off(pod, first_image(plan.template), pending)

    # The Events go first: a pod whose status shows the problem already has the Events that explain it.

    def _unschedulable(self, pod: Obj, pending: PendingPods) -> None:
        message = unschedulable_message(pending)
        self.api.event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
        self._set_status(
            pod, {"phase": "Pending", "conditions": [status_condition("PodScheduled", False, "Unschedulable", message)]}
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
                    status_condition("PodScheduled", True),
                    status_condition("Ready", False, "ContainersNotReady", "containers with unready status"),
                ],
                "containerStatuses": container_statuses(pod, ready=False, waiting=waiting),
            },
        )
