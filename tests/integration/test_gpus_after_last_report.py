"""No GPU held without work (issue 26, "measure it"): per path that stops a running sweep, the GPU-seconds its pods
held after the run's last report, summed from the pod lifetimes the KubeRay stand-in records, stay under a bound.

Where the operator starts the deletion (a user's delete, the deadline, a spent budget) it suspends the RayCluster's
worker groups while KubeRay still reconciles the cluster, and KubeRay deletes the worker pods: KubeRay v1.7.0's
`raycluster_controller.go` reconcilePods (a group with `suspend: true`: deleteAllPods, then skip), with
`utils/validation.go` ValidateRayClusterSpec (refused with the in-tree autoscaler on) and `rayjob_controller.go`
getOrCreateRayClusterInstance ("Disregard changes in RayClusterSpec of RayJob": the RayCluster is patched, not the
RayJob). Where someone else did (a Kueue eviction), the guard deletes a held cluster's workers itself."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_sandbox import kuberay
from sweep_sandbox.kuberay import Outcome, ScriptedRun
from sweep_sandbox.pod_lifetimes import PodLife, PodLifetimes
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
STOP_SECONDS = 1.0
# GPU-seconds a worker may hold after the run's last report: the operator's look at the stopped job, a suspend (or a
# guard check) and KubeRay's reaction, each a reconcile or two on a machine slowed by a CPU hog. A leak (workers kept
# until the checkpoints verify, or for good) exceeds it, or never frees the workers the test waits for.
SLACK_S = 20.0
WORKERS = 2  # one GPU each (tests/support/factories.py gpu_sweep); Kueue sizes the group at its maximum
QUEUE = "idle-team"


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server)
    environment.standin.emulate_pods = True
    environment.standin.record_pods()
    try:
        yield environment
    finally:
        stop()


@pytest.fixture(scope="module")
def kueue_env(s3_server: Any) -> Iterator[OperatorEnv]:
    from sweep_sandbox.kueue import cluster_queue, local_queue, resource_flavor

    environment, stop = start_operator_env(s3_server, kueue_default_queue=QUEUE)
    assert environment.kueue is not None
    environment.kueue.apply_queues(resource_flavor(), local_queue("default", QUEUE, "idle-cq"))
    environment.kueue.apply(cluster_queue("idle-cq", {"cpu": 256, "memory": "1024Gi", constants.GPU_RESOURCE: 16}))
    environment.standin.emulate_pods = True
    environment.standin.record_pods()
    try:
        yield environment
    finally:
        stop()


def lifetimes(env: OperatorEnv) -> PodLifetimes:
    assert env.standin.pod_lifetimes is not None
    return env.standin.pod_lifetimes


def live_workers(env: OperatorEnv, cluster: str) -> list[str]:
    pods = env.core.list_namespaced_pod("default", label_selector=f"ray.io/cluster={cluster}").items
    return [
        p.metadata.name
        for p in pods
        if p.metadata.labels.get("ray.io/node-type") == "worker" and not p.metadata.deletion_timestamp
    ]


def planned_workers(env: OperatorEnv, cluster: str) -> int:
    """The worker pods KubeRay creates for the cluster (its groups' replicas; Kueue sizes them at maxReplicas)."""
    spec = (env.get(constants.RAYCLUSTER_PLURAL, cluster) or {}).get("spec") or {}
    return sum(int(g.get("replicas", g.get("minReplicas", 0)) or 0) for g in spec.get("workerGroupSpecs") or [])


def workers_gone(env: OperatorEnv, cluster: str, count: int) -> list[PodLife] | None:
    """The cluster's `count` worker pods' lives once every one is gone (the pod watch saw it), else None."""
    lives = lifetimes(env).lives(cluster=cluster, node_type="worker")
    return lives if len(lives) >= count and all(w.gone is not None for w in lives) else None


def scripted_run(env: OperatorEnv, rayjob: str) -> ScriptedRun:
    return wait_for(
        lambda: next(r for r in reversed(env.runner.runs) if r.rayjob_key[1] == rayjob), TIMEOUT, what="the run"
    )


def start_gpu_sweep(env: OperatorEnv, prefix: str, **changes: Any) -> tuple[str, dict[str, Any]]:
    changes.setdefault("spec__workerGroup__minReplicas", WORKERS)
    changes.setdefault("spec__deadlines", {"activeSeconds": 3600, "startupSeconds": 600, "gracefulStopSeconds": 30})
    doc = env.new_sweep(prefix, gpu=True, **changes)
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(stop_seconds=STOP_SECONDS))
    env.apply(doc)
    running = env.wait_phase(name, "Running")
    cluster = running["rayClusterName"]
    wait_for(lambda: len(live_workers(env, cluster)) == planned_workers(env, cluster) > 0, TIMEOUT, what="GPUs up")
    return name, running


