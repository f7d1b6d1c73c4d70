"""A Kubernetes API on 127.0.0.1 for the sandbox and the tests: kmock's emulator with its gaps closed.

Adds what kopf, kubectl and the kubernetes client rely on (metadata, resourceVersion watches, subresources, tables,
garbage collection, OpenAPI, server-side apply) and custom resources as strict as kube-apiserver (schema.py).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import copy
import datetime
import functools
import json
import logging
import os
import re
import secrets
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import yaml
from kmock._internal import dicts as kmock_dicts
from kmock._internal import rendering as kmock_rendering

from sweep_contracts import constants
from sweep_contracts.timestamps import parse_time, rfc3339

from . import openapi
from . import schema as crd_schema
from . import schema_apply as managed_fields
from .admission import ADMISSION_GROUP, Admission, AdmissionDenied, AdmissionRequest, UserInfo

Obj = dict[str, Any]
ObjectKey = tuple[kmock.resource, str | None, str]  # (resource, namespace, name), as kmock's ObjectsArray keys

logger = logging.getLogger(__name__)
SERVER_VERSION: Obj = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-kmock",
    "gitCommit": "",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "python",
    "compiler": "kmock",
    "platform": "linux/amd64",
}

FOREGROUND_FINALIZER = "foregroundDeletion"
NAMESPACE_FINALIZER = "kubernetes"
# kube's utilrand alphabet: no vowels (no words), no 0/1/3 (no confusion with o/l/e).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


@functools.lru_cache(maxsize=1024)
def resource_key(group: str, version: str | None, plural: str | None) -> kmock.resource:
    """kmock's resource key, cached: building one runs a slow runtime Protocol isinstance check."""
    return kmock.resource(group=group, version=version, plural=plural)


def random_suffix(length: int = 5) -> str:
    """What Kubernetes appends to a generateName (and KubeRay to a RayCluster name)."""
    return "".join(secrets.choice(_NAME_ALPHABET) for _ in range(length))


def now_rfc3339() -> str:
    return rfc3339()


def parse_rfc3339(value: str) -> datetime.datetime:
    parsed = parse_time(value)
    if parsed is None:
        raise ValueError("an empty time")
    return parsed


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


_MERGE_PATCHES = ("application/merge-patch+json", "application/strategic-merge-patch+json", "application/json")
_FIELD_VALIDATION = {"": "Warn", "Warn": "Warn", "Strict": "Strict", "Ignore": "Ignore"}


def _field_validation(query: Mapping[str, str]) -> str:
    """The fieldValidation directive; absent means Warn (apiserver handlers/rest.go fieldValidation)."""
    value = query.get("fieldValidation", "")
    if value not in _FIELD_VALIDATION:
        raise ApiError(
            400,
            "BadRequest",
            f"fieldValidation parameter unsupported: {value!r}; valid values are Ignore, Warn, or Strict",
        )
    return _FIELD_VALIDATION[value]


def _dry_run(query: Mapping[str, str]) -> bool:
    """dryRun=All (kubectl --dry-run=server): every stage but storage (handlers/rest.go dryRun validation)."""
    value = query.get("dryRun", "")
    if value not in ("", "All"):
        raise ApiError(400, "BadRequest", f"Invalid dry run value: {value!r}; valid values are: All")
    return value == "All"


def _field_manager(query: Mapping[str, str], raw: aiohttp.web.BaseRequest) -> str:
    """fieldManager, else the User-Agent's product (handlers/rest.go prefixFromUserAgent)."""
    if query.get("fieldManager"):
        return query["fieldManager"]
    agent = raw.headers.get("User-Agent", "")
    return agent.split("/", 1)[0][:128] if agent else "unknown"


def _warning_headers(warnings: list[str]) -> Any:
    """One `Warning: 299 - "<text>"` header per warning (RFC 7234 warn-code 299, as apiserver/pkg/warning)."""
    from multidict import CIMultiDict

    headers: CIMultiDict[str] = CIMultiDict()
    for text in dict.fromkeys(warnings):
        headers.add("Warning", "299 - " + json.dumps(text, ensure_ascii=False))
    return headers


