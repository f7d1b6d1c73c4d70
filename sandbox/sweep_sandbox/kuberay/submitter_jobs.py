"""The submitter Job of a RayJob in K8sJobMode (rayjob_controller.go createK8sJobIfNeed, deleteSubmitterJob), and
what the Job controller and the kubelet make of it when the stand-in emulates pods."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ..container_logs import ContainerLogs
from ..controllers import Key, Obj
from ..kube_values import now_rfc3339
from ..submitter_pods import SubmitterPods
from .builders import status_condition, submission_mode, submitter_job_for
from .options import KubeRayOptions
from .ray_api import RayApi
from .runs import RunRegistry


class SubmitterJobs:
    """`api` writes as KubeRay; `cluster_api` as the cluster's own controllers (the Job controller and the kubelet:
    the submitter's pod and the Job's status), whom RBAC grants what it does not grant KubeRay."""

    def __init__(
        self,
        api: RayApi,
        cluster_api: RayApi,
        runs: RunRegistry,
        options: KubeRayOptions,
        container_logs: ContainerLogs | None,
    ) -> None:
        self.api = api
        self.cluster_api = cluster_api
        self.runs = runs
        self.options = options
        # The submitter Job's pod under `emulate_pods`; its log (the emulator's `container_logs`) is the driver's
        self.pods = SubmitterPods(cluster_api.core, container_logs)
        self._done: set[tuple[str, str]] = set()  # (Job uid, step) done once each
        self._lock = threading.Lock()

    def _job_path(self, rayjob: Obj) -> str:
        meta = rayjob["metadata"]
        return f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs/{meta['name']}"

    def get(self, rayjob: Obj) -> Obj | None:
        try:
            return self.api.core("GET", self._job_path(rayjob))
        except self.api.ApiException as e:
            if e.status == 404:
                return None
            raise

    def ensure(self, rayjob: Obj, cluster: Obj) -> None:
        """createK8sJobIfNeed: create the submitter Job unless one of that name exists. Under `emulate_pods` the
        Job controller's pod follows, its log the driver's output."""
        meta = rayjob["metadata"]
        existing = self.get(rayjob)
        if existing is not None:
            self._start_pod(existing, (meta["namespace"], meta["name"]))
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
        self._start_pod(created, (meta["namespace"], meta["name"]))

    def _start_pod(self, job: Obj, key: Key) -> None:
        if not self._pod_once(job, "start"):
            return
        try:
            self.pods.start(job, lambda: self.runs.driver_log(key))
        except BaseException:
            with self._lock:  # the next reconcile tries again
                self._done.discard((str(job["metadata"].get("uid")), "start"))
            raise

    def finish(self, job: Obj) -> str:
        """What the Job controller records when the submitter pod exits 0; returns the Complete condition's time."""
        if self._pod_once(job, "succeed"):
            self.pods.succeed(job)
        done = job_condition(job, "Complete")
        if done is not None:
            return str(done.get("lastTransitionTime", ""))
        now = now_rfc3339()
        meta = job["metadata"]
        status = {
            "succeeded": 1,
            "startTime": (job.get("status") or {}).get("startTime") or now,
            "completionTime": now,
            "conditions": [
                status_condition(
                    "SuccessCriteriaMet", True, "CompletionsReached", "Reached expected number of succeeded pods"
                ),
                status_condition("Complete", True, "CompletionsReached", "Reached expected number of succeeded pods"),
            ],
        }
        self.cluster_api.core(
            "PATCH",
            f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs/{meta['name']}/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )
        return now

    def delete(self, rayjob: Obj) -> bool:
        """deleteSubmitterJob: HTTPMode and SidecarMode have none; else delete it (Background) and wait until gone."""
        if submission_mode(rayjob.get("spec") or {}) in ("HTTPMode", "SidecarMode"):
            return True
        job = self.get(rayjob)
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

    def _pod_once(self, job: Obj, step: str) -> bool:
        mark = (str(job["metadata"].get("uid")), step)
        with self._lock:
            if not self.options.emulate_pods or mark in self._done:
                return False
            self._done.add(mark)
        return True


def job_condition(job: Mapping[str, Any], type_: str) -> Obj | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            return dict(condition)
    return None
