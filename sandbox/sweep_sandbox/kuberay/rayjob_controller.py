"""The RayJob state machine of the KubeRay stand-in (rayjob_controller.go Reconcile): validate, then one switch on
status.jobDeploymentStatus whose branches change the status in memory, written once at the end."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants

from ..controllers import Informer, Key, Obj, WorkQueue, resource_version
from ..kube_values import now_rfc3339, parse_rfc3339, random_suffix
from .builders import submission_mode
from .finished_rayjobs import FinishedRayJobs
from .options import KubeRayOptions
from .ray_api import RayApi
from .raycluster_controller import RayClusterController, ready_before_demand
from .rayjob_types import (
    APP_FAILED,
    DEADLINE_EXCEEDED,
    KUBERAY_MANAGED_BY,
    LABEL_CLUSTER,
    NOT_RETRIED,
    PRE_RUNNING_DEADLINE_EXCEEDED,
    RAYJOB_FINALIZER,
    SUBMISSION_FAILED,
    TERMINAL_JOB,
    VALIDATION_FAILED,
    Deployment,
    JobStatus,
)
from .rayjob_validation import validate_rayjob
from .runners import RunPhase
from .runs import RunRegistry
from .submitter_jobs import SubmitterJobs, job_condition


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


class RayJobController:
    """Reconciles one RayJob at a time; the RayCluster side, the submitter Job, the runs and what happens once a
    RayJob finished are its collaborators. `reading` records the resourceVersion each reconcile read (the stand-in
    keeps it as what "it has looked again" waits on)."""

    def __init__(
        self,
        api: RayApi,
        rayjobs: Informer,
        clusters: RayClusterController,
        submitters: SubmitterJobs,
        runs: RunRegistry,
        options: KubeRayOptions,
        queue: WorkQueue,
        reading: dict[Key, int],
    ) -> None:
        self.api = api
        self.rayjobs = rayjobs
        self.clusters = clusters
        self.submitters = submitters
        self.runs = runs
        self.options = options
        self.reading = reading
        self.finished = FinishedRayJobs(api, clusters, options, queue)

    def reconcile(self, key: Key) -> float | None:
        """One reconcile of one RayJob; returns when to look again (None: on the next change only)."""
        rayjob = self.rayjobs.get(*key)
        if rayjob is None:
            return None  # "RayJob resource not found": its cluster goes by ownerReference GC, the run with it
        self.reading[key] = resource_version(rayjob)
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
            return self.finished.reconcile(
                rayjob
            )  # returns before checkBackoffLimit: the counters move only on transitions
        else:
            return self.options.poll_interval  # "Unknown JobDeploymentStatus" (ValidationFailed after a fix lands here)
        if not proceed:
            return step.requeue_after
        _attempt_counts(step.status, spec)
        self._write_status(rayjob, original, step)
        return step.requeue_after if step.requeue_after is not None else self.options.poll_interval

    def _on_deleting(self, key: Key, rayjob: Obj) -> float | None:
        """The deletion branch: StopJob when jobStatus is not terminal, then drop ray.io/rayjob-finalizer, whatever
        other finalizers remain; no wait for anything. The cluster stays until the RayJob is gone (background GC)."""
        if (rayjob.get("status") or {}).get("jobStatus", "") not in TERMINAL_JOB:
            current = self.runs.current(key)
            if current is not None:
                current.stop()
        finalizers = rayjob["metadata"].get("finalizers") or []
        if RAYJOB_FINALIZER in finalizers:
            remaining = [f for f in finalizers if f != RAYJOB_FINALIZER]
            self.remember_rayjob(
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
        return self.remember_rayjob(patched)

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
        cluster = self.clusters.get_or_create(rayjob, step.status.get("rayClusterName", ""))
        if cluster is None:
            step.wake_in(self.options.poll_interval)
            return False
        if not status.get("dashboardURL"):
            cluster, wake = self.clusters.reconcile_for_job(key, rayjob, cluster)
            step.wake_in(wake)
            if (cluster.get("status") or {}).get("state") != "ready":
                status["rayClusterStatus"] = cluster.get("status") or {}
                return True
            url = self.clusters.dashboard_url(cluster)
            if url is None:  # FetchHeadServiceURL failed: the reconcile is retried
                step.wake_in(self.options.poll_interval)
                return True
            status["dashboardURL"] = url
        mode = submission_mode(spec)
        if mode == "InteractiveMode":
            status["jobDeploymentStatus"] = "Waiting"
            return True
        if mode == "K8sJobMode":
            self.submitters.ensure({**rayjob, "status": status}, cluster)
        status["jobDeploymentStatus"] = Deployment.RUNNING.value
        step.wake_in(0)
        return True

    def _waiting(self, rayjob: Obj, step: _Step) -> bool:
        """InteractiveMode: wait for spec.jobId (the pre-running deadline still applies)."""
        if self._deadline_passed(rayjob, step, "preRunningDeadlineSeconds", PRE_RUNNING_DEADLINE_EXCEEDED):
            return True
        job_id = (rayjob.get("spec") or {}).get("jobId")
        if not job_id:
            step.wake_in(self.options.poll_interval)
            return False
        step.status.update(jobId=job_id, jobDeploymentStatus=Deployment.RUNNING.value)
        return True

    def _running(self, key: Key, rayjob: Obj, step: _Step) -> bool:
        spec, status = rayjob.get("spec") or {}, step.status
        if self._to_suspending(spec, status):
            return True
        if self._deadline_passed(rayjob, step, "activeDeadlineSeconds", DEADLINE_EXCEEDED):
            return True  # the Ray job keeps running (KR#2314): only a cluster deletion or a RayJob deletion ends it
        cluster = self.clusters.get_or_create(
            rayjob, step.status.get("rayClusterName", "")
        )  # a cluster gone under a Running RayJob is recreated
        if cluster is None:
            step.wake_in(self.options.poll_interval)
            return False
        mode = submission_mode(spec)
        submitter: Obj | None = None
        if mode == "K8sJobMode":
            submitter = self.submitters.get(rayjob)
            if submitter is None:
                step.wake_in(self.options.poll_interval)  # checkSubmitterAndUpdateStatusIfNeeded: Get failed, requeue
                return False
            failed = job_condition(submitter, "Failed")
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
        run = self.runs.run_for(key, rayjob, cluster)
        poll = run.poll()
        phase = poll.phase
        if phase is RunPhase.STARTING and ready_before_demand(cluster, poll.pending_pods):
            # The driver runs on the head (Ray job RUNNING); the workers its trials ask for stay Pending
            cluster = self.clusters.autoscaler_demand(cluster, poll.pending_pods)
            phase = RunPhase.RUNNING
        elif phase is RunPhase.STARTING:
            # GetJobInfo: the Ray job is not on the cluster yet (not submitted, or the cluster is new): requeue
            step.wake_in(self.options.poll_interval if poll.recheck_after is None else poll.recheck_after)
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
            done = job_condition(submitter, "Complete")
            finished_at = (
                self.submitters.finish(submitter) if terminal else done and str(done.get("lastTransitionTime"))
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
        step.wake_in(self.options.poll_interval if poll.recheck_after is None else poll.recheck_after)
        return True

    def _release(self, key: Key, rayjob: Obj, step: _Step) -> bool:
        """Suspending / Retrying: delete the cluster and the submitter Job, wait until both are really gone (a
        finalizer on the cluster holds this branch), then reset the attempt's fields; Suspended, or New for a retry.
        startTime, endTime and the counters stay. The job is not stopped first (pods go with the cluster)."""
        cluster_gone = self.clusters.delete(rayjob, step.status.get("rayClusterName", ""))
        job_gone = self.submitters.delete(rayjob)
        if not (cluster_gone and job_gone):
            step.wake_in(self.options.poll_interval)
            return False
        self.runs.stop_run(key)
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

    def remember_rayjob(self, rayjob: Obj) -> Obj:
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
        self.remember_rayjob(
            self.api.patch(constants.RAYJOB_PLURAL, rayjob, {"status": patch}, status=True, guarded=True)
        )
