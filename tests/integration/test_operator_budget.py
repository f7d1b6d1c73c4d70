"""GPU-hour budgets end to end: the KubeRay stand-in's GPU pods carry the timestamps Kubernetes would give them, the
operator measures them into status.usage across a restart, stops a sweep at its budget with its checkpoints verified,
and queues a namespace over its window until the window frees it (docs/budgets.md)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import pytest

from sweep_contracts import constants
from sweep_operator.gpu_time import HOUR, UsageLedger, epoch, fold, observe_pod
from sweep_sandbox.emulator import EmulatorServer
from sweep_sandbox.kuberay import KubeRayStandIn, Outcome, ScriptedRunner
from tests.integration.test_kuberay_standin import Cluster
from tests.support.operator_env import OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

RECONCILE = 1.0  # start_operator_env's reconcile_seconds: the accounting's promised precision
WINDOW = 20  # seconds: the namespace window of the queueing test
TEAM = "team-b"


def _pods(kube: Cluster, cluster: str) -> list[dict[str, Any]]:
    """The cluster's pods as plain JSON, as the operator reads them (kube.KubeApi.list_pods)."""
    listed = kube.core.list_namespaced_pod(kube.ns, label_selector=f"ray.io/cluster={cluster}", _preload_content=False)
    return list(json.loads(listed.data)["items"])


def test_standin_gpu_pods_keep_their_scheduling_time_and_go_with_their_cluster() -> None:
    """kube-scheduler sets PodScheduled when it binds a pod; the kubelet keeps that condition's lastTransitionTime
    while its status does not change (status_manager.go updateLastTransitionTime) and sets startTime once; the
    garbage collector deletes a cluster's pods once the cluster is gone. Accounting over what the API showed
    equals the GPU-seconds between the pods' binding and their disappearance (within the poll spacing)."""
    with EmulatorServer() as server:
        api = server.api_client()
        kube = Cluster(kubernetes.client.CustomObjectsApi(api), kubernetes.client.CoreV1Api(api), server, "default")
        runner = ScriptedRunner(Outcome.succeed(2.0, startup=1.2))
        with KubeRayStandIn(api, runner, poll_interval=0.1, emulate_pods=True):
            kube.submit("gpu")
            name = wait_for(lambda: kube.status("gpu").get("rayClusterName"), 10, what="a cluster")

            def all_scheduled() -> list[dict[str, Any]]:
                pods = _pods(kube, name)
                return pods if len(pods) == 3 and all((p.get("status") or {}).get("conditions") for p in pods) else []

            starting = wait_for(all_scheduled, 10, what="3 scheduled pods")
            scheduled = {p["metadata"]["uid"]: _scheduled(p) for p in starting}
            ledger, clusters = UsageLedger(), {name}

            def all_running() -> list[dict[str, Any]]:
                pods = _pods(kube, name)
                return pods if len(pods) == 3 and all(p["status"].get("phase") == "Running" for p in pods) else []

            running = wait_for(all_running, 10, what="3 running pods")
            for pod in running:
                assert _scheduled(pod) == scheduled[pod["metadata"]["uid"]], "PodScheduled moved when the pod ran"
                assert epoch(pod["status"]["startTime"]) >= epoch(_scheduled(pod))
            gpu_pods = [p for p in running if observe_pod(p) is not None]
            assert len(gpu_pods) == 2  # the head holds no GPU
            # poll as the operator does, until the cluster and its pods are gone
            last_seen = time.time()
            while True:
                now = time.time()
                pods = _pods(kube, name)
                ledger = fold(ledger, [i for i in map(observe_pod, pods) if i], now, listed_clusters=clusters)
                if not pods:
                    break
                last_seen = now
                time.sleep(0.1)
            gone_by = time.time()
            started = min(epoch(_scheduled(p)) for p in gpu_pods)
            assert all(i.end is not None for i in ledger.intervals)
            used = ledger.gpu_seconds(gone_by)
            # each GPU pod from its binding to between the last poll that saw it and the first that did not
            low = sum(last_seen - epoch(_scheduled(p)) for p in gpu_pods)
            assert low - 2.0 <= used <= low + 2 * (gone_by - last_seen) + 2.0  # RFC 3339 seconds round outward
            assert started <= min(i.start for i in ledger.intervals) + 1


