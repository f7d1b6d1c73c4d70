"""KubeRay's objects built without a client, as its common/ package builds them: a RayCluster's pods, its head
Service and ready status, the RayCluster and submitter Job of a RayJob."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants

from ..controllers import Obj
from ..kube_values import now_rfc3339, random_suffix
from ..submitter_pods import container_id
from .rayjob_types import (
    CREATED_BY,
    DEFAULT_SUBMITTER_BACKOFF_LIMIT,
    HEAD_GROUP,
    LABEL_CLUSTER,
    LABEL_CREATED_BY,
    LABEL_GROUP,
    LABEL_NODE_TYPE,
    LABEL_SUBMISSION_MODE,
)
from .runners import PendingPods, PendingReason


def owner_ref(obj: Mapping[str, Any]) -> Obj:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def first_image(template: Mapping[str, Any]) -> str:
    containers = (template.get("spec") or {}).get("containers") or [{}]
    return str(containers[0].get("image", "rayproject/ray:2.58.0"))


def worker_count(group: Mapping[str, Any]) -> int:
    replicas = group.get("replicas", group.get("minReplicas", 0)) or 0
    return int(replicas)


@dataclass
class PodPlan:
    """One pod the RayCluster controller wants: its name, node type, group and template."""

    name: str
    node_type: str
    group: str
    template: Obj


def plan_pods(cluster: Mapping[str, Any], workers: int | None = None) -> list[PodPlan]:
    """KubeRay's pods for a cluster: `<cluster>-head-xxxxx` and `<cluster>-<group>-worker-xxxxx`."""
    name = cluster["metadata"]["name"]
    spec = cluster.get("spec") or {}
    plans = [
        PodPlan(
            f"{name}-head-{random_suffix()}",
            "head",
            HEAD_GROUP,
            (spec.get("headGroupSpec") or {}).get("template") or {},
        )
    ]
    for group in spec.get("workerGroupSpecs") or []:
        if group.get("suspend") is True:
            continue  # reconcilePods: a suspended group's pods are deleted and the group skipped
        count = worker_count(group) if workers is None else workers
        for _ in range(count):
            plans.append(
                PodPlan(
                    f"{name}-{group['groupName']}-worker-{random_suffix()}",
                    "worker",
                    group["groupName"],
                    group.get("template") or {},
                )
            )
    return plans


# common/service.go getDefaultPorts (v1.7.0): the head Service's ports when the head container names none.
DEFAULT_HEAD_PORTS = {"client": 10001, "gcs-server": 6379, "dashboard": 8265, "metrics": 8080, "serve": 8000}
CLUSTER_DOMAIN = "cluster.local"  # utils.GetClusterDomainName without CLUSTER_DOMAIN set


def head_service_name(cluster: Mapping[str, Any]) -> str:
    """utils.GenerateHeadServiceName (RayClusterCRD): headGroupSpec.headService's name, else `<cluster>-head-svc`."""
    head = (cluster.get("spec") or {}).get("headGroupSpec") or {}
    custom = ((head.get("headService") or {}).get("metadata") or {}).get("name")
    return str(custom) if custom else f"{cluster['metadata']['name']}-head-svc"


def head_service_body(cluster: Mapping[str, Any]) -> Obj:
    """common/service.go BuildServiceForHeadPod with createService's controller reference (v1.7.0, without a custom
    headService beyond its name): HeadServiceLabels as labels and selector (app.kubernetes.io/name from the head
    template's labels if set), the head container's named ports (getPortsFromCluster; unnamed: `<port>-port`) or
    getDefaultPorts, metrics always, appProtocol tcp, sorted by name; headless (clusterIP None, not-ready addresses
    published) unless the type is other than ClusterIP."""
    name = cluster["metadata"]["name"]
    head = (cluster.get("spec") or {}).get("headGroupSpec") or {}
    template = head.get("template") or {}
    selector = {
        LABEL_CLUSTER: name,
        LABEL_NODE_TYPE: "head",
        "ray.io/identifier": f"{name}-head",
        "app.kubernetes.io/name": ((template.get("metadata") or {}).get("labels") or {}).get(
            "app.kubernetes.io/name", "kuberay"
        ),
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    containers = (template.get("spec") or {}).get("containers") or [{}]
    ports = {
        str(p.get("name") or f"{p.get('containerPort')}-port"): int(p["containerPort"])
        for p in containers[0].get("ports") or []
        if isinstance(p, Mapping) and "containerPort" in p
    } or dict(DEFAULT_HEAD_PORTS)
    ports.setdefault("metrics", DEFAULT_HEAD_PORTS["metrics"])
    kind = head.get("serviceType") or ""
    spec: Obj = {
        "selector": selector,
        "ports": [{"name": n, "port": port, "appProtocol": "tcp"} for n, port in sorted(ports.items())],
    }
    if kind:
        spec["type"] = kind
    if kind in ("", "ClusterIP"):
        spec.update(clusterIP="None", publishNotReadyAddresses=True)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": head_service_name(cluster),
            "namespace": cluster["metadata"]["namespace"],
            "labels": dict(selector),
            "annotations": dict(head.get("headServiceAnnotations") or {}),
            "ownerReferences": [owner_ref(cluster)],
        },
        "spec": spec,
    }


