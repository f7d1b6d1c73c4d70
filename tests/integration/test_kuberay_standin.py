"""The KubeRay v1.7.0 stand-in on the emulator, one test per behaviour, each naming the KubeRay source it models.

RJ = ray-operator/controllers/ray/rayjob_controller.go, RC = raycluster_controller.go, V = utils/validation.go,
all at tag v1.7.0 (commit 59d663aeec13760646da3db9c1cf8cfe883e30b7). docs/kuberay-conformance.md maps them.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_sandbox.emulator import EmulatorServer
from sweep_sandbox.kuberay import (
    RAYJOB_FINALIZER,
    KubeRayStandIn,
    Outcome,
    PendingReason,
    ScriptedRun,
    ScriptedRunner,
)
from tests.support import standins
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

RAY = (constants.RAY_GROUP, constants.RAY_VERSION_API)
CLUSTER_NAME = re.compile(r"^(?P<rayjob>.+)-[bcdfghjklmnpqrstvwxz2456789]{5}$")  # KubeRay: <rayjob>-<5 chars>


# The emulator, runner and stand-in fixtures the Kueue stand-in's tests use too (tests/support/standins.py).
server = standins.emulator()
runner = standins.scripted_runner(Outcome.succeed(0.2))
standin = standins.kuberay()
_clear_injected_errors = standins.clear_injected_errors()
ns = standins.namespace("k-")
custom = standins.kube_api("CustomObjectsApi")
core = standins.kube_api("CoreV1Api")


def rayjob_body(name: str, *, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A RayJob shaped like the renderer's: sweep labels, a head and a GPU worker group."""
    template = {
        "metadata": {"labels": {constants.LABEL_SWEEP: "s1"}},
        "spec": {"containers": [{"name": "ray-head", "image": "trainer:1"}]},
    }
    worker = {
        "metadata": {"labels": {constants.LABEL_SWEEP: "s1"}},
        "spec": {
            "containers": [
                {"name": "ray-worker", "image": "trainer:1", "resources": {"limits": {constants.GPU_RESOURCE: 1}}}
            ]
        },
    }
    return {
        "apiVersion": constants.RAY_API_VERSION,
        "kind": constants.RAYJOB_KIND,
        "metadata": {
            "name": name,
            "labels": {constants.LABEL_SWEEP: "s1", constants.LABEL_RUN_ID: "r1"},
            "annotations": {"note": "copied"} if annotations is None else annotations,
        },
        "spec": {
            "entrypoint": constants.ENTRYPOINT_COMMAND,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 0,
            "rayClusterSpec": {
                "rayVersion": constants.SUPPORTED_RAY_VERSION,
                "headGroupSpec": {"rayStartParams": {}, "template": template},
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": 2,
                        "minReplicas": 0,
                        "maxReplicas": 4,
                        "rayStartParams": {},
                        "template": worker,
                    }
                ],
            },
            **spec,
        },
    }


class Cluster:
    """Reads for one namespace: the RayJob, its clusters, pods and events."""

    def __init__(self, custom: Any, core: Any, server: EmulatorServer, ns: str) -> None:
        self.custom, self.core, self.server, self.ns = custom, core, server, ns
        self.standin: KubeRayStandIn | None = None

    def submit(self, name: str, **spec: Any) -> dict[str, Any]:
        return dict(self.custom.create_namespaced_custom_object(*RAY, self.ns, "rayjobs", rayjob_body(name, **spec)))

    def patch(self, plural: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.custom.patch_namespaced_custom_object(*RAY, self.ns, plural, name, body))

    def delete(self, plural: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(*RAY, self.ns, plural, name)

    def guard(self, cluster: str) -> None:
        """Put the checkpoint guard's finalizer on a RayCluster, as the operator does."""
        self.patch("rayclusters", cluster, {"metadata": {"finalizers": [constants.FINALIZER]}})

    def release(self, plural: str, name: str) -> None:
        self.patch(plural, name, {"metadata": {"finalizers": None}})

    def states(self, name: str) -> list[dict[str, Any]]:
        """Every status the RayJob has had, oldest first."""
        return [dict(s.get("status") or {}) for s in self.server.history(*RAY, "rayjobs", self.ns, name)]

    def job(self, name: str) -> Any:
        import kubernetes.client

        return kubernetes.client.BatchV1Api(self.server.api_client()).read_namespaced_job(name, self.ns)

    def rayjob(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(*RAY, self.ns, "rayjobs", name))

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.rayjob(name).get("status") or {})

    def until(self, name: str, deployment: str, timeout: float = 10.0) -> dict[str, Any]:
        return dict(
            wait_for(
                lambda: (s := self.status(name)).get("jobDeploymentStatus") == deployment and s,
                timeout,
                what=f"RayJob {name} to be {deployment}",
            )
        )

    def clusters(self, rayjob: str | None = None) -> list[dict[str, Any]]:
        selector = f"{constants.RAY_LABEL_ORIGINATED_FROM_CR_NAME}={rayjob}" if rayjob else ""
        return list(
            self.custom.list_namespaced_custom_object(*RAY, self.ns, "rayclusters", label_selector=selector)["items"]
        )

    def cluster(self, name: str) -> dict[str, Any] | None:
        found = [c for c in self.clusters() if c["metadata"]["name"] == name]
        return found[0] if found else None

    def events(self, **selector: str) -> list[Any]:
        fields = ",".join(f"{k}={v}" for k, v in selector.items())
        return list(self.core.list_namespaced_event(self.ns, field_selector=fields).items)

    def event_after(self, name: str, reason: str) -> Any:
        """The one Event `reason` on `name`, waited for: KubeRay records it after the write it reports
        (rayjob_controller.go deleteClusterResources / suspendWorkerGroups: r.Delete or r.Update, then
        r.Recorder.Eventf), so a test that saw the write may look before the Event exists."""
        selector = {"involvedObject.name": name, "reason": reason}
        (event,) = wait_for(lambda: (e := self.events(**selector)) and e, 10, what=f"the {reason} Event")
        return event

    def deployments(self, name: str) -> list[str]:
        """Every jobDeploymentStatus the RayJob has had, in order (from the emulator's change log)."""
        seen: list[str] = []
        for state in self.server.history(*RAY, "rayjobs", self.ns, name):
            deployment = (state.get("status") or {}).get("jobDeploymentStatus", "")
            if not seen or seen[-1] != deployment:
                seen.append(deployment)
        return seen


@pytest.fixture
def kube(custom: Any, core: Any, server: EmulatorServer, ns: str, standin: KubeRayStandIn) -> Cluster:
    cluster = Cluster(custom, core, server, ns)
    cluster.standin = standin
    return cluster


def kube_standin(kube: Cluster) -> KubeRayStandIn:
    assert kube.standin is not None
    return kube.standin


@pytest.fixture
def quiet() -> Iterator[Cluster]:
    """A server of its own, for tests that run their own stand-in (the shared one would reconcile too)."""
    import kubernetes.client

    with EmulatorServer() as own:
        api = own.api_client()
        yield Cluster(kubernetes.client.CustomObjectsApi(api), kubernetes.client.CoreV1Api(api), own, "default")


