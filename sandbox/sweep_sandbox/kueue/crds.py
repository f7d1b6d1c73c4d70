"""The Kueue v1beta2 API as the stand-in installs it: its group, labels and names, and the CRDs of Workload,
ClusterQueue, LocalQueue, ResourceFlavor and WorkloadPriorityClass with the schemas and rules the API enforces."""

from __future__ import annotations

import re
from typing import Any

Obj = dict[str, Any]


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

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME = {"type": "string", "maxLength": 253, "pattern": DNS1123_SUBDOMAIN.pattern}
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