def _scheduled(pod: dict[str, Any]) -> str:
    return next(c["lastTransitionTime"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")


# ----------------------------------------------------------------------------------------------- the operator


class VerifierSpy:
    """The operator's verifier, recorded: which run roots it verified and what it found."""

    def __init__(self, real: Any) -> None:
        self.real, self.calls, self.lock = real, [], threading.Lock()

    def __call__(self, client: Any, root: str, **options: Any) -> Any:
        result = self.real(client, root, **options)
        with self.lock:
            self.calls.append((root, result))
        return result


def _restart(env: OperatorEnv, spy: VerifierSpy) -> None:
    env.operator.stop()
    env.operator = type(env.operator)(env.settings, env.server.url, s3_client_for=env.s3_switch)
    env.operator.controller.verify = spy
    env.operator.start()


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server)
    environment.standin.emulate_pods = (
        True  # the RayClusters' pods, as KubeRay, the scheduler and the kubelet leave them
    )
    settings = dataclasses.replace(
        environment.settings,
        usage_refresh_seconds=0.5,
        namespace_gpu_hour_budgets=(f"{TEAM}=0.009",),  # 32.4 GPU-seconds per WINDOW
        gpu_hours_window_seconds=WINDOW,
    )
    environment.settings = settings
    environment.operator.controller.settings = settings
    spy = VerifierSpy(environment.operator.controller.verify)
    environment.operator.controller.verify = spy
    environment.spy = spy  # type: ignore[attr-defined]  # the module's tests read it
    try:
        environment.core.create_namespace({"metadata": {"name": TEAM}})
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise
    try:
        yield environment
    finally:
        stop()


def _pod_times(env: OperatorEnv, namespace: str, cluster: str, seen: dict[str, dict[str, Any]]) -> bool:
    """Record each GPU pod's binding time and the first moment the test saw it gone; True while any exists."""
    listed = env.core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={cluster}", _preload_content=False)
    pods = json.loads(listed.data)["items"]
    now, present = time.time(), set()
    for pod in pods:
        interval = observe_pod(pod)
        if interval is not None:
            present.add(interval.pod)
            seen.setdefault(interval.pod, {"start": interval.start, "gpus": interval.gpus, "gone": None, "last": now})
            seen[interval.pod]["last"] = now
    for pod, record in seen.items():
        if pod not in present and record["gone"] is None:
            record["gone"] = now
    return bool(pods)


def test_gpu_hours_follow_the_pods_across_a_restart_and_the_budget_stops_the_sweep(env: OperatorEnv) -> None:
    """4 one-GPU workers run until the sweep's 0.012 GPU-hours (43 GPU-seconds) are spent: the operator, restarted
    mid-run, records every pod from its PodScheduled time to its end within one reconcile interval, stops the run
    through the checkpoint guard (phase BudgetExhausted, condition BudgetExhausted) and verifies the checkpoints."""
    spy: VerifierSpy = env.spy
    doc = env.new_sweep(
        "budget",
        gpu=True,
        namespace="default",
        **{
            "spec__workerGroup__minReplicas": 4,  # the 2 x 2 workers exist from the start (no autoscaler here)
            "spec__budget": {"gpuHours": 0.012, "runUntilExhausted": True},
            "spec__deadlines": {"activeSeconds": 600, "startupSeconds": 120, "gracefulStopSeconds": 0},
        },
    )
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(startup=0.3))
    env.apply(doc)
    bucket, prefix = env.run_root(name)
    write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    cluster = env.wait_status(name, lambda s: s.get("rayClusterName"), "a RayCluster")["rayClusterName"]
    seen: dict[str, dict[str, Any]] = {}
    wait_for(lambda: _pod_times(env, "default", cluster, seen) and len(seen) == 4, 30, what="4 GPU pods scheduled")
    env.wait_status(name, lambda s: ((s.get("usage") or {}).get("gpusHeld") or 0) == 4, "4 GPUs measured")
    _restart(env, spy)  # the record is the status: the new operator continues it
    stopped = env.wait_phase(name, "BudgetExhausted", timeout=90)
    assert "GPU budget spent" in stopped["message"]
    assert any(c["type"] == "BudgetExhausted" and c["status"] == "True" for c in stopped["conditions"])
    wait_for(lambda: not _pod_times(env, "default", cluster, seen), 60, what="the pods gone with their cluster")
    final = env.wait_status(name, lambda s: (s.get("usage") or {}).get("gpusHeld") == 0, "every pod closed", timeout=30)
    verified = env.wait_status(name, lambda s: (s.get("checkpoints") or {}).get("verifiedAt"), "the end-of-run check")
    assert verified["checkpoints"]["verified"] is True
    roots = [(root, result) for root, result in spy.calls if root.endswith(f"{name}-{verified['runId']}")]
    assert roots and all(r.verified and r.checked >= 1 for _, r in roots), roots  # it ran, and saw the checkpoint
    # the ledger against the pods' own timestamps
    ledger = UsageLedger.from_status(final["usage"])
    recorded = {i.pod: i for i in ledger.intervals}
    assert set(recorded) == set(seen)
    for pod, record in seen.items():
        interval = recorded[pod]
        assert abs(interval.start - record["start"]) <= 1.0  # RFC 3339 seconds, rounded outward
        assert interval.end is not None
        # Closed when a pass sees the pod gone: a reconcile interval after it went on an idle machine, later on a
        # busy one (the bound only catches an interval closed far too late or before the pod went).
        assert record["last"] - 1.0 <= interval.end <= record["gone"] + 4 * RECONCILE + 2.0
    used = ledger.gpu_seconds(time.time())
    expected = sum(r["gpus"] * (r["gone"] - r["start"]) for r in seen.values())
    assert abs(used - expected) <= 4 * (RECONCILE + 2.0), (used, expected)
    assert used >= 0.012 * HOUR - 4 * RECONCILE  # it ran until the budget, not before
    assert final["usage"]["attempts"][0]["rayClusterName"] == cluster