def test_the_standin_deletes_a_suspended_worker_groups_pods_as_kuberay_v1_7_0(env: OperatorEnv) -> None:
    """The stand-in's `reconcile_cluster` against KubeRay v1.7.0: the CRD takes `workerGroupSpecs[].suspend` (nothing
    pruned); with the in-tree autoscaler on, ValidateRayClusterSpec refuses the spec (InvalidRayClusterSpec, the
    pods stay); without it, reconcilePods deletes the group's pods (DeletedWorkerPod) and keeps the head."""
    name, running = start_gpu_sweep(env, "susp")
    cluster_name = running["rayClusterName"]
    cluster = env.get(constants.RAYCLUSTER_PLURAL, cluster_name)
    assert cluster is not None and cluster["spec"].get("enableInTreeAutoscaling") is True
    groups = [{**g, "suspend": True} for g in cluster["spec"]["workerGroupSpecs"]]
    env.custom.patch_namespaced_custom_object(
        constants.RAY_GROUP,
        constants.RAY_VERSION_API,
        "default",
        constants.RAYCLUSTER_PLURAL,
        cluster_name,
        {"spec": {"workerGroupSpecs": groups}},
    )
    invalid = wait_for(
        lambda: [e for e in env.events(cluster_name) if e.reason == "InvalidRayClusterSpec"],
        TIMEOUT,
        what="the spec refused",
    )
    assert "cannot be suspended with Autoscaler enabled" in invalid[0].message
    assert len(live_workers(env, cluster_name)) == planned_workers(env, cluster_name), "a refused spec deletes nothing"
    env.custom.patch_namespaced_custom_object(
        constants.RAY_GROUP,
        constants.RAY_VERSION_API,
        "default",
        constants.RAYCLUSTER_PLURAL,
        cluster_name,
        {"spec": {"enableInTreeAutoscaling": False}},
    )
    wait_for(lambda: not live_workers(env, cluster_name), TIMEOUT, what="the suspended group's pods deleted")
    # The stand-in posts its Event after the deletes, as KubeRay does: it is read with a wait.
    deleted = wait_for(
        lambda: [e for e in env.events(cluster_name) if e.reason == "DeletedWorkerPod"],
        TIMEOUT,
        what="the stand-in's DeletedWorkerPod Event",
    )
    assert deleted[0].message.startswith("Deleted all pods for suspended worker group")
    pods = env.core.list_namespaced_pod("default", label_selector=f"ray.io/cluster={cluster_name}").items
    assert [p.metadata.labels["ray.io/node-type"] for p in pods] == ["head"]
    stored = env.get(constants.RAYCLUSTER_PLURAL, cluster_name) or {}
    assert all(g.get("suspend") is True for g in stored["spec"]["workerGroupSpecs"])
    assert not [p for p in env.pruned() if "suspend" in p[1]], env.pruned()
    env.delete_sweep(name)
    wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="the sweep gone")


def deletion_began(env: OperatorEnv, plural: str, name: str) -> bool:
    """In any state the API server kept of the object, its deletion began."""
    return any(
        (s.get("metadata") or {}).get("deletionTimestamp")
        for s in env.server.history(constants.RAY_GROUP, constants.RAY_VERSION_API, plural, "default", name)
    )


