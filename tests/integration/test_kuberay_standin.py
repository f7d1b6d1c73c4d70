"""The KubeRay v1.7 stand-in on the emulator: RayJob/RayCluster lifecycle, deadlines, retries, cleanup, pending pods."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sweep_operator import constants
from sweep_operator.sandbox.emulator import EmulatorServer, wait_for
from sweep_operator.sandbox.kuberay import (
    RAYJOB_FINALIZER,
    KubeRayStandIn,
    Outcome,
    PendingReason,
    ScriptedRunner,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

RAY = (constants.RAY_GROUP, constants.RAY_VERSION_API)
CLUSTER_NAME = re.compile(r"^(?P<rayjob>.+)-[bcdfghjklmnpqrstvwxz2456789]{5}$")  # KubeRay: <rayjob>-<5 chars>


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    with EmulatorServer() as running:
        yield running


@pytest.fixture(scope="module")
def runner() -> ScriptedRunner:
    return ScriptedRunner(default=Outcome.succeed(0.2))


@pytest.fixture(scope="module")
def standin(server: EmulatorServer, runner: ScriptedRunner) -> Iterator[KubeRayStandIn]:
    with KubeRayStandIn(server.api_client(), runner, poll_interval=0.1) as running:
        yield running


@pytest.fixture(autouse=True)
def _clear_injected_errors(server: EmulatorServer) -> Iterator[None]:
    yield
    server.emulator.errors.clear()


@pytest.fixture
def ns() -> str:
    return f"k-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def custom(server: EmulatorServer) -> Any:
    import kubernetes.client

    return kubernetes.client.CustomObjectsApi(server.api_client())


@pytest.fixture
def core(server: EmulatorServer) -> Any:
    import kubernetes.client

    return kubernetes.client.CoreV1Api(server.api_client())


def rayjob_body(name: str, **spec: Any) -> dict[str, Any]:
    """A RayJob shaped like the renderer's: sweep labels, a head and a GPU worker group."""
    template = {"metadata": {"labels": {constants.LABEL_SWEEP: "s1"}},
                "spec": {"containers": [{"name": "ray-head", "image": "trainer:1"}]}}
    worker = {"metadata": {"labels": {constants.LABEL_SWEEP: "s1"}}, "spec": {"containers": [
        {"name": "ray-worker", "image": "trainer:1", "resources": {"limits": {constants.GPU_RESOURCE: 1}}}]}}
    return {
        "apiVersion": constants.RAY_API_VERSION,
        "kind": constants.RAYJOB_KIND,
        "metadata": {"name": name, "labels": {constants.LABEL_SWEEP: "s1", constants.LABEL_RUN_ID: "r1"},
                     "annotations": {"note": "copied"}},
        "spec": {
            "entrypoint": constants.ENTRYPOINT_COMMAND,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 0,
            "rayClusterSpec": {
                "rayVersion": constants.SUPPORTED_RAY_VERSION,
                "headGroupSpec": {"rayStartParams": {}, "template": template},
                "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "minReplicas": 0, "maxReplicas": 4,
                                      "rayStartParams": {}, "template": worker}],
            },
            **spec,
        },
    }


class Cluster:
    """Reads for one namespace: the RayJob, its clusters, pods and events."""

    def __init__(self, custom: Any, core: Any, server: EmulatorServer, ns: str) -> None:
        self.custom, self.core, self.server, self.ns = custom, core, server, ns

    def submit(self, name: str, **spec: Any) -> dict[str, Any]:
        return dict(self.custom.create_namespaced_custom_object(*RAY, self.ns, "rayjobs", rayjob_body(name, **spec)))

    def rayjob(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(*RAY, self.ns, "rayjobs", name))

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.rayjob(name).get("status") or {})

    def until(self, name: str, deployment: str, timeout: float = 10.0) -> dict[str, Any]:
        return dict(wait_for(lambda: (s := self.status(name)).get("jobDeploymentStatus") == deployment and s,
                             timeout, what=f"RayJob {name} to be {deployment}"))

    def clusters(self, rayjob: str | None = None) -> list[dict[str, Any]]:
        selector = f"{constants.RAY_LABEL_ORIGINATED_FROM_CR_NAME}={rayjob}" if rayjob else ""
        return list(self.custom.list_namespaced_custom_object(*RAY, self.ns, "rayclusters",
                                                              label_selector=selector)["items"])

    def cluster(self, name: str) -> dict[str, Any] | None:
        found = [c for c in self.clusters() if c["metadata"]["name"] == name]
        return found[0] if found else None

    def events(self, **selector: str) -> list[Any]:
        fields = ",".join(f"{k}={v}" for k, v in selector.items())
        return list(self.core.list_namespaced_event(self.ns, field_selector=fields).items)

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
    return Cluster(custom, core, server, ns)


