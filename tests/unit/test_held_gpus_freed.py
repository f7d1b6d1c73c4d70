"""GPU workers of a run the guard holds do not wait for the verification (issue 26): a RayJob deleted by anyone else
has its cluster's worker groups suspended first, and a held cluster whose driver stopped loses its workers before
the verification, which may take its whole timeout, begins."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator.reconcile.controller import RetryLater
from sweep_operator.status import rfc3339
from tests.unit.test_controller import World, add_sweep
from tests.unit.test_stops_not_lost import make_world


def cluster_with_workers(world: World, rayjob: dict[str, Any], name: str, workers: int = 4) -> None:
    """The RayCluster KubeRay made for `rayjob` (its controller ownerReference), GPU workers up, autoscaler off."""
    world.kube.add(
        "RayCluster",
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {
                "name": name,
                "namespace": "ml",
                "uid": "cluster-uid",
                "labels": dict(rayjob["metadata"]["labels"]),
                "annotations": dict(rayjob["metadata"].get("annotations") or {}),
                "finalizers": [constants.FINALIZER],
                "ownerReferences": [
                    {
                        "kind": "RayJob",
                        "name": rayjob["metadata"]["name"],
                        "uid": rayjob["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "enableInTreeAutoscaling": False,
                "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers, "minReplicas": workers}],
            },
        },
    )
    for i in range(workers):
        world.kube.pods.append(
            {
                "metadata": {
                    "name": f"{name}-w{i}",
                    "namespace": "ml",
                    "labels": {constants.RAY_LABEL_CLUSTER: name, constants.RAY_LABEL_NODE_TYPE: "worker"},
                    "ownerReferences": [{"uid": "cluster-uid"}],
                },
                "spec": {"containers": [{"resources": {"limits": {constants.GPU_RESOURCE: "1"}}}]},
                "status": {
                    "phase": "Running",
                    "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-02T11:00:00Z"}
                    ],
                },
            }
        )


def running_with_workers() -> tuple[World, str, str]:
    """An admitted sweep whose job runs on a cluster with GPU workers: (world, RayJob, RayCluster)."""
    world = make_world()
    add_sweep(world, "digits")
    name = world.reconcile("digits")["rayJobName"]
    cluster = f"{name}-x7k2p"
    world.kube.set_rayjob_status(name, "ml", jobDeploymentStatus="Running", jobStatus="RUNNING", rayClusterName=cluster)
    cluster_with_workers(world, world.kube.get_rayjob("ml", name) or {}, cluster)
    return world, name, cluster


def test_a_rayjob_deleted_by_a_user_has_its_clusters_worker_groups_suspended_before_it_is_verified() -> None:
    world, name, cluster = running_with_workers()
    world.verifier.verified = False  # the checkpoints do not verify: the guard holds
    world.kube.delete_rayjob("ml", name)  # `kubectl delete rayjob`: the cluster stays while its owner is held
    deleted = world.kube.objects[("RayJob", "ml", name)]["metadata"]
    deleted["deletionTimestamp"] = rfc3339(world.clock() - 30)  # on the world's clock
    for pod in world.kube.pods:  # bound an hour before
        pod["status"]["conditions"][0]["lastTransitionTime"] = rfc3339(world.clock() - 3600)
    body = world.kube.get_rayjob("ml", name) or {}
    world.kube.calls.clear()
    with pytest.raises(RetryLater) as held:
        world.controller.guard_rayjob_deletion(body, 0)
    assert held.value.counted is False, "a wait for the workers, not a failed check"
    suspended = world.kube.get_raycluster("ml", cluster) or {}
    assert all(g.get("suspend") is True for g in suspended["spec"]["workerGroupSpecs"]), suspended["spec"]
    assert not suspended["metadata"].get("deletionTimestamp"), "the cluster itself stays, held with its owner"
    # The 4 workers' GPU time from the RayJob's deletion (KubeRay stopped the job then) to the suspend is idle,
    # recorded as the hold's (no graceful stop of the operator's was asked).
    idle = world.status("digits").get("idleGpuSeconds") or {}
    assert idle.get("heldDeletion") == pytest.approx(4 * 30), idle
    assert "stopping" not in idle, idle
    world.kube.pods.clear()  # KubeRay deletes a suspended group's pods (raycluster_controller.go reconcilePods)
    world.verifier.calls.clear()
    with pytest.raises(RetryLater) as held:
        world.controller.guard_rayjob_deletion(body, 1)
    assert held.value.counted is True and world.verifier.calls, "then the guard verifies, and holds"
    assert world.status("digits")["idleGpuSeconds"] == idle, "recorded once"


@pytest.mark.parametrize("verified", [True, False])
def test_a_held_clusters_workers_go_before_its_verification_once_the_driver_stopped(verified: bool) -> None:
    world = make_world()
    order: list[str] = []
    world.kube.delete_pod = lambda namespace, pod: order.append("delete_pod") or True  # type: ignore[method-assign]  # records the order
    add_sweep(world, "digits")
    name = world.reconcile("digits")["rayJobName"]
    cluster = f"{name}-x7k2p"
    world.kube.set_rayjob_status(
        name, "ml", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED", rayClusterName=cluster
    )
    cluster_with_workers(world, world.kube.get_rayjob("ml", name) or {}, cluster)
    world.verifier.verified = verified
    verify = world.controller.reads.verifier

    def slow(*args: Any, **kwargs: Any) -> Any:
        order.append("verify")
        world.clock.now += 900  # a verification that takes its whole timeout (a slow or throttled bucket)
        return verify(*args, **kwargs)

    world.controller.reads.verifier = slow
    world.kube._delete("RayCluster", "ml", cluster)  # KubeRay's TTL deletion of the finished job's cluster
    body = world.kube.get_raycluster("ml", cluster) or {}
    try:
        world.controller.guard_raycluster_deletion(body, 0)
    except RetryLater:
        assert not verified
    assert order[:5] == ["delete_pod"] * 4 + ["verify"], order


def test_the_sweeps_rayjob_is_found_by_what_only_the_operator_writes_never_by_ownerreferences() -> None:
    """A tenant may edit a RayJob's ownerReferences and create RayJobs of their own: a run re-pointed at another
    owner is still the sweep's (its deletion stops and deletes it), an unmarked decoy at the name the sweep's uid
    implies is not (the operator would stop it through its status.dashboardURL)."""
    from sweep_operator.rendering import rayjob_name, run_id_for

    world = make_world()
    add_sweep(world, "digits")
    name = world.reconcile("digits")["rayJobName"]
    rayjob = world.kube.get("RayJob", "ml", name) or {}
    rayjob["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "anchor", "uid": "x"}]
    world.kube.objects[("RayJob", "ml", name)] = rayjob
    found = world.controller.reads.rayjob_of_sweep(world.sweep("digits"))
    assert found is not None and found["metadata"]["name"] == name, "a re-pointed owner detached the run"

    decoyed = add_sweep(world, "queued")  # never admitted: no status, so the name its uid implies is looked up
    decoy = rayjob_name("queued", run_id_for(decoyed["metadata"]["uid"]))
    world.kube.add("RayJob", {"metadata": {"name": decoy, "namespace": "ml"}, "status": {"dashboardURL": "x:1"}})
    assert world.controller.reads.rayjob_of_sweep(world.sweep("queued")) is None


def test_a_clusters_rayjob_is_of_the_clusters_own_run() -> None:
    world = make_world()
    add_sweep(world, "digits")
    name = world.reconcile("digits")["rayJobName"]
    cluster = f"{name}-x7k2p"
    cluster_with_workers(world, world.kube.get_rayjob("ml", name) or {}, cluster)
    body = world.kube.get_raycluster("ml", cluster) or {}
    found = world.controller.reads.rayjob_of_cluster(body)
    assert found is not None and found["metadata"]["name"] == name
    world.kube.add("RayJob", {"metadata": {"name": "decoy", "namespace": "ml", "uid": "decoy-uid"}})
    repointed = {**body, "metadata": {**body["metadata"], "ownerReferences": [
        {"kind": "RayJob", "name": "decoy", "uid": "decoy-uid", "controller": True}
    ]}}  # fmt: skip
    assert world.controller.reads.rayjob_of_cluster(repointed) is None


def test_an_ended_jobs_workers_go_at_its_end_not_when_kuberay_deletes_the_cluster() -> None:
    """KubeRay deletes a finished job's cluster ttlSecondsAfterFinished later (300 s by default); until then its
    GPU workers would idle. The pass that sees the end suspends the cluster's worker groups (the head stays); once."""
    world, name, cluster = running_with_workers()
    assert world.reconcile("digits")["phase"] == "Running"
    assert not any(
        g.get("suspend") for g in (world.kube.get_raycluster("ml", cluster) or {})["spec"]["workerGroupSpecs"]
    )
    world.kube.set_rayjob_status(name, "ml", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
    assert world.reconcile("digits")["phase"] == "Succeeded"
    groups = (world.kube.get_raycluster("ml", cluster) or {})["spec"]["workerGroupSpecs"]
    assert all(g.get("suspend") is True for g in groups), groups
    assert "WorkerGroupsSuspended" in world.reasons(name)
    world.kube.calls.clear()
    world.reconcile("digits")  # a later pass of the ended sweep: nothing more
    assert not [c for c in world.kube.calls if c[0] in ("get_raycluster", "patch_raycluster")]


def test_a_restarted_operator_suspends_an_ended_jobs_workers_and_leaves_others_alone() -> None:
    world = make_world()
    add_sweep(world, "digits")
    name = world.reconcile("digits")["rayJobName"]
    cluster = f"{name}-x7k2p"
    world.kube.set_rayjob_status(
        name, "ml", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED", rayClusterName=cluster
    )
    world.controller.stopper.suspend_finished = lambda *args: None  # type: ignore[method-assign]  # the process goes first
    assert world.reconcile("digits")["phase"] == "Succeeded"
    cluster_with_workers(world, world.kube.get_rayjob("ml", name) or {}, cluster)
    restarted = make_world()
    restarted.kube, restarted.clock = world.kube, world.clock
    from sweep_operator.reconcile.controller import SweepController

    restarted.controller = SweepController(
        world.controller.settings, world.kube, lambda *a: world.s3, lambda *e: None, verifier=world.verifier,
        clock=world.clock,
    )  # fmt: skip
    restarted.reconcile("digits")
    assert all(g.get("suspend") for g in (world.kube.get_raycluster("ml", cluster) or {})["spec"]["workerGroupSpecs"])

    other = make_world()  # a cluster its ownerReference does not tie to this RayJob is not touched
    add_sweep(other, "digits")
    name = other.reconcile("digits")["rayJobName"]
    other.kube.set_rayjob_status(
        name, "ml", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED", rayClusterName="foreign"
    )
    cluster_with_workers(other, {**(other.kube.get_rayjob("ml", name) or {}), "metadata": {
        **(other.kube.get_rayjob("ml", name) or {})["metadata"], "uid": "someone-else"}}, "foreign")  # fmt: skip
    other.reconcile("digits")
    assert not any(
        g.get("suspend") for g in (other.kube.get_raycluster("ml", "foreign") or {})["spec"]["workerGroupSpecs"]
    )
