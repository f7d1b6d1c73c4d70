"""A stand-in for Kueue (v1beta2 API) managing KubeRay RayJobs: Workloads, ClusterQueue quota, admission, eviction.

It models, from kubernetes-sigs/kueue, what the operator depends on:
- pkg/controller/jobs/rayjob/rayjob_controller.go: the RayJob integration (PodSets from head, worker groups and the
  K8sJobMode submitter; IsActive; Finished; Skip with clusterSelector);
- pkg/controller/jobframework/reconciler.go `ReconcileGenericJob`: Workload creation for a suspended RayJob,
  startJob (unsuspend on admission), stopJob (suspend on eviction / when not admitted), quota released only once
  the job is no longer active, Finished;
- pkg/controller/jobs/rayjob/rayjob_webhook.go + raycluster.ValidateCreate + jobframework validation.go: what a
  Kueue-managed RayJob must look like (refused at the API, as the validating webhook does);
- the scheduler (pkg/scheduler/scheduler.go, flavorassigner.go, pkg/workload/workload.go SetQuotaReservation,
  admissionchecks.go SyncAdmittedCondition): nominalQuota per resource and flavor, FIFO by priority then creation,
  StrictFIFO / BestEffortFIFO, QuotaReserved/Admitted conditions with Kueue's messages;
- eviction on demand (`evict`), as the preemptor writes it (pkg/scheduler/preemption/preemption.go IssuePreemptions,
  pkg/workload/evict Evict): Evicted + Preempted conditions; the reconciler then suspends the RayJob.

Not modelled: cohorts and borrowing, automatic priority-based preemption, admission checks, TAS, fair sharing,
waitForPodsReady, flavor node labels injected into pod templates (podset.Merge), the Workload finalizer.
Threads, not asyncio: informers feed one worker that reconciles jobs and runs the scheduler in turn, so quota is
never double-booked.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import re
import threading
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from .controllers import Informer, WorkQueue, event_body
from .emulator import now_rfc3339, parse_rfc3339

Obj = dict[str, Any]
logger = logging.getLogger(__name__)

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # pkg/controller/constants QueueLabel
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"  # WorkloadPriorityClassLabel
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # JobUIDLabel
MANAGER = "kueue-controller-manager"
MANAGER_POD = "kueue-controller-manager-6b9f7c8d5-m4x2p"  # the pod that writes Events (reportingInstance)
USER_AGENT = "kueue-standin/v0.19"
RAY_GROUP, RAY_VERSION = "ray.io", "v1"
HEAD_POD_SET = "head"  # rayjob_controller.go headGroupPodSetName
SUBMITTER_POD_SET = "submitter"  # submitterJobPodSetName
MAX_POD_SETS = 18  # jobframework.MaxPodSets

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME = {"type": "string", "maxLength": 253, "pattern": _DNS1123_SUBDOMAIN.pattern}
_POD_SET_NAME = {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "default": "main"}
_QUANTITY = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "x-kubernetes-int-or-string": True,
    "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
}
_CONDITIONS = {  # metav1.Condition, as every Kueue status declares it
    "type": "array",
    "maxItems": 16,
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
    "items": {
        "type": "object",
        "required": ["lastTransitionTime", "message", "reason", "status", "type"],
        "properties": {
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "message": {"type": "string", "maxLength": 32768},
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "reason": {
                "type": "string",
                "minLength": 1,
                "maxLength": 1024,
                "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
            },
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "type": {"type": "string", "maxLength": 316},
        },
    },
}
_RESERVED = "has(self.status) && has(self.status.conditions) && self.status.conditions.exists(c, c.type == 'QuotaReserved' && c.status == 'True')"


def _crd(
    kind: str, plural: str, schema: Obj, *, namespaced: bool, short: list[str], columns: list[Obj], status: bool = True
) -> Obj:
    """A CRD document shaped as config/components/crd/bases/kueue.x-k8s.io_<plural>.yaml (v1beta2, storage), with a
    schema covering the fields this stand-in and the operator use (the rest of spec/status is left open)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if namespaced else "Cluster",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}} if status else {},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def _object(spec: Obj, status: Obj | None = None, *, required: list[str] | None = None, **extra: Any) -> Obj:
    props: Obj = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": spec,
    }
    if status is not None:
        props["status"] = status
    return {"type": "object", "properties": props, **({"required": required} if required else {}), **extra}