def test_a_namespace_over_its_window_queues_and_is_readmitted_when_the_window_frees_it(env: OperatorEnv) -> None:
    """team-b may use 32.4 GPU-seconds per 20 s. Sweep A's worst case (1 GPU x 30 s) is reserved while it runs,
    so B (the same shape) queues, saying when budget frees up; after A ends its hours stay in the window, so B
    still waits; once they leave the window, B is admitted by itself."""
    shape = {
        "spec__trial": {"workers": 1, "resourcesPerWorker": {"cpu": 1, "gpu": 1, "memory": "4Gi"}},
        "spec__tune__maxConcurrentTrials": 1,
        "spec__workerGroup__minReplicas": 1,
        "spec__deadlines": {"activeSeconds": 30, "startupSeconds": 20, "gracefulStopSeconds": 0},
    }
    a = env.new_sweep("win-a", gpu=True, namespace=TEAM, **shape)
    b = env.new_sweep("win-b", gpu=True, namespace=TEAM, **shape)
    env.runner.script(a["metadata"]["name"], Outcome.succeed(4.0, startup=0.3))
    env.apply(a)
    env.wait_status(
        a["metadata"]["name"],
        lambda s: ((s.get("usage") or {}).get("gpusHeld") or 0) == 1,
        "A's GPU measured",
        namespace=TEAM,
    )
    env.apply(b)
    queued = env.wait_phase(b["metadata"]["name"], "Queued", namespace=TEAM)
    assert "budget frees up" in queued["message"] and "namespace budget" in queued["message"]
    ended = env.wait_status(
        a["metadata"]["name"],
        lambda s: (s.get("usage") or {}).get("gpusHeld") == 0 and s.get("phase") == "Succeeded",
        "A ended and its pod gone",
        namespace=TEAM,
        timeout=60,
    )
    a_end = max(i.end or 0.0 for i in UsageLedger.from_status(ended["usage"]).intervals)
    # A's hours are still in the window: B waits (a state, read after A ended, not a sleep)
    still = env.status(b["metadata"]["name"], TEAM)
    if time.time() < a_end + WINDOW - 12:
        assert still["phase"] == "Queued", still
    admitted = env.wait_status(
        b["metadata"]["name"], lambda s: s.get("runId"), "B admitted", namespace=TEAM, timeout=60
    )
    started = epoch(admitted["startedAt"])
    assert started is not None and started >= a_end + WINDOW - 2 * 5.0  # freed by the window, not by A's end