def head_service_url(service: Mapping[str, Any]) -> str | None:
    """utils.FetchHeadServiceURL: `<service>.<namespace>.svc.<domain>:<the port named dashboard>`; None without
    that port ("dashboard port is not found")."""
    meta = service["metadata"]
    port = next(
        (p["port"] for p in (service.get("spec") or {}).get("ports") or [] if p.get("name") == "dashboard"), None
    )
    return None if port is None else f"{meta['name']}.{meta['namespace']}.svc.{CLUSTER_DOMAIN}:{port}"


def pod_body(cluster: Mapping[str, Any], plan: PodPlan) -> Obj:
    template = plan.template
    cluster_name = cluster["metadata"]["name"]
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels.update(
        {
            LABEL_CLUSTER: cluster_name,
            LABEL_NODE_TYPE: plan.node_type,
            LABEL_GROUP: plan.group,
            "ray.io/identifier": f"{cluster_name}-{plan.node_type}",
            "ray.io/is-ray-node": "yes",
            "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": plan.name,
            "namespace": cluster["metadata"]["namespace"],
            "labels": labels,
            "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
            "ownerReferences": [owner_ref(cluster)],
        },
        "spec": copy.deepcopy(template.get("spec") or {"containers": [{"name": "ray", "image": "rayproject/ray"}]}),
    }


def status_condition(type_: str, status: bool, reason: str = "", message: str = "") -> Obj:
    condition: Obj = {"type": type_, "status": "True" if status else "False", "lastTransitionTime": now_rfc3339()}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def cluster_condition(type_: str, status: bool, reason: str, message: str = "") -> Obj:
    """A metav1.Condition, as RayCluster status.conditions holds them: message and reason always present."""
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339(),
    }


def container_statuses(pod: Mapping[str, Any], *, ready: bool, waiting: Obj | None = None) -> list[Obj]:
    statuses = []
    for container in pod["spec"].get("containers", []):
        state: Obj = {"running": {"startedAt": now_rfc3339()}} if ready else {"waiting": dict(waiting or {})}
        entry: Obj = {
            "name": container.get("name", "ray"),
            "image": container.get("image", ""),
            "imageID": "",
            "ready": ready,
            "restartCount": 0,
            "started": ready,
            "state": state,
        }
        if ready:  # a started container has the id the kubelet serves its log by
            entry["containerID"] = container_id(dict(pod), entry["name"])
        statuses.append(entry)
    return statuses


def running_pod_status(pod: Mapping[str, Any], index: int) -> Obj:
    """A pod's status once its containers run. A condition whose status does not change keeps its
    lastTransitionTime (kubelet pkg/kubelet/status/status_manager.go `updateLastTransitionTime`, which
    updateStatusInternal applies to PodScheduled too): PodScheduled stays the binding's time, which GPU-hour
    accounting reads as the moment the pod took its GPUs; startTime is set once (`generateAPIPodStatus`)."""
    before = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    conditions = []
    for type_ in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        condition, old = status_condition(type_, True), before.get(type_) or {}
        if old.get("status") == "True" and old.get("lastTransitionTime"):
            condition["lastTransitionTime"] = old["lastTransitionTime"]
        conditions.append(condition)
    return {
        "phase": "Running",
        "podIP": f"10.0.{index // 250}.{index % 250 + 2}",
        "startTime": (pod.get("status") or {}).get("startTime") or now_rfc3339(),
        "conditions": conditions,
        "containerStatuses": container_statuses(pod, ready=True),
    }


def unschedulable_message(pending: PendingPods) -> str:
    if pending.message:
        return pending.message
    n = pending.nodes
    if pending.reason is PendingReason.INSUFFICIENT_GPU:
        return (
            f"0/{n} nodes are available: {n} Insufficient {constants.GPU_RESOURCE}. preemption: 0/{n} nodes are "
            f"available: {n} No preemption victims found for incoming pod."
        )
    return (
        f"0/{n} nodes are available: {n} node(s) didn't match Pod's node affinity/selector. preemption: 0/{n} "
        f"nodes are available: {n} Preemption is not helpful for scheduling."
    )