WORKLOAD_SCHEMA = _object(
    {
        "type": "object",
        "required": ["podSets"],
        "x-kubernetes-validations": [
            {
                "rule": "!has(self.priorityClassRef) || has(self.priority)",
                "message": "priority should not be nil when priorityClassRef is set",
            }
        ],
        "properties": {
            "active": {"type": "boolean", "default": True},
            "podSets": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_POD_SETS,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {
                    "type": "object",
                    "required": ["template"],
                    "properties": {
                        "name": _POD_SET_NAME,
                        "count": {"type": "integer", "format": "int32", "minimum": 0, "default": 1},
                        "minCount": {"type": "integer", "format": "int32", "minimum": 1},
                        "template": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    },
                },
            },
            "queueName": _NAME,
            "priority": {"type": "integer", "format": "int32"},
            "priorityClassRef": {
                "type": "object",
                "required": ["group", "kind", "name"],
                "properties": {
                    "group": {"type": "string", "enum": ["kueue.x-k8s.io", "scheduling.k8s.io"]},
                    "kind": {"type": "string", "enum": ["WorkloadPriorityClass", "PriorityClass"]},
                    "name": {**_NAME, "minLength": 1},
                },
            },
            "maximumExecutionTimeSeconds": {"type": "integer", "format": "int32", "minimum": 1},
        },
    },
    {
        "type": "object",
        "properties": {
            "conditions": _CONDITIONS,
            "admission": {
                "type": "object",
                "required": ["clusterQueue", "podSetAssignments"],
                "properties": {
                    "clusterQueue": _NAME,
                    "podSetAssignments": {
                        "type": "array",
                        "maxItems": MAX_POD_SETS,
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": _POD_SET_NAME,
                                "flavors": {"type": "object", "additionalProperties": _NAME},
                                "resourceUsage": {"type": "object", "additionalProperties": _QUANTITY},
                                "count": {"type": "integer", "format": "int32", "minimum": 0},
                            },
                        },
                    },
                },
            },
            "requeueState": {
                "type": "object",
                "properties": {
                    "count": {"type": "integer", "format": "int32"},
                    "requeueAt": {"type": "string", "format": "date-time"},
                },
            },
            "resourceRequests": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": _POD_SET_NAME,
                        "resources": {"type": "object", "additionalProperties": _QUANTITY},
                    },
                },
            },
            "accumulatedPastExecutionTimeSeconds": {"type": "integer", "format": "int32"},
        },
    },
    **{
        "x-kubernetes-validations": [
            {
                "rule": f"{_RESERVED} && has(self.status.admission) ? "
                "size(self.spec.podSets) == size(self.status.admission.podSetAssignments) : true",
                "message": "podSetAssignments must have the same number of podSets as the spec",
            }
        ]
    },
)

