"""What KubeRay does with a RayJob that is Complete or Failed: its deletion strategy (rules or the legacy onSuccess /
onFailure policies) or shutdownAfterJobFinishes, each after its TTL from status.endTime; no status write."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sweep_contracts import constants

from ..controllers import Obj, WorkQueue
from ..kube_values import parse_rfc3339
from .options import KubeRayOptions
from .ray_api import RayApi
from .raycluster_controller import RayClusterController
from .rayjob_types import RAYCLUSTER_KEY


class FinishedRayJobs:
    """The finished branch of the RayJob controller; `queue` wakes the RayCluster controller for a suspended group."""

    def __init__(self, api: RayApi, clusters: RayClusterController, options: KubeRayOptions, queue: WorkQueue) -> None:
        self.api = api
        self.clusters = clusters
        self.options = options
        self.queue = queue

    def reconcile(self, rayjob: Obj) -> float | None:
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
        end = (rayjob.get("status") or {}).get("endTime")
        return parse_rfc3339(end).timestamp() if end else time.time()

    def _shutdown_after_job_finishes(self, rayjob: Obj) -> float | None:
        """handleShutdownAfterJobFinishes: ttlSecondsAfterFinished after status.endTime, delete the RayCluster once
        (the RayJob stays, Complete/Failed; with DELETE_RAYJOB_CR_AFTER_JOB_FINISHES=true the RayJob is deleted
        instead); no requeue after the delete (a held cluster is looked at again only on its own changes)."""
        ttl = int((rayjob.get("spec") or {}).get("ttlSecondsAfterFinished") or 0)
        remaining = self._end_time(rayjob) + ttl - time.time()
        if remaining > 0:
            return remaining + 0.01
        if self.options.delete_rayjob_after_job_finishes:
            self._delete_rayjob(rayjob)
        else:
            self.clusters.delete(rayjob, (rayjob.get("status") or {}).get("rayClusterName", ""))
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
            self.clusters.delete(rayjob, (rayjob.get("status") or {}).get("rayClusterName", ""))
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
        self.clusters.rayclusters.remember(updated)
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