def ready_cluster_status(cluster: Obj) -> Obj:
    """A RayCluster's status once its pods run, as raycluster_controller.go's calculateStatus writes it (state `ready`,
    stateTransitionTimes, lastUpdateTime; every field in the v1.7.0 CRD's status schema)."""
    groups = (cluster.get("spec") or {}).get("workerGroupSpecs") or []
    desired = sum(worker_count(g) for g in groups)
    name = cluster["metadata"]["name"]
    now = now_rfc3339()
    return {
        "state": "ready",
        "stateTransitionTimes": {"ready": now},
        "lastUpdateTime": now,
        "desiredWorkerReplicas": desired,
        "availableWorkerReplicas": desired,
        "readyWorkerReplicas": desired,
        "minWorkerReplicas": sum(int(g.get("minReplicas", 0) or 0) for g in groups),
        "maxWorkerReplicas": sum(int(g.get("maxReplicas", 0) or 0) for g in groups),
        "endpoints": {"client": "10001", "dashboard": "8265", "gcs-server": "6379", "metrics": "8080"},
        "head": {
            "podName": f"{name}-head-{random_suffix()}",
            "podIP": "10.0.0.2",
            "serviceName": f"{name}-head-svc",
            "serviceIP": "10.96.0.10",
        },
        "conditions": [
            cluster_condition("HeadPodReady", True, "HeadPodRunningAndReady"),
            cluster_condition(
                "RayClusterProvisioned",
                True,
                "AllPodRunningAndReadyFirstTime",
                "All Ray Pods are ready for the first time",
            ),
        ],
        "observedGeneration": cluster["metadata"].get("generation", 1),
    }


def submission_mode(spec: Mapping[str, Any]) -> str:
    """spec.submissionMode, with the default the API server applies from the v1.7.0 CRD (K8sJobMode)."""
    return str(spec.get("submissionMode") or "K8sJobMode")


def cluster_for(rayjob: Obj, name: str) -> Obj:
    """rayjob_controller.go constructRayClusterForRayJob: the RayJob's labels (maps.Copy) plus originated-from-cr-name,
    originated-from-crd and job-submission-mode; ALL its annotations (maps.Copy, v1.7.0 line 1005); a deep copy of
    spec.rayClusterSpec; a controller ownerReference to the RayJob (ctrl.SetControllerReference)."""
    meta, spec = rayjob["metadata"], rayjob.get("spec") or {}
    labels = dict(meta.get("labels") or {})
    labels[constants.RAY_LABEL_ORIGINATED_FROM_CR_NAME] = meta["name"]
    labels[constants.RAY_LABEL_ORIGINATED_FROM_CRD] = constants.RAYJOB_KIND
    labels[LABEL_SUBMISSION_MODE] = submission_mode(spec)
    annotations = dict(meta.get("annotations") or {})
    cluster_spec = copy.deepcopy(spec["rayClusterSpec"])
    if submission_mode(spec) == "SidecarMode":
        annotations["ray.io/disable-provisioned-head-restart"] = "true"
        cluster_spec.setdefault("headGroupSpec", {}).setdefault("template", {}).setdefault("spec", {})[
            "restartPolicy"
        ] = "Never"
    return {
        "apiVersion": constants.RAY_API_VERSION,
        "kind": constants.RAYCLUSTER_KIND,
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_ref(rayjob)],
        },
        "spec": cluster_spec,
    }


def submitter_job_for(rayjob: Obj, cluster: Obj) -> Obj:
    """rayjob_controller.go createNewK8sJob/getSubmitterTemplate (K8sJobMode): a batch/v1 Job named as the RayJob,
    owned by it, backoffLimit from submitterConfig (default 2), its pod template from submitterPodTemplate (or the
    head container's image) with KubeRay's labels and RAY_DASHBOARD_ADDRESS / RAY_JOB_SUBMISSION_ID."""
    meta, spec, status = rayjob["metadata"], rayjob.get("spec") or {}, rayjob.get("status") or {}
    kuberay_labels = {
        constants.RAY_LABEL_ORIGINATED_FROM_CR_NAME: meta["name"],
        constants.RAY_LABEL_ORIGINATED_FROM_CRD: constants.RAYJOB_KIND,
        LABEL_CREATED_BY: CREATED_BY,
    }
    template = copy.deepcopy(spec.get("submitterPodTemplate") or {})
    pod_spec = template.setdefault("spec", {})
    if not pod_spec.get("containers"):
        head = (((cluster.get("spec") or {}).get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
        image = ((head.get("containers") or [{}])[0]).get("image", "rayproject/ray")
        pod_spec["containers"] = [{"name": "ray-job-submitter", "image": image}]
        pod_spec["restartPolicy"] = "Never"
    container = pod_spec["containers"][0]
    if not container.get("command"):
        container["command"] = ["/bin/bash", "-ce", "--"]
        container["args"] = [
            f"ray job submit --address http://{status.get('dashboardURL', '')} "
            f"--submission-id {status.get('jobId', '')} --no-wait -- {spec.get('entrypoint', '')}"
        ]
    container["env"] = [
        *(container.get("env") or []),
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "RAY_DASHBOARD_ADDRESS", "value": status.get("dashboardURL", "")},
        {"name": "RAY_JOB_SUBMISSION_ID", "value": status.get("jobId", "")},
    ]
    template.setdefault("metadata", {}).setdefault("labels", {}).update(kuberay_labels)
    backoff = (spec.get("submitterConfig") or {}).get("backoffLimit", DEFAULT_SUBMITTER_BACKOFF_LIMIT)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": dict(kuberay_labels),
            "ownerReferences": [owner_ref(rayjob)],
        },
        "spec": {"backoffLimit": backoff, "template": template},
    }