def _uid_of_pod(env: OperatorEnv, name: str) -> str | None:
    try:
        return str(env.core.read_namespaced_pod(name, "default").metadata.uid)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_a_worker_relabelled_out_of_its_cluster_stays_counted_until_it_is_gone(env: OperatorEnv) -> None:
    """The pods are listed by their `ray.io/cluster` label, which anyone who may edit a pod can change: a worker
    relabelled away from its cluster (KubeRay, which counts its pods by that label, starts another) keeps its open
    interval (the operator reads it by name and uid) and is closed only once it is gone (docs/security.md)."""
    doc = env.new_sweep(
        "relabel",
        gpu=True,
        namespace="default",
        spec__workerGroup__minReplicas=2,
        spec__deadlines={"activeSeconds": 600, "startupSeconds": 120, "gracefulStopSeconds": 0},
    )
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(startup=0.3))
    env.apply(doc)
    cluster = env.wait_status(name, lambda s: s.get("rayClusterName"), "a RayCluster")["rayClusterName"]
    measured = env.wait_status(name, lambda s: ((s.get("usage") or {}).get("gpusHeld") or 0) == 2, "2 GPUs measured")
    open_pods = {i.pod: i for i in UsageLedger.from_status(measured["usage"]).intervals if i.end is None}
    victim = next(iter(open_pods.values()))
    env.core.patch_namespaced_pod(victim.name, "default", {"metadata": {"labels": {"ray.io/cluster": "elsewhere"}}})
    relabelled = time.time()

    def measured_since(moment: float) -> Callable[[dict[str, Any]], bool]:
        def after(status: dict[str, Any]) -> bool:
            at = epoch((status.get("usage") or {}).get("lastMeasuredAt"))
            return at is not None and at >= moment + 2.0  # RFC 3339 seconds: a pass that surely read the pods after

        return after

    after = env.wait_status(name, measured_since(relabelled), "a measurement after the relabel")
    recorded = {i.pod: i for i in UsageLedger.from_status(after["usage"]).intervals}
    assert recorded[victim.pod].end is None, "a relabelled worker's interval was closed while it still runs"
    assert recorded[victim.pod].cluster == cluster
    env.core.delete_namespaced_pod(victim.name, "default")
    wait_for(lambda: _uid_of_pod(env, victim.name) != victim.pod, 30, what="the relabelled pod gone")
    closed = env.wait_status(
        name,
        lambda s: (
            next((i for i in UsageLedger.from_status(s.get("usage")).intervals if i.pod == victim.pod), victim).end
        ),
        "the relabelled pod's interval closed once it is gone",
    )
    end = next(i for i in UsageLedger.from_status(closed["usage"]).intervals if i.pod == victim.pod).end
    assert end is not None and end >= relabelled
    env.annotate_sweep(name, {constants.ANNOTATION_SKIP_VERIFICATION: "true"})
    env.delete_sweep(name)
    wait_for(lambda: env.sweep(name) is None, 60, what="the sweep gone")
