"""The emulator's resource model and how the API answers: the types it serves (built-in kinds, CRDs), their printer
tables, JSON paths and selectors, names and times, and metav1.Status errors. No state: emulator_store.py keeps it."""

from __future__ import annotations

import datetime
import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kmock

from .admission import ADMISSION_GROUP
from .kube_values import parse_rfc3339
from .schema import CrdSchema

Obj = dict[str, Any]


@functools.lru_cache(maxsize=1024)
def resource_key(group: str, version: str | None, plural: str | None) -> kmock.resource:
    """kmock's resource key, cached: building one runs a slow runtime Protocol isinstance check."""
    return kmock.resource(group=group, version=version, plural=plural)


def human_age(timestamp: str | None) -> str:
    """`kubectl get`'s AGE cell (Go's duration.HumanDuration)."""
    if not timestamp:
        return "<unknown>"
    try:
        seconds = int((datetime.datetime.now(datetime.UTC) - parse_rfc3339(timestamp)).total_seconds())
    except ValueError:
        return "<invalid>"
    if seconds < -1:
        return "<invalid>"
    seconds = max(seconds, 0)
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 730:
        return f"{days}d"
    return f"{days // 365}y{days % 365}d" if days < 2920 else f"{days // 365}y"


# --------------------------------------------------------------------------------------------------------------------
# Errors the API answers with (metav1.Status)


@dataclass
class ApiError(Exception):
    """An API failure rendered as a metav1.Status, as the real API server sends it."""

    code: int
    reason: str
    message: str
    details: Obj | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> Obj:
        status: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            status["details"] = self.details
        return status


class _InvalidObject(Exception):
    """A 422 Invalid with its field causes (schema.invalid_status builds the body)."""

    def __init__(self, status: Obj) -> None:
        super().__init__(status["message"])
        self.status = status


STATUS_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


# --------------------------------------------------------------------------------------------------------------------
# Resources: what the emulator serves, built from CRD documents (ours, KubeRay's) or from built-in definitions


@dataclass(frozen=True)
class PrinterColumn:
    """One column of `kubectl get` (a CRD's additionalPrinterColumns entry, or a built-in cell function)."""

    name: str
    type: str = "string"
    json_path: str = ""
    priority: int = 0
    description: str = ""
    format: str = ""
    cell: Callable[[Obj], Any] | None = None

    def value(self, obj: Obj) -> Any:
        if self.cell is not None:
            return self.cell(obj)
        value = json_path_get(obj, self.json_path)
        if self.type == "date" and isinstance(value, str):
            return human_age(value)
        return value

    def definition(self) -> Obj:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


@dataclass(frozen=True)
class ResourceType:
    """A served resource: discovery facts plus what the emulator needs to store and print it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    columns: tuple[PrinterColumn, ...] = ()
    custom: bool = False  # a custom resource: strategic-merge patches are refused, as the real server does
    schema: CrdSchema | None = field(default=None, compare=False, repr=False)
    openapi: Obj | None = field(default=None, compare=False, repr=False)  # the version's openAPIV3Schema

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> kmock.resource:
        return resource_key(self.group, self.version, self.plural)

    @property
    def qualified(self) -> str:
        """The name the real server puts in messages: `trainingsweeps.sweeps.dev`, or `pods`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def info(self) -> kmock.ResourceInfo:
        verbs = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
        return kmock.ResourceInfo(
            kind=self.kind,
            singular=self.singular or self.kind.lower(),
            namespaced=self.namespaced,
            verbs=verbs,
            shortnames=set(self.short_names),
            categories=set(self.categories),
            subresources=set(self.subresources),
        )

    @classmethod
    def from_crd(cls, crd: Mapping[str, Any]) -> list[ResourceType]:
        """One ResourceType per served version of an apiextensions.k8s.io/v1 CRD document."""
        spec = crd["spec"]
        names = spec["names"]
        result = []
        for version in spec.get("versions", []):
            if not version.get("served", True):
                continue
            columns = tuple(
                PrinterColumn(
                    name=c["name"],
                    type=c.get("type", "string"),
                    json_path=c["jsonPath"],
                    priority=int(c.get("priority", 0)),
                    description=c.get("description", ""),
                    format=c.get("format", ""),
                )
                for c in version.get("additionalPrinterColumns", [])
            )
            if not columns:  # the server's default for a CRD without printer columns
                columns = (PrinterColumn("Age", "date", ".metadata.creationTimestamp"),)
            result.append(
                cls(
                    group=spec["group"],
                    version=version["name"],
                    plural=names["plural"],
                    kind=names["kind"],
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    singular=names.get("singular", ""),
                    short_names=tuple(names.get("shortNames", [])),
                    categories=tuple(names.get("categories", [])),
                    subresources=tuple(version.get("subresources", {}) or {}),
                    columns=columns,
                    custom=True,
                    schema=compiled_schema(names["kind"], spec["group"], version),
                    openapi=(version.get("schema") or {}).get("openAPIV3Schema"),
                )
            )
        return result