def cluster_deleted(env: OperatorEnv, cluster: str) -> bool:
    return deletion_began(env, constants.RAYCLUSTER_PLURAL, cluster)


def not_verified(status: dict[str, Any]) -> bool:
    """The guard verified the sweep's run and found it incomplete (the test deleted a checkpoint file)."""
    return any(
        c.get("type") == "CheckpointsVerified" and c.get("status") == "False" and (status.get("checkpoints") or {})
        for c in status.get("conditions") or []
    )


@dataclass(frozen=True)
class Path:
    """One way a running sweep stops. `stop(env, name, rayjob)` starts it and returns the run's last report when the
    test wrote it (else the end of the driver's graceful stop counts); `held`: the deletion stays held (a checkpoint
    file is missing) once the workers are gone; `suspended`: the operator started the deletion, so KubeRay deleted
    the workers of the suspended groups; `cause`: the status.idleGpuSeconds key the path records."""

    name: str
    stop: Callable[[OperatorEnv, str, str], float | None]
    changes: dict[str, Any] = field(default_factory=dict)
    held: bool = False
    suspended: bool = True
    cause: str = "stopping"
    kueue: bool = False
    kuberay_first: bool = False  # the operator's suspend is refused: KubeRay deletes the stopped job's cluster first


def _delete(env: OperatorEnv, name: str, rayjob: str) -> float | None:
    env.delete_sweep(name)
    return None


def _own_limit(env: OperatorEnv, name: str, rayjob: str) -> float | None:
    """The sweep's own deadline or budget stops it."""
    return None


def _no_trial_running(env: OperatorEnv, name: str, rayjob: str) -> float | None:
    """The driver's last report says its trials are done and none runs (status.json); the operator counts the GPU
    workers still up as `unscheduled-trials`, then the user deletes the sweep."""
    bucket, prefix = env.run_root(name)
    doc = {
        "phase": "Running",
        "trials": {"total": 2, "running": 0, "terminated": 2},
        "updatedAt": "2026-12-05T00:00:00Z",
    }
    reported = time.time()
    env.s3_client.put_object(Bucket=bucket, Key=f"{prefix}/_sweep/status.json", Body=json.dumps(doc).encode())
    env.wait_status(name, lambda s: (s.get("idleGpuSeconds") or {}).get("unscheduledTrials"), "unscheduled-trials")
    env.delete_sweep(name)
    return reported


def _preempt(env: OperatorEnv, name: str, rayjob: str) -> float | None:
    """Kueue evicts the Workload and suspends the RayJob; KubeRay deletes the cluster without stopping the job."""
    from sweep_sandbox.kueue import workload_name

    assert env.kueue is not None
    env.kueue.evict("default", workload_name(env.get(constants.RAYJOB_PLURAL, rayjob) or {}))
    return None


