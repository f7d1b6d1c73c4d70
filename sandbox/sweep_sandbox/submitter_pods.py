"""The submitter Job's pod, as the Job controller, kube-scheduler and the kubelet leave it (K8sJobMode): created for
the Job KubeRay makes, Running while `ray job submit` follows the driver, Succeeded once the job ends; its log is the
driver's output (what `ray job logs --follow` prints), served by the emulator's pods/log."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from typing import Any

from .container_logs import ContainerLogs
from .kube_values import JOB_CONTROLLER_UID_LABELS, now_rfc3339, random_suffix

Obj = dict[str, Any]
NODE_NAME = "sandbox-node-0"


def submitter_pod_body(job: Obj) -> Obj:
    """pkg/controller/job: a pod from the Job's template (the labels generateSelector added), named
    `<job>-<suffix>`, owned by the Job as its controller."""
    meta = job["metadata"]
    template = (job.get("spec") or {}).get("template") or {}
    template_meta = template.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-{random_suffix()}",
            "namespace": meta["namespace"],
            "labels": dict(template_meta.get("labels") or {}),
            "annotations": dict(template_meta.get("annotations") or {}),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": copy.deepcopy(template.get("spec") or {}),
    }


def container_id(pod: Obj, container: str) -> str:
    """The id the kubelet reports for a started container (stable per pod and container)."""
    digest = hashlib.sha256(f"{pod['metadata']['uid']}/{container}".encode()).hexdigest()
    return f"containerd://{digest}"


def _statuses(pod: Obj, state: Obj, *, ready: bool) -> list[Obj]:
    return [
        {
            "name": c.get("name", ""),
            "image": c.get("image", ""),
            "imageID": "",
            "containerID": container_id(pod, c.get("name", "")),
            "ready": ready,
            "restartCount": 0,
            "started": ready,
            "state": copy.deepcopy(state),
        }
        for c in (pod.get("spec") or {}).get("containers") or []
    ]


def _condition(type_: str, status: bool, reason: str = "") -> Obj:
    condition: Obj = {"type": type_, "status": "True" if status else "False", "lastTransitionTime": now_rfc3339()}
    if reason:
        condition["reason"] = reason
    return condition


class SubmitterPods:
    """Creates and finishes the submitter Job's pod through the API (`core(method, path, body, ...)`, the stand-in's
    plain-JSON call), and registers its container's output with the emulator's `ContainerLogs`."""

    def __init__(self, core: Callable[..., Obj], logs: ContainerLogs | None) -> None:
        self.core = core
        self.logs = logs

    def _pods(self, job: Obj) -> list[Obj]:
        meta = job["metadata"]
        selector = f"{JOB_CONTROLLER_UID_LABELS[1]}={meta['uid']}"
        found = self.core("GET", f"/api/v1/namespaces/{meta['namespace']}/pods", query=[("labelSelector", selector)])
        return list(found.get("items") or [])

    def _status(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        self.core(
            "PATCH",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )

    def start(self, job: Obj, output: Callable[[], bytes]) -> Obj:
        """The Job's pod, bound and Running (created unless the Job has one); `output()` is its container's log."""
        existing = self._pods(job)
        if existing:
            return existing[0]
        namespace = job["metadata"]["namespace"]
        pod = self.core("POST", f"/api/v1/namespaces/{namespace}/pods", submitter_pod_body(job))
        name = pod["metadata"]["name"]
        for container in (pod.get("spec") or {}).get("containers") or []:
            if self.logs is not None:
                self.logs.register(namespace, name, container.get("name", ""), output)
        self.core(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"spec": {"nodeName": NODE_NAME}},
            content_type="application/merge-patch+json",
        )
        now = now_rfc3339()
        self._status(
            pod,
            {
                "phase": "Running",
                "startTime": now,
                "podIP": "10.0.255.2",
                "conditions": [
                    _condition(t, True) for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ],
                "containerStatuses": _statuses(pod, {"running": {"startedAt": now}}, ready=True),
            },
        )
        return pod

    def succeed(self, job: Obj) -> None:
        """The submitter exited 0 (`ray job logs --follow` returns once the job ends): the pod Succeeded."""
        for pod in self._pods(job):
            status = pod.get("status") or {}
            if status.get("phase") == "Succeeded":
                continue
            started = next(
                (
                    ((s.get("state") or {}).get("running") or {}).get("startedAt")
                    for s in status.get("containerStatuses") or []
                ),
                None,
            )
            terminated = {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": started or now_rfc3339(),
                "finishedAt": now_rfc3339(),
            }
            terminated_statuses = _statuses(pod, {"terminated": terminated}, ready=False)
            for entry in terminated_statuses:
                entry["state"]["terminated"]["containerID"] = entry["containerID"]
            self._status(
                pod,
                {
                    "phase": "Succeeded",
                    "conditions": [
                        _condition("PodScheduled", True),
                        _condition("Initialized", True, "PodCompleted"),
                        _condition("ContainersReady", False, "PodCompleted"),
                        _condition("Ready", False, "PodCompleted"),
                    ],
                    "containerStatuses": terminated_statuses,
                },
            )
