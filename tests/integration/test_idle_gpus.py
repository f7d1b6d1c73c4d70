"""Hold the data, not the GPUs (issue 26, section 2), through the whole operator on loopback: kopf, the KubeRay
stand-in with emulated pods, the API emulator, moto S3 and the real verifier."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator import ray_jobs
from sweep_sandbox.kuberay import Outcome
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server)
    environment.standin.emulate_pods = True
    try:
        yield environment
    finally:
        stop()


def _pods(env: OperatorEnv, cluster: str) -> dict[str, str]:
    """name -> node type of the cluster's pods that are not being deleted."""
    pods = env.core.list_namespaced_pod("default", label_selector=f"ray.io/cluster={cluster}").items
    return {p.metadata.name: p.metadata.labels["ray.io/node-type"] for p in pods if not p.metadata.deletion_timestamp}


def test_a_held_cluster_loses_its_gpu_workers_after_the_graceful_window_and_stays_held(env: OperatorEnv) -> None:
    """KubeRay deletes a running sweep's RayCluster (as a TTL or a Kueue preemption would) while a checkpoint file
    is missing: the guard holds it, and KubeRay no longer reconciles it, so its GPU workers would run until the
    checkpoints verify. Once the graceful window has passed they are deleted; the cluster, its head pod and the
    finalizer stay, the hold goes on, and the cluster goes once the checkpoints verify."""
    doc = env.new_sweep(
        "idle",
        gpu=True,
        spec__workerGroup__minReplicas=4,
        spec__deadlines={"activeSeconds": 3600, "startupSeconds": 600, "gracefulStopSeconds": 3},
    )
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang())
    env.apply(doc)
    bucket, prefix = env.run_root(name)
    synthetic = write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    cluster = env.wait_phase(name, "Running")["rayClusterName"]
    workers = wait_for(
        lambda: [p for p, kind in _pods(env, cluster).items() if kind == "worker"] or None,
        TIMEOUT,
        what="GPU worker pods",
    )
    wait_for(
        lambda: (
            constants.FINALIZER
            in ((env.get(constants.RAYCLUSTER_PLURAL, cluster) or {})["metadata"]).get("finalizers", [])
        ),
        TIMEOUT,
        what="cluster guarded",
    )
    synthetic.delete_file()
    env.delete_ray(constants.RAYCLUSTER_PLURAL, cluster)
    wait_for(lambda: "CheckpointsNotVerified" in env.event_reasons(cluster), TIMEOUT, what="the cluster held")
    wait_for(
        lambda: not [p for p, kind in _pods(env, cluster).items() if kind == "worker"],
        TIMEOUT,
        what="the held cluster's workers deleted",
    )
    held = env.get(constants.RAYCLUSTER_PLURAL, cluster)
    assert held is not None and constants.FINALIZER in held["metadata"]["finalizers"], "the data stays held"
    assert "head" in _pods(env, cluster).values(), "the head stays"
    notice = wait_for(  # posted after the pod deletes, so the pods can be seen gone first
        lambda: [e.message for e in env.events(cluster) if e.reason == "HeldClusterWorkersReleased"] or None,
        TIMEOUT,
        what="the HeldClusterWorkersReleased Event",
    )
    assert notice and f"{len(workers)} worker pod(s)" in notice[0] and "graceful window" in notice[0], notice
    metric = env.operator.controller.metrics.idle_gpu_seconds.labels(
        namespace="default", sweep=name, cause="held-deletion"
    )._value.get()
    assert metric > 0, "the hold's GPU-seconds are recorded"
    recorded = env.wait_status(name, lambda s: (s.get("idleGpuSeconds") or {}).get("heldDeletion"), "status record")
    assert recorded["idleGpuSeconds"]["heldDeletion"] == pytest.approx(metric, rel=0.01)
    write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    uid = held["metadata"]["uid"]  # KubeRay creates the running job's cluster again, under the same name
    wait_for(
        lambda: ((env.get(constants.RAYCLUSTER_PLURAL, cluster) or {}).get("metadata") or {}).get("uid") != uid,
        TIMEOUT,
        what="released once verified",
    )


def test_a_sweep_deleted_while_held_is_still_stopped_at_its_deadline(env: OperatorEnv) -> None:
    """Issue 26, section 3: the sweep is deleted while a checkpoint file is missing, so the guard holds it before
    its RayJob is deleted; its RayJob keeps running (its head did not take the graceful stop the deletion asked first:
    issue 26 section 0). The sweep's deadline (30 s, 1 s graceful window) still stops it: the RayJob is deleted (KubeRay
    stops the Ray job) while the sweep stays held, and both go once verified."""
    doc = env.new_sweep("late", spec__deadlines={"activeSeconds": 30, "startupSeconds": 20, "gracefulStopSeconds": 1})
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang())
    env.apply(doc)
    bucket, prefix = env.run_root(name)
    synthetic = write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    status = env.wait_phase(name, "Running")
    rayjob = status["rayJobName"]
    synthetic.delete_file()
    controller = env.operator.controller
    reachable = controller.stop_job
    controller.stop_job = lambda url, job: ray_jobs.StopOutcome(asked=False, error="the head is unreachable (test)")
    try:
        _held_sweep_stopped_at_its_deadline(env, name, rayjob, bucket, prefix)
    finally:
        controller.stop_job = reachable


def _held_sweep_stopped_at_its_deadline(env: OperatorEnv, name: str, rayjob: str, bucket: str, prefix: str) -> None:
    env.delete_sweep(name)
    wait_for(lambda: "CheckpointsNotVerified" in env.event_reasons(name), TIMEOUT, what="the sweep held")
    wait_for(
        lambda: ((env.get(constants.RAYJOB_PLURAL, rayjob) or {}).get("metadata") or {}).get("deletionTimestamp"),
        TIMEOUT,
        what="the RayJob stopped at the deadline while the sweep is held",
    )
    assert env.sweep(name) is not None, "the sweep is still held"
    stopped = wait_for(  # written with the pass's status, after its delete
        lambda: [e.message for e in env.events(name) if e.reason == "StoppedWhileHeld"] or None,
        TIMEOUT,
        what="the StoppedWhileHeld Event",
    )
    assert stopped and "deadline" in stopped[0], stopped
    write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    wait_for(
        lambda: env.sweep(name) is None and env.get(constants.RAYJOB_PLURAL, rayjob) is None,
        TIMEOUT,
        what="released once verified",
    )