PATHS = [
    Path("user-delete", _delete),
    Path("held-deletion", _delete, held=True),
    Path(
        "deadline",
        _own_limit,
        {"spec__deadlines": {"activeSeconds": 30, "startupSeconds": 20, "gracefulStopSeconds": 2}},
    ),
    Path(
        "budget",
        _own_limit,  # 21.6 GPU-seconds: some 10 s on 2 GPUs, then a stop with its 2 s window
        {
            "spec__budget": {"gpuHours": 0.006, "runUntilExhausted": True},
            "spec__deadlines": {"activeSeconds": 3600, "startupSeconds": 600, "gracefulStopSeconds": 2},
        },
    ),
    # The stopped job's cluster deleted by KubeRay (shutdownAfterJobFinishes) before the operator could suspend it:
    # the stop is still recorded, up to where the deletion began (a slow pass loses this race under load).
    Path("kuberay-deletes-first", _delete, kuberay_first=True),
    # The same race where the checkpoints do not verify: the guard holds the deleting cluster, which KubeRay no
    # longer reconciles, and deletes its workers itself once the head says the job stopped.
    Path("held-kuberay-first", _delete, held=True, kuberay_first=True),
    Path("no-trial-running", _no_trial_running, cause="unscheduledTrials"),
    # Kueue's, not ours: the guard frees the held cluster's workers once the head says the job stopped (the RayJob's
    # jobStatus stays RUNNING while KubeRay suspends it), not the graceful window (30 s) later.
    Path("kueue-preemption", _preempt, held=True, suspended=False, cause="preemption", kueue=True),
]


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_gpu_seconds_after_the_last_report_are_bounded(request: pytest.FixtureRequest, path: Path) -> None:
    """The run reports until its last report (the end of its graceful stop, or what the test wrote); from then on
    its GPU workers may hold at most SLACK_S GPU-seconds each before they are gone, whether or not the deletion is
    held afterwards (then the cluster, its head and the finalizer stay)."""
    env: OperatorEnv = request.getfixturevalue("kueue_env" if path.kueue else "env")
    name, running = start_gpu_sweep(env, f"b-{path.name[:6]}", **path.changes)
    cluster, rayjob = running["rayClusterName"], running["rayJobName"]
    count = planned_workers(env, cluster)
    bucket, prefix = env.run_root(name)
    synthetic = write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    if path.held:
        synthetic.delete_file()
    run = scripted_run(env, rayjob)
    refused = None
    if path.kuberay_first:  # every suspend patch but the stand-in's own writes is a conflict, once the guard holds
        wait_for(
            lambda: (
                constants.FINALIZER
                in ((env.get(constants.RAYCLUSTER_PLURAL, cluster) or {}).get("metadata") or {}).get("finalizers", [])
            ),
            TIMEOUT,
            what="the guard's finalizer on the cluster",
        )
        refused = env.server.emulator.errors.inject(
            409,
            times=None,
            verb="patch",
            plural=constants.RAYCLUSTER_PLURAL,
            name=cluster,
            user_agent=f"^(?!{re.escape(kuberay.USER_AGENT)})",
        )
    reported = path.stop(env, name, rayjob)
    wait_for(lambda: run.stop_requests, TIMEOUT, what="the graceful stop asked")
    if refused is not None:  # refused until KubeRay deleted the cluster and the operator gave up suspending it
        # (it deletes the RayJob, unless the verification holds it first); then the guard's release of the cluster
        # goes through
        wait_for(lambda: cluster_deleted(env, cluster), TIMEOUT, what="KubeRay deletes the stopped job's cluster")
        if path.held:
            env.wait_status(name, not_verified, "the sweep's deletion held by its verification")
        else:
            wait_for(
                lambda: deletion_began(env, constants.RAYJOB_PLURAL, rayjob),
                TIMEOUT,
                what="the operator deletes the RayJob",
            )
        env.server.emulator.errors.withdraw(refused)
    last_report = reported if reported is not None else run.stop_requests[0] + STOP_SECONDS
    workers = wait_for(lambda: workers_gone(env, cluster, count), TIMEOUT, what="the GPU workers gone")
    assert len(workers) == count and all(w.gpus == 1 for w in workers), workers
    held = lifetimes(env).gpu_seconds_after(last_report, cluster=cluster, node_type="worker")
    assert held <= count * SLACK_S, f"{held:.1f} GPU-seconds after the last report"
    if path.suspended:
        # KubeRay deletes a suspended group's pods and then posts DeletedWorkerPod, so the pods can be seen gone
        # first. Where the stopped job's cluster was deleted before the operator's suspend (a fast stop: KubeRay's
        # shutdownAfterJobFinishes after ttlSecondsAfterFinished, 1 s here), KubeRay no longer reconciles the
        # cluster (raycluster_controller.go: "being deleted, just ignore"): the pods went with it, or, where the
        # guard holds it, the guard deleted them (HeldClusterWorkersReleased on the cluster).
        def freed_by() -> str | None:
            reasons = env.event_reasons(cluster)
            if "DeletedWorkerPod" in reasons:
                return "kuberay"
            if not cluster_deleted(env, cluster):
                return None
            if not path.held:
                return "deleted"
            return "guard" if "HeldClusterWorkersReleased" in reasons else None

        freer = wait_for(
            freed_by,
            TIMEOUT,
            what="KubeRay deletes the workers of the groups the operator suspended (or the cluster with them, or "
            "the guard the held cluster's)",
        )
        if path.kuberay_first:  # the suspend was refused: the deletion took the pods, or the guard did
            assert freer == ("guard" if path.held else "deleted"), freer
    else:
        assert "DeletedWorkerPod" not in env.event_reasons(cluster), "no group was suspended"
    if refused is not None:  # whether the operator's look came before KubeRay's deletion (then refused) or not
        assert "WorkerGroupsSuspended" not in env.event_reasons(name), "no suspend went through"
    if refused is not None and not path.held:  # the sweep goes with its deletion: the metric keeps the stop's
        # GPU-seconds, from the ask to where KubeRay's deletion began (the driver's stop and the stand-in's look)
        metrics = env.operator.controller.metrics
        total = "trainingsweep_idle_gpu_seconds_total"
        stopped = wait_for(lambda: metrics.total(total, sweep=name, cause="stopping"), TIMEOUT, what="stop recorded")
        assert 0 < stopped <= count * SLACK_S, stopped
        wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="the sweep released")
        assert metrics.total(total, sweep=name, cause="stopping") == stopped, "recorded once"
        return
    recorded = env.wait_status(name, lambda s: (s.get("idleGpuSeconds") or {}).get(path.cause), path.cause)
    assert 0 < recorded["idleGpuSeconds"][path.cause] <= count * (SLACK_S + 60), recorded["idleGpuSeconds"]
    if path.held:
        assert env.get(constants.RAYCLUSTER_PLURAL, cluster) is not None or path.suspended, "the cluster stays held"
        write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    if path.kueue:  # released once verified; Kueue readmits the sweep, which the test then deletes
        env.wait_status(name, lambda s: (s.get("kueue") or {}).get("admissions") == 2, "readmitted")
    sweep = env.sweep(name)
    if sweep is not None and not sweep["metadata"].get("deletionTimestamp"):
        env.delete_sweep(name)
    wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="the sweep released")