CLUSTER_QUEUE_SCHEMA = _object(
    {
        "type": "object",
        "properties": {
            "resourceGroups": {
                "type": "array",
                "maxItems": 16,
                "items": {
                    "type": "object",
                    "required": ["coveredResources", "flavors"],
                    "properties": {
                        "coveredResources": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": 64,
                            "items": {"type": "string"},
                        },
                        "flavors": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": 64,
                            "items": {
                                "type": "object",
                                "required": ["name", "resources"],
                                "properties": {
                                    "name": _NAME,
                                    "resources": {
                                        "type": "array",
                                        "minItems": 1,
                                        "maxItems": 64,
                                        "items": {
                                            "type": "object",
                                            "required": ["name", "nominalQuota"],
                                            "properties": {
                                                "name": {"type": "string"},
                                                "nominalQuota": _QUANTITY,
                                                "borrowingLimit": _QUANTITY,
                                                "lendingLimit": _QUANTITY,
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
            "cohortName": {"type": "string"},
            "queueingStrategy": {
                "type": "string",
                "enum": ["StrictFIFO", "BestEffortFIFO"],
                "default": "BestEffortFIFO",
            },
            "namespaceSelector": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "preemption": {
                "type": "object",
                "properties": {
                    "withinClusterQueue": {
                        "type": "string",
                        "enum": ["Never", "LowerPriority", "LowerOrNewerEqualPriority"],
                    },
                    "reclaimWithinCohort": {"type": "string", "enum": ["Never", "LowerPriority", "Any"]},
                },
            },
            "stopPolicy": {"type": "string", "enum": ["None", "Hold", "HoldAndDrain"]},
        },
    },
    {
        "type": "object",
        "properties": {
            "conditions": _CONDITIONS,
            "pendingWorkloads": {"type": "integer"},
            "reservingWorkloads": {"type": "integer"},
            "admittedWorkloads": {"type": "integer"},
            "flavorsReservation": {
                "type": "array",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
            "flavorsUsage": {
                "type": "array",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
    },
)

LOCAL_QUEUE_SCHEMA = _object(
    {
        "type": "object",
        "required": ["clusterQueue"],
        "properties": {
            "clusterQueue": _NAME,
            "stopPolicy": {"type": "string", "enum": ["None", "Hold", "HoldAndDrain"]},
        },
        "x-kubernetes-validations": [
            {"rule": "self.clusterQueue == oldSelf.clusterQueue", "message": "field is immutable"}
        ],
    },
    {
        "type": "object",
        "properties": {
            "conditions": _CONDITIONS,
            "pendingWorkloads": {"type": "integer"},
            "reservingWorkloads": {"type": "integer"},
            "admittedWorkloads": {"type": "integer"},
        },
    },
    required=["spec"],
)

RESOURCE_FLAVOR_SCHEMA = _object(
    {
        "type": "object",
        "properties": {
            "nodeLabels": {"type": "object", "maxProperties": 8, "additionalProperties": {"type": "string"}},
            "nodeTaints": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            "tolerations": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        },
    },
)

PRIORITY_CLASS_SCHEMA = {
    "type": "object",
    "required": ["value"],
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "value": {"type": "integer", "format": "int32"},
        "description": {"type": "string"},
    },
}

_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
KUEUE_CRDS: tuple[Obj, ...] = (
    _crd(
        "Workload",
        "workloads",
        WORKLOAD_SCHEMA,
        namespaced=True,
        short=["kwl", "kueueworkload", "kueueworkloads"],
        columns=[
            {"name": "Queue", "type": "string", "jsonPath": ".spec.queueName"},
            {"name": "Reserved in", "type": "string", "jsonPath": ".status.admission.clusterQueue"},
            {"name": "Admitted", "type": "string", "jsonPath": ".status.conditions[?(@.type=='Admitted')].status"},
            {"name": "Finished", "type": "string", "jsonPath": ".status.conditions[?(@.type=='Finished')].status"},
            _AGE,
        ],
    ),
    _crd(
        "ClusterQueue",
        "clusterqueues",
        CLUSTER_QUEUE_SCHEMA,
        namespaced=False,
        short=["cq"],
        columns=[
            {"name": "Cohort", "type": "string", "jsonPath": ".spec.cohortName"},
            {"name": "Pending Workloads", "type": "integer", "jsonPath": ".status.pendingWorkloads"},
        ],
    ),
    _crd(
        "LocalQueue",
        "localqueues",
        LOCAL_QUEUE_SCHEMA,
        namespaced=True,
        short=["queue", "queues", "lq"],
        columns=[
            {"name": "ClusterQueue", "type": "string", "jsonPath": ".spec.clusterQueue"},
            {"name": "Pending Workloads", "type": "integer", "jsonPath": ".status.pendingWorkloads"},
            {"name": "Admitted Workloads", "type": "integer", "jsonPath": ".status.admittedWorkloads"},
        ],
    ),
    _crd(
        "ResourceFlavor",
        "resourceflavors",
        RESOURCE_FLAVOR_SCHEMA,
        namespaced=False,
        short=["flavor", "flavors", "rf"],
        columns=[],
        status=False,
    ),
    _crd(
        "WorkloadPriorityClass",
        "workloadpriorityclasses",
        PRIORITY_CLASS_SCHEMA,
        namespaced=False,
        short=["wpc"],
        columns=[{"name": "Value", "type": "integer", "jsonPath": ".value"}],
        status=False,
    ),
)


# --------------------------------------------------------------------------------------------------------------------
# Pure pieces: validation, pod sets, names, quota


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
    if not _DNS1123_SUBDOMAIN.match(queue) or len(queue) > 253:
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


def _quantity(value: Any) -> Decimal:
    from kubernetes.utils import parse_quantity

    return Decimal(parse_quantity(value))


def _format(resource: str, amount: Decimal) -> str:
    """resource.Quantity's canonical form, as Kueue prints requests and capacity (cpu in millis when fractional)."""
    if amount == amount.to_integral_value():
        whole = int(amount)
        if resource == "memory" or resource.endswith("storage"):
            for suffix, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
                if whole and whole % size == 0:
                    return f"{whole // size}{suffix}"
        return str(whole)
    return f"{int(amount * 1000)}m"


def pod_requests(template: Mapping[str, Any]) -> dict[str, Decimal]:
    """A pod's requests as Kueue counts them (limits stand in for missing requests; init containers by max)."""
    spec = template.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in wanted.items():
            total[name] = total.get(name, Decimal(0)) + _quantity(value)
    for container in spec.get("initContainers") or []:
        resources = container.get("resources") or {}
        for name, value in {**(resources.get("limits") or {}), **(resources.get("requests") or {})}.items():
            total[name] = max(total.get(name, Decimal(0)), _quantity(value))
    for name, value in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, Decimal(0)) + _quantity(value)
    return total


def workload_requests(workload: Mapping[str, Any]) -> list[tuple[str, int, dict[str, Decimal]]]:
    """(pod set, count, total requests) of each pod set."""
    out = []
    for ps in (workload.get("spec") or {}).get("podSets") or []:
        count = int(ps.get("count", 1))
        per_pod = pod_requests(ps.get("template") or {})
        out.append((ps.get("name", "main"), count, {k: v * count for k, v in per_pod.items()}))
    return out


def _condition(
    type_: str, status: bool, reason: str, message: str, generation: int | None = None, at: str | None = None
) -> Obj:
    condition: Obj = {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": at or now_rfc3339(),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def set_condition(conditions: list[Obj], new: Obj) -> list[Obj]:
    """apimeta.SetStatusCondition: replace by type; lastTransitionTime kept when the status did not change."""
    out, found = [], False
    for c in conditions:
        if c.get("type") == new["type"]:
            found = True
            merged = {**c, **new}
            if c.get("status") == new["status"]:
                merged["lastTransitionTime"] = c.get("lastTransitionTime", new["lastTransitionTime"])
            out.append(merged)
        else:
            out.append(c)
    if not found:
        out.append(new)
    return out


def condition_of(obj: Mapping[str, Any], type_: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def is_true(obj: Mapping[str, Any], type_: str) -> bool:
    c = condition_of(obj, type_)
    return c is not None and c.get("status") == "True"


def _rayjob_active(rayjob: Mapping[str, Any]) -> bool:
    """rayjob_controller.go IsActive: not Suspended and not New (no pods should exist then)."""
    return (rayjob.get("status") or {}).get("jobDeploymentStatus", "") not in ("Suspended", "")


def _rayjob_finished(rayjob: Mapping[str, Any]) -> tuple[str, bool, bool]:
    """rayjob_controller.go Finished: (message, success, finished)."""
    status = rayjob.get("status") or {}
    return (
        str(status.get("message") or ""),
        status.get("jobStatus") == "SUCCEEDED",
        status.get("jobDeploymentStatus") in ("Failed", "Complete"),
    )


# --------------------------------------------------------------------------------------------------------------------
# The stand-in


class KueueStandIn:
    """Kueue for RayJobs against a Kubernetes API (the emulator in practice).

        kueue = KueueStandIn(server.api_client())
        kueue.start()                         # installs the Kueue CRDs if missing and the RayJob webhook
        kueue.apply_queues(cluster_queue("gpu-cq", {"nvidia.com/gpu": 4}), local_queue("team-a", "gpu-q", "gpu-cq"))
        ...
        kueue.evict("team-a", workload_name)  # what the preemptor does to a victim
        kueue.stop()

    With `server` (an EmulatorServer) the stand-in registers the RayJob validating webhook in the emulator, so a
    Kueue-managed RayJob that breaks rayjob_webhook.go's rules is refused at the API as on a real cluster.
    """

    def __init__(self, api_client: Any, *, server: Any = None, poll_interval: float = 0.5) -> None:
        import kubernetes.client

        api_client.user_agent = USER_AGENT
        self.api_client = api_client
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.ApiException = kubernetes.client.ApiException
        self.server = server
        self.poll_interval = poll_interval
        self.queue = WorkQueue()
        self._install_crds()
        kueue = (self.custom, GROUP, VERSION)
        self.rayjobs = Informer(self.custom, RAY_GROUP, RAY_VERSION, "rayjobs", self._on_rayjob)
        self.workloads = Informer(*kueue, "workloads", self._on_workload)
        self.cluster_queues = Informer(*kueue, "clusterqueues", self._on_queue_change)
        self.local_queues = Informer(*kueue, "localqueues", self._on_queue_change)
        self.priority_classes = Informer(*kueue, "workloadpriorityclasses", self._on_queue_change)
        self._informers = (self.rayjobs, self.workloads, self.cluster_queues, self.local_queues, self.priority_classes)
        self._worker = threading.Thread(target=self._work, name="kueue-worker", daemon=True)
        self._lock = threading.Lock()
        self.events: list[tuple[str, str, str]] = []  # (object name, reason, message), for tests
        self.admissions: list[tuple[str, str, float]] = []  # (workload, cluster queue, when)
        self._webhook_installed = False

    # ---- lifecycle

    def _install_crds(self) -> None:
        import kubernetes.client

        ext = kubernetes.client.ApiextensionsV1Api(self.api_client)
        for crd in KUEUE_CRDS:
            try:
                ext.create_custom_resource_definition(copy.deepcopy(crd))
            except self.ApiException as e:
                if e.status != 409:
                    raise

    def start(self, timeout: float = 10.0) -> KueueStandIn:
        if self.server is not None:
            self._install_webhook()
        for informer in self._informers:
            informer.start()
        for informer in self._informers:
            if not informer.synced.wait(timeout):
                self.stop()
                raise RuntimeError(f"the Kueue stand-in could not list {informer.plural}")
        self._worker.start()
        self.queue.add(("schedule",))
        return self

    def stop(self, timeout: float = 5.0) -> None:
        for informer in self._informers:
            informer.stop(timeout)
        self.queue.close()
        if self._worker.is_alive():
            self._worker.join(timeout)
        if self._webhook_installed and self.server is not None and self.server.running:
            self._uninstall_webhook()

    def __enter__(self) -> KueueStandIn:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _install_webhook(self) -> None:
        """vrayjob.kb.io (failurePolicy Fail): the API refuses RayJob creates and updates that break Kueue's rules."""
        hooks = self.server.emulator.validating_webhooks
        self.server.call(lambda: hooks.append(self._admission_review))
        self._webhook_installed = True

    def _uninstall_webhook(self) -> None:
        hooks = self.server.emulator.validating_webhooks
        self.server.call(lambda: hooks.remove(self._admission_review) if self._admission_review in hooks else None)
        self._webhook_installed = False

    def _admission_review(self, resource: str, old: Obj | None, new: Obj) -> tuple[str, list[str]]:
        if resource != f"{RAY_GROUP}/rayjobs":
            return "", []
        if old is None:
            return "vrayjob.kb.io", validate_rayjob_for_kueue(new)
        return "vrayjob.kb.io", validate_rayjob_update(old, new)

    # ---- queues (for tests and the sandbox)

    def apply(self, obj: Obj) -> Obj:
        """Create or replace a Kueue object (ClusterQueue, LocalQueue, ResourceFlavor, WorkloadPriorityClass)."""
        plural = {
            "ClusterQueue": "clusterqueues",
            "LocalQueue": "localqueues",
            "ResourceFlavor": "resourceflavors",
            "WorkloadPriorityClass": "workloadpriorityclasses",
        }[obj["kind"]]
        namespace, name = obj["metadata"].get("namespace"), obj["metadata"]["name"]
        try:
            if namespace:
                return dict(self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, obj))
            return dict(self.custom.create_cluster_custom_object(GROUP, VERSION, plural, obj))
        except self.ApiException as e:
            if e.status != 409:
                raise
        for _ in range(20):  # replace; the stand-in's own status writes may bump the resourceVersion in between
            if namespace:
                current = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
            else:
                current = self.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
            body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
            try:
                if namespace:
                    return dict(
                        self.custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, body)
                    )
                return dict(self.custom.replace_cluster_custom_object(GROUP, VERSION, plural, name, body))
            except self.ApiException as e:
                if e.status != 409:
                    raise
        raise RuntimeError(f"could not replace {plural}/{name}: conflicts")

    def apply_queues(self, *objects: Obj) -> None:
        for obj in objects:
            self.apply(obj)

    # ---- eviction on demand (the preemptor's half; the job reconciler then stops the RayJob)

    def evict(
        self,
        namespace: str,
        name: str,
        *,
        reason: str = "Preempted",
        preemption_reason: str = "InClusterQueue",
        message: str = "",
    ) -> Obj:
        """Evict an admitted Workload as preemption.go IssuePreemptions does: Evicted=True (reason Preempted) and
        Preempted=True (reason InClusterQueue...), with the preemptor's message."""
        text = message or (
            "Preempted to accommodate a workload (UID: UNKNOWN, JobUID: UNKNOWN) due to "
            "prioritization in the ClusterQueue; preemptor path: UNKNOWN; preemptee path: UNKNOWN"
        )
        for _ in range(20):
            wl = dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", name))
            if not (wl.get("status") or {}).get("admission"):
                raise ValueError(f"workload {namespace}/{name} holds no quota: nothing to evict")
            conditions = list((wl.get("status") or {}).get("conditions") or [])
            generation = wl["metadata"].get("generation")
            conditions = set_condition(conditions, _condition("Evicted", True, reason, text, generation))
            if reason == "Preempted":
                conditions = set_condition(conditions, _condition("Preempted", True, preemption_reason, text))
            try:
                patched = self._patch_workload_status(wl, {"conditions": conditions})
            except self.ApiException as e:
                if e.status == 409:
                    continue
                raise
            self._event(wl, "Normal", "Preempted" if reason == "Preempted" else "EvictedDueTo" + reason, text)
            return patched
        raise RuntimeError(f"could not evict {namespace}/{name}: conflicts")

    # ---- informers into the queue

    def _on_rayjob(self, rayjob: Obj) -> None:
        self.queue.add(("job", rayjob["metadata"]["namespace"], rayjob["metadata"]["name"]))

    def _on_workload(self, wl: Obj) -> None:
        for ref in wl["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "RayJob" and ref.get("controller"):
                self.queue.add(("job", wl["metadata"]["namespace"], ref["name"]))
        self.queue.add(("schedule",))

    def _on_queue_change(self, _: Obj) -> None:
        self.queue.add(("schedule",))

    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            assert isinstance(key, tuple)
            delay: float | None = None
            try:
                if key[0] == "job":
                    delay = self.reconcile_job(key[1], key[2])
                else:
                    self.schedule()
            except Exception as e:
                expected = isinstance(e, self.ApiException) and e.status in (404, 409)
                logger.log(logging.DEBUG if expected else logging.WARNING, "kueue %s failed: %r", key, e)
                delay = 0.1
            finally:
                self.queue.done(key)
            if delay is not None:
                self.queue.add_after(key, delay)

    # ---- API helpers

    def _event(self, involved: Obj, type_: str, reason: str, message: str) -> None:
        """An Event through client-go's events recorder (best effort, as the recorder)."""
        with self._lock:
            self.events.append((involved["metadata"]["name"], reason, message))
        body = event_body(involved, type_, reason, message, MANAGER, action=reason, instance=MANAGER_POD)
        try:
            _, url, headers, payload, _ = self.api_client.param_serialize(
                "POST",
                f"/api/v1/namespaces/{body['metadata']['namespace']}/events",
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                body=body,
            )
            self.api_client.call_api("POST", url, header_params=headers, body=payload).read()
        except Exception as e:
            logger.debug("kueue event %s not recorded: %r", reason, e)

    def _patch_workload_status(self, wl: Obj, status: Obj) -> Obj:
        meta = wl["metadata"]
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
        patched = dict(
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, meta["namespace"], "workloads", meta["name"], patch
            )
        )
        self.workloads.remember(patched)
        return patched

    def _patch_rayjob(self, rayjob: Obj, spec: Obj) -> Obj:
        meta = rayjob["metadata"]
        patched = dict(
            self.custom.patch_namespaced_custom_object(
                RAY_GROUP,
                RAY_VERSION,
                meta["namespace"],
                "rayjobs",
                meta["name"],
                {"metadata": {"resourceVersion": meta["resourceVersion"]}, "spec": spec},
            )
        )
        self.rayjobs.remember(patched)
        return patched

    def _workload_for(self, rayjob: Obj) -> Obj | None:
        uid = rayjob["metadata"].get("uid")
        owned = [
            w
            for w in self.workloads.items()
            if w["metadata"].get("namespace") == rayjob["metadata"]["namespace"]
            and any(r.get("uid") == uid and r.get("controller") for r in w["metadata"].get("ownerReferences") or [])
        ]
        return owned[0] if owned else None

    # ---- the job reconciler (jobframework ReconcileGenericJob, for RayJob)

    def reconcile_job(self, namespace: str, name: str) -> float | None:
        rayjob = self.rayjobs.get(namespace, name)
        if rayjob is None or rayjob["metadata"].get("deletionTimestamp"):
            return None  # the Workload goes with its owner (ownerReference GC)
        queue = (rayjob["metadata"].get("labels") or {}).get(QUEUE_LABEL, "")
        spec = rayjob.get("spec") or {}
        if not queue or spec.get("clusterSelector"):
            return None  # no queue name (manageJobsWithoutQueueName off), or RayJob.Skip
        wl = self._workload_for(rayjob)
        if wl is not None and is_true(wl, "Finished"):
            return None
        status = rayjob.get("status") or {}
        if wl is not None and status.get("jobDeploymentStatus") == "ValidationFailed":  # IsOnHold
            if is_true(wl, "QuotaReserved"):
                self._unset_reservation(wl, "OnHold", "Job is on hold")
            return None
        message, success, finished = _rayjob_finished(rayjob)
        if finished:
            if wl is not None:
                conditions = set_condition(
                    list((wl.get("status") or {}).get("conditions") or []),
                    _condition(
                        "Finished",
                        True,
                        "Succeeded" if success else "Failed",
                        message or "Job finished",
                        wl["metadata"].get("generation"),
                    ),
                )
                self._patch_workload_status(wl, {"conditions": conditions})
                self._event(
                    rayjob,
                    "Normal",
                    "FinishedWorkload",
                    f"Workload '{namespace}/{wl['metadata']['name']}' is declared finished",
                )
            return None
        if wl is None:
            if _rayjob_active(rayjob):
                if not spec.get("suspend"):  # step 8 without a Workload: stop it first
                    self._patch_rayjob(rayjob, {"suspend": True})
                return self.poll_interval  # "Job is suspended but still has active pods, waiting"
            self._create_workload(rayjob, queue)
            return None
        evicted = condition_of(wl, "Evicted")
        if evicted is not None and evicted.get("status") == "True":  # 6. handle eviction
            if not spec.get("suspend"):
                self._patch_rayjob(rayjob, {"suspend": True})
                self._event(rayjob, "Normal", "Stopped", evicted.get("message", ""))
                return None
            if is_true(wl, "QuotaReserved") and not _rayjob_active(rayjob):
                # the job is no longer active (KubeRay: Suspended, its cluster gone): clear the admission
                requeued = evicted.get("reason") in ("Preempted", "NodeFailures")
                conditions = set_condition(
                    list(wl["status"].get("conditions") or []),
                    _condition(
                        "Requeued",
                        requeued,
                        evicted.get("reason", ""),
                        evicted.get("message", ""),
                        wl["metadata"].get("generation"),
                    ),
                )
                self._unset_reservation(wl, "PendingEvaluation", evicted.get("message", ""), conditions)
            return self.poll_interval if is_true(wl, "QuotaReserved") else None
        if spec.get("suspend"):  # 7. the job is suspended
            if is_true(wl, "Admitted"):
                cq = (wl["status"].get("admission") or {}).get("clusterQueue", "")
                self._patch_rayjob(rayjob, {"suspend": False})  # startJob -> RunWithPodSetsInfo
                self._event(rayjob, "Normal", "Started", f"Admitted by clusterQueue {cq}")
            return None
        if not is_true(wl, "Admitted"):  # 8. running but not admitted: suspend
            self._patch_rayjob(rayjob, {"suspend": True})
            self._event(rayjob, "Normal", "Stopped", "Not admitted by cluster queue")
        return None

    def _create_workload(self, rayjob: Obj, queue: str) -> None:
        """handleJobWithNoWorkload -> ConstructWorkload: pod sets, queue name, priority, job-uid label, controller
        ownerReference to the RayJob."""
        meta = rayjob["metadata"]
        body: Obj = {
            "apiVersion": API_VERSION,
            "kind": "Workload",
            "metadata": {
                "name": workload_name(rayjob),
                "namespace": meta["namespace"],
                "labels": {JOB_UID_LABEL: meta.get("uid", "")},
                "ownerReferences": [
                    {
                        "apiVersion": f"{RAY_GROUP}/{RAY_VERSION}",
                        "kind": "RayJob",
                        "name": meta["name"],
                        "uid": meta.get("uid", ""),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"podSets": pod_sets_for(rayjob), "queueName": queue, "active": True, "priority": 0},
        }
        priority_class = (meta.get("labels") or {}).get(PRIORITY_CLASS_LABEL, "")
        if priority_class:
            wpc = self.priority_classes.get("", priority_class)
            if wpc is None:
                raise self.ApiException(status=404, reason=f"workloadpriorityclass {priority_class} not found")
            body["spec"]["priority"] = int(wpc.get("value", 0))
            body["spec"]["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": priority_class}
        try:
            created = dict(
                self.custom.create_namespaced_custom_object(GROUP, VERSION, meta["namespace"], "workloads", body)
            )
        except self.ApiException as e:
            if e.status == 409:
                return
            raise
        self.workloads.remember(created)
        self._event(
            rayjob, "Normal", "CreatedWorkload", f"Created Workload: {meta['namespace']}/{body['metadata']['name']}"
        )
        self.queue.add(("schedule",))

    def _unset_reservation(self, wl: Obj, reason: str, message: str, conditions: list[Obj] | None = None) -> Obj:
        """UnsetQuotaReservationWithCondition (+ SyncAdmittedCondition): QuotaReserved False, admission cleared,
        Admitted False / NoReservation."""
        conditions = list(conditions if conditions is not None else (wl.get("status") or {}).get("conditions") or [])
        generation = wl["metadata"].get("generation")
        conditions = set_condition(conditions, _condition("QuotaReserved", False, reason, message, generation))
        if condition_of({"status": {"conditions": conditions}}, "Admitted") is not None:
            conditions = set_condition(
                conditions,
                _condition("Admitted", False, "NoReservation", "The workload has no reservation", generation),
            )
        patched = self._patch_workload_status(wl, {"conditions": conditions, "admission": None})
        self.queue.add(("schedule",))
        return patched

    # ---- the scheduler

    def schedule(self) -> None:
        """One scheduling pass: each ClusterQueue admits its pending Workloads by priority, then creation, while
        they fit its nominalQuota (StrictFIFO: the head blocks the rest; BestEffortFIFO: the rest may go)."""
        cqs = {cq["metadata"]["name"]: cq for cq in self.cluster_queues.items()}
        lqs = {(lq["metadata"]["namespace"], lq["metadata"]["name"]): lq for lq in self.local_queues.items()}
        workloads = [
            w
            for w in self.workloads.items()
            if not is_true(w, "Finished") and not w["metadata"].get("deletionTimestamp")
        ]
        usage: dict[str, dict[tuple[str, str], Decimal]] = {name: {} for name in cqs}
        for wl in workloads:
            admission = (wl.get("status") or {}).get("admission") or {}
            if admission.get("clusterQueue") in usage:
                for psa in admission.get("podSetAssignments") or []:
                    for resource, amount in (psa.get("resourceUsage") or {}).items():
                        flavor = (psa.get("flavors") or {}).get(resource, "")
                        key = (flavor, resource)
                        usage[admission["clusterQueue"]][key] = usage[admission["clusterQueue"]].get(
                            key, Decimal(0)
                        ) + _quantity(amount)
        pending: dict[str, list[Obj]] = {name: [] for name in cqs}
        for wl in workloads:
            if (wl.get("status") or {}).get("admission") or not (wl.get("spec") or {}).get("active", True):
                continue
            lq = lqs.get((wl["metadata"]["namespace"], (wl.get("spec") or {}).get("queueName", "")))
            if lq is None:
                self._pending(wl, "Misconfigured", f"LocalQueue {wl['spec'].get('queueName', '')} doesn't exist")
                continue
            cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
            if cq_name not in cqs:
                self._pending(wl, "Misconfigured", f"ClusterQueue {cq_name} doesn't exist")
                continue
            if (cqs[cq_name].get("spec") or {}).get("stopPolicy") in ("Hold", "HoldAndDrain"):
                self._pending(wl, "Suspended", f"ClusterQueue {cq_name} is inactive")
                continue
            if not self._namespace_eligible(cqs[cq_name], wl["metadata"]["namespace"]):
                self._pending(wl, "Inadmissible", "workload namespace doesn't match ClusterQueue selector")
                continue
            pending[cq_name].append(wl)
        for cq_name, queue in pending.items():
            cq = cqs[cq_name]
            queue.sort(
                key=lambda w: (
                    -int((w.get("spec") or {}).get("priority") or 0),
                    w["metadata"].get("creationTimestamp", ""),
                    w["metadata"]["name"],
                )
            )
            strict = (cq.get("spec") or {}).get("queueingStrategy", "BestEffortFIFO") == "StrictFIFO"
            blocked = False
            for wl in queue:
                if blocked:
                    self._pending(
                        wl,
                        "WaitingForQuota",
                        f"Workload is waiting behind an older workload in ClusterQueue {cq_name} (StrictFIFO)",
                    )
                    continue
                assignments, reason, message = assign_flavors(cq, wl, usage[cq_name])
                if assignments is None:
                    self._pending(wl, reason, message)
                    blocked = strict
                    continue
                for psa in assignments:
                    for resource, amount in psa["resourceUsage"].items():
                        key = (psa["flavors"][resource], resource)
                        usage[cq_name][key] = usage[cq_name].get(key, Decimal(0)) + _quantity(amount)
                self._admit(wl, cq_name, assignments)
        self._write_queue_status(cqs, lqs)

    def _namespace_eligible(self, cq: Obj, namespace: str) -> bool:
        """spec.namespaceSelector: null selects no namespace, {} every one; matchLabels against the Namespace's
        labels (matchExpressions are not modelled)."""
        selector = (cq.get("spec") or {}).get("namespaceSelector")
        if selector is None:
            return False
        wanted = selector.get("matchLabels") or {}
        if not wanted:
            return True
        import kubernetes.client

        try:
            ns = kubernetes.client.CoreV1Api(self.api_client).read_namespace(namespace)
        except self.ApiException:
            return False
        labels = ns.metadata.labels or {}
        return all(labels.get(k) == v for k, v in wanted.items())

    def _pending(self, wl: Obj, reason: str, message: str) -> None:
        current = condition_of(wl, "QuotaReserved")
        if (
            current is not None
            and current.get("status") == "False"
            and current.get("reason") == reason
            and current.get("message") == message
        ):
            return
        conditions = set_condition(
            list((wl.get("status") or {}).get("conditions") or []),
            _condition("QuotaReserved", False, reason, message, wl["metadata"].get("generation")),
        )
        try:
            self._patch_workload_status(wl, {"conditions": conditions})
        except self.ApiException as e:
            if e.status not in (404, 409):
                raise
            return
        self._event(wl, "Warning", reason, message)

    def _admit(self, wl: Obj, cq_name: str, assignments: list[Obj]) -> None:
        """SetQuotaReservation (Evicted/Preempted reset to False with "Previously: ..."), then SyncAdmittedCondition
        (no admission checks: Admitted at once)."""
        generation = wl["metadata"].get("generation")
        conditions = list((wl.get("status") or {}).get("conditions") or [])
        now = now_rfc3339()
        conditions = set_condition(
            conditions,
            _condition(
                "QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {cq_name}", generation, now
            ),
        )
        for type_ in ("Evicted", "Preempted"):
            previous = condition_of({"status": {"conditions": conditions}}, type_)
            if previous is not None and previous.get("status") == "True":
                conditions = set_condition(
                    conditions,
                    _condition(
                        type_, False, "QuotaReserved", "Previously: " + previous.get("message", ""), generation, now
                    ),
                )
        conditions = set_condition(
            conditions, _condition("Admitted", True, "Admitted", "The workload is admitted", generation, now)
        )
        try:
            patched = self._patch_workload_status(
                wl, {"conditions": conditions, "admission": {"clusterQueue": cq_name, "podSetAssignments": assignments}}
            )
        except self.ApiException as e:
            if e.status in (404, 409):
                self.queue.add_after(("schedule",), 0.05)
                return
            raise
        created = (
            parse_rfc3339(wl["metadata"]["creationTimestamp"]).timestamp()
            if wl["metadata"].get("creationTimestamp")
            else time.time()
        )
        requeued = condition_of(wl, "Requeued")
        since = parse_rfc3339(requeued["lastTransitionTime"]).timestamp() if requeued else created
        with self._lock:
            self.admissions.append((wl["metadata"]["name"], cq_name, time.time()))
        self._event(
            patched,
            "Normal",
            "QuotaReserved",
            f"Quota reserved in ClusterQueue {cq_name}, wait time since queued was {max(time.time() - since, 0):.0f}s",
        )
        self._event(
            patched, "Normal", "Admitted", f"Admitted by ClusterQueue {cq_name}, wait time since reservation was 0s"
        )

    def _write_queue_status(self, cqs: Mapping[str, Obj], lqs: Mapping[tuple[str, str], Obj]) -> None:
        """pendingWorkloads / reservingWorkloads / admittedWorkloads, as the queue controllers count them."""
        workloads = [w for w in self.workloads.items() if not is_true(w, "Finished")]
        for (namespace, name), lq in lqs.items():
            mine = [
                w for w in workloads if w["metadata"]["namespace"] == namespace and w["spec"].get("queueName") == name
            ]
            self._counts("localqueues", lq, mine)
        for name, cq in cqs.items():
            mine = [
                w
                for w in workloads
                if ((w.get("status") or {}).get("admission") or {}).get("clusterQueue") == name
                or (
                    not (w.get("status") or {}).get("admission")
                    and (lqs.get((w["metadata"]["namespace"], w["spec"].get("queueName", ""))) or {})
                    .get("spec", {})
                    .get("clusterQueue")
                    == name
                )
            ]
            self._counts("clusterqueues", cq, mine)

    def _counts(self, plural: str, queue: Obj, workloads: list[Obj]) -> None:
        counts = {
            "pendingWorkloads": sum(1 for w in workloads if not is_true(w, "QuotaReserved")),
            "reservingWorkloads": sum(1 for w in workloads if is_true(w, "QuotaReserved")),
            "admittedWorkloads": sum(1 for w in workloads if is_true(w, "Admitted")),
        }
        if all((queue.get("status") or {}).get(k) == v for k, v in counts.items()):
            return
        meta = queue["metadata"]
        try:
            if plural == "localqueues":
                self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, meta["namespace"], plural, meta["name"], {"status": counts}
                )
            else:
                self.custom.patch_cluster_custom_object_status(GROUP, VERSION, plural, meta["name"], {"status": counts})
        except self.ApiException as e:
            if e.status != 404:
                raise


def assign_flavors(
    cq: Mapping[str, Any], wl: Mapping[str, Any], usage: Mapping[tuple[str, str], Decimal]
) -> tuple[list[Obj] | None, str, str]:
    """flavorassigner.go for one ClusterQueue without cohorts: for each pod set, the first flavor of each resource's
    group whose nominalQuota holds what earlier pod sets and this one need. Returns (podSetAssignments, "", "") or
    (None, reason, Kueue's message: "couldn't assign flavors to pod set <ps>: ...")."""
    groups = (cq.get("spec") or {}).get("resourceGroups") or []
    assumed: dict[tuple[str, str], Decimal] = {}
    assignments: list[Obj] = []
    problems: list[str] = []
    reason = ""
    for ps_name, count, requests in workload_requests(wl):
        flavors: dict[str, str] = {}
        ps_problems: list[str] = []
        for resource, amount in sorted(requests.items()):
            if amount == 0:
                continue
            group = next((g for g in groups if resource in (g.get("coveredResources") or [])), None)
            if group is None:
                ps_problems.append(f"resource {resource} unavailable in ClusterQueue")
                reason = reason or "WaitingForQuota"
                continue
            chosen, why = None, []
            for flavor in group.get("flavors") or []:
                quota = next((r for r in flavor.get("resources") or [] if r.get("name") == resource), None)
                if quota is None:
                    continue
                nominal = _quantity(quota["nominalQuota"])
                key = (flavor["name"], resource)
                before = assumed.get(key, Decimal(0))
                if before + amount > nominal:
                    why.append(
                        f"insufficient quota for {resource} in flavor {flavor['name']}, previously considered "
                        f"podsets requests ({_format(resource, before)}) + current podset request "
                        f"({_format(resource, amount)}) > maximum capacity ({_format(resource, nominal)})"
                    )
                    reason = reason or "ExceedsMaxQuota"
                    continue
                used = usage.get(key, Decimal(0))
                if used + before + amount > nominal:
                    more = used + before + amount - nominal
                    why.append(
                        f"insufficient unused quota for {resource} in flavor {flavor['name']}, "
                        f"{_format(resource, more)} more needed"
                    )
                    reason = "WaitingForQuota" if reason in ("", "ExceedsMaxQuota") else reason
                    continue
                chosen = flavor["name"]
                break
            if chosen is None:
                ps_problems.append(", ".join(why) or f"resource {resource} unavailable in ClusterQueue")
                continue
            flavors[resource] = chosen
        if ps_problems:
            problems.append(f"couldn't assign flavors to pod set {ps_name}: {'; '.join(ps_problems)}")
            continue
        for resource, flavor in flavors.items():
            key = (flavor, resource)
            assumed[key] = assumed.get(key, Decimal(0)) + requests[resource]
        assignments.append(
            {
                "name": ps_name,
                "count": count,
                "flavors": flavors,
                "resourceUsage": {r: _format(r, requests[r]) for r in flavors},
            }
        )
    if problems:
        return None, reason or "WaitingForQuota", "; ".join(problems)
    return assignments, "", ""


# --------------------------------------------------------------------------------------------------------------------
# Objects a platform team creates (docs/kueue.md shows the same)


def resource_flavor(name: str = "default-flavor", node_labels: Mapping[str, str] | None = None) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": dict(node_labels)} if node_labels else {},
    }


def cluster_queue(
    name: str, quota: Mapping[str, Any], *, flavor: str = "default-flavor", strategy: str = "BestEffortFIFO"
) -> Obj:
    """One resource group covering `quota`'s resources, one flavor, nominalQuota as given."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": strategy,
            "resourceGroups": [
                {
                    "coveredResources": list(quota),
                    "flavors": [
                        {"name": flavor, "resources": [{"name": r, "nominalQuota": q} for r, q in quota.items()]}
                    ],
                }
            ],
        },
    }


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def workload_priority_class(name: str, value: int, description: str = "") -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
        "description": description,
    }
