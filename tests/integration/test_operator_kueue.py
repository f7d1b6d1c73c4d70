"""The operator in Kueue mode, with the KubeRay and Kueue stand-ins (docs/kueue.md): admission by Kueue's quota,
preemption (the RayJob suspended again) through the checkpoint guard, readmission with the deadline counted only
while admitted. Judged by state changes (conditions, status fields, Events), never by sleeping.

Kueue sources the behaviour rests on: pkg/controller/jobframework/reconciler.go ReconcileGenericJob (startJob
unsuspends an admitted RayJob; an evicted one is suspended and its quota cleared once KubeRay has released the
cluster), pkg/scheduler/flavorassigner/flavorassigner.go (the admission message), site/.../tasks/run/rayjobs.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_contracts.runtime_env import deadline_of
from sweep_operator.status import parse_time
from sweep_sandbox.kuberay import Outcome
from sweep_sandbox.kueue import cluster_queue, local_queue, resource_flavor, workload_name
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

QUEUE = "team"


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server, kueue_default_queue=QUEUE)
    environment.kueue.apply_queues(resource_flavor(), local_queue("default", QUEUE, "kueue-cq"))
    try:
        yield environment
    finally:
        stop()


def quota(env: OperatorEnv, cpu: Any) -> None:
    env.kueue.apply(cluster_queue("kueue-cq", {"cpu": cpu, "memory": "256Gi", constants.GPU_RESOURCE: 8}))


def rayjob_of(env: OperatorEnv, name: str) -> dict[str, Any]:
    (rayjob,) = env.rayjobs(name)
    return rayjob


def test_kueue_admission_then_preemption_then_readmission(env: OperatorEnv) -> None:
    """Queued by Kueue with its message (no deadline, our namespace budget out of the way), admitted when the
    quota allows (the startup and sweep clocks start there), preempted: suspended with the RayCluster's deletion
    held by the guard until the checkpoints are verified, the deadline paused; readmitted: a new attempt on a new
    cluster from the same run root, the deadline moved by the time it was not admitted."""
    quota(env, "100m")  # too small for the head: the Workload waits
    doc = env.new_sweep("kq", **{"spec.deadlines": {"activeSeconds": 3600, "startupSeconds": 600}})
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(), Outcome.hang())
    env.apply(doc)

    queued = env.wait_status(
        name, lambda s: "couldn't assign flavors" in (s.get("message") or ""), "Kueue's admission message"
    )
    assert queued["phase"] == "Queued"
    assert queued["message"].startswith(f"Queued (Kueue: {QUEUE}): couldn't assign flavors to pod set head: ")
    assert queued["kueue"]["summary"] == f"Queued (Kueue: {QUEUE})" and queued["kueue"]["admissions"] == 0
    assert "deadlineAt" not in queued  # the sweep clock has not started
    rayjob = rayjob_of(env, name)
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
    assert rayjob["spec"]["suspend"] is True

    quota(env, 64)
    running = env.wait_phase(name, "Running")
    admitted_at = parse_time(running["kueue"]["admittedSince"]).timestamp()
    first_deadline = parse_time(running["deadlineAt"]).timestamp()
    assert first_deadline == pytest.approx(admitted_at + 3600, abs=1)
    assert running["kueue"]["admissions"] == 1 and running["kueue"]["clusterQueue"] == "kueue-cq"
    assert "AdmittedByKueue" in env.event_reasons(name)
    cluster = running["rayClusterName"]
    bucket, prefix = env.run_root(name)
    write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=2, files=2)  # what the trials committed

    env.kueue.evict("default", workload_name(rayjob))  # the preemptor's half (preemption.go IssuePreemptions)
    preempted = env.wait_status(
        name, lambda s: (s.get("kueue") or {}).get("preemptions") == 1, "the preemption recorded"
    )
    assert preempted["phase"] == "Suspended"
    assert preempted["message"].startswith(f"Preempted (Kueue: {QUEUE}): Preempted to accommodate a workload")
    assert "deadlineAt" not in preempted  # paused while not admitted
    assert preempted["kueue"]["admittedSeconds"] >= 0 and "admittedSince" not in preempted["kueue"]  # removed
    # the graceful stop: KubeRay's cluster deletion went through the guard, which verified the checkpoints
    wait_for(
        lambda: not [c for c in env.rayclusters(name) if c["metadata"]["name"] == cluster],
        TIMEOUT,
        what="the preempted cluster released",
    )
    released = wait_for(  # kopf posts the Event on its own queue: the cluster can be seen gone first
        lambda: [e for e in env.events(cluster) if e.reason == "CheckpointGuardReleased"] or None,
        TIMEOUT,
        what="the CheckpointGuardReleased Event",
    )
    assert released and "verified" in released[0].message
    wait_for(lambda: "PreemptedByKueue" in env.event_reasons(name), TIMEOUT, what="the PreemptedByKueue Event")

    readmitted = env.wait_status(
        name, lambda s: (s.get("kueue") or {}).get("admissions") == 2 and s.get("phase") == "Running", "readmitted"
    )
    second_deadline = parse_time(readmitted["deadlineAt"]).timestamp()
    paused = (
        parse_time(readmitted["kueue"]["admittedSince"]).timestamp()
        - admitted_at
        - readmitted["kueue"]["admittedSeconds"]
    )
    assert second_deadline == pytest.approx(first_deadline + paused, abs=2)  # moved by the time not admitted
    assert readmitted["rayClusterName"] != cluster and readmitted["runId"] == running["runId"]  # same run root
    assert readmitted["kueue"]["firstAdmittedAt"] == running["kueue"]["firstAdmittedAt"]
    assert deadline_of(rayjob_of(env, name)) <= second_deadline + 5  # the readmitted driver stops in time
    assert env.pruned() == [] or all(kind != f"trainingsweeps.{constants.GROUP}" for kind, _ in env.pruned())

    env.delete_sweep(name)  # the guard holds exactly as today: verified, then released
    wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="the sweep released by the guard")


def test_a_preempted_run_with_a_broken_checkpoint_holds_its_cluster_but_not_its_gpus(env: OperatorEnv) -> None:
    """The guard matrix's Kueue-preemption row (issues 25 and 26): Kueue preempts a running sweep whose run lost a
    checkpoint file. KubeRay deletes the cluster on the suspend without stopping the job; the guard holds it
    (verification saw the missing file), and once the graceful window has passed its GPU workers are deleted while
    the cluster, its head and the finalizer stay. Repaired, the cluster is released and Kueue readmits the sweep."""
    quota(env, 64)
    doc = env.new_sweep(
        "kq-held",
        gpu=True,
        spec__tune__maxConcurrentTrials=1,
        spec__workerGroup__minReplicas=2,
        **{"spec.deadlines": {"activeSeconds": 3600, "startupSeconds": 600, "gracefulStopSeconds": 2}},
    )
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(), Outcome.hang())
    env.standin.emulate_pods = True
    try:
        env.apply(doc)
        running = env.wait_phase(name, "Running")
        cluster = running["rayClusterName"]
        bucket, prefix = env.run_root(name)
        synthetic = write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)

        def workers() -> list[str]:
            pods = env.core.list_namespaced_pod("default", label_selector=f"ray.io/cluster={cluster}").items
            return [
                p.metadata.name
                for p in pods
                if p.metadata.labels.get("ray.io/node-type") == "worker" and not p.metadata.deletion_timestamp
            ]

        wait_for(workers, TIMEOUT, what="the GPU workers running")
        missing = synthetic.delete_file()
        env.kueue.evict("default", workload_name(rayjob_of(env, name)))
        wait_for(lambda: "CheckpointsNotVerified" in env.event_reasons(cluster), TIMEOUT, what="the cluster held")
        wait_for(lambda: not workers(), TIMEOUT, what="the held cluster's GPU workers deleted")
        held = env.get(constants.RAYCLUSTER_PLURAL, cluster)
        assert held is not None and constants.FINALIZER in held["metadata"]["finalizers"]
        messages = [e.message for e in env.events(cluster) if e.reason == "CheckpointsNotVerified"]
        assert any(missing.split("/")[-1] in m for m in messages), messages
        # The operator posts the Event after its pod deletes, so the pods can be seen gone before it arrives.
        wait_for(lambda: "HeldClusterWorkersReleased" in env.event_reasons(cluster), TIMEOUT, what="the release Event")
        write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
        wait_for(lambda: env.get(constants.RAYCLUSTER_PLURAL, cluster) is None, TIMEOUT, what="released once verified")
        env.wait_status(
            name, lambda s: (s.get("kueue") or {}).get("admissions") == 2 and s.get("phase") == "Running", "readmitted"
        )
    finally:
        env.standin.emulate_pods = False
    env.delete_sweep(name)
    wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="the sweep released by the guard")


def test_kueue_sweeps_reserve_their_gpu_hours_from_creation_and_the_rayjob_waits_for_the_check(
    env: OperatorEnv,
) -> None:
    """Issue 27, leak 4: a namespace of 36 GPU-seconds per hour. The first Kueue sweep (30 GPU-seconds worst case)
    passes the GPU-hour check, reserves its hours and gets its suspended RayJob, which Kueue keeps queued (no quota
    for it); a second one of the same shape is Queued by the GPU-hour check with no RayJob at all, although nothing
    has run yet."""
    import dataclasses

    from sweep_operator.gpu_time import HOUR

    namespace = "kq-hours"
    try:
        env.core.create_namespace({"metadata": {"name": namespace}})
    except Exception as exc:  # already there (a rerun)
        if getattr(exc, "status", None) != 409:
            raise
    env.kueue.apply_queues(local_queue(namespace, QUEUE, "kueue-cq"))
    quota(env, "100m")  # too small for the head: Kueue keeps every Workload queued
    before = env.operator.controller.settings
    settings = dataclasses.replace(
        before, namespace_gpu_hour_budgets=(f"{namespace}={36 / HOUR:.6f}",), gpu_hours_window_seconds=3600
    )
    env.operator.controller.settings = settings
    shape = {
        "spec__trial": {"workers": 1, "resourcesPerWorker": {"cpu": 1, "gpu": 1, "memory": "4Gi"}},
        "spec__tune__maxConcurrentTrials": 1,
        "spec.deadlines": {"activeSeconds": 30, "startupSeconds": 20, "gracefulStopSeconds": 0},
    }
    applied: list[str] = []
    try:
        first = env.new_sweep("kq-h1", namespace=namespace, gpu=True, **shape)
        env.apply(first)
        applied.append(first["metadata"]["name"])
        one = env.wait_status(
            first["metadata"]["name"],
            lambda s: (s.get("kueue") or {}).get("localQueue") == QUEUE,
            "queued by Kueue",
            namespace,
        )
        assert one["phase"] == "Queued" and len(env.rayjobs(first["metadata"]["name"], namespace)) == 1
        second = env.new_sweep("kq-h2", namespace=namespace, gpu=True, **shape)
        env.apply(second)
        applied.append(second["metadata"]["name"])
        two = env.wait_status(
            second["metadata"]["name"],
            lambda s: s.get("phase") == "Queued" and "namespace budget" in (s.get("message") or ""),
            "queued by the GPU-hour check",
            namespace,
        )
        assert "kueue" not in two and not two.get("runId")
        assert env.rayjobs(second["metadata"]["name"], namespace) == []  # created only once the check admits it
        stored = env.custom.get_namespaced_custom_object(
            constants.GROUP, constants.VERSION, namespace, constants.LEDGER_PLURAL, constants.LEDGER_NAME
        )
        (entry,) = stored["status"]["sweeps"]
        assert entry["name"] == first["metadata"]["name"]
        assert entry["reservation"]["gpuHours"] * HOUR == pytest.approx(30, abs=0.1)
    finally:
        env.operator.controller.settings = before
        for name in applied:
            env.delete_sweep(name, namespace)