_SCHEMAS: dict[str, CrdSchema] = {}


def compiled_schema(kind: str, group: str, version: Mapping[str, Any]) -> CrdSchema:
    """One compiled schema per distinct CRD version (KubeRay's take a second to compile; every test reuses it)."""
    raw = (version.get("schema") or {}).get("openAPIV3Schema")
    digest = json.dumps([kind, group, version.get("name"), raw], sort_keys=True)
    if digest not in _SCHEMAS:
        _SCHEMAS[digest] = CrdSchema(kind, group, raw)
    return _SCHEMAS[digest]


def minimal_crd(
    group: str,
    version: str,
    kind: str,
    plural: str,
    *,
    short_names: Iterable[str] = (),
    categories: Iterable[str] = (),
    namespaced: bool = True,
    status: bool = True,
    columns: Iterable[Mapping[str, Any]] = (),
) -> Obj:
    """A schema-less CRD document: enough for discovery, storage, printing and kubectl."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": list(short_names),
                "categories": list(categories),
            },
            "scope": "Namespaced" if namespaced else "Cluster",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    "subresources": {"status": {}} if status else {},
                    "additionalPrinterColumns": [dict(c) for c in columns],
                }
            ],
        },
    }


_AGE = {"name": "age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


# kopf's peering resources, so an operator started without --standalone finds them (and falls back cleanly).
KOPF_PEERING_CRDS: tuple[Obj, ...] = (
    minimal_crd("kopf.dev", "v1", "KopfPeering", "kopfpeerings", status=False),
    minimal_crd("kopf.dev", "v1", "ClusterKopfPeering", "clusterkopfpeerings", namespaced=False, status=False),
)


def _pod_ready(pod: Obj) -> str:
    statuses = pod.get("status", {}).get("containerStatuses", [])
    total = len(pod.get("spec", {}).get("containers", [])) or len(statuses)
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _pod_status(pod: Obj) -> str:
    """kubectl's STATUS cell: a waiting container's reason (ImagePullBackOff) beats the phase."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "Terminating"
    status = pod.get("status", {})
    for container in status.get("containerStatuses", []):
        waiting = container.get("state", {}).get("waiting")
        if waiting and waiting.get("reason"):
            return str(waiting["reason"])
    return str(status.get("reason") or status.get("phase") or "Unknown")


def _pod_restarts(pod: Obj) -> int:
    return sum(int(s.get("restartCount", 0)) for s in pod.get("status", {}).get("containerStatuses", []))


def _event_object(event: Obj) -> str:
    involved = event.get("involvedObject", {})
    return f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"


def _event_last_seen(event: Obj) -> str:
    return human_age(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp"))


_AGE_COLUMN = PrinterColumn("Age", "date", ".metadata.creationTimestamp")

BUILTIN_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        short_names=("ns",),
        subresources=("status", "finalize"),
        columns=(PrinterColumn("Status", json_path=".status.phase"), _AGE_COLUMN),
    ),
    ResourceType(
        "",
        "v1",
        "pods",
        "Pod",
        short_names=("po",),
        categories=("all",),
        subresources=("status",),
        columns=(
            PrinterColumn("Ready", cell=_pod_ready),
            PrinterColumn("Status", cell=_pod_status),
            PrinterColumn("Restarts", "integer", cell=_pod_restarts),
            _AGE_COLUMN,
            PrinterColumn("IP", json_path=".status.podIP", priority=1),
            PrinterColumn("Node", json_path=".spec.nodeName", priority=1),
        ),
    ),
    ResourceType(
        "",
        "v1",
        "events",
        "Event",
        short_names=("ev",),
        columns=(
            PrinterColumn("Last Seen", cell=_event_last_seen),
            PrinterColumn("Type", json_path=".type"),
            PrinterColumn("Reason", json_path=".reason"),
            PrinterColumn("Object", cell=_event_object),
            PrinterColumn("Message", json_path=".message"),
        ),
    ),
    ResourceType("", "v1", "configmaps", "ConfigMap", short_names=("cm",), columns=(_AGE_COLUMN,)),
    ResourceType("", "v1", "secrets", "Secret", columns=(PrinterColumn("Type", json_path=".type"), _AGE_COLUMN)),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",), columns=(_AGE_COLUMN,)),
    ResourceType(
        "",
        "v1",
        "services",
        "Service",
        short_names=("svc",),
        categories=("all",),
        subresources=("status",),
        columns=(PrinterColumn("Cluster-IP", json_path=".spec.clusterIP"), _AGE_COLUMN),
    ),
    ResourceType("batch", "v1", "jobs", "Job", categories=("all",), subresources=("status",), columns=(_AGE_COLUMN,)),
    # What the operator's chart installs (stored as given: no controller acts on them here).
    ResourceType(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        short_names=("deploy",),
        categories=("all",),
        subresources=("status",),
        columns=(_AGE_COLUMN,),
    ),
    ResourceType(
        "",
        "v1",
        "resourcequotas",
        "ResourceQuota",
        short_names=("quota",),
        subresources=("status",),
        columns=(_AGE_COLUMN,),
    ),
    ResourceType(
        "networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=("netpol",), columns=(_AGE_COLUMN,)
    ),
    ResourceType(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        short_names=("pdb",),
        subresources=("status",),
        columns=(_AGE_COLUMN,),
    ),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", columns=(_AGE_COLUMN,)),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", columns=(_AGE_COLUMN,)),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False, columns=(_AGE_COLUMN,)
    ),
    ResourceType(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
        columns=(_AGE_COLUMN,),
    ),
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short_names=("crd", "crds"),
        subresources=("status",),
        columns=(PrinterColumn("Created At", json_path=".metadata.creationTimestamp"),),
    ),
    # What the admission chain reads (admission.py): the chart's guard policy and the operator's webhooks.
    ResourceType(
        ADMISSION_GROUP,
        "v1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        namespaced=False,
        subresources=("status",),
        columns=(_AGE_COLUMN,),
    ),
    ResourceType(
        ADMISSION_GROUP,
        "v1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        namespaced=False,
        columns=(_AGE_COLUMN,),
    ),
    ResourceType(
        ADMISSION_GROUP,
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        namespaced=False,
        columns=(_AGE_COLUMN,),
    ),
    ResourceType(
        ADMISSION_GROUP,
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        namespaced=False,
        columns=(_AGE_COLUMN,),
    ),
)