@pytest.fixture
def quiet() -> Iterator[Cluster]:
    """A server of its own, for tests that run their own stand-in (the shared one would reconcile too)."""
    import kubernetes.client

    with EmulatorServer() as own:
        api = own.api_client()
        yield Cluster(kubernetes.client.CustomObjectsApi(api), kubernetes.client.CoreV1Api(api), own, "default")


def test_rayjob_walks_new_initializing_running_complete(kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("walk", Outcome.succeed(0.3, submit=0.2))
    kube.submit("walk")
    status = kube.until("walk", "Complete")
    assert kube.deployments("walk") == ["", "Initializing", "Running", "Complete"]
    assert status["jobStatus"] == "SUCCEEDED" and status["succeeded"] == 1 and status["failed"] == 0
    assert status["startTime"] <= status["endTime"] and status["jobId"].startswith("walk-")
    assert CLUSTER_NAME.match(status["rayClusterName"])["rayjob"] == "walk"
    assert set(status["rayJobInfo"]) == {"startTime", "endTime"}
    job_statuses = [(s.get("status") or {}).get("jobStatus") for s in kube.server.history(*RAY, "rayjobs", kube.ns, "walk")]
    assert "PENDING" in job_statuses and "RUNNING" in job_statuses
    assert RAYJOB_FINALIZER in kube.rayjob("walk")["metadata"]["finalizers"]


def test_raycluster_is_named_labelled_and_owned_like_kuberay(kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("owned", Outcome.hang())
    rayjob = kube.submit("owned")
    status = kube.until("owned", "Running")
    cluster = kube.cluster(status["rayClusterName"])
    assert cluster is not None
    labels = cluster["metadata"]["labels"]
    assert labels[constants.LABEL_SWEEP] == "s1" and labels[constants.LABEL_RUN_ID] == "r1"  # copied
    assert labels[constants.RAY_LABEL_ORIGINATED_FROM_CRD] == "RayJob"
    assert labels[constants.RAY_LABEL_ORIGINATED_FROM_CR_NAME] == "owned"
    assert cluster["metadata"]["annotations"] == {"note": "copied"}
    (owner,) = cluster["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "RayJob", "owned", rayjob["metadata"]["uid"], True)
    assert cluster["spec"] == rayjob["spec"]["rayClusterSpec"]
    assert cluster["status"]["state"] == "ready"
    (created,) = kube.events(**{"involvedObject.name": "owned", "reason": "CreatedRayCluster"})
    assert created.message == f"Created RayCluster {kube.ns}/{status['rayClusterName']}"
    assert created.source.component == "rayjob-controller"


def test_active_deadline_fails_a_running_job_and_is_not_retried(kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("slow", Outcome.hang())
    kube.submit("slow", activeDeadlineSeconds=1, backoffLimit=2)
    status = kube.until("slow", "Failed")
    assert status["reason"] == "DeadlineExceeded" and "activeDeadlineSeconds" in status["message"]
    assert status["failed"] == 1  # DeadlineExceeded is never retried, whatever backoffLimit says
    assert [r for r in runner.runs if r.rayjob_key == (kube.ns, "slow")][0].stopped


def test_pre_running_deadline_fails_a_cluster_that_never_starts(kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("never", Outcome.pending(PendingReason.INSUFFICIENT_GPU))
    kube.submit("never", preRunningDeadlineSeconds=1)
    status = kube.until("never", "Failed")
    assert status["reason"] == "PreRunningDeadlineExceeded" and status["jobStatus"] == ""
    assert kube.deployments("never") == ["", "Initializing", "Failed"]


def test_backoff_limit_retries_each_attempt_on_a_new_cluster(kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("flaky", Outcome.fail(0.1), Outcome.fail(0.1), Outcome.succeed(0.1))
    kube.submit("flaky", backoffLimit=2)
    status = kube.until("flaky", "Complete")
    assert (status["failed"], status["succeeded"]) == (2, 1)
    assert kube.deployments("flaky").count("Retrying") == 2
    names = {(s.get("status") or {}).get("rayClusterName") for s in kube.server.history(*RAY, "rayjobs", kube.ns, "flaky")}
    assert len(names - {None}) == 3  # one cluster per attempt
    assert [r.attempt for r in runner.runs if r.rayjob_key == (kube.ns, "flaky")] == [0, 1, 2]


def test_failure_beyond_the_backoff_limit_is_final(kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("broken", Outcome.fail(0.05, "Traceback: boom"))
    kube.submit("broken", backoffLimit=1)
    status = wait_for(lambda: (s := kube.status("broken")).get("failed") == 2 and s, 10, what="two failed attempts")
    assert status["jobDeploymentStatus"] == "Failed" and status["jobStatus"] == "FAILED"
    assert status["reason"] == "AppFailed" and status["message"] == "Traceback: boom"


def test_cluster_deletion_on_finish_is_held_by_a_finalizer_until_released(kube: Cluster, runner: ScriptedRunner) -> None:
    """KubeRay's shutdownAfterJobFinishes issues a real delete: the checkpoint guard's finalizer holds it (R22)."""
    runner.script("guarded", Outcome.succeed(0.5))
    kube.submit("guarded")
    name = kube.until("guarded", "Running")["rayClusterName"]
    kube.custom.patch_namespaced_custom_object(*RAY, kube.ns, "rayclusters", name,
                                               {"metadata": {"finalizers": [constants.FINALIZER]}})
    kube.until("guarded", "Complete")
    held = wait_for(lambda: (c := kube.cluster(name)) and c["metadata"].get("deletionTimestamp") and c, 10,
                    what="KubeRay to delete the cluster")
    assert held["metadata"]["finalizers"] == [constants.FINALIZER]
    assert kube.events(**{"involvedObject.name": "guarded", "reason": "DeletedRayCluster"})
    kube.custom.patch_namespaced_custom_object(*RAY, kube.ns, "rayclusters", name, {"metadata": {"finalizers": None}})
    wait_for(lambda: kube.cluster(name) is None, 5, what="the released cluster to go")


def test_ttl_seconds_after_finished_delays_cluster_deletion(kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("ttl", Outcome.succeed(0.05))
    kube.submit("ttl", ttlSecondsAfterFinished=2)
    name = kube.until("ttl", "Complete")["rayClusterName"]
    assert kube.cluster(name) is not None
    wait_for(lambda: kube.cluster(name) is None, 6, what="the cluster to go after its TTL")


def test_without_shutdown_after_job_finishes_the_cluster_stays(kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("keep", Outcome.succeed(0.05))
    kube.submit("keep", shutdownAfterJobFinishes=False)
    name = kube.until("keep", "Complete")["rayClusterName"]
    assert kube.cluster(name) is not None
    assert not kube.events(**{"involvedObject.name": "keep", "reason": "DeletedRayCluster"})


def test_deleting_a_running_rayjob_removes_its_cluster_through_garbage_collection(kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("doomed", Outcome.hang())
    kube.submit("doomed")
    name = kube.until("doomed", "Running")["rayClusterName"]
    kube.custom.delete_namespaced_custom_object(*RAY, kube.ns, "rayjobs", "doomed")
    wait_for(lambda: kube.cluster(name) is None, 10, what="the cluster to follow its RayJob")
    assert [r for r in runner.runs if r.rayjob_key == (kube.ns, "doomed")][-1].stopped


def test_a_guarded_rayjob_keeps_its_cluster_until_released(kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("kept", Outcome.hang())
    body = rayjob_body("kept")
    body["metadata"]["finalizers"] = [constants.FINALIZER]
    kube.custom.create_namespaced_custom_object(*RAY, kube.ns, "rayjobs", body)
    name = kube.until("kept", "Running")["rayClusterName"]
    kube.custom.delete_namespaced_custom_object(*RAY, kube.ns, "rayjobs", "kept")
    wait_for(lambda: kube.rayjob("kept")["metadata"]["finalizers"] == [constants.FINALIZER], 5,
             what="KubeRay to drop only its own finalizer")
    assert kube.cluster(name) is not None and "deletionTimestamp" not in kube.cluster(name)["metadata"]
    kube.custom.patch_namespaced_custom_object(*RAY, kube.ns, "rayjobs", "kept", {"metadata": {"finalizers": None}})
    wait_for(lambda: kube.cluster(name) is None, 10, what="the cluster to follow its released RayJob")


def test_suspend_deletes_the_cluster_and_resume_creates_a_new_one(kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("nap", Outcome.hang())
    kube.submit("nap")
    first = kube.until("nap", "Running")["rayClusterName"]
    kube.custom.patch_namespaced_custom_object(*RAY, kube.ns, "rayjobs", "nap", {"spec": {"suspend": True}})
    suspended = kube.until("nap", "Suspended")
    assert "rayClusterName" not in suspended and kube.cluster(first) is None
    kube.custom.patch_namespaced_custom_object(*RAY, kube.ns, "rayjobs", "nap", {"spec": {"suspend": False}})
    second = kube.until("nap", "Running")["rayClusterName"]
    assert second != first and kube.deployments("nap")[-5:] == ["Suspending", "Suspended", "", "Initializing", "Running"]


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
    """R6, R20: GPU workers stay Pending with PodScheduled=False and FailedScheduling events."""
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
        assert (event.type, event.reason, event.source.component) == ("Warning", "FailedScheduling", "default-scheduler")
        assert event.message.startswith("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
        assert event.involved_object.uid == pod.metadata.uid
    assert kube.status("gpu")["jobDeploymentStatus"] == "Initializing"  # stuck until a deadline


def test_pending_pods_show_image_pull_back_off_from_the_kubelet(kube: Cluster, runner: ScriptedRunner) -> None:
    """R6, R20: containers waiting in ImagePullBackOff, with ErrImagePull events."""
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
    """R6, R20: a ResourceQuota refuses the workers; KubeRay reports it on the RayCluster."""
    runner.script("quota", Outcome.pending(PendingReason.QUOTA))
    kube.submit("quota")
    name = kube.until("quota", "Initializing")["rayClusterName"]
    selector = {"involvedObject.name": name, "reason": "FailedToCreateWorkerPod"}
    events = wait_for(lambda: len(e := kube.events(**selector)) == 2 and e, 10, what="one refusal per worker")
    assert all("exceeded quota" in e.message for e in events)
    assert [p.metadata.labels["ray.io/node-type"] for p in _pods(kube, name)] == ["head"]
    conditions = {c["type"]: c for c in wait_for(lambda: (kube.cluster(name) or {}).get("status", {}).get("conditions"), 5)}
    assert conditions["RayClusterProvisioned"]["status"] == "False"
    assert "exceeded quota" in conditions["ReplicaFailure"]["message"]


def test_emulated_pods_run_once_the_cluster_is_ready(quiet: Cluster) -> None:
    kube = quiet
    runner = ScriptedRunner(Outcome.succeed(0.3, startup=0.3))
    with KubeRayStandIn(kube.server.api_client(), runner, poll_interval=0.1, emulate_pods=True):
        kube.submit("pods")
        name = kube.until("pods", "Initializing")["rayClusterName"]
        starting = _settled_pods(kube, name, 3)
        assert {p.status.phase for p in starting} == {"Pending"}
        kube.until("pods", "Running")
        assert {p.status.phase for p in _pods(kube, name)} == {"Running"}
        kube.until("pods", "Complete")
        wait_for(lambda: not _pods(kube, name), 10, what="the pods to go with their cluster")


# ---- robustness and lifecycle


def test_injected_api_errors_are_retried_to_convergence(server: EmulatorServer, kube: Cluster, runner: ScriptedRunner) -> None:
    runner.script("bumpy", Outcome.succeed(0.1))
    server.emulator.errors.inject(500, times=3, verb="patch", plural="rayjobs", subresource="status",
                                  user_agent="kuberay-standin")
    server.emulator.errors.inject(409, times=1, verb="create", plural="rayclusters", user_agent="kuberay-standin")
    kube.submit("bumpy")
    assert kube.until("bumpy", "Complete")["jobStatus"] == "SUCCEEDED"
    assert server.emulator.errors.pending == []


def test_standin_starts_and_stops_cleanly(quiet: Cluster) -> None:
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
    runner = ScriptedRunner(Outcome.succeed())
    runner.script("s1", Outcome.fail(), Outcome.hang())
    labelled = {"metadata": {"name": "s1-abc", "labels": {constants.LABEL_SWEEP: "s1"}}}
    assert runner.outcome_for(labelled, 0).result == "fail"
    assert runner.outcome_for(labelled, 5).result == "hang"  # the last outcome repeats
    assert runner.outcome_for({"metadata": {"name": "other"}}, 0).result == "succeed"