def _yaml_body(body: bytes) -> Any:
    """An apply patch's body: YAML (JSON is YAML)."""
    try:
        return yaml.load(body.decode("utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise ApiError(400, "BadRequest", f"error decoding YAML: {e}") from e


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
    schema: crd_schema.CrdSchema | None = field(default=None, compare=False, repr=False)
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


_SCHEMAS: dict[str, crd_schema.CrdSchema] = {}


def compiled_schema(kind: str, group: str, version: Mapping[str, Any]) -> crd_schema.CrdSchema:
    """One compiled schema per distinct CRD version (KubeRay's take a second to compile; every test reuses it)."""
    raw = (version.get("schema") or {}).get("openAPIV3Schema")
    digest = json.dumps([kind, group, version.get("name"), raw], sort_keys=True)
    if digest not in _SCHEMAS:
        _SCHEMAS[digest] = crd_schema.CrdSchema(kind, group, raw)
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

# KubeRay v1.7.0's CRDs as far as the API server is concerned (names, scope, status subresource, printer columns;
# ../shared/schemas/kuberay has the full schemas).
KUBERAY_CRDS: tuple[Obj, ...] = (
    minimal_crd(
        constants.RAY_GROUP,
        constants.RAY_VERSION_API,
        constants.RAYJOB_KIND,
        constants.RAYJOB_PLURAL,
        categories=["all"],
        columns=[
            {"name": "job status", "type": "string", "jsonPath": ".status.jobStatus"},
            {"name": "deployment status", "type": "string", "jsonPath": ".status.jobDeploymentStatus"},
            {"name": "ray cluster name", "type": "string", "jsonPath": ".status.rayClusterName"},
            {"name": "start time", "type": "string", "jsonPath": ".status.startTime"},
            {"name": "end time", "type": "string", "jsonPath": ".status.endTime"},
            _AGE,
        ],
    ),
    minimal_crd(
        constants.RAY_GROUP,
        constants.RAY_VERSION_API,
        constants.RAYCLUSTER_KIND,
        constants.RAYCLUSTER_PLURAL,
        categories=["all"],
        columns=[
            {"name": "desired workers", "type": "integer", "jsonPath": ".status.desiredWorkerReplicas"},
            {"name": "available workers", "type": "integer", "jsonPath": ".status.availableWorkerReplicas"},
            {"name": "cpus", "type": "string", "jsonPath": ".status.desiredCPU"},
            {"name": "memory", "type": "string", "jsonPath": ".status.desiredMemory"},
            {"name": "gpus", "type": "string", "jsonPath": ".status.desiredGPU"},
            {"name": "status", "type": "string", "jsonPath": ".status.state"},
            _AGE,
        ],
    ),
)


def kuberay_crd_dir() -> Path | None:
    """$KUBERAY_CRDS when set (only there), else ../shared/schemas/kuberay beside the repository (absent in a fresh
    clone); None when that directory lacks either file."""
    configured = os.environ.get("KUBERAY_CRDS")  # as tests/support/schemas.py kuberay_crd_dir reads it
    candidate = (
        Path(configured)
        if configured
        else Path(__file__).resolve().parents[2].parent / "shared" / "schemas" / "kuberay"
    )
    if (candidate / "ray.io_rayjobs.yaml").is_file() and (candidate / "ray.io_rayclusters.yaml").is_file():
        return candidate
    return None


@functools.lru_cache(maxsize=4)
def _load_crd_files(directory: str) -> tuple[Obj, ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the files are 1-1.4 MB: libyaml reads them in 0.5 s
    return tuple(
        yaml.load((Path(directory) / name).read_text(), Loader=loader)
        for name in ("ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml")
    )


def kuberay_crds() -> tuple[Obj, ...]:
    """KubeRay v1.7.0's full CRDs (schemas, CEL rules) when present; the minimal definitions otherwise."""
    directory = kuberay_crd_dir()
    if directory is None:
        return KUBERAY_CRDS
    return _load_crd_files(str(directory))  # install_crd stores a copy


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
            checks.append(lambda labels, k=requirement[1:].strip(): k not in labels)
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


# --------------------------------------------------------------------------------------------------------------------
# Injected errors


@dataclass
class InjectedError:
    """Answer the next `times` requests that match with `code` instead of serving them (None: every request)."""

    code: int
    times: int | None = 1
    verb: str | None = None  # get, list, watch, create, update (PUT), patch, delete, deletecollection
    plural: str | None = None
    subresource: str | None = None
    name: str | None = None
    namespace: str | None = None
    path: str | None = None  # a regex searched in the URL path
    user_agent: str | None = None  # a regex searched in the User-Agent (kopf's, the stand-in's, kubectl's)
    reason: str = ""
    message: str = ""
    retry_after: int | None = None
    hits: int = 0

    def matches(self, verb: str, path: str, target: RequestTarget | None, user_agent: str = "") -> bool:
        if self.verb is not None and self.verb != verb:
            return False
        if self.path is not None and not re.search(self.path, path):
            return False
        if self.user_agent is not None and not re.search(self.user_agent, user_agent):
            return False
        wanted = (self.plural, self.subresource, self.name, self.namespace)
        if all(w is None for w in wanted):
            return True
        if target is None:
            return False
        return all(
            w is None or w == have
            for w, have in zip(wanted, (target.plural, target.subresource, target.name, target.namespace), strict=True)
        )

    def error(self) -> ApiError:
        reason = self.reason or STATUS_REASONS.get(self.code, "InternalError")
        message = self.message or f"injected error {self.code} ({reason}) by the emulator"
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}
        details = {"retryAfterSeconds": self.retry_after} if self.retry_after is not None else None
        return ApiError(self.code, reason, message, details, headers)


class ErrorInjector:
    """Thread-safe: tests add rules from their own thread while the server answers in its loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[InjectedError] = []

    def inject(self, code: int, times: int | None = 1, **criteria: Any) -> InjectedError:
        """E.g. `inject(409, times=2, verb="patch", plural="trainingsweeps", subresource="status")`."""
        rule = InjectedError(code=code, times=times, **criteria)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    @property
    def pending(self) -> list[InjectedError]:
        with self._lock:
            return [r for r in self._rules if r.times is None or r.times > 0]

    def take(self, verb: str, path: str, target: RequestTarget | None, user_agent: str = "") -> ApiError | None:
        with self._lock:
            for rule in self._rules:
                if (rule.times is None or rule.times > 0) and rule.matches(verb, path, target, user_agent):
                    rule.hits += 1
                    if rule.times is not None:
                        rule.times -= 1
                    return rule.error()
        return None


# --------------------------------------------------------------------------------------------------------------------
# The change log behind resourceVersions and watches


@dataclass(frozen=True)
class Change:
    """One committed mutation; its resourceVersion is `rv`. `old` is the state before it (None on creation)."""

    rv: int
    resource: kmock.resource
    namespace: str | None
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None


class ResourceVersionExpired(Exception):
    """The requested resourceVersion is older than the retained history (HTTP 410 Gone)."""


class ChangeLog:
    """Every mutation in order; watches replay from a resourceVersion and then wait for more."""

    def __init__(self, retain: int = 20_000) -> None:
        self.retain = retain
        self.rv = 0
        self._changes: list[Change] = []
        self._first_rv = 1
        self._wakeup = asyncio.Event()

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def append(self, change: Change) -> None:
        self._changes.append(change)
        if len(self._changes) > self.retain:
            self.compact(keep=self.retain // 2)
        wakeup, self._wakeup = self._wakeup, asyncio.Event()
        wakeup.set()

    def compact(self, keep: int = 0) -> None:
        """Forget all but the last `keep` changes: watches from older resourceVersions get 410 Gone (relist)."""
        del self._changes[: max(len(self._changes) - keep, 0)]
        self._first_rv = self._changes[0].rv if self._changes else self.rv + 1

    def since(self, rv: int) -> list[Change]:
        if rv >= self.rv:
            return []
        if rv < self._first_rv - 1:
            raise ResourceVersionExpired(rv)
        start = rv - self._first_rv + 1
        return self._changes[start:]

    def of(self, resource: kmock.resource, namespace: str | None, name: str) -> list[Change]:
        """The retained changes of one object, oldest first (for asserting progressions)."""
        return [
            c
            for c in self._changes
            if c.resource == resource and c.namespace == namespace and c.obj["metadata"]["name"] == name
        ]

    async def wait(self, timeout: float | None) -> None:
        wakeup = self._wakeup
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wakeup.wait(), timeout)

    def wake_all(self) -> None:
        self._wakeup.set()


# --------------------------------------------------------------------------------------------------------------------
# Request targets


@dataclass(frozen=True)
class RequestTarget:
    """What a resource URL addresses: /api/v1/namespaces/ns/pods/name/status and the like."""

    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_resource_path(path: str) -> RequestTarget | None:
    """The target of a resource URL, or None for discovery and other paths."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if rest[0] == "namespaces":
        if len(rest) == 1:
            return RequestTarget(group, version, "namespaces")
        if len(rest) == 2 or (len(rest) == 3 and rest[2] in ("status", "finalize")):
            if group == "":  # the Namespace object itself (core API only)
                return RequestTarget(group, version, "namespaces", None, rest[1], rest[2] if len(rest) == 3 else None)
            return None
        namespace, rest = rest[1], rest[2:]
    else:
        namespace = None
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return RequestTarget(group, version, plural, namespace, name, subresource)


def _verb(method: str, target: RequestTarget | None, query: Mapping[str, str]) -> str:
    named = target is not None and target.name is not None
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if named else "list"
    return {
        ("POST", False): "create",
        ("PUT", True): "update",
        ("PATCH", True): "patch",
        ("DELETE", True): "delete",
        ("DELETE", False): "deletecollection",
    }.get((method, named), method.lower())


# --------------------------------------------------------------------------------------------------------------------
# The emulator


@attrs.define(kw_only=True)
class KubernetesApiEmulator(kmock.KubernetesEmulator):
    """kmock's in-memory Kubernetes API, made faithful enough for kopf, kubectl and the kubernetes client.

    It serves every resource request itself (kmock's reactions still answer other paths) and keeps objects in
    `self.objects` (kmock's ObjectsArray, for assertions). Everything runs in the server's event loop; from other
    threads, go through the API or `EmulatorServer.call()`.
    """

    history_limit: int = 10  # versions kept per object in `objects[...]` history (kmock keeps all)
    request_log_limit: int = 2_000  # requests kept in kmock's request log (`list(emulator)`); 0 keeps none
    auto_create_namespaces: bool = True  # a namespaced object creates its Namespace (the real server refuses)
    errors: ErrorInjector = attrs.field(factory=ErrorInjector)
    changes: ChangeLog = attrs.field(factory=ChangeLog)
    _types: dict[kmock.resource, ResourceType] = attrs.field(factory=dict, init=False)
    _uids: dict[str, ObjectKey] = attrs.field(factory=dict, init=False)  # live objects by uid
    _live_keys: dict[kmock.resource, set[ObjectKey]] = attrs.field(factory=dict, init=False)
    _dependents_of: dict[str, set[ObjectKey]] = attrs.field(factory=dict, init=False)  # owner uid -> dependents
    _gc_candidates: set[ObjectKey] = attrs.field(factory=set, init=False)  # dependents to look at
    _gc_owners: set[str] = attrs.field(factory=set, init=False)  # foreground owners to look at
    _terminating: set[str] = attrs.field(factory=set, init=False)  # namespaces being drained
    _gc_wakeup: asyncio.Event | None = attrs.field(default=None, init=False)
    _gc_task: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _openapi_cache: tuple[Any, dict[str, tuple[str, bytes]], bytes] | None = attrs.field(default=None, init=False)
    # (resource, field path) of every unknown field a write sent and the server pruned (Warn or Ignore), newest
    # last: a test can assert its component writes nothing a real server would drop
    unknown_fields: collections.deque[tuple[str, str]] = attrs.field(
        factory=lambda: collections.deque(maxlen=1000), init=False
    )
    # Validating admission webhooks (a stand-in registers its own, e.g. Kueue's vrayjob.kb.io): each is called with
    # ("group/plural", old or None, new) and returns (webhook name, denials); any denial refuses the write with 403.
    validating_webhooks: list[Callable[[str, Obj | None, Obj], tuple[str, list[str]]]] = attrs.field(
        factory=list, init=False
    )
    # Users by bearer token, and the API server's admission chain over the stored ValidatingAdmissionPolicies,
    # their bindings and the Mutating/ValidatingWebhookConfigurations (admission.py)
    admission: Admission = attrs.field(factory=Admission, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for resource_type in BUILTIN_RESOURCES:
            self.register(resource_type)

    # ---- registration

    def register(self, resource_type: ResourceType) -> None:
        """Serve a resource (discovery included).

        A new schema for a kind already served defaults its stored objects, as the apiserver defaults what it reads
        from etcd (customresource codec: structuraldefaulting.Default on decode); resourceVersions stay.
        """
        previous = self._types.get(resource_type.key)
        self._types[resource_type.key] = resource_type
        self.resources[resource_type.key] = resource_type.info()
        if previous is not None and resource_type.schema is not None and previous.schema is not resource_type.schema:
            for key in self._live_keys.get(resource_type.key, ()):
                resource_type.schema.apply_defaults(self.objects[key].raw)

    def install_crd(self, crd: Mapping[str, Any]) -> None:
        """Register a CRD's resources and store the CRD object, as applying it to a real cluster would."""
        for resource_type in ResourceType.from_crd(crd):
            self.register(resource_type)
        crd_type = self._type_for("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        key = (crd_type.key, None, crd["metadata"]["name"])
        if key not in self.objects or self.objects[key].deleted:
            self._store_new(crd_type, None, self._stamp_new(crd_type, None, copy.deepcopy(dict(crd))))

    def resource_type(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get(resource_key(group, version, plural))

    def _type_for(self, group: str, version: str, plural: str) -> ResourceType:
        resource_type = self.resource_type(group, version, plural)
        if resource_type is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return resource_type

    # ---- lifecycle (entered by EmulatorServer inside its loop)

    async def __aenter__(self) -> KubernetesApiEmulator:
        await super().__aenter__()
        self._closing = False  # a stopped server can be started again, with its objects
        self.changes._wakeup = asyncio.Event()  # bind to this loop
        self._gc_wakeup = asyncio.Event()
        self._gc_task = asyncio.create_task(self._collect_garbage_forever(), name="emulator-gc")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._closing = True
        self.changes.wake_all()
        if self._gc_task is not None:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
        await super().__aexit__(*exc)

    # ---- HTTP entry point

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body = await raw.read()
        target = parse_resource_path(raw.path)
        query = dict(raw.query)
        verb = _verb(raw.method, target, query)
        request = self._remember(raw, body, target, verb)
        try:
            injected = self.errors.take(verb, raw.path, target, raw.headers.get("User-Agent", ""))
            if injected is not None:
                raise injected
            if target is not None:
                return await self._serve_resource(raw, request, target, verb, query)
            return await self._serve_other(raw, request)
        except ApiError as e:
            return aiohttp.web.json_response(e.body(), status=e.code, headers=e.headers)
        except _InvalidObject as e:
            return aiohttp.web.json_response(e.status, status=422)
        except AdmissionDenied as e:
            return aiohttp.web.json_response(e.status(), status=e.code)
        except managed_fields.ApplyConflict as e:
            return aiohttp.web.json_response(e.status(), status=409)
        except kmock.KubernetesError as e:
            error = ApiError(e.status, e.reason or STATUS_REASONS.get(e.status, "InternalError"), e.message or "")
            return aiohttp.web.json_response(error.body(), status=error.code)
        except Exception as e:  # an emulator bug must reach the client as a 500, never as a hang
            logger.exception("emulator failed on %s %s", raw.method, raw.path_qs)
            error = ApiError(500, "InternalError", f"emulator error: {e!r}")
            return aiohttp.web.json_response(error.body(), status=500)

    def _remember(
        self, raw: aiohttp.web.BaseRequest, body: bytes, target: RequestTarget | None, verb: str
    ) -> kmock_rendering.Request:
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        actions = {
            "list": kmock.action.LIST,
            "watch": kmock.action.WATCH,
            "get": kmock.action.FETCH,
            "create": kmock.action.CREATE,
            "patch": kmock.action.UPDATE,
            "delete": kmock.action.DELETE,
        }
        request = kmock_rendering.Request(
            id=len(self._requests),
            raw_request=raw,
            url=raw.url,
            method=raw.method,
            params=dict(raw.query),
            headers=dict(raw.headers),
            body=body,
            text=body.decode("utf-8", errors="replace"),
            data=data,
            action=actions.get(verb),
            resource=resource_key(target.group, target.version, target.plural) if target else None,
            namespace=target.namespace if target else None,
            name=target.name if target else None,
            subresource=target.subresource if target else None,
        )
        if self.request_log_limit > 0:
            self._requests.append(request)
            if len(self._requests) > self.request_log_limit:
                del self._requests[: self.request_log_limit // 2]
        return request

    async def _serve_other(
        self, raw: aiohttp.web.BaseRequest, request: kmock_rendering.Request
    ) -> aiohttp.web.StreamResponse:
        """Discovery (with core /api/v1 fixed) and version; anything else goes to kmock's reactions."""
        path = "/" + raw.path.strip("/")
        if raw.method == "GET":
            if path == "/":
                return aiohttp.web.json_response(await self._serve_root(request))
            if path == "/version":
                return aiohttp.web.json_response(SERVER_VERSION)
            if path == "/api":
                return aiohttp.web.json_response({"kind": "APIVersions", "versions": ["v1"]})
            if path == "/apis":
                return aiohttp.web.json_response(self._group_list())
            if match := re.fullmatch(r"/api/([^/]+)", path):
                return aiohttp.web.json_response(self._resource_list("", match[1]))
            if match := re.fullmatch(r"/apis/([^/]+)/([^/]+)", path):
                return aiohttp.web.json_response(self._resource_list(match[1], match[2]))
            if match := re.fullmatch(r"/apis/([^/]+)", path):
                return aiohttp.web.json_response(self._group(match[1]))
            if path.startswith("/openapi"):
                return self._serve_openapi(raw, path)
        try:
            return await kmock.RawHandler._handle(self, request)
        except NotImplementedError as e:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})") from e

    def _openapi_documents(self) -> dict[str, tuple[str, bytes]]:
        """Group-version path -> (hash, JSON), rebuilt only when the registered kinds change."""
        key = tuple((t.key, id(t.openapi)) for t in self._types.values())
        if self._openapi_cache is None or self._openapi_cache[0] != key:
            by_gv: dict[str, list[ResourceType]] = {}
            for t in self._types.values():
                by_gv.setdefault(openapi.group_version_path(t.group, t.version), []).append(t)
            documents = {}
            for gv, types in by_gv.items():
                document = openapi.group_version_document(types)
                documents[gv] = (openapi.digest(document), json.dumps(document).encode())
            swagger = json.dumps(openapi.swagger_document(list(self._types.values()))).encode()
            self._openapi_cache = (key, documents, swagger)
        return self._openapi_cache[1]

    def _serve_openapi(self, raw: aiohttp.web.BaseRequest, path: str) -> aiohttp.web.StreamResponse:
        """/openapi/v3, /openapi/v3/<group-version> and /openapi/v2 (JSON; a protobuf-only Accept gets 406)."""
        documents = self._openapi_documents()
        if path == "/openapi/v3":
            paths = {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={h}"} for gv, (h, _) in documents.items()}
            return aiohttp.web.json_response({"paths": paths})
        if path.startswith("/openapi/v3/"):
            entry = documents.get(path.removeprefix("/openapi/v3/"))
            if entry is None:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            headers = {"ETag": json.dumps(entry[0])}
            return aiohttp.web.Response(body=entry[1], content_type="application/json", headers=headers)
        if path == "/openapi/v2":
            accept = raw.headers.get("Accept", "")
            if accept and "json" not in accept and "*/*" not in accept:
                raise ApiError(406, "NotAcceptable", "only application/json is served for /openapi/v2 by the emulator")
            assert self._openapi_cache is not None
            return aiohttp.web.Response(body=self._openapi_cache[2], content_type="application/json")
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")

    def _group(self, group: str) -> Obj:
        versions = list(dict.fromkeys(t.version for t in self._types.values() if t.group == group))
        if not group or not versions:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({group})")
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def _group_list(self) -> Obj:
        groups = dict.fromkeys(t.group for t in self._types.values() if t.group)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [self._group(g) for g in groups]}

    def _resource_list(self, group: str, version: str) -> Obj:
        types = [t for t in self._types.values() if t.group == group and t.version == version]
        if not types:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({group}/{version})")
        resources = []
        for t in types:
            info = t.info()
            resources.append(
                {
                    "name": t.plural,
                    "singularName": info.singular,
                    "namespaced": t.namespaced,
                    "kind": t.kind,
                    "verbs": sorted(info.verbs),
                    "shortNames": list(t.short_names),
                    "categories": list(t.categories),
                }
            )
            for sub in t.subresources:
                resources.append(
                    {
                        "name": f"{t.plural}/{sub}",
                        "singularName": "",
                        "namespaced": t.namespaced,
                        "kind": t.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    # ---- resource requests

    async def _serve_resource(
        self,
        raw: aiohttp.web.BaseRequest,
        request: kmock_rendering.Request,
        target: RequestTarget,
        verb: str,
        query: dict[str, str],
    ) -> aiohttp.web.StreamResponse:
        resource_type = self._type_for(target.group, target.version, target.plural)
        table = "as=Table" in raw.headers.get("Accept", "")
        if verb == "watch":
            return await self._serve_watch(raw, resource_type, target, query, table)
        if verb == "list":
            return aiohttp.web.json_response(self.list_objects(resource_type, target.namespace, query, table))
        if verb == "deletecollection":
            return aiohttp.web.json_response(self._delete_collection(resource_type, target, query))
        data = request.data
        directive = _field_validation(query)
        dry_run = _dry_run(query)
        user = self.admission.authenticate(raw.headers.get("Authorization"))
        warnings: list[str] = []
        if verb == "get":
            if target.subresource not in (None, "status"):
                raise ApiError(
                    404, "NotFound", f"the server could not find the requested resource ({target.subresource})"
                )
            obj = self.get_object(resource_type, target.namespace, target.name or "")
            return aiohttp.web.json_response(self._table([obj], resource_type, query) if table else obj)
        if verb == "create":
            if not isinstance(data, dict):
                raise ApiError(400, "BadRequest", "the request body must be a JSON object")
            created = await self.create_object(
                resource_type,
                target.namespace,
                data,
                directive=directive,
                warnings=warnings,
                manager=_field_manager(query, raw),
                dry_run=dry_run,
                user=user,
            )
            return aiohttp.web.json_response(created, status=201, headers=_warning_headers(warnings))
        if verb in ("patch", "update"):
            content_type = raw.headers.get("Content-Type", "application/json").split(";")[0].strip()
            if content_type == "application/apply-patch+yaml":
                data = _yaml_body(request.body)
            obj = await self._update(
                resource_type,
                target,
                data,
                content_type if verb == "patch" else "replace",
                directive=directive,
                warnings=warnings,
                manager=_field_manager(query, raw),
                force=query.get("force") in ("true", "1"),
                dry_run=dry_run,
                user=user,
            )
            return aiohttp.web.json_response(obj, headers=_warning_headers(warnings))
        if verb == "delete":
            options = dict(data) if isinstance(data, dict) else {}
            for key in ("propagationPolicy", "gracePeriodSeconds"):
                if key in query:
                    options.setdefault(key, query[key])
            if dry_run or "All" in (options.get("dryRun") or []):  # DeleteOptions carry it in the body
                return aiohttp.web.json_response(self.get_object(resource_type, target.namespace, target.name or ""))
            obj, gone = self.delete_object(resource_type, target.namespace, target.name or "", options)
            waits_for_dependents = not gone and _foreground(options)
            return aiohttp.web.json_response(obj, status=202 if waits_for_dependents else 200)
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    # ---- reading

    def _current(self, resource_type: ResourceType, namespace: str | None, name: str) -> Obj | None:
        key = (resource_type.key, namespace if resource_type.namespaced else None, name)
        if key not in self.objects:
            return None
        stored = self.objects[key]
        return None if stored.deleted else stored.raw

    def get_object(self, resource_type: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self._current(resource_type, namespace, name)
        if obj is None:
            raise self._not_found(resource_type, name)
        return obj

    def _not_found(self, resource_type: ResourceType, name: str) -> ApiError:
        details = {"name": name, "group": resource_type.group, "kind": resource_type.plural}
        return ApiError(404, "NotFound", f'{resource_type.qualified} "{name}" not found', details)

    def _live(self, resource_type: ResourceType, namespace: str | None) -> list[Obj]:
        keys = sorted(
            (k for k in self._live_keys.get(resource_type.key, ()) if namespace is None or k[1] == namespace),
            key=lambda k: (k[1] or "", k[2]),
        )
        return [self.objects[k].raw for k in keys]

    def _live_object(self, key: ObjectKey) -> tuple[ResourceType, Obj] | None:
        if key not in self.objects or self.objects[key].deleted or key[0] not in self._types:
            return None
        return self._types[key[0]], self.objects[key].raw

    @staticmethod
    def _selects(query: Mapping[str, str]) -> Callable[[Obj], bool]:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""))
        return lambda obj: labels(obj.get("metadata", {}).get("labels") or {}) and fields(obj)

    def list_objects(
        self, resource_type: ResourceType, namespace: str | None, query: Mapping[str, str], table: bool = False
    ) -> Obj:
        selects = self._selects(query)
        items = [o for o in self._live(resource_type, namespace) if selects(o)]
        metadata: Obj = {"resourceVersion": str(self.changes.rv)}
        if token := query.get("continue"):
            after = tuple(json.loads(base64.urlsafe_b64decode(token.encode())))
            items = [o for o in items if (o["metadata"].get("namespace") or "", o["metadata"]["name"]) > after]
        limit = int(query.get("limit") or 0)
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            position = json.dumps([last.get("namespace") or "", last["name"]]).encode()
            metadata["continue"] = base64.urlsafe_b64encode(position).decode()
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        if table:
            result = self._table(items, resource_type, query)
            result["metadata"].update(metadata)
            return result
        return {
            "kind": f"{resource_type.kind}List",
            "apiVersion": resource_type.api_version,
            "metadata": metadata,
            "items": items,
        }

    def _table(self, items: list[Obj], resource_type: ResourceType, query: Mapping[str, str]) -> Obj:
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
            "metadata": {"resourceVersion": str(self.changes.rv)},
            "columnDefinitions": [c.definition() for c in columns],
            "rows": rows,
        }

    # ---- watching

    async def _serve_watch(
        self,
        raw: aiohttp.web.BaseRequest,
        resource_type: ResourceType,
        target: RequestTarget,
        query: Mapping[str, str],
        table: bool,
    ) -> aiohttp.web.StreamResponse:
        selects = self._selects(query)
        name = target.name
        namespace = target.namespace if resource_type.namespaced else None

        def visible(obj: Obj | None) -> bool:
            if obj is None:
                return False
            meta = obj.get("metadata", {})
            if name is not None and meta.get("name") != name:
                return False
            if namespace is not None and meta.get("namespace") != namespace:
                return False
            return selects(obj)

        def render(event_type: str, obj: Obj) -> bytes:
            payload = self._table([obj], resource_type, query) if table and event_type != "BOOKMARK" else obj
            return json.dumps({"type": event_type, "object": payload}).encode() + b"\n"

        since = query.get("resourceVersion", "")
        initial: list[Obj] = []
        if since in ("", "0") or query.get("sendInitialEvents") == "true":
            initial = [o for o in self._live(resource_type, namespace) if visible(o)]
            position = self.changes.rv
        else:
            try:
                position = int(since)
            except ValueError as e:
                raise ApiError(400, "BadRequest", f"invalid resourceVersion {since!r}") from e

        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        loop = asyncio.get_running_loop()
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        deadline = loop.time() + timeout if timeout is not None else None
        try:
            for obj in initial:
                await response.write(render("ADDED", obj))
            if query.get("sendInitialEvents") == "true":
                bookmark = {
                    "kind": resource_type.kind,
                    "apiVersion": resource_type.api_version,
                    "metadata": {
                        "resourceVersion": str(position),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }
                await response.write(render("BOOKMARK", bookmark))
            while not self._closing:
                try:
                    changes = self.changes.since(position)
                except ResourceVersionExpired:
                    gone = ApiError(410, "Expired", f"too old resource version: {position} ({self.changes.rv})")
                    await response.write(json.dumps({"type": "ERROR", "object": gone.body()}).encode() + b"\n")
                    break
                for change in changes:
                    position = change.rv
                    if change.resource != resource_type.key:
                        continue
                    event_type = self._watch_event_type(change, visible)
                    if event_type is not None:
                        await response.write(render(event_type, change.obj))
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                await self.changes.wait(min(remaining, 5.0) if remaining is not None else 5.0)
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away
        return response

    @staticmethod
    def _watch_event_type(change: Change, visible: Callable[[Obj | None], bool]) -> str | None:
        """Selectors apply to both states: leaving the selection reads as DELETED, entering it as ADDED."""
        now, before = visible(change.obj), visible(change.old)
        if change.type == "MODIFIED":
            if now and before:
                return "MODIFIED"
            return "ADDED" if now else "DELETED" if before else None
        return change.type if now else None

    # ---- writing

    def _commit(self, resource_type: ResourceType, namespace: str | None, new: Obj | None, old: Obj | None) -> None:
        """Store `new` (None: remove `old`) and record the change for watchers and the garbage collector."""
        name = (new or old or {})["metadata"]["name"]
        key = (resource_type.key, namespace, name)
        rv = str(self.changes.next_rv())  # exactly one resourceVersion per recorded change (watches rely on it)
        self._track(key, new, old)
        if new is None:
            assert old is not None
            gone = {**old, "metadata": {**old["metadata"], "resourceVersion": rv}}
            self.objects[key].delete()
            self.changes.append(Change(self.changes.rv, resource_type.key, namespace, "DELETED", gone, old))
        else:
            new["metadata"]["resourceVersion"] = rv
            if key not in self.objects:
                self.objects[key] = new
            elif self.objects[key].deleted:
                self.objects[key].create(new)
            else:
                self.objects[key].history.append(new)
            history = self.objects[key].history
            if self.history_limit and len(history) > self.history_limit:
                del history[: len(history) - self.history_limit]
            change_type = "ADDED" if old is None else "MODIFIED"
            self.changes.append(Change(self.changes.rv, resource_type.key, namespace, change_type, new, old))
            if resource_type.kind == "CustomResourceDefinition" and resource_type.group == "apiextensions.k8s.io":
                for served in ResourceType.from_crd(new):  # `kubectl apply -f crd.yaml` serves the kind at once
                    self.register(served)
        if self._gc_wakeup is not None and (self._gc_candidates or self._gc_owners or self._terminating):
            self._gc_wakeup.set()

    def _track(self, key: ObjectKey, new: Obj | None, old: Obj | None) -> None:
        """Keep the indexes current and queue what the garbage collector must look at after this change."""
        old_refs = _owner_uids(old) if old is not None else set()
        new_refs = _owner_uids(new) if new is not None else set()
        for uid in old_refs - new_refs:
            self._dependents_of.get(uid, set()).discard(key)
        for uid in new_refs - old_refs:
            self._dependents_of.setdefault(uid, set()).add(key)
        if new is None:
            assert old is not None
            uid = old["metadata"].get("uid", "")
            self._uids.pop(uid, None)
            self._live_keys.get(key[0], set()).discard(key)
            self._gc_candidates.update(self._dependents_of.get(uid, ()))  # now without this owner
            self._gc_owners.update(old_refs)  # a foreground owner may have waited for this one
            return
        meta = new["metadata"]
        self._uids[meta["uid"]] = key
        self._live_keys.setdefault(key[0], set()).add(key)
        if new_refs - old_refs:
            self._gc_candidates.add(key)  # an owner that does not exist is collected
        if meta.get("deletionTimestamp"):
            if FOREGROUND_FINALIZER in meta.get("finalizers", []):
                self._gc_candidates.update(self._dependents_of.get(meta["uid"], ()))
                self._gc_owners.add(meta["uid"])
            if _namespace_terminating(new):
                self._terminating.add(meta["name"])

    def _stamp_new(self, resource_type: ResourceType, namespace: str | None, data: Obj) -> Obj:
        obj = dict(data)
        meta = dict(obj.get("metadata") or {})
        obj["apiVersion"] = resource_type.api_version
        obj["kind"] = resource_type.kind
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(
                    422,
                    "Invalid",
                    f"{resource_type.kind} is invalid: metadata.name: Required value: name or generateName is required",
                )
            meta["name"] = meta["generateName"] + random_suffix()
        if resource_type.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        for server_owned in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
            meta.pop(server_owned, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        obj["metadata"] = meta
        if "status" in resource_type.subresources:
            obj.pop("status", None)  # the status subresource owns it; create ignores it
        if resource_type.plural == "namespaces" and resource_type.group == "":
            obj["spec"] = {"finalizers": [NAMESPACE_FINALIZER]}
            obj["status"] = {"phase": "Active"}
        if resource_type.kind == "Pod" and resource_type.group == "":
            obj = normalize_pod_quantities(obj)
            obj["status"] = {"phase": "Pending"}  # as the real server's PrepareForCreate
        return obj

    def _store_new(self, resource_type: ResourceType, namespace: str | None, obj: Obj) -> Obj:
        self._commit(resource_type, namespace, obj, None)
        return obj

    async def create_object(
        self,
        resource_type: ResourceType,
        namespace: str | None,
        data: Obj,
        *,
        directive: str = "Warn",
        warnings: list[str] | None = None,
        manager: str = "",
        applied_by: Obj | None = None,
        dry_run: bool = False,
        user: UserInfo | None = None,
    ) -> Obj:
        """Create an object; `applied_by` is the managedFields entry of a server-side apply that creates it."""
        data = _json_copy(data)
        if resource_type.schema is not None:
            self._decode(resource_type, data, directive, warnings)
        body_ns = (data.get("metadata") or {}).get("namespace")
        if resource_type.namespaced:
            if namespace and body_ns and body_ns != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            namespace = namespace or body_ns or "default"
        else:
            namespace = None
        if (data.get("metadata") or {}).get("resourceVersion"):
            # storage/etcd3/store.go Create, surfaced as an internal error by the generic registry
            raise ApiError(500, "InternalError", "resourceVersion should not be set on objects to be created")
        review = self._admission_request(resource_type, "CREATE", namespace, data, None, user, None, dry_run)
        if review is not None:  # handlers/create.go: mutating admission before the registry's BeforeCreate
            mutated = await self._mutating_admission(review)
            if mutated is not data:
                data = mutated
                if resource_type.schema is not None:  # a mutated custom resource is pruned and defaulted again
                    self._decode(resource_type, data, "Ignore", None)
        obj = self._stamp_new(resource_type, namespace, data)
        name = obj["metadata"]["name"]
        if self._current(resource_type, namespace, name) is not None:
            details = {"name": name, "group": resource_type.group, "kind": resource_type.plural}
            raise ApiError(409, "AlreadyExists", f'{resource_type.qualified} "{name}" already exists', details)
        if resource_type.schema is None:
            self._admit_meta(resource_type, obj)
        if resource_type.schema is not None:
            self._admit(resource_type, obj, None)
            if applied_by is not None:
                obj["metadata"]["managedFields"] = [applied_by]
            elif manager:
                managed_fields.record(obj, None, manager, resource_type.api_version)
        if review is not None:
            review.object, review.name = obj, name
            await self._validating_admission(review, warnings)
            if self._current(resource_type, namespace, name) is not None:  # created while the webhooks answered
                details = {"name": name, "group": resource_type.group, "kind": resource_type.plural}
                raise ApiError(409, "AlreadyExists", f'{resource_type.qualified} "{name}" already exists', details)
        if dry_run:
            return obj  # dryRun=All: admitted, named and stamped, never stored
        if namespace is not None and self.auto_create_namespaces:
            self._ensure_namespace(namespace)
        return self._store_new(resource_type, namespace, obj)

    # ---- admission of custom resources: decoding (prune, default) and validation

    def _decode(
        self,
        resource_type: ResourceType,
        data: Obj,
        directive: str,
        warnings: list[str] | None,
        *,
        defaults: bool = True,
        status_only: bool = False,
        keys: set[str] | None = None,
        patched: str | None = None,
    ) -> None:
        """Prune and default a request's object in place as the CR codec does; Strict refuses unknown fields.

        apiserver/pkg/endpoints/handlers/create.go (and update.go, patch.go): a strict decoding error is a 400
        BadRequest through transformDecodeError; Warn sends one `Warning: 299` header per field.
        """
        assert resource_type.schema is not None
        pruned = resource_type.schema.decode(data, defaults=defaults, status_only=status_only, keys=keys)
        if not pruned:
            return
        if directive != "Strict":
            self.unknown_fields.extend((resource_type.qualified, path) for path in pruned)
        if directive == "Ignore":
            return
        messages = crd_schema.unknown_field_messages(pruned)
        if directive == "Strict" and patched is not None:
            # handlers/patch.go jsonPatcher.applyPatchToCurrentObject: NewInvalid with no kind or name, one cause
            # on the field `patch` quoting the patched object
            error = crd_schema.FieldError(
                "FieldValueInvalid", "patch", patched, f"strict decoding error: {', '.join(messages)}"
            )
            raise _InvalidObject(crd_schema.invalid_status("", "", "", [error]))
        if directive == "Strict":
            raise ApiError(
                400,
                "BadRequest",
                f"{resource_type.kind} in version {json.dumps(resource_type.version)} cannot be handled as a "
                f"{resource_type.kind}: strict decoding error: {', '.join(messages)}",
            )
        if warnings is not None:
            warnings.extend(messages)

    def _admit(self, resource_type: ResourceType, obj: Obj, old: Obj | None, status_only: bool = False) -> None:
        """customresource/strategy.go Validate/ValidateUpdate (status_strategy.go for /status): 422 Invalid."""
        assert resource_type.schema is not None
        errors = resource_type.schema.errors(obj, old, status_only=status_only)
        if errors:
            name = obj["metadata"].get("name", "")
            raise _InvalidObject(crd_schema.invalid_status(resource_type.kind, resource_type.group, name, errors))
        for webhook in () if status_only else list(self.validating_webhooks):
            hook, denials = webhook(f"{resource_type.group}/{resource_type.plural}", old, obj)
            if denials:  # field.ErrorList.ToAggregate(): one error as is, several as [a, b]
                text = denials[0] if len(denials) == 1 else f"[{', '.join(denials)}]"
                raise ApiError(403, "Forbidden", f'admission webhook "{hook}" denied the request: {text}')

    # ---- the admission chain: users, ValidatingAdmissionPolicies, mutating and validating webhooks (admission.py)

    def _admission_request(
        self,
        resource_type: ResourceType,
        operation: str,
        namespace: str | None,
        obj: Obj,
        old: Obj | None,
        user: UserInfo | None,
        subresource: str | None,
        dry_run: bool,
        name: str = "",
    ) -> AdmissionRequest | None:
        """The request the admission chain sees, or None where nothing could act on it: the admission
        configuration kinds themselves (never sent to webhooks or policies, as in the real server) or no
        policy binding and no webhook configuration stored."""
        if resource_type.group == ADMISSION_GROUP or not self._admission_configured():
            return None
        return AdmissionRequest(
            operation,
            resource_type.group,
            resource_type.version,
            resource_type.plural,
            resource_type.kind,
            namespace,
            name or str((obj.get("metadata") or {}).get("name") or ""),
            user or self.admission.authenticate(None),
            obj,
            old,
            subresource=subresource or "",
            dry_run=dry_run,
            namespaced=resource_type.namespaced,
        )

    def _admission_objects(self, plural: str) -> list[Obj]:
        resource_type = self.resource_type(ADMISSION_GROUP, "v1", plural)
        if resource_type is None:
            return []
        return [obj for obj in self._live(resource_type, None) if not obj["metadata"].get("deletionTimestamp")]

    def _admission_configured(self) -> bool:
        return any(
            self._live_keys.get(resource_key(ADMISSION_GROUP, "v1", plural))
            for plural in (
                "validatingadmissionpolicybindings",
                "validatingwebhookconfigurations",
                "mutatingwebhookconfigurations",
            )
        )

    def _namespace_labels(self, namespace: str | None) -> dict[str, str]:
        if not namespace:
            return {}
        stored = self._current(self._type_for("", "v1", "namespaces"), None, namespace)
        return dict(((stored or {}).get("metadata") or {}).get("labels") or {})

    async def _mutating_admission(self, review: AdmissionRequest) -> Obj:
        hooks = Admission.webhooks(self._admission_objects("mutatingwebhookconfigurations"), mutating=True)
        if not hooks:
            return review.object
        return await self.admission.mutate(hooks, review, self._namespace_labels(review.namespace))

    async def _validating_admission(self, review: AdmissionRequest, warnings: list[str] | None) -> None:
        """The ValidatingAdmissionPolicy plugin, then the ValidatingAdmissionWebhook plugin (the default plugin
        order, kube-apiserver's options/plugins.go)."""
        labels = self._namespace_labels(review.namespace)
        bindings = self._admission_objects("validatingadmissionpolicybindings")
        if bindings:
            policies = self._admission_objects("validatingadmissionpolicies")
            self.admission.check_policies(review, policies, bindings, labels, warnings)
        hooks = Admission.webhooks(self._admission_objects("validatingwebhookconfigurations"), mutating=False)
        if hooks:
            await self.admission.validate(hooks, review, labels)

    def _admit_meta(self, resource_type: ResourceType, obj: Obj) -> None:
        """The ObjectMeta checks every built-in kind's strategy runs (labels, annotations, finalizers)."""
        errors = crd_schema.object_meta_errors(obj.get("metadata") or {})
        if errors:
            name = obj["metadata"].get("name", "")
            raise _InvalidObject(crd_schema.invalid_status(resource_type.kind, resource_type.group, name, errors))

    def _ensure_namespace(self, namespace: str) -> None:
        ns_type = self._type_for("", "v1", "namespaces")
        if self._current(ns_type, None, namespace) is None:
            self._store_new(ns_type, None, self._stamp_new(ns_type, None, {"metadata": {"name": namespace}}))

    async def _update(
        self,
        resource_type: ResourceType,
        target: RequestTarget,
        data: Any,
        mode: str,
        **options: Any,
    ) -> Obj:
        """An update or patch; redone on the object as it is now when another write landed while the admission
        webhooks answered (registry/store.go Update's GuaranteedUpdate retries on a conflict it did not ask for)."""
        for _ in range(10):
            result = await self._update_once(resource_type, target, data, mode, **options)
            if result is not None:
                return result
        raise ApiError(409, "Conflict", "the object kept changing during admission; please retry")

    async def _update_once(
        self,
        resource_type: ResourceType,
        target: RequestTarget,
        data: Any,
        mode: str,
        *,
        directive: str = "Warn",
        warnings: list[str] | None = None,
        manager: str = "",
        force: bool = False,
        dry_run: bool = False,
        user: UserInfo | None = None,
    ) -> Obj | None:
        namespace = target.namespace if resource_type.namespaced else None
        name = target.name or ""
        if target.subresource not in (None, "status"):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({target.subresource})")
        if (
            mode == "application/apply-patch+yaml"
            and self._current(resource_type, namespace, name) is None
            and target.subresource is None
        ):
            return await self._apply_create(
                resource_type, namespace, name, data, manager, directive, warnings, dry_run, user
            )
        old = self.get_object(resource_type, namespace, name)
        if mode == "application/apply-patch+yaml":
            new = self._server_side_apply(
                resource_type, old, data, manager, force, target.subresource, directive, warnings
            )
        else:
            new = self._apply_change(resource_type, old, data, mode)
            if resource_type.schema is not None:
                status_only = target.subresource == "status"
                touched = None
                if mode in _MERGE_PATCHES and isinstance(data, dict) and None not in data.values():
                    # the stored object is decoded already: only what the patch reaches needs it again
                    touched = {"status"} if status_only else set(data) - {"apiVersion", "kind"}
                elif mode != "replace":
                    touched = {"status"} if status_only else None
                if mode != "replace":  # a merged object shares parts with the stored one: decode a copy
                    new = (
                        {**new, **{k: _json_copy(new[k]) for k in touched if k in new}}
                        if touched is not None
                        else _json_copy(new)
                    )
                patched = None
                if mode != "replace" and directive == "Strict":  # what a strict refusal of a patch quotes
                    patched = json.dumps(
                        {**new, "metadata": {k: v for k, v in new["metadata"].items() if k != "managedFields"}},
                        sort_keys=True,
                        separators=(",", ":"),
                    )
                self._decode(
                    resource_type, new, directive, warnings, status_only=status_only, keys=touched, patched=patched
                )
        if target.subresource is None and "status" in resource_type.subresources:
            new = (
                {**new, "status": old["status"]} if "status" in old else {k: v for k, v in new.items() if k != "status"}
            )
        elif target.subresource == "status":
            new = (
                {**old, "status": new["status"]} if "status" in new else {k: v for k, v in old.items() if k != "status"}
            )
            new["metadata"] = {**old["metadata"], "managedFields": (new.get("metadata") or {}).get("managedFields")}
            if new["metadata"]["managedFields"] is None:
                del new["metadata"]["managedFields"]
        review = self._admission_request(
            resource_type, "UPDATE", namespace, new, old, user, target.subresource, dry_run, name
        )
        if review is not None:  # handlers/update.go and patch.go: mutating admission, then validation
            mutated = await self._mutating_admission(review)
            if mutated is not new:
                new = mutated
                if resource_type.schema is not None:
                    self._decode(resource_type, new, "Ignore", None, status_only=target.subresource == "status")
        if resource_type.schema is None and new.get("metadata") != old.get("metadata"):
            self._admit_meta(resource_type, new)
        merged = self._merged_metadata(resource_type, old, new)
        if resource_type.schema is not None:
            if mode != "application/apply-patch+yaml" and manager:
                managed_fields.record(new, old, manager, resource_type.api_version, target.subresource)
            merged = self._merged_metadata(resource_type, old, new)
            self._admit(resource_type, merged, old, status_only=target.subresource == "status")
        if review is not None:
            review.object = merged
            await self._validating_admission(review, warnings)
            current = self._current(resource_type, namespace, name)
            if current is None or current["metadata"].get("resourceVersion") != old["metadata"].get("resourceVersion"):
                return None  # changed (or gone) while the webhooks answered: start over from what is stored
        return self.replace_object(resource_type, old, new, dry_run=dry_run)

    async def _apply_create(
        self,
        resource_type: ResourceType,
        namespace: str | None,
        name: str,
        data: Any,
        manager: str,
        directive: str,
        warnings: list[str] | None,
        dry_run: bool = False,
        user: UserInfo | None = None,
    ) -> Obj:
        """An apply to a missing object creates it, the applier owning what it sent (handlers/patch.go)."""
        if not isinstance(data, dict):
            raise ApiError(400, "BadRequest", "the apply patch must be a YAML or JSON object")
        applied = copy.deepcopy(data)
        applied.setdefault("metadata", {})["name"] = applied["metadata"].get("name") or name
        if resource_type.schema is not None:
            self._decode(resource_type, applied, directive, warnings, defaults=False)
        owned = managed_fields.scoped_paths(applied, None)
        entry = {
            "manager": manager,
            "operation": "Apply",
            "apiVersion": resource_type.api_version,
            "time": now_rfc3339(),
            "fieldsType": "FieldsV1",
            "fieldsV1": managed_fields.fields_v1(owned),
        }
        return await self.create_object(
            resource_type,
            namespace,
            applied,
            directive=directive,
            warnings=warnings,
            applied_by=entry,
            dry_run=dry_run,
            user=user,
        )

    def _merged_metadata(self, resource_type: ResourceType, old: Obj, new: Obj) -> Obj:
        """`new` with the server-owned metadata replace_object will restore (validation sees the stored name)."""
        meta = dict(new.get("metadata") or {})
        for owned in ("name", "namespace", "uid", "creationTimestamp", "generation"):
            if owned in old["metadata"]:
                meta[owned] = old["metadata"][owned]
        return {**new, "metadata": meta}

    def _server_side_apply(
        self,
        resource_type: ResourceType,
        old: Obj,
        data: Any,
        manager: str,
        force: bool,
        subresource: str | None,
        directive: str,
        warnings: list[str] | None,
    ) -> Obj:
        """An apply patch (application/apply-patch+yaml), merged by field ownership; see managed_fields.apply."""
        if not isinstance(data, dict):
            raise ApiError(400, "BadRequest", "the apply patch must be a YAML or JSON object")
        if not manager:
            raise ApiError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
            )
        applied = copy.deepcopy(data)
        if resource_type.schema is not None:
            self._decode(resource_type, applied, directive, warnings, defaults=False)
        return managed_fields.apply(
            old, applied, manager, resource_type.api_version, force, subresource, defaults=resource_type.schema
        )

    def _apply_change(self, resource_type: ResourceType, old: Obj, data: Any, mode: str) -> Obj:
        if mode == "application/json-patch+json":
            if not isinstance(data, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            try:
                return jsonpatch.apply_patch(copy.deepcopy(old), data, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise ApiError(
                    422, "Invalid", f"the server rejected our request due to an error in our request: {e}"
                ) from e
        if not isinstance(data, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        self._check_precondition(resource_type, old, data)
        if mode == "replace":
            if resource_type.custom and not (data.get("metadata") or {}).get("resourceVersion"):
                # customresource/strategy.go AllowUnconditionalUpdate is false: registry/store.go Update refuses
                error = crd_schema.FieldError(
                    "FieldValueInvalid",
                    "metadata.resourceVersion",
                    crd_schema.GoLiteral("0x0"),
                    "must be specified for an update",
                )
                raise _InvalidObject(
                    crd_schema.invalid_status(
                        resource_type.plural, resource_type.group, old["metadata"]["name"], [error]
                    )
                )
            return copy.deepcopy(data)  # server-owned metadata is restored by replace_object (managedFields kept)
        if mode == "application/strategic-merge-patch+json" and resource_type.custom:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            )
        if mode not in ("application/merge-patch+json", "application/strategic-merge-patch+json", "application/json"):
            raise ApiError(415, "UnsupportedMediaType", f"the emulator does not support {mode} (server-side apply)")
        try:
            return dict(kmock_dicts.merge_patch_dict(old, _strip_directives(data)))
        except ValueError as e:
            raise ApiError(422, "Invalid", str(e)) from e

    def _check_precondition(self, resource_type: ResourceType, old: Obj, data: Obj) -> None:
        wanted = (data.get("metadata") or {}).get("resourceVersion")
        if wanted and str(wanted) != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource_type.qualified} "{old["metadata"]["name"]}": '
                "the object has been modified; please apply your changes to the latest version and try again",
                {"name": old["metadata"]["name"], "group": resource_type.group, "kind": resource_type.plural},
            )

    def replace_object(self, resource_type: ResourceType, old: Obj, new: Obj, dry_run: bool = False) -> Obj:
        """Commit `new` in place of `old`, keeping server-owned metadata; finish a released deletion.

        `dry_run` (dryRun=All) stops short of the commit: the answer is what would be stored.
        """
        meta = dict(new.get("metadata") or {})
        old_meta = old["metadata"]
        for owned in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ):
            if owned in old_meta:
                meta[owned] = old_meta[owned]
            else:
                meta.pop(owned, None)
        if not meta.get("finalizers"):
            meta.pop("finalizers", None)
        if old_meta.get("deletionTimestamp"):
            added = [f for f in meta.get("finalizers", []) if f not in old_meta.get("finalizers", [])]
            if added:
                raise ApiError(
                    422,
                    "Invalid",
                    f'{resource_type.kind} "{old_meta["name"]}" is invalid: metadata.finalizers: Forbidden: '
                    f"no new finalizers can be added if the object is being deleted, found new finalizers {added}",
                )
        new = {**new, "apiVersion": resource_type.api_version, "kind": resource_type.kind, "metadata": meta}
        if resource_type.kind == "Pod" and resource_type.group == "":
            new = normalize_pod_quantities(new)
        if new == old:
            return old  # a no-op changes nothing: same resourceVersion, no watch event
        excluded = ("metadata", "status") if "status" in resource_type.subresources else ("metadata",)
        if _without(new, *excluded) != _without(old, *excluded):
            # customresource/strategy.go PrepareForUpdate: only a change outside metadata (and status, with the
            # status subresource) moves the generation
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        namespace = meta.get("namespace") if resource_type.namespaced else None
        if dry_run:
            return new
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not _namespace_terminating(new):
            self._commit(resource_type, namespace, None, {**new})
            return new
        self._commit(resource_type, namespace, new, old)
        return new

    # ---- deleting and garbage collection

    def delete_object(
        self, resource_type: ResourceType, namespace: str | None, name: str, options: Mapping[str, Any] | None = None
    ) -> tuple[Obj, bool]:
        """Delete (or mark for deletion) one object; returns (its last state, whether it is gone)."""
        options = options or {}
        namespace = namespace if resource_type.namespaced else None
        obj = self.get_object(resource_type, namespace, name)
        preconditions = options.get("preconditions") or {}
        for field_name in ("uid", "resourceVersion"):
            if preconditions.get(field_name) and preconditions[field_name] != obj["metadata"].get(field_name):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource_type.qualified} "{name}": Precondition failed: '
                    f"{field_name} in precondition: {preconditions[field_name]}, "
                    f"{field_name} in object meta: {obj['metadata'].get(field_name)}",
                )
        if obj["metadata"].get("deletionTimestamp"):
            return obj, False
        policy = str(options.get("propagationPolicy") or "Background")
        if policy == "Orphan" or options.get("orphanDependents") is True:
            self._orphan_dependents(obj["metadata"]["uid"])
        finalizers = list(obj["metadata"].get("finalizers", []))
        if (
            policy == "Foreground"
            and self._dependents(obj["metadata"]["uid"])
            and FOREGROUND_FINALIZER not in finalizers
        ):
            finalizers.append(FOREGROUND_FINALIZER)
        is_namespace = resource_type.group == "" and resource_type.plural == "namespaces"
        if not finalizers and not is_namespace:
            self._commit(resource_type, namespace, None, obj)
            return obj, True
        meta = {**obj["metadata"], "deletionTimestamp": now_rfc3339(), "deletionGracePeriodSeconds": 0}
        if meta.get("generation"):  # registry/generic/registry/store.go markAsDeleting
            meta["generation"] = int(meta["generation"]) + 1
        if finalizers:
            meta["finalizers"] = finalizers
        marked = {**obj, "metadata": meta}
        if is_namespace:
            marked["status"] = {**obj.get("status", {}), "phase": "Terminating"}
        self._commit(resource_type, namespace, marked, obj)
        return marked, False

    def _delete_collection(self, resource_type: ResourceType, target: RequestTarget, query: Mapping[str, str]) -> Obj:
        listed = self.list_objects(resource_type, target.namespace, query)
        for obj in listed["items"]:
            self.delete_object(resource_type, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        return listed

    def _dependents(self, owner_uid: str) -> list[tuple[ResourceType, Obj]]:
        found = (self._live_object(key) for key in sorted(self._dependents_of.get(owner_uid, ()), key=str))
        return [live for live in found if live is not None]

    def _orphan_dependents(self, owner_uid: str) -> None:
        for resource_type, dependent in self._dependents(owner_uid):
            refs = [r for r in dependent["metadata"]["ownerReferences"] if r.get("uid") != owner_uid]
            meta = {**dependent["metadata"], "ownerReferences": refs}
            if not refs:
                del meta["ownerReferences"]
            self.replace_object(resource_type, dependent, {**dependent, "metadata": meta})

    def collect_garbage(self, full: bool = False) -> int:
        """One pass of the garbage collector (background cascade); returns how many objects it changed.

        A dependent whose owners (by uid) are all gone is deleted, respecting its finalizers; dangling references
        next to a live owner are dropped. Foreground deletions wait for their dependents; a terminating Namespace
        deletes its contents, then itself. Only what changes queued is looked at, unless `full`.
        """
        candidates, self._gc_candidates = self._gc_candidates, set()
        owners, self._gc_owners = self._gc_owners, set()
        if full:
            candidates = {k for keys in self._dependents_of.values() for k in keys}
            owners = set(self._uids)
        changed = 0
        for key in sorted(candidates, key=str):
            live = self._live_object(key)
            if live is not None:
                changed += self._collect_dependent(*live)
        for uid in owners:
            live = self._live_object(self._uids[uid]) if uid in self._uids else None
            if live is not None:
                changed += self._finish_foreground(*live)
        for namespace in sorted(self._terminating):
            changed += self._drain_namespace(namespace)
        return changed

    def _collect_dependent(self, resource_type: ResourceType, obj: Obj) -> int:
        meta = obj["metadata"]
        refs = meta.get("ownerReferences") or []
        if not refs or meta.get("deletionTimestamp"):
            return 0
        dangling = [r for r in refs if r.get("uid") not in self._uids]
        if len(dangling) == len(refs) or any(self._owner_deleting_in_foreground(r.get("uid", "")) for r in refs):
            self.delete_object(resource_type, meta.get("namespace"), meta["name"])
            return 1
        if dangling:
            kept = [r for r in refs if r.get("uid") in self._uids]
            self.replace_object(resource_type, obj, {**obj, "metadata": {**meta, "ownerReferences": kept}})
            return 1
        return 0

    def _finish_foreground(self, resource_type: ResourceType, obj: Obj) -> int:
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or FOREGROUND_FINALIZER not in meta.get("finalizers", []):
            return 0
        if self._dependents(meta["uid"]):
            return 0
        remaining = [f for f in meta["finalizers"] if f != FOREGROUND_FINALIZER]
        self.replace_object(resource_type, obj, {**obj, "metadata": {**meta, "finalizers": remaining}})
        return 1

    def _owner_deleting_in_foreground(self, uid: str) -> bool:
        live = self._live_object(self._uids[uid]) if uid in self._uids else None
        if live is None:
            return False
        meta = live[1]["metadata"]
        return bool(meta.get("deletionTimestamp")) and FOREGROUND_FINALIZER in meta.get("finalizers", [])

    def _drain_namespace(self, namespace: str) -> int:
        ns_type = self._type_for("", "v1", "namespaces")
        ns_obj = self._current(ns_type, None, namespace)
        if ns_obj is None or not _namespace_terminating(ns_obj):
            self._terminating.discard(namespace)
            return 0
        contents = [
            live
            for keys in self._live_keys.values()
            for key in keys
            if key[1] == namespace and (live := self._live_object(key)) is not None
        ]
        if not contents:
            self._terminating.discard(namespace)
            self._commit(ns_type, None, None, ns_obj)
            return 1
        deleting = [(t, o) for t, o in contents if not o["metadata"].get("deletionTimestamp")]
        for resource_type, obj in deleting:
            self.delete_object(resource_type, namespace, obj["metadata"]["name"])
        return len(deleting)  # objects held by finalizers keep the namespace Terminating, without spinning

    async def _collect_garbage_forever(self) -> None:
        assert self._gc_wakeup is not None
        while True:
            await self._gc_wakeup.wait()
            self._gc_wakeup.clear()
            while self.collect_garbage():
                await asyncio.sleep(0)  # let requests in between cascade steps, as the real collector does


def _foreground(options: Mapping[str, Any]) -> bool:
    return str(options.get("propagationPolicy") or "") == "Foreground"


def _owner_uids(obj: Obj) -> set[str]:
    return {str(ref.get("uid")) for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("uid")}


def _namespace_terminating(obj: Obj) -> bool:
    return obj.get("kind") == "Namespace" and bool(obj["metadata"].get("deletionTimestamp"))


def _json_copy(value: Any) -> Any:
    """A deep copy of JSON data (several times faster than copy.deepcopy)."""
    return json.loads(json.dumps(value))


def _without(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}


def _quantity_text(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def normalize_pod_quantities(pod: Obj) -> Obj:
    """The API server stores resource quantities as strings (1 -> "1", 0.5 -> "500m"); typed clients rely on it."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return pod
    spec = dict(spec)
    for key in ("containers", "initContainers"):
        containers = []
        for container in spec.get(key) or []:
            resources = container.get("resources") or {}
            if resources:
                resources = {
                    kind: {name: _quantity_text(v) for name, v in (values or {}).items()}
                    if isinstance(values, dict)
                    else values
                    for kind, values in resources.items()
                }
                container = {**container, "resources": resources}
            containers.append(container)
        if key in spec:
            spec[key] = containers
    return {**pod, "spec": spec}


def _strip_directives(patch: Any) -> Any:
    """Drop strategic-merge-patch directives ($patch, $setElementOrder/...): merged as a JSON merge patch."""
    if isinstance(patch, dict):
        return {k: _strip_directives(v) for k, v in patch.items() if not str(k).startswith("$")}
    return patch


# --------------------------------------------------------------------------------------------------------------------
# Setup and the server


def sweep_crd() -> Obj:
    """Our CRD as the operator package builds it (no repo file needed)."""
    from sweep_operator.crd import build_crd

    return build_crd()


def ledger_crd() -> Obj:
    """The GPUHourLedger CRD (the namespaces' GPU-hour ledgers), as the operator package builds it."""
    from sweep_operator.crd import build_ledger_crd

    return build_ledger_crd()


def build_emulator(**options: Any) -> KubernetesApiEmulator:
    """An emulator serving the built-in kinds, the TrainingSweep and GPUHourLedger CRDs, KubeRay's RayJob/RayCluster and kopf peering."""
    emulator = KubernetesApiEmulator(**options)
    for crd in (sweep_crd(), ledger_crd(), *kuberay_crds(), *KOPF_PEERING_CRDS):
        emulator.install_crd(crd)
    for namespace in ("default", "kube-system"):
        emulator._ensure_namespace(namespace)
    return emulator


def __getattr__(name: str) -> Any:
    """TEMPORARY (issue 29; remove once no test imports them from here): `wait_for` and `GiveUp` are test helpers and
    live in tests/support/waiting.py; this forwards the old import path to the same objects while tests move."""
    if name in ("wait_for", "GiveUp"):
        from tests.support import waiting

        return getattr(waiting, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_api_client(url: str, token: str | None = None, ca_file: str | None = None) -> Any:
    """A kubernetes.client.ApiClient for `url` from an explicit Configuration (no kubeconfig, no environment),
    authenticating with `token` when given (the emulator's users: admission.py), trusting `ca_file` for https."""
    import kubernetes.client

    configuration = kubernetes.client.Configuration(host=url)
    configuration.verify_ssl = ca_file is not None
    configuration.ssl_ca_cert = ca_file
    client = kubernetes.client.ApiClient(configuration)
    if token:
        client.set_default_header("Authorization", f"Bearer {token}")
    return client


def kubeconfig_document(
    url: str,
    context: str = "sandbox",
    namespace: str = "default",
    users: Mapping[str, str] | None = None,
    ca_pem: bytes | None = None,
) -> Obj:
    """A kubeconfig whose current context is `context` (token `sandbox`: the emulator's administrator); `users`
    adds a context per user (context name -> token) on the same cluster and namespace. kubectl sends a token over
    TLS only (clientcmd DirectClientConfig.ClientConfig): `ca_pem` is the certificate of an https `url`."""
    tokens = {context: "sandbox", **(users or {})}
    cluster: Obj = {"server": url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}} for name, token in tokens.items()],
        "contexts": [
            {"name": name, "context": {"cluster": context, "user": name, "namespace": namespace}} for name in tokens
        ],
        "current-context": context,
        "preferences": {},
    }


def _self_signed_server(host: str) -> tuple[bytes, Any]:
    """A certificate for `host` (an IP address SAN) signed by its own key, and a server context serving it."""
    import ipaddress
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes-api-emulator")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host)), x509.DNSName("localhost")]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as folder:  # load_cert_chain reads files only
        (Path(folder) / "tls.crt").write_bytes(cert_pem)
        (Path(folder) / "tls.key").write_bytes(key_pem)
        context.load_cert_chain(Path(folder) / "tls.crt", Path(folder) / "tls.key")
    return cert_pem, context


class EmulatorServer:
    """Runs a KubernetesApiEmulator on 127.0.0.1 in a background thread with its own event loop.

    with EmulatorServer() as server:          # or server.start() ... server.stop()
        server.write_kubeconfig(path)
        api = server.api_client()
    """

    def __init__(
        self,
        emulator: KubernetesApiEmulator | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: bool = False,
    ) -> None:
        """`tls`: serve https with a self-signed certificate for 127.0.0.1 (`ca_pem`), which a kubeconfig with
        tokens needs: kubectl sends them over TLS only."""
        self.emulator = emulator if emulator is not None else build_emulator()
        self.host = host
        self.port = port
        self.ca_pem: bytes | None = None
        self.ca_file: str | None = None  # ca_pem in a file, for clients that read one
        self._ssl: Any = None
        if tls:
            self.ca_pem, self._ssl = _self_signed_server(host)
            self._ca_dir = tempfile.TemporaryDirectory(prefix="emulator-ca-")
            self.ca_file = str(Path(self._ca_dir.name) / "ca.crt")
            Path(self.ca_file).write_bytes(self.ca_pem)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        if not self._ready.is_set():
            raise RuntimeError("the emulator server is not running")
        return f"{'https' if self._ssl is not None else 'http'}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 10.0) -> str:
        """Start serving; returns the URL (http://127.0.0.1:<port>)."""
        if self._thread is not None:
            raise RuntimeError("the emulator server is already running")
        self._thread = threading.Thread(target=self._run, name="kubernetes-api-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the emulator server did not start in time")
        if self._failure is not None:
            raise RuntimeError("the emulator server failed to start") from self._failure
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving: watch streams end, the port closes, the thread exits."""
        if self._thread is None or self._loop is None:
            return
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError("the emulator server did not stop in time")
        self._thread = None
        self._ready.clear()

    def __enter__(self) -> EmulatorServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run `fn()` in the server's loop (safe access to `emulator.objects` and friends) and return its result."""
        if self._loop is None:
            raise RuntimeError("the emulator server is not running")

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def history(self, group: str, version: str, plural: str, namespace: str | None, name: str) -> list[Obj]:
        """Every retained state of one object, oldest first (a DELETED change contributes its last state)."""
        key = resource_key(group, version, plural)
        return self.call(lambda: [copy.deepcopy(c.obj) for c in self.emulator.changes.of(key, namespace, name)])

    def write_kubeconfig(
        self, path: str | Path, namespace: str = "default", users: Mapping[str, str] | None = None
    ) -> Path:
        """`users`: a context per user, context name -> token (see kubeconfig_document)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        document = kubeconfig_document(self.url, namespace=namespace, users=users, ca_pem=self.ca_pem)
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    def api_client(self, token: str | None = None) -> Any:
        return make_api_client(self.url, token, self.ca_file)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # reported to start(); the thread must not die silently
            self._failure = e
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        async with self.emulator:
            server = aiohttp.web.Server(self.emulator, handler_cancellation=True)
            runner = aiohttp.web.ServerRunner(server, shutdown_timeout=1.0)
            await runner.setup()
            site = aiohttp.web.TCPSite(runner, self.host, self.port, ssl_context=self._ssl)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                self.emulator._closing = True
                self.emulator.changes.wake_all()
                await runner.cleanup()