def runs_of(runner: ScriptedRunner, kube: Cluster, name: str) -> list[ScriptedRun]:
    return [r for r in runner.runs if r.rayjob_key == (kube.ns, name)]


def looked_again(standin: KubeRayStandIn, kube: Cluster, name: str) -> None:
    """Wait until the stand-in has reconciled the RayJob as it is now: touch it (an annotation KubeRay ignores) and
    wait for a finished reconcile that read that version or a newer one (a "nothing happens" check, not a sleep)."""
    touched = kube.patch("rayjobs", name, {"metadata": {"annotations": {"test/touch": uuid.uuid4().hex}}})
    version = int(touched["metadata"]["resourceVersion"])
    wait_for(lambda: standin.reconciled.get((kube.ns, name), 0) >= version, 10, what=f"a reconcile of {name}")


# ---- the happy path, the RayCluster KubeRay builds, its Events


def test_rayjob_walks_new_initializing_running_complete(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ Reconcile (New -> Initializing -> Running -> Complete), initRayJobStatusIfNeed (jobId, rayClusterName,
    startTime), updateRayJobStatus (endTime on Complete), checkBackoffLimitAndUpdateStatusIfNeeded (succeeded)."""
    # KubeRay reads the job's status only when it reconciles (every 3 s while Running, here every 0.1 s): a phase
    # shorter than a reconcile's delay on a busy machine is never seen, as on a real cluster (CI once saw a 0.2 s
    # PENDING and a 0.3 s RUNNING both missed). Each lasts long enough here to be seen.
    runner.script("walk", Outcome.succeed(1.5, submit=1.0))
    kube.submit("walk")
    status = kube.until("walk", "Complete")
    assert kube.deployments("walk") == ["", "Initializing", "Running", "Complete"]
    assert status["jobStatus"] == "SUCCEEDED" and status["succeeded"] == 1 and status["failed"] == 0
    assert "reason" not in status  # JobFailedReason "" is omitempty
    assert status["startTime"] <= status["endTime"] and status["jobId"].startswith("walk-")
    assert CLUSTER_NAME.match(status["rayClusterName"])["rayjob"] == "walk"
    assert status["dashboardURL"] == f"{status['rayClusterName']}-head-svc.{kube.ns}.svc.cluster.local:8265"
    assert set(status["rayJobInfo"]) == {"startTime", "endTime"}
    job_statuses = [s.get("jobStatus") for s in kube.states("walk")]
    assert "PENDING" in job_statuses and "RUNNING" in job_statuses
    assert RAYJOB_FINALIZER in kube.rayjob("walk")["metadata"]["finalizers"]
    assert "conditions" not in status  # a v1.7.0 RayJob has no status.conditions


def test_raycluster_is_named_labelled_annotated_and_owned_like_kuberay(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ constructRayClusterForRayJob: maps.Copy of the RayJob's labels and of ALL its annotations (v1.7.0 lines
    998-1005), ray.io/originated-from-cr-name, ray.io/originated-from-crd=RayJob, ray.io/job-submission-mode,
    spec = rayClusterSpec, ctrl.SetControllerReference; getOrCreateRayClusterInstance's CreatedRayCluster Event."""
    runner.script("owned", Outcome.hang())
    guard_facts = {
        "sweeps.dev/run-root": "s3://b/sweeps/ns/s1-r1",
        "sweeps.dev/endpoint": "http://127.0.0.1:9000",
        "sweeps.dev/region": "eu-west-1",
        "sweeps.dev/verify": "true",
    }
    body = rayjob_body("owned", annotations=guard_facts)
    rayjob = dict(kube.custom.create_namespaced_custom_object(*RAY, kube.ns, "rayjobs", body))
    status = kube.until("owned", "Running")
    cluster = kube.cluster(status["rayClusterName"])
    assert cluster is not None
    labels = cluster["metadata"]["labels"]
    assert labels[constants.LABEL_SWEEP] == "s1" and labels[constants.LABEL_RUN_ID] == "r1"  # copied
    assert labels[constants.RAY_LABEL_ORIGINATED_FROM_CRD] == "RayJob"
    assert labels[constants.RAY_LABEL_ORIGINATED_FROM_CR_NAME] == "owned"
    assert labels["ray.io/job-submission-mode"] == "K8sJobMode"  # the CRD's default for submissionMode
    assert cluster["metadata"]["annotations"] == guard_facts
    (owner,) = cluster["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "name": "owned",
        "uid": rayjob["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert cluster["spec"] == rayjob["spec"]["rayClusterSpec"]
    assert cluster["status"]["state"] == "ready"
    (created,) = kube.events(**{"involvedObject.name": "owned", "reason": "CreatedRayCluster"})
    assert created.message == f"Created RayCluster {kube.ns}/{status['rayClusterName']}"


def test_kuberay_events_have_the_events_api_shape(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ/RC `r.Recorder.Eventf(obj, nil, type, reason, action, note)` through mgr.GetEventRecorder (client-go
    tools/events): reportingComponent rayjob-controller, an action, an eventTime, no legacy source."""
    runner.script("evented", Outcome.hang())
    kube.submit("evented")
    kube.until("evented", "Running")
    (created,) = kube.events(**{"involvedObject.name": "evented", "reason": "CreatedRayCluster"})
    assert (created.type, created.action, created.reporting_component) == ("Normal", "Create", "rayjob-controller")
    assert created.reporting_instance.startswith("rayjob-controller-") and created.event_time is not None
    assert not (created.source and created.source.component)
    assert (
        created.involved_object.kind == "RayJob"
        and created.involved_object.uid == kube.rayjob("evented")["metadata"]["uid"]
    )


def test_submitter_job_in_k8s_job_mode(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ createK8sJobIfNeed / createNewK8sJob / getSubmitterTemplate: a batch/v1 Job named as the RayJob, owned by
    it, backoffLimit 2 unless submitterConfig says, KubeRay's labels, RAY_JOB_SUBMISSION_ID; the RayJob completes
    only once the Ray job is terminal and the submitter finished (Running branch, isJobTerminal && finishedAt)."""
    runner.script("submit", Outcome.succeed(0.2))
    rayjob = kube.submit("submit", submitterConfig={"backoffLimit": 1})
    status = kube.until("submit", "Complete")
    job = kube.job("submit")
    assert job.spec.backoff_limit == 1
    assert job.metadata.labels == {
        "ray.io/originated-from-cr-name": "submit",
        "ray.io/originated-from-crd": "RayJob",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    (owner,) = job.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller) == (
        "RayJob",
        "submit",
        rayjob["metadata"]["uid"],
        True,
    )
    env = {e.name: e.value for e in job.spec.template.spec.containers[0].env}
    assert env["RAY_JOB_SUBMISSION_ID"] == status["jobId"] and env["RAY_DASHBOARD_ADDRESS"] == status["dashboardURL"]
    assert {c.type for c in job.status.conditions if c.status == "True"} >= {"Complete"}
    (created,) = kube.events(**{"involvedObject.name": "submit", "reason": "CreatedRayJobSubmitter"})
    assert created.message == f"Created Kubernetes Job {kube.ns}/submit"


# ---- startTime, counters, retries (backoffLimit)


def test_start_time_is_set_per_attempt_and_kept_through_retrying(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ initRayJobStatusIfNeed sets status.startTime at New -> Initializing, once per attempt; the Retrying branch
    (shared with Suspending) resets jobId, rayClusterName, reason, message but not startTime."""
    runner.script("clock", Outcome.fail(1.2), Outcome.succeed(0.1))
    kube.submit("clock", backoffLimit=1)
    kube.until("clock", "Complete")
    states = kube.states("clock")
    deployments = [s.get("jobDeploymentStatus", "") for s in states]
    first = states[deployments.index("Initializing")]["startTime"]
    retry = deployments.index("Retrying")
    second = deployments.index("Initializing", retry)
    between = states[retry:second]  # Retrying, then New (jobDeploymentStatus "" is omitted)
    assert [s.get("jobDeploymentStatus", "") for s in between] == ["Retrying", ""]
    assert all(s["startTime"] == first for s in between)
    assert between[0]["reason"] == "AppFailed" and between[0]["failed"] == 1
    assert all(k not in between[1] for k in ("jobId", "rayClusterName", "reason", "message", "jobStatus"))
    assert states[second]["startTime"] > first  # the second attempt has its own startTime


def test_backoff_limit_retries_each_attempt_on_a_new_cluster(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ checkBackoffLimitAndUpdateStatusIfNeeded (Failed with failed < backoffLimit+1 -> Retrying; failed and
    succeeded counted on the transition only); Retrying branch -> New; initRayJobStatusIfNeed: a new cluster name."""
    runner.script("flaky", Outcome.fail(0.1), Outcome.fail(0.1), Outcome.succeed(0.1))
    kube.submit("flaky", backoffLimit=2)
    status = kube.until("flaky", "Complete")
    assert (status["failed"], status["succeeded"]) == (2, 1)
    assert kube.deployments("flaky") == [
        "",
        "Initializing",
        "Running",
        "Retrying",
        "",
        "Initializing",
        "Running",
        "Retrying",
        "",
        "Initializing",
        "Running",
        "Complete",
    ]
    names = [s.get("rayClusterName") for s in kube.states("flaky")]
    assert len(set(names) - {None}) == 3  # one cluster per attempt
    assert [r.attempt for r in runs_of(runner, kube, "flaky")] == [0, 1, 2]
    counts = [(s.get("failed"), s.get("succeeded")) for s in kube.states("flaky") if "failed" in s]
    assert counts == sorted(counts)  # the counters never go back


def test_failure_beyond_the_backoff_limit_is_final(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ checkBackoffLimitAndUpdateStatusIfNeeded: the attempt that makes failed == backoffLimit+1 stays Failed."""
    runner.script("broken", Outcome.fail(0.05, "Traceback: boom"))
    kube.submit("broken", backoffLimit=1)
    status = wait_for(lambda: (s := kube.status("broken")).get("failed") == 2 and s, 10, what="two failed attempts")
    assert status["jobDeploymentStatus"] == "Failed" and status["jobStatus"] == "FAILED"
    assert status["reason"] == "AppFailed" and status["message"] == "Traceback: boom"


def test_a_stopped_ray_job_completes_the_rayjob(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ Running branch: IsJobTerminal(STOPPED) and the submitter finished -> Complete, reason empty (only FAILED
    makes Failed/AppFailed); `ray job stop` by someone is the run's stop() here. Operator: Complete + STOPPED."""
    runner.script("halted", Outcome.hang())
    kube.submit("halted")
    kube.until("halted", "Running")
    (run,) = runs_of(runner, kube, "halted")
    run.stop()
    status = kube.until("halted", "Complete")
    assert status["jobStatus"] == "STOPPED" and "reason" not in status
    assert (status["failed"], status["succeeded"]) == (0, 0)


def test_a_failed_submitter_job_fails_the_rayjob_with_submission_failed(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ checkSubmitterAndUpdateStatusIfNeeded / checkK8sJobStatus: the submitter Job's Failed condition makes the
    RayJob Failed, reason SubmissionFailed (AppFailed only if jobStatus was FAILED), message from the condition."""
    import kubernetes.client

    runner.script("unsent", Outcome.hang())
    kube.submit("unsent")
    kube.until("unsent", "Running")
    failed = {
        "type": "Failed",
        "status": "True",
        "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    kubernetes.client.BatchV1Api(kube.server.api_client()).patch_namespaced_job_status(
        "unsent", kube.ns, {"status": {"conditions": [failed], "failed": 3}}
    )
    status = kube.until("unsent", "Failed")
    assert status["reason"] == "SubmissionFailed"
    assert status["message"] == (
        "Job submission has failed. Reason: BackoffLimitExceeded. Message: Job has reached the specified backoff limit"
    )


def test_default_backoff_limit_zero_never_retries(kube: Cluster, runner: ScriptedRunner) -> None:
    """The CRD defaults spec.backoffLimit to 0; RJ checkBackoffLimitAndUpdateStatusIfNeeded: 1 < 0+1 is false."""
    runner.script("once", Outcome.fail(0.05))
    kube.submit("once")
    status = kube.until("once", "Failed")
    assert status["failed"] == 1 and "Retrying" not in kube.deployments("once")


def test_retrying_waits_until_a_guarded_cluster_is_really_gone(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ Retrying branch: deleteClusterResources deletes once, then waits while the cluster has a deletionTimestamp
    (our guard's finalizer holds it); its pods, and so the run, keep going until the object is gone."""
    runner.script("held", Outcome.fail(1.5), Outcome.hang())
    kube.submit("held", backoffLimit=1)
    first = kube.until("held", "Running")["rayClusterName"]
    kube.guard(first)
    kube.until("held", "Retrying")
    held = wait_for(
        lambda: (c := kube.cluster(first)) and c["metadata"].get("deletionTimestamp") and c,
        10,
        what="KubeRay to delete the old cluster",
    )
    looked_again(kube_standin(kube), kube, "held")
    assert kube.status("held")["jobDeploymentStatus"] == "Retrying" and len(kube.clusters("held")) == 1
    assert held["metadata"]["finalizers"] == [constants.FINALIZER]
    kube.release("rayclusters", first)
    second = kube.until("held", "Running")["rayClusterName"]
    assert second != first and kube.cluster(first) is None
    assert [r.cluster_name for r in runs_of(runner, kube, "held")] == [first, second]


def test_pre_running_deadline_fails_an_attempt_and_is_retried(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ checkPreRunningDeadlineAndUpdateStatusIfNeeded (Initializing/Waiting): Failed/PreRunningDeadlineExceeded;
    checkBackoffLimitAndUpdateStatusIfNeeded excludes only DeadlineExceeded and JobStatusCheckTimeoutExceeded, so
    v1.7.0 DOES retry it (docs/KUBERAY-KUEUE.md says otherwise; the source decides)."""
    runner.script("late", Outcome.pending(PendingReason.INSUFFICIENT_GPU), Outcome.succeed(0.1))
    kube.submit("late", preRunningDeadlineSeconds=2, backoffLimit=1)  # startTime has whole seconds: margin
    status = kube.until("late", "Complete", timeout=15)
    assert (status["failed"], status["succeeded"]) == (1, 1)
    failed = next(s for s in kube.states("late") if s.get("jobDeploymentStatus") == "Retrying")
    assert failed["reason"] == "PreRunningDeadlineExceeded" and "jobStatus" not in failed
    assert failed["message"].startswith("The RayJob has passed the preRunningDeadlineSeconds. StartTime: ")


def test_pre_running_deadline_without_retries_is_final(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ checkPreRunningDeadlineAndUpdateStatusIfNeeded with backoffLimit 0: Failed, jobStatus still New (omitted)."""
    runner.script("never", Outcome.pending(PendingReason.INSUFFICIENT_GPU))
    kube.submit("never", preRunningDeadlineSeconds=1)
    status = kube.until("never", "Failed")
    assert status["reason"] == "PreRunningDeadlineExceeded" and "jobStatus" not in status
    assert kube.deployments("never") == ["", "Initializing", "Failed"]


# ---- deadlines


def test_active_deadline_fails_and_is_not_retried_and_does_not_stop_the_job(
    kube: Cluster, runner: ScriptedRunner
) -> None:
    """RJ checkActiveDeadlineAndUpdateStatusIfNeeded: Failed/DeadlineExceeded from this attempt's startTime;
    checkBackoffLimitAndUpdateStatusIfNeeded never retries it; nothing stops the Ray job (KR#2314): jobStatus stays
    RUNNING and the run goes on while the cluster exists (shutdownAfterJobFinishes false keeps it)."""
    runner.script("slow", Outcome.hang())
    kube.submit("slow", activeDeadlineSeconds=1, backoffLimit=2, shutdownAfterJobFinishes=False)
    status = kube.until("slow", "Failed")
    assert status["reason"] == "DeadlineExceeded" and "activeDeadlineSeconds" in status["message"]
    assert status["failed"] == 1 and status["jobStatus"] == "RUNNING"
    looked_again(kube_standin(kube), kube, "slow")
    (run,) = runs_of(runner, kube, "slow")
    assert not run.stopped and kube.cluster(status["rayClusterName"]) is not None
    assert kube.status("slow")["failed"] == 1  # the counters do not move after the transition


def test_deadline_then_shutdown_ends_the_job_only_when_the_cluster_is_gone(
    kube: Cluster, runner: ScriptedRunner
) -> None:
    """RJ checkActiveDeadlineAndUpdateStatusIfNeeded then handleShutdownAfterJobFinishes: the cluster is deleted
    ttlSecondsAfterFinished after endTime; with the guard's finalizer on it, its pods (the run) keep going."""
    runner.script("cut", Outcome.hang())
    kube.submit("cut", activeDeadlineSeconds=3)  # time to put the guard on first
    name = kube.until("cut", "Running")["rayClusterName"]
    kube.guard(name)
    kube.until("cut", "Failed")
    wait_for(
        lambda: (c := kube.cluster(name)) and c["metadata"].get("deletionTimestamp"),
        10,
        what="the cluster to be deleted",
    )
    (run,) = runs_of(runner, kube, "cut")
    assert not run.stopped
    kube.release("rayclusters", name)
    wait_for(lambda: run.stopped, 10, what="the run to end with its cluster")
    assert kube.status("cut")["jobDeploymentStatus"] == "Failed"  # the RayJob itself stays


# ---- deletion


def test_deleting_a_guarded_rayjob_stops_the_job_at_once_and_drops_only_kuberays_finalizer(
    kube: Cluster, runner: ScriptedRunner
) -> None:
    """RJ Reconcile's deletion branch: StopJob when jobStatus is not terminal, RemoveFinalizer(ray.io/rayjob-finalizer)
    whatever other finalizers remain; the cluster stays until the RayJob is gone (background GC)."""
    runner.script("kept", Outcome.hang())
    body = rayjob_body("kept")
    body["metadata"]["finalizers"] = [constants.FINALIZER]
    kube.custom.create_namespaced_custom_object(*RAY, kube.ns, "rayjobs", body)
    name = kube.until("kept", "Running")["rayClusterName"]
    kube.delete("rayjobs", "kept")
    wait_for(
        lambda: kube.rayjob("kept")["metadata"]["finalizers"] == [constants.FINALIZER],
        5,
        what="KubeRay to drop only its own finalizer",
    )
    (run,) = runs_of(runner, kube, "kept")
    assert run.stopped  # at once, while our finalizer still holds the RayJob
    assert kube.cluster(name) is not None and "deletionTimestamp" not in kube.cluster(name)["metadata"]
    assert kube.status("kept")["jobDeploymentStatus"] == "Running"  # no status write after the deletion
    kube.release("rayjobs", "kept")
    wait_for(lambda: kube.cluster(name) is None, 10, what="the cluster to follow its released RayJob")


def test_deleting_a_rayjob_after_its_deadline_stops_the_still_running_job(
    kube: Cluster, runner: ScriptedRunner
) -> None:
    """RJ deletion branch: a DeadlineExceeded RayJob's jobStatus is still RUNNING (not terminal), so StopJob runs."""
    runner.script("overdue", Outcome.hang())
    kube.submit("overdue", activeDeadlineSeconds=1, shutdownAfterJobFinishes=False)
    kube.until("overdue", "Failed")
    (run,) = runs_of(runner, kube, "overdue")
    assert not run.stopped
    kube.delete("rayjobs", "overdue")
    wait_for(lambda: run.stopped, 10, what="StopJob on deletion")


def test_deleting_a_running_rayjob_removes_its_cluster_through_garbage_collection(
    kube: Cluster, runner: ScriptedRunner
) -> None:
    """RJ deletion branch then Kubernetes' background GC of the controller-owned RayCluster and submitter Job."""
    runner.script("doomed", Outcome.hang())
    kube.submit("doomed")
    name = kube.until("doomed", "Running")["rayClusterName"]
    kube.delete("rayjobs", "doomed")
    wait_for(lambda: kube.cluster(name) is None, 10, what="the cluster to follow its RayJob")
    assert runs_of(runner, kube, "doomed")[-1].stopped


# ---- a RayCluster with a deletionTimestamp


def test_a_deleting_raycluster_is_not_reconciled(kube: Cluster, runner: ScriptedRunner) -> None:
    """RC rayClusterReconcile: "RayCluster is being deleted, just ignore" (no pods, no status, no scaling) while a
    finalizer holds it; RJ getOrCreateRayClusterInstance still finds it, so the RayJob waits in Initializing."""
    runner.script("frozen", Outcome.succeed(0.1, startup=1.5))
    kube.submit("frozen")
    name = wait_for(
        lambda: (n := kube.status("frozen").get("rayClusterName")) and kube.cluster(n) and n, 10, what="the cluster"
    )
    kube.guard(name)
    kube.delete("rayclusters", name)
    (run,) = wait_for(lambda: runs_of(runner, kube, "frozen"), 10, what="the run")
    wait_for(lambda: run.poll().phase.value != "STARTING", 10, what="the run's cluster to be ready")
    looked_again(kube_standin(kube), kube, "frozen")
    cluster = kube.cluster(name)
    assert cluster is not None and (cluster.get("status") or {}).get("state") != "ready"
    assert kube.status("frozen")["jobDeploymentStatus"] == "Initializing"
    kube.release("rayclusters", name)
    assert kube.until("frozen", "Complete")["rayClusterName"] == name  # recreated under the same name


def test_a_cluster_deleted_under_a_running_rayjob_is_recreated_with_the_same_name(
    kube: Cluster, runner: ScriptedRunner
) -> None:
    """RJ Running branch -> getOrCreateRayClusterInstance: a missing cluster is created again (same
    status.rayClusterName); the submitter resubmits the job to it (the stand-in: a new run on the new cluster)."""
    runner.script("phoenix", Outcome.hang())
    kube.submit("phoenix")
    name = kube.until("phoenix", "Running")["rayClusterName"]
    old_uid = kube.cluster(name)["metadata"]["uid"]
    kube.delete("rayclusters", name)
    wait_for(lambda: (c := kube.cluster(name)) and c["metadata"]["uid"] != old_uid, 10, what="a new cluster")
    runs = wait_for(lambda: len(r := runs_of(runner, kube, "phoenix")) == 2 and r, 10, what="a second run")
    assert runs[0].stopped and not runs[1].stopped and runs[1].attempt == 0


# ---- shutdownAfterJobFinishes, ttlSecondsAfterFinished, deletionStrategy


def test_cluster_deletion_on_finish_is_held_by_a_finalizer_until_released(
    kube: Cluster, runner: ScriptedRunner
) -> None:
    """RJ handleShutdownAfterJobFinishes -> deleteClusterResources: a real delete, which the guard's finalizer holds;
    the RayJob stays Complete, its status unchanged."""
    runner.script("guarded", Outcome.succeed(1.5))
    kube.submit("guarded")
    name = kube.until("guarded", "Running")["rayClusterName"]
    kube.guard(name)
    done = kube.until("guarded", "Complete")
    held = wait_for(
        lambda: (c := kube.cluster(name)) and c["metadata"].get("deletionTimestamp") and c,
        10,
        what="KubeRay to delete the cluster",
    )
    assert held["metadata"]["finalizers"] == [constants.FINALIZER]
    deleted = kube.event_after("guarded", "DeletedRayCluster")
    assert deleted.message == f"Deleted cluster {kube.ns}/{name}" and deleted.action == "Delete"
    kube.release("rayclusters", name)
    wait_for(lambda: kube.cluster(name) is None, 5, what="the released cluster to go")
    assert kube.status("guarded") == done  # the RayJob is kept, rayClusterName and all


def test_ttl_seconds_after_finished_delays_cluster_deletion(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ handleShutdownAfterJobFinishes: shutdownTime = status.endTime + ttlSecondsAfterFinished."""
    runner.script("ttl", Outcome.succeed(0.05))
    kube.submit("ttl", ttlSecondsAfterFinished=2)
    name = kube.until("ttl", "Complete")["rayClusterName"]
    assert kube.cluster(name) is not None
    wait_for(lambda: kube.cluster(name) is None, 6, what="the cluster to go after its TTL")


def test_without_shutdown_after_job_finishes_the_cluster_stays(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ Complete/Failed branch: no deletionStrategy, no shutdownAfterJobFinishes -> nothing is deleted."""
    runner.script("keep", Outcome.succeed(0.05))
    kube.submit("keep", shutdownAfterJobFinishes=False)
    name = kube.until("keep", "Complete")["rayClusterName"]
    looked_again(kube_standin(kube), kube, "keep")
    assert kube.cluster(name) is not None
    assert not kube.events(**{"involvedObject.name": "keep", "reason": "DeletedRayCluster"})


def test_delete_rayjob_cr_after_job_finishes_deletes_the_rayjob_instead(quiet: Cluster) -> None:
    """RJ handleShutdownAfterJobFinishes with the operator's env DELETE_RAYJOB_CR_AFTER_JOB_FINISHES=true: the RayJob
    is deleted (its cluster follows by GC) instead of the cluster alone."""
    kube = quiet
    with KubeRayStandIn(
        kube.server.api_client(),
        ScriptedRunner(Outcome.succeed(0.05)),
        poll_interval=0.1,
        delete_rayjob_after_job_finishes=True,
    ):
        kube.submit("gone")
        name = wait_for(lambda: kube.status("gone").get("rayClusterName"), 10, what="the cluster name")
        wait_for(
            lambda: not kube.custom.list_namespaced_custom_object(*RAY, kube.ns, "rayjobs")["items"],
            10,
            what="the RayJob to be deleted",
        )
        wait_for(lambda: kube.cluster(name) is None, 10, what="its cluster to follow")


def test_deletion_rules_delete_the_cluster_on_success(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ handleDeletionRules / isDeletionRuleMatched / executeDeletionPolicy (feature gate RayJobDeletionPolicy is
    on by default in v1.7.0): a matching rule runs ttlSeconds after endTime; DeleteNone does nothing."""
    runner.script("rules", Outcome.succeed(0.05))
    rules = [
        {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 1}},
        {"policy": "DeleteSelf", "condition": {"jobStatus": "FAILED"}},
    ]
    kube.submit("rules", shutdownAfterJobFinishes=False, deletionStrategy={"deletionRules": rules})
    name = kube.until("rules", "Complete")["rayClusterName"]
    wait_for(lambda: kube.cluster(name) is None, 6, what="DeleteCluster after its ttlSeconds")
    assert kube.rayjob("rules")  # DeleteSelf's condition (FAILED) did not match


def test_deletion_rules_delete_self_on_failure(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ handleDeletionRules -> executeDeletionPolicy(DeleteSelf): the RayJob deletes itself."""
    runner.script("selfish", Outcome.fail(0.05))
    rules = [{"policy": "DeleteSelf", "condition": {"jobDeploymentStatus": "Failed"}}]
    kube.submit("selfish", shutdownAfterJobFinishes=False, deletionStrategy={"deletionRules": rules})
    wait_for(
        lambda: (
            not any(
                r["metadata"]["name"] == "selfish"
                for r in kube.custom.list_namespaced_custom_object(*RAY, kube.ns, "rayjobs")["items"]
            )
        ),
        10,
        what="the RayJob to delete itself",
    )


def test_deletion_rules_delete_workers_suspends_the_worker_groups(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ suspendWorkerGroups: every workerGroupSpecs[].suspend set to true on the RayCluster (UpdatedRayCluster)."""
    runner.script("lean", Outcome.succeed(0.05))
    rules = [{"policy": "DeleteWorkers", "condition": {"jobStatus": "SUCCEEDED"}}]
    kube.submit("lean", shutdownAfterJobFinishes=False, deletionStrategy={"deletionRules": rules})
    name = kube.until("lean", "Complete")["rayClusterName"]
    wait_for(
        lambda: all(g.get("suspend") for g in kube.cluster(name)["spec"]["workerGroupSpecs"]),
        10,
        what="the worker groups to be suspended",
    )
    updated = kube.event_after("lean", "UpdatedRayCluster")
    assert updated.message == f"Set the `suspend` field to true for all worker groups in cluster {kube.ns}/{name}"


def test_legacy_deletion_policy_deletes_the_cluster_on_success(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ handleLegacyDeletionPolicy: onSuccess / onFailure chosen by jobStatus, after the global
    ttlSecondsAfterFinished (0 here: a TTL needs shutdownAfterJobFinishes, which DeleteNone refuses)."""
    runner.script("legacy", Outcome.succeed(0.05))
    strategy = {"onSuccess": {"policy": "DeleteCluster"}, "onFailure": {"policy": "DeleteNone"}}
    kube.submit("legacy", shutdownAfterJobFinishes=False, deletionStrategy=strategy)
    name = kube.until("legacy", "Complete")["rayClusterName"]
    wait_for(lambda: kube.cluster(name) is None, 6, what="onSuccess DeleteCluster")
    assert kube.rayjob("legacy")


# ---- validation (ValidationFailed)


@pytest.mark.parametrize(
    ("name", "spec", "event", "message"),
    [
        (
            "rules-and-shutdown",
            {
                "deletionStrategy": {
                    "deletionRules": [{"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED"}}]
                }
            },
            "InvalidRayJobSpec",
            "The RayJob spec is invalid: spec.shutdownAfterJobFinishes and spec.deletionStrategy.deletionRules are mutually exclusive",
        ),
        (
            "ttl-without-shutdown",
            {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 5},
            "InvalidRayJobSpec",
            "The RayJob spec is invalid: a RayJob with shutdownAfterJobFinishes set to false cannot have TTLSecondsAfterFinished",
        ),
        (
            "suspend-without-shutdown",
            {"shutdownAfterJobFinishes": False, "suspend": True},
            "InvalidRayJobSpec",
            "The RayJob spec is invalid: a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended",
        ),
        (
            "legacy-delete-none",
            {"deletionStrategy": {"onSuccess": {"policy": "DeleteNone"}, "onFailure": {"policy": "DeleteCluster"}}},
            "InvalidRayJobSpec",
            "The RayJob spec is invalid: shutdownAfterJobFinshes is set to 'true' while deletion policy is 'DeleteNone'",
        ),
        (
            "rules-ttl-order",
            {
                "shutdownAfterJobFinishes": False,
                "deletionStrategy": {
                    "deletionRules": [
                        {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 10}},
                        {"policy": "DeleteSelf", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 5}},
                    ]
                },
            },
            "InvalidRayJobSpec",
            "for JobStatus 'SUCCEEDED': DeleteSelf TTL (5) must be >= DeleteCluster TTL (10)",
        ),
        (
            "a" * 48,
            {},
            "InvalidRayJobMetadata",
            "The RayJob metadata is invalid: RayJob name should be no more than 47 characters",
        ),
    ],
)
def test_invalid_rayjob_specs_fail_validation(
    kube: Cluster, name: str, spec: dict[str, Any], event: str, message: str
) -> None:
    """RJ Reconcile -> validateRayJob (V ValidateRayJobMetadata, ValidateRayJobSpec, validateDeletionConfiguration,
    validateDeletionRules, validateLegacyDeletionPolicies): jobDeploymentStatus ValidationFailed, reason
    ValidationFailed, message the error, a Warning Event (action Validate, note "<ns>/<name>: <error>"); validation
    runs before the New branch, so no finalizer, no cluster, no startTime."""
    kube.submit(name, **spec)
    status = kube.until(name, "ValidationFailed")
    assert (status["reason"], status["message"]) == ("ValidationFailed", message)
    assert "startTime" not in status and "endTime" not in status
    warning = wait_for(lambda: kube.events(**{"involvedObject.name": name, "reason": event}), 5, what="the Event")[0]
    assert (warning.type, warning.action, warning.message) == ("Warning", "Validate", f"{kube.ns}/{name}: {message}")
    assert RAYJOB_FINALIZER not in (kube.rayjob(name)["metadata"].get("finalizers") or [])
    assert not kube.clusters(name)


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("env-not-yaml", "env_vars: [unclosed", "runtimeEnvYAML is not YAML"),
        ("env-a-string", "just words", "runtimeEnvYAML must be a YAML mapping, not str"),
        ("env-a-list", "- env_vars", "runtimeEnvYAML must be a YAML mapping, not list"),
    ],
)
def test_a_runtime_env_that_is_not_a_yaml_mapping_fails_validation(
    kube: Cluster, name: str, text: str, words: str
) -> None:
    """V ValidateRayJobSpec -> utils/dashboardclient/dashboard_httpclient.go UnmarshalRuntimeEnvYAML (v1.7.0):
    sigs.k8s.io/yaml into RuntimeEnvType (map[string]any) fails for YAML that does not parse and for YAML that is
    not a mapping; the error is "failed to unmarshal RuntimeEnvYAML: <text>: <parser's words>" (the words here are
    the contract decoder's, sweep_contracts.runtime_env.decode), Event reason InvalidRayJobSpec."""
    kube.submit(name, runtimeEnvYAML=text)
    status = kube.until(name, "ValidationFailed")
    assert status["reason"] == "ValidationFailed"
    assert status["message"].startswith(f"failed to unmarshal RuntimeEnvYAML: {text}: {words}")
    warning = wait_for(
        lambda: kube.events(**{"involvedObject.name": name, "reason": "InvalidRayJobSpec"}), 5, what="the Event"
    )[0]
    assert warning.message == f"{kube.ns}/{name}: {status['message']}"
    assert not kube.clusters(name)


def test_a_runtime_env_mapping_passes_validation(kube: Cluster, runner: ScriptedRunner) -> None:
    """V ValidateRayJobSpec checks only that runtimeEnvYAML unmarshals into a map, not Ray's schema inside it."""
    kube.submit("env-ok", runtimeEnvYAML="env_vars:\n  A: '1'\nanything: [1, 2]\n")
    kube.until("env-ok", "Complete")


def test_a_spec_made_invalid_while_running_fails_validation_and_stays_failed(
    kube: Cluster, runner: ScriptedRunner
) -> None:
    """RJ Reconcile validates on every reconcile: a Running RayJob edited into an invalid spec goes ValidationFailed
    (its cluster and job left as they are); fixing the spec does not bring it back (the switch has no
    ValidationFailed case: "Unknown JobDeploymentStatus")."""
    runner.script("edited", Outcome.hang())
    kube.submit("edited")
    name = kube.until("edited", "Running")["rayClusterName"]
    kube.patch("rayjobs", "edited", {"spec": {"shutdownAfterJobFinishes": False, "suspend": True}})
    kube.until("edited", "ValidationFailed")
    kube.patch("rayjobs", "edited", {"spec": {"shutdownAfterJobFinishes": True, "suspend": False}})
    looked_again(kube_standin(kube), kube, "edited")
    assert kube.status("edited")["jobDeploymentStatus"] == "ValidationFailed"
    assert kube.cluster(name) is not None and not runs_of(runner, kube, "edited")[0].stopped


def test_a_rayjob_managed_by_another_controller_is_left_alone(kube: Cluster) -> None:
    """RJ Reconcile: utils.ManagedByExternalController(spec.managedBy) -> "Skipping RayJob managed by a custom
    controller": no finalizer, no status."""
    kube.submit("foreign", managedBy="kueue.x-k8s.io/multikueue")
    looked_again(kube_standin(kube), kube, "foreign")
    rayjob = kube.rayjob("foreign")
    assert not rayjob.get("status") or not rayjob["status"].get("jobDeploymentStatus")
    assert RAYJOB_FINALIZER not in (rayjob["metadata"].get("finalizers") or [])


# ---- suspend


def test_suspend_deletes_the_cluster_and_resume_starts_a_new_attempt(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ updateStatusToSuspendingIfNeeded (Running/Initializing only), the Suspending branch (delete the cluster and
    the submitter Job, wait, reset), Suspended -> New on unsuspend, initRayJobStatusIfNeed: a new jobId, cluster
    and startTime; the counters are kept."""
    runner.script("nap", Outcome.hang())
    kube.submit("nap")
    running = kube.until("nap", "Running")
    first = running["rayClusterName"]
    kube.patch("rayjobs", "nap", {"spec": {"suspend": True}})
    suspended = kube.until("nap", "Suspended")
    assert "rayClusterName" not in suspended and "jobId" not in suspended and kube.cluster(first) is None
    assert suspended["startTime"] == running["startTime"] and "jobStatus" not in suspended
    assert _job_gone(kube, "nap")  # Suspended only once the submitter Job is gone too (deleteSubmitterJob)
    kube.patch("rayjobs", "nap", {"spec": {"suspend": False}})
    resumed = kube.until("nap", "Running")
    assert resumed["rayClusterName"] != first and resumed["jobId"] != running["jobId"]
    assert (resumed["failed"], resumed["succeeded"]) == (0, 0)
    assert kube.deployments("nap")[-5:] == ["Suspending", "Suspended", "", "Initializing", "Running"]
    assert runs_of(runner, kube, "nap")[0].stopped  # ended with its cluster, not by the suspend itself


def _job_gone(kube: Cluster, name: str) -> bool:
    import kubernetes.client

    try:
        kube.job(name)
    except kubernetes.client.ApiException as e:
        return e.status == 404
    return False


def test_suspending_waits_for_a_guarded_cluster(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ Suspending branch: "Wait for the resources to be deleted before the status transitions": a finalizer on
    the cluster keeps the RayJob Suspending (and its pods running) until released."""
    runner.script("stalled", Outcome.hang())
    kube.submit("stalled")
    name = kube.until("stalled", "Running")["rayClusterName"]
    kube.guard(name)
    kube.patch("rayjobs", "stalled", {"spec": {"suspend": True}})
    kube.until("stalled", "Suspending")
    wait_for(lambda: kube.cluster(name)["metadata"].get("deletionTimestamp"), 5, what="the cluster deletion")
    looked_again(kube_standin(kube), kube, "stalled")
    assert kube.status("stalled")["jobDeploymentStatus"] == "Suspending"
    assert not runs_of(runner, kube, "stalled")[0].stopped
    kube.release("rayclusters", name)
    kube.until("stalled", "Suspended")


def test_a_rayjob_created_suspended_never_gets_a_cluster(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ New branch (finalizer, initRayJobStatusIfNeed: startTime) -> Initializing -> updateStatusToSuspendingIfNeeded
    -> Suspending (nothing to delete) -> Suspended: how Kueue submits a RayJob."""
    kube.submit("queued", suspend=True)
    status = kube.until("queued", "Suspended")
    assert kube.deployments("queued") == ["", "Initializing", "Suspending", "Suspended"]
    assert status["startTime"] and not kube.clusters("queued")
    assert not runs_of(runner, kube, "queued")


# ---- pending pods: what the operator's startup-deadline diagnosis reads (R6, R20)


def _pods(kube: Cluster, cluster: str) -> list[Any]:
    return list(kube.core.list_namespaced_pod(kube.ns, label_selector=f"ray.io/cluster={cluster}").items)


def _settled_pods(kube: Cluster, cluster: str, count: int) -> list[Any]:
    """The cluster's `count` pods once each carries the status the scheduler/kubelet gave it."""

    def settled() -> list[Any]:
        pods = _pods(kube, cluster)
        return pods if len(pods) == count and all(p.status.conditions for p in pods) else []

    return list(wait_for(settled, 10, what=f"{count} pods of {cluster} with their status"))


def test_pending_pods_show_insufficient_gpu_from_the_scheduler(kube: Cluster, runner: ScriptedRunner) -> None:
    """R6, R20: GPU workers stay Pending with PodScheduled=False and FailedScheduling events (kube-scheduler; the pod
    names and labels from RC reconcilePods/buildWorkerPod); RJ Initializing branch waits for state ready."""
    runner.script("gpu", Outcome.pending(PendingReason.INSUFFICIENT_GPU))
    kube.submit("gpu")
    name = kube.until("gpu", "Initializing")["rayClusterName"]
    pods = _settled_pods(kube, name, 3)
    workers = [p for p in pods if p.metadata.labels["ray.io/node-type"] == "worker"]
    head = [p for p in pods if p.metadata.labels["ray.io/node-type"] == "head"]
    assert len(workers) == 2 and len(head) == 1 and head[0].status.phase == "Running"
    for pod in workers:
        assert pod.metadata.labels["ray.io/group"] == "gpu" and pod.metadata.labels[constants.LABEL_SWEEP] == "s1"
        assert pod.metadata.name.startswith(f"{name}-gpu-worker-")
        assert pod.status.phase == "Pending"
        (scheduled,) = pod.status.conditions
        assert (scheduled.type, scheduled.status, scheduled.reason) == ("PodScheduled", "False", "Unschedulable")
        (event,) = kube.events(**{"involvedObject.name": pod.metadata.name})
        assert (event.type, event.reason, event.source.component) == (
            "Warning",
            "FailedScheduling",
            "default-scheduler",
        )
        assert event.message.startswith("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
        assert event.involved_object.uid == pod.metadata.uid
    assert kube.status("gpu")["jobDeploymentStatus"] == "Initializing"  # stuck until a deadline


def test_gpu_workers_autoscaled_from_zero_leave_the_rayjob_running(kube: Cluster, runner: ScriptedRunner) -> None:
    """RC calculateStatus: state ready once pods == desired workers + head and all run, and never taken back; with
    replicas 0 (an autoscaled group at minReplicas 0) the head alone makes the cluster ready, so RJ's Initializing
    branch goes Running and the Ray job (its driver on the head) is RUNNING while the GPU workers the autoscaler
    asks for stay Pending. The stand-in models the autoscaler's demand as pending pods, not as a replicas change."""
    runner.script("zero", Outcome.pending(PendingReason.INSUFFICIENT_GPU))
    body = rayjob_body("zero")
    body["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] = True
    body["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(replicas=0, minReplicas=0)
    kube.custom.create_namespaced_custom_object(*RAY, kube.ns, "rayjobs", body)
    status = wait_for(lambda: (s := kube.status("zero")).get("jobStatus") == "RUNNING" and s, 10, what="RUNNING")
    assert status["jobDeploymentStatus"] == "Running" and status["rayClusterStatus"]["state"] == "ready"
    (worker,) = [
        p for p in _settled_pods(kube, status["rayClusterName"], 2) if p.metadata.labels["ray.io/node-type"] == "worker"
    ]
    assert worker.status.phase == "Pending" and worker.status.conditions[0].reason == "Unschedulable"
    assert kube.cluster(status["rayClusterName"])["status"]["state"] == "ready"


def test_rayclusterspec_changes_on_the_rayjob_do_not_reach_the_cluster(kube: Cluster, runner: ScriptedRunner) -> None:
    """RJ getOrCreateRayClusterInstance: "Disregard changes in RayClusterSpec of RayJob": the cluster keeps the spec
    it was created with (a retry's new cluster takes the edited one)."""
    runner.script("edit", Outcome.hang())
    kube.submit("edit")
    name = kube.until("edit", "Running")["rayClusterName"]
    kube.patch(
        "rayjobs",
        "edit",
        {
            "spec": {
                "rayClusterSpec": {
                    "workerGroupSpecs": [
                        {**kube.rayjob("edit")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0], "replicas": 3}
                    ]
                }
            }
        },
    )
    looked_again(kube_standin(kube), kube, "edit")
    assert kube.cluster(name)["spec"]["workerGroupSpecs"][0]["replicas"] == 2


def test_pending_pods_show_image_pull_back_off_from_the_kubelet(kube: Cluster, runner: ScriptedRunner) -> None:
    """R6, R20: containers waiting in ImagePullBackOff, with ErrImagePull events (the kubelet, not KubeRay)."""
    runner.script("pull", Outcome.pending(PendingReason.IMAGE_PULL, workers=1))
    kube.submit("pull")
    name = kube.until("pull", "Initializing")["rayClusterName"]
    pods = _settled_pods(kube, name, 2)
    for pod in pods:
        (container,) = pod.status.container_statuses
        assert pod.status.phase == "Pending" and container.state.waiting.reason == "ImagePullBackOff"
        assert 'Back-off pulling image "trainer:1"' in container.state.waiting.message
    reasons = [e.message for e in kube.events(**{"involvedObject.name": pods[0].metadata.name})]
    assert "Error: ErrImagePull" in reasons and "Error: ImagePullBackOff" in reasons


def test_quota_refusal_shows_failed_create_events_on_the_cluster(kube: Cluster, runner: ScriptedRunner) -> None:
    """R6, R20: a ResourceQuota refuses the workers; RC createWorkerPod's FailedToCreateWorkerPod Event and
    calculateStatus's ReplicaFailure / RayClusterProvisioned=False conditions."""
    runner.script("quota", Outcome.pending(PendingReason.QUOTA))
    kube.submit("quota")
    name = kube.until("quota", "Initializing")["rayClusterName"]
    selector = {"involvedObject.name": name, "reason": "FailedToCreateWorkerPod"}
    events = wait_for(lambda: len(e := kube.events(**selector)) == 2 and e, 10, what="one refusal per worker")
    assert all("exceeded quota" in e.message for e in events)
    assert [p.metadata.labels["ray.io/node-type"] for p in _pods(kube, name)] == ["head"]
    conditions = {
        c["type"]: c for c in wait_for(lambda: (kube.cluster(name) or {}).get("status", {}).get("conditions"), 5)
    }
    assert conditions["RayClusterProvisioned"]["status"] == "False"
    assert "exceeded quota" in conditions["ReplicaFailure"]["message"]


def test_emulated_pods_run_once_the_cluster_is_ready(quiet: Cluster) -> None:
    """RC reconcilePods (head and workers), calculateStatus (state ready once they run); the pods go with the
    cluster by ownerReference GC."""
    kube = quiet
    # The job runs for seconds, not a blink: the pods are checked while they run, and the RayJob's Running is read
    # from the emulator's change log, so a loaded machine that polls late cannot miss either.
    runner = ScriptedRunner(Outcome.succeed(3.0, startup=0.3))
    with KubeRayStandIn(kube.server.api_client(), runner, poll_interval=0.1, emulate_pods=True):
        kube.submit("pods")
        name = kube.until("pods", "Initializing")["rayClusterName"]
        starting = _settled_pods(kube, name, 3)
        assert {p.status.phase for p in starting} == {"Pending"}
        running = wait_for(
            lambda: len(p := _pods(kube, name)) == 3 and {x.status.phase for x in p} == {"Running"} and p,
            10,
            what="the cluster's 3 pods to be Running",
        )
        assert {p.metadata.name for p in running} == {p.metadata.name for p in starting}  # the same pods, now running
        kube.until("pods", "Complete")
        assert kube.deployments("pods")[-3:] == ["Initializing", "Running", "Complete"]
        wait_for(lambda: not _pods(kube, name), 10, what="the pods to go with their cluster")


# ---- robustness and lifecycle


def test_injected_api_errors_are_retried_to_convergence(
    server: EmulatorServer, kube: Cluster, runner: ScriptedRunner
) -> None:
    """controller-runtime requeues a failed reconcile; RJ updateRayJobStatus / getOrCreateRayClusterInstance retry."""
    runner.script("bumpy", Outcome.succeed(0.1))
    server.emulator.errors.inject(
        500, times=3, verb="patch", plural="rayjobs", subresource="status", user_agent="kuberay-standin"
    )
    server.emulator.errors.inject(409, times=1, verb="create", plural="rayclusters", user_agent="kuberay-standin")
    kube.submit("bumpy")
    assert kube.until("bumpy", "Complete")["jobStatus"] == "SUCCEEDED"
    assert server.emulator.errors.pending == []


def test_standin_starts_and_stops_cleanly(quiet: Cluster) -> None:
    """The stand-in's own lifecycle (no KubeRay counterpart): stop() ends its threads and every run."""
    kube = quiet
    before = {t.ident for t in threading.enumerate()}
    runner = ScriptedRunner(Outcome.hang())
    standin = KubeRayStandIn(kube.server.api_client(), runner, namespace="default", poll_interval=0.1).start()
    kube.submit("idle")
    kube.until("idle", "Running")
    standin.stop()
    assert all(run.stopped for run in runner.runs)
    assert {t.ident for t in threading.enumerate() if t.is_alive()} <= before


def test_scripted_outcomes_are_keyed_by_rayjob_name_or_sweep_label() -> None:
    """The ScriptedRunner's seam (no KubeRay counterpart): attempt i is status.failed at the attempt's start."""
    runner = ScriptedRunner(Outcome.succeed())
    runner.script("s1", Outcome.fail(), Outcome.hang())
    labelled = {"metadata": {"name": "s1-abc", "labels": {constants.LABEL_SWEEP: "s1"}}}
    assert runner.outcome_for(labelled, 0).result == "fail"
    assert runner.outcome_for(labelled, 5).result == "hang"  # the last outcome repeats
    assert runner.outcome_for({"metadata": {"name": "other"}}, 0).result == "succeed"
