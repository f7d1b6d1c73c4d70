"""GPU-hour budgets end to end: the KubeRay stand-in's GPU pods carry the timestamps Kubernetes would give them, and
the accounting (reconcile.usage) measures them."""

from __future__ import annotations

import json
import time
from typing import Any

import kubernetes.client

from sweep_operator.reconcile.usage import UsageLedger, epoch, fold, observe_pod
from sweep_sandbox.emulator import EmulatorServer, wait_for
from sweep_sandbox.kuberay import KubeRayStandIn, Outcome, ScriptedRunner
from tests.integration.test_kuberay_standin import Cluster


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
