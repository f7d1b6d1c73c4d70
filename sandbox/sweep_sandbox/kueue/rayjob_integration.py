"""Kueue's RayJob integration without a client (pkg/controller/jobs/rayjob): what its webhook refuses, the PodSets of
a RayJob, its Workload's name, and whether the RayJob is active or finished."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

from .crds import (
    DNS1123_SUBDOMAIN,
    HEAD_POD_SET,
    MAX_POD_SETS,
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    RAY_GROUP,
    SUBMITTER_POD_SET,
    Obj,
)


def validate_rayjob_for_kueue(rayjob: Mapping[str, Any]) -> list[str]:
    """rayjob_webhook.go validateCreate (+ raycluster.ValidateCreate, jobframework.ValidateJobOnCreate) for a RayJob
    with a queue name: the field errors the validating webhook refuses it with (empty: valid)."""
    labels = (rayjob.get("metadata") or {}).get("labels") or {}
    queue = labels.get(QUEUE_LABEL, "")
    if not queue:
        return []  # manageJobsWithoutQueueName is off: not Kueue's
    errors: list[str] = []
    spec = rayjob.get("spec") or {}
    selector, cluster_spec = spec.get("clusterSelector") or {}, spec.get("rayClusterSpec")
    if selector and cluster_spec is not None:
        return [
            f"spec.clusterSelector: Invalid value: {selector!r}: a kueue managed job should not use an existing cluster"
        ]
    if selector:
        return []  # uses an existing cluster: not managed by Kueue (RayJob.Skip)
    if cluster_spec is None:
        return [
            "spec.rayClusterSpec: Required value: rayClusterSpec is required for Kueue-managed jobs that don't "
            "use clusterSelector"
        ]
    if not spec.get("shutdownAfterJobFinishes"):
        errors.append(
            "spec.shutdownAfterJobFinishes: Invalid value: false: a kueue managed job should delete the "
            "cluster after finishing"
        )
    if (
        cluster_spec.get("enableInTreeAutoscaling")
        and ((rayjob.get("metadata") or {}).get("annotations") or {}).get("kueue.x-k8s.io/elastic-job") != "true"
    ):
        errors.append(
            "spec.rayClusterSpec.enableInTreeAutoscaling: Invalid value: true: a kueue managed job should "
            "only use autoscaling when workload slicing is enabled"
        )
    groups = cluster_spec.get("workerGroupSpecs") or []
    if len(groups) + 1 > MAX_POD_SETS:
        errors.append(
            f"spec.rayClusterSpec.workerGroupSpecs: Too many: {len(groups) + 1}: must have at most {MAX_POD_SETS} items"
        )
    for i, group in enumerate(groups):
        if group.get("groupName") == HEAD_POD_SET:
            errors.append(
                f'spec.rayClusterSpec.workerGroupSpecs[{i}].groupName: Forbidden: "head" is reserved for the head group'
            )
    if not DNS1123_SUBDOMAIN.match(queue) or len(queue) > 253:
        errors.append(
            f"metadata.labels[{QUEUE_LABEL}]: Invalid value: {queue!r}: a lowercase RFC 1123 subdomain "
            "must consist of lower case alphanumeric characters, '-' or '.'"
        )
    return errors


def validate_rayjob_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """ValidateJobOnUpdate: the queue name is immutable while the job runs (validateUpdateForQueueName); a priority
    class cannot be added to a running job nor removed (ValidateUpdateForWorkloadPriorityClassName)."""

    def label(obj: Mapping[str, Any], key: str) -> str:
        return ((obj.get("metadata") or {}).get("labels") or {}).get(key, "")

    if not label(new, QUEUE_LABEL) and not label(old, QUEUE_LABEL):
        return []  # ShouldValidateRayOrSparkJobOnUpdate: not Kueue's before or after
    errors: list[str] = []
    suspended = bool((new.get("spec") or {}).get("suspend"))
    if not suspended and label(new, QUEUE_LABEL) != label(old, QUEUE_LABEL):
        errors.append(f"metadata.labels[{QUEUE_LABEL}]: Invalid value: {label(new, QUEUE_LABEL)!r}: field is immutable")
    old_pc, new_pc = label(old, PRIORITY_CLASS_LABEL), label(new, PRIORITY_CLASS_LABEL)
    if not suspended and not old_pc and new_pc:
        errors.append(
            f"metadata.labels[{PRIORITY_CLASS_LABEL}]: Invalid value: {new_pc!r}: WorkloadPriorityClass "
            "cannot be added to a non-suspended workload"
        )
    if old_pc and not new_pc:
        errors.append(
            f'metadata.labels[{PRIORITY_CLASS_LABEL}]: Invalid value: "": WorkloadPriorityClass cannot '
            "be removed from a workload"
        )
    return errors + validate_rayjob_for_kueue(new)


def _submitter_template(spec: Mapping[str, Any]) -> Obj:
    """getSubmitterTemplate: spec.submitterPodTemplate, else KubeRay's default submitter (the head image,
    500m/200Mi requests) as Kueue copies it."""
    if spec.get("submitterPodTemplate"):
        return copy.deepcopy(spec["submitterPodTemplate"])
    head = (((spec.get("rayClusterSpec") or {}).get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
    image = ((head.get("containers") or [{}])[0]).get("image", "")
    return {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": image,
                    "resources": {
                        "limits": {"cpu": "1", "memory": "1Gi"},
                        "requests": {"cpu": "500m", "memory": "200Mi"},
                    },
                }
            ],
        }
    }


def pod_sets_for(rayjob: Mapping[str, Any]) -> list[Obj]:
    """RayJob.PodSets -> raycluster.BuildPodSets (+ addSubmitterPodSet): `head` (count 1; with the autoscaler
    sidecar's 500m/512Mi when in-tree autoscaling is on), one per worker group (count = replicas, default 1, times
    numOfHosts) and `submitter` in K8sJobMode (the default mode)."""
    spec = rayjob.get("spec") or {}
    cluster = spec.get("rayClusterSpec") or {}
    head = copy.deepcopy((cluster.get("headGroupSpec") or {}).get("template") or {})
    if cluster.get("enableInTreeAutoscaling"):
        resources = (cluster.get("autoscalerOptions") or {}).get("resources") or {
            "requests": {"cpu": "500m", "memory": "512Mi"},
            "limits": {"cpu": "500m", "memory": "512Mi"},
        }
        head.setdefault("spec", {}).setdefault("containers", []).append({"name": "autoscaler", "resources": resources})
    pod_sets = [{"name": HEAD_POD_SET, "count": 1, "template": head}]
    for group in cluster.get("workerGroupSpecs") or []:
        count = int(group["replicas"]) if group.get("replicas") is not None else 1
        if int(group.get("numOfHosts") or 1) > 1:
            count *= int(group["numOfHosts"])
        pod_sets.append(
            {
                "name": str(group["groupName"]).lower(),
                "count": count,
                "template": copy.deepcopy(group.get("template") or {}),
            }
        )
    if (spec.get("submissionMode") or "K8sJobMode") == "K8sJobMode":
        pod_sets.append({"name": SUBMITTER_POD_SET, "count": 1, "template": _submitter_template(spec)})
    return pod_sets


def workload_name(rayjob: Mapping[str, Any]) -> str:
    """workload_names.go GetWorkloadNameForOwnerWithGVK: `rayjob-<name>` (truncated) + '-' + sha1(kind, group,
    name, uid)[:5]."""
    meta = rayjob["metadata"]
    digest = hashlib.sha1("\n".join(["RayJob", RAY_GROUP, meta["name"], meta.get("uid", "")]).encode()).hexdigest()
    return f"rayjob-{meta['name']}"[: 253 - 6] + "-" + digest[:5]


def rayjob_active(rayjob: Mapping[str, Any]) -> bool:
    """rayjob_controller.go IsActive: not Suspended and not New (no pods should exist then)."""
    return (rayjob.get("status") or {}).get("jobDeploymentStatus", "") not in ("Suspended", "")


def rayjob_finished(rayjob: Mapping[str, Any]) -> tuple[str, bool, bool]:
    """rayjob_controller.go Finished: (message, success, finished)."""
    status = rayjob.get("status") or {}
    return (
        str(status.get("message") or ""),
        status.get("jobStatus") == "SUCCEEDED",
        status.get("jobDeploymentStatus") in ("Failed", "Complete"),
    )