# --------------------------------------------------------------------------------------------------------------------
# Field paths and selectors


_PATH_TOKEN = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]")


def json_path_get(obj: Any, path: str) -> Any:
    """The value at a simple JSONPath (`.status.phase`, `.spec.items[0].name`); None when absent."""
    path = path.strip().removeprefix("{").removesuffix("}").removeprefix("$")
    current = obj
    for match in _PATH_TOKEN.finditer(path):
        key, index = match.groups()
        if key is not None:
            current = current.get(key) if isinstance(current, Mapping) else None
        else:
            items = current if isinstance(current, list) else []
            current = items[int(index)] if int(index) < len(items) else None
        if current is None:
            return None
    return current


_SET_REQUIREMENT = re.compile(r"^\s*(\S+?)\s+(in|notin)\s+\((.*)\)\s*$")


def _split_selector(selector: str) -> list[str]:
    """Split on commas that are not inside `in (a,b)` parentheses."""
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate on labels for a labelSelector string (=, ==, !=, in, notin, key, !key)."""
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for requirement in _split_selector(selector or ""):
        if match := _SET_REQUIREMENT.match(requirement):
            key, op, raw = match.groups()
            values = {v.strip() for v in raw.split(",") if v.strip()}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif "!=" in requirement:
            key, value = (s.strip() for s in requirement.split("!=", 1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in requirement:
            key, value = (s.strip() for s in re.split(r"==?", requirement, maxsplit=1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif requirement.startswith("!"):
            absent = requirement[1:].strip()
            checks.append(lambda labels, k=absent: k not in labels)
        else:
            checks.append(lambda labels, k=requirement: k in labels)
    return lambda labels: all(check(labels) for check in checks)


def _field_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(selector: str) -> Callable[[Obj], bool]:
    """A predicate on objects for a fieldSelector string (`metadata.name=x,involvedObject.kind!=Pod`).

    The real server allows a few fields per kind; the emulator allows any dotted path.
    """
    checks: list[Callable[[Obj], bool]] = []
    for requirement in _split_selector(selector or ""):
        negate = "!=" in requirement
        path, value = (s.strip() for s in re.split(r"!=|==?", requirement, maxsplit=1))
        checks.append(lambda obj, p=path, v=value, n=negate: (_field_text(json_path_get(obj, "." + p)) == v) != n)
    return lambda obj: all(check(obj) for check in checks)


def render_table(items: list[Obj], resource_type: ResourceType, query: Mapping[str, str], resource_version: int) -> Obj:
    """A meta.k8s.io/v1 Table of `items` (what `kubectl get` asks for): the name, then the type's printer columns."""
    include = query.get("includeObject", "Metadata")
    columns = [
        PrinterColumn(
            "Name", format="name", description="Name must be unique within a namespace.", json_path=".metadata.name"
        ),
        *resource_type.columns,
    ]
    rows = []
    for obj in items:
        row: Obj = {"cells": [c.value(obj) for c in columns]}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata", {}),
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": str(resource_version)},
        "columnDefinitions": [c.definition() for c in columns],
        "rows": rows,
    }
