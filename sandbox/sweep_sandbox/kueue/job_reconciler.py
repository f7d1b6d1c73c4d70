"""Kueue's job reconciler for RayJobs (jobframework ReconcileGenericJob): a Workload for each suspended RayJob with a
queue name, the RayJob started on admission and stopped on eviction, the Workload finished with its job."""

from __future__ import annotations

from ..controllers import WorkQueue
from .client import KueueClient
from .crds import (
    API_VERSION,
    GROUP,
    JOB_UID_LABEL,
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    RAY_GROUP,
    RAY_VERSION,
    VERSION,
    Obj,
)
from .rayjob_integration import pod_sets_for, rayjob_active, rayjob_finished, workload_name
from .workloads import condition_of, is_true, set_condition, workload_condition


class RayJobReconciler:
    """One RayJob at a time; `queue` takes ("schedule",) when quota may have changed hands."""

    def __init__(self, client: KueueClient, queue: WorkQueue, poll_interval: float) -> None:
        self.client = client
        self.queue = queue
        self.poll_interval = poll_interval

    def reconcile(self, namespace: str, name: str) -> float | None:
        rayjob = self.client.rayjobs.get(namespace, name)
        if rayjob is None or rayjob["metadata"].get("deletionTimestamp"):
            return None  # the Workload goes with its owner (ownerReference GC)
        queue = (rayjob["metadata"].get("labels") or {}).get(QUEUE_LABEL, "")
        spec = rayjob.get("spec") or {}
        if not queue or spec.get("clusterSelector"):
            return None  # no queue name (manageJobsWithoutQueueName off), or RayJob.Skip
        wl = self.client.workload_for(rayjob)
        if wl is not None and is_true(wl, "Finished"):
            return None
        status = rayjob.get("status") or {}
        if wl is not None and status.get("jobDeploymentStatus") == "ValidationFailed":  # IsOnHold
            if is_true(wl, "QuotaReserved"):
                self.unset_reservation(wl, "OnHold", "Job is on hold")
            return None
        message, success, finished = rayjob_finished(rayjob)
        if finished:
            if wl is not None:
                conditions = set_condition(
                    list((wl.get("status") or {}).get("conditions") or []),
                    workload_condition(
                        "Finished",
                        True,
                        "Succeeded" if success else "Failed",
                        message or "Job finished",
                        wl["metadata"].get("generation"),
                    ),
                )
                self.client.patch_workload_status(wl, {"conditions": conditions})
                self.client.event(
                    rayjob,
                    "Normal",
                    "FinishedWorkload",
                    f"Workload '{namespace}/{wl['metadata']['name']}' is declared finished",
                )
            return None
        if wl is None:
            if rayjob_active(rayjob):
                if not spec.get("suspend"):  # step 8 without a Workload: stop it first
                    self.client.patch_rayjob(rayjob, {"suspend": True})
                return self.poll_interval  # "Job is suspended but still has active pods, waiting"
            self._create_workload(rayjob, queue)
            return None
        evicted = condition_of(wl, "Evicted")
        if evicted is not None and evicted.get("status") == "True":  # 6. handle eviction
            if not spec.get("suspend"):
                self.client.patch_rayjob(rayjob, {"suspend": True})
                self.client.event(rayjob, "Normal", "Stopped", evicted.get("message", ""))
                return None
            if is_true(wl, "QuotaReserved") and not rayjob_active(rayjob):
                # the job is no longer active (KubeRay: Suspended, its cluster gone): clear the admission
                requeued = evicted.get("reason") in ("Preempted", "NodeFailures")
                conditions = set_condition(
                    list(wl["status"].get("conditions") or []),
                    workload_condition(
                        "Requeued",
                        requeued,
                        evicted.get("reason", ""),
                        evicted.get("message", ""),
                        wl["metadata"].get("generation"),
                    ),
                )
                self.unset_reservation(wl, "PendingEvaluation", evicted.get("message", ""), conditions)
            return self.poll_interval if is_true(wl, "QuotaReserved") else None
        if spec.get("suspend"):  # 7. the job is suspended
            if is_true(wl, "Admitted"):
                cq = (wl["status"].get("admission") or {}).get("clusterQueue", "")
                self.client.patch_rayjob(rayjob, {"suspend": False})  # startJob -> RunWithPodSetsInfo
                self.client.event(rayjob, "Normal", "Started", f"Admitted by clusterQueue {cq}")
            return None
        if not is_true(wl, "Admitted"):  # 8. running but not admitted: suspend
            self.client.patch_rayjob(rayjob, {"suspend": True})
            self.client.event(rayjob, "Normal", "Stopped", "Not admitted by cluster queue")
        return None

    def _create_workload(self, rayjob: Obj, queue: str) -> None:
        """handleJobWithNoWorkload -> ConstructWorkload: pod sets, queue name, priority, job-uid label, controller
        ownerReference to the RayJob."""
        meta = rayjob["metadata"]
        body: Obj = {
            "apiVersion": API_VERSION,
            "kind": "Workload",
            "metadata": {
                "name": workload_name(rayjob),
                "namespace": meta["namespace"],
                "labels": {JOB_UID_LABEL: meta.get("uid", "")},
                "ownerReferences": [
                    {
                        "apiVersion": f"{RAY_GROUP}/{RAY_VERSION}",
                        "kind": "RayJob",
                        "name": meta["name"],
                        "uid": meta.get("uid", ""),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"podSets": pod_sets_for(rayjob), "queueName": queue, "active": True, "priority": 0},
        }
        priority_class = (meta.get("labels") or {}).get(PRIORITY_CLASS_LABEL, "")
        if priority_class:
            wpc = self.client.priority_classes.get("", priority_class)
            if wpc is None:
                raise self.client.ApiException(status=404, reason=f"workloadpriorityclass {priority_class} not found")
            body["spec"]["priority"] = int(wpc.get("value", 0))
            body["spec"]["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": priority_class}
        try:
            created = dict(
                self.client.custom.create_namespaced_custom_object(GROUP, VERSION, meta["namespace"], "workloads", body)
            )
        except self.client.ApiException as e:
            if e.status == 409:
                return
            raise
        self.client.workloads.remember(created)
        self.client.event(
            rayjob, "Normal", "CreatedWorkload", f"Created Workload: {meta['namespace']}/{body['metadata']['name']}"
        )
        self.queue.add(("schedule",))

    def unset_reservation(self, wl: Obj, reason: str, message: str, conditions: list[Obj] | None = None) -> Obj:
        """UnsetQuotaReservationWithCondition (+ SyncAdmittedCondition): QuotaReserved False, admission cleared,
        Admitted False / NoReservation."""
        conditions = list(conditions if conditions is not None else (wl.get("status") or {}).get("conditions") or [])
        generation = wl["metadata"].get("generation")
        conditions = set_condition(conditions, workload_condition("QuotaReserved", False, reason, message, generation))
        if condition_of({"status": {"conditions": conditions}}, "Admitted") is not None:
            conditions = set_condition(
                conditions,
                workload_condition("Admitted", False, "NoReservation", "The workload has no reservation", generation),
            )
        patched = self.client.patch_workload_status(wl, {"conditions": conditions, "admission": None})
        self.queue.add(("schedule",))
        return patched