def test_an_operator_restarted_mid_stop_neither_asks_again_nor_forgets_the_stop(env: OperatorEnv) -> None:
    """The graceful stop's request is in status.gracefulStop (only the operator writes a sweep's status): an
    operator restarted while the driver stops asks the head nothing more (its window runs from the first request)
    and still deletes the RayJob only once the job stopped."""
    stop_seconds = 6.0
    doc = env.new_sweep(
        "restart", spec__deadlines={"activeSeconds": 3600, "startupSeconds": 600, "gracefulStopSeconds": 60}
    )
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(stop_seconds=stop_seconds))
    env.apply(doc)
    rayjob = env.wait_phase(name, "Running")["rayJobName"]
    bucket, prefix = env.run_root(name)
    write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    run = scripted_run(env, rayjob)
    deleting: list[float] = []

    def watch() -> None:
        while not deleting and env.get(constants.RAYJOB_PLURAL, rayjob) is not None:
            if ((env.get(constants.RAYJOB_PLURAL, rayjob) or {}).get("metadata") or {}).get("deletionTimestamp"):
                deleting.append(time.time())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    env.delete_sweep(name)
    env.wait_status(name, lambda s: s.get("gracefulStop"), "the stop's request recorded")
    assert run.stop_requests and not deleting
    env.operator.stop()
    env.operator = type(env.operator)(env.settings, env.server.url, s3_client_for=env.s3_switch)
    env.operator.start()
    wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="the sweep released")
    watcher.join(TIMEOUT)
    assert env.standin.jobs_api is not None
    stops = [r for r in env.standin.jobs_api.requests if r[0] == "POST" and rayjob in r[1]]
    assert len(stops) == 1, f"asked again after the restart: {stops}"
    assert deleting and deleting[0] >= run.stop_requests[0] + stop_seconds, "deleted before the job stopped"
