"""Who asks the API server and what: users by bearer token, the AdmissionRequest a webhook or policy sees, and how
admission rules and label selectors match it."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
ADMISSION_GROUP = "admissionregistration.k8s.io"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


# ------------------------------------------------------------------------------------------------------------ users


@dataclass(frozen=True)
class UserInfo:
    username: str
    groups: tuple[str, ...] = ()

    def as_dict(self) -> Obj:
        return {"username": self.username, "groups": list(self.groups)}


# Every request without a known token: the emulator's one user before it knew several (an administrator: in
# system:masters, which RBAC never stops; rbac.py).
DEFAULT_USER = UserInfo("sandbox", ("system:masters", "system:authenticated"))


def service_account_user(namespace: str, name: str) -> UserInfo:
    """A ServiceAccount's identity as the API server authenticates its token (serviceaccount.UserInfo)."""
    return UserInfo(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


# ------------------------------------------------------------------------------------------------------- a request


@dataclass
class AdmissionRequest:
    """One create or update on its way through admission (k8s.io/apiserver/pkg/admission Attributes)."""

    operation: str
    group: str
    version: str
    resource: str
    kind: str
    namespace: str | None
    name: str
    user: UserInfo
    object: Obj | None  # None on a DELETE: the object is `old_object`
    old_object: Obj | None = None
    subresource: str = ""
    dry_run: bool = False
    namespaced: bool = True
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    # The request's namespace as policies see it (`namespaceObject`); None for cluster-scoped objects
    namespace_object: Obj | None = None

    @property
    def qualified(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def review_request(self) -> Obj:
        """admission/v1 AdmissionRequest (webhook/request/admissionreview.go CreateV1AdmissionReview)."""
        gvk = {"group": self.group, "version": self.version, "kind": self.kind}
        gvr = {"group": self.group, "version": self.version, "resource": self.resource}
        request: Obj = {
            "uid": self.uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": self.name,
            "operation": self.operation,
            "userInfo": self.user.as_dict(),
            "object": self.object,
            "oldObject": self.old_object,
            "dryRun": self.dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{self.operation.title()}Options"},
        }
        if self.subresource:
            request["subResource"] = self.subresource
            request["requestSubResource"] = self.subresource
        if self.namespace:
            request["namespace"] = self.namespace
        return request


def rule_matches(rule: Mapping[str, Any], request: AdmissionRequest) -> bool:
    """admissionregistration/v1 RuleWithOperations (admission/plugin/webhook/predicates/rules/rules.go Matcher)."""

    def listed(values: Sequence[str] | None, value: str) -> bool:
        return bool(values) and ("*" in values or value in values)  # type: ignore[operator]  # bool() guards None

    if not (listed(rule.get("apiGroups"), request.group) and listed(rule.get("apiVersions"), request.version)):
        return False
    if not listed(rule.get("operations"), request.operation):
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Namespaced" and not request.namespaced) or (scope == "Cluster" and request.namespaced):
        return False
    for resource in rule.get("resources") or ():
        name, _, sub = resource.partition("/")
        if name not in ("*", request.resource):
            continue
        if (sub or "") == request.subresource or sub == "*":
            return True
    return False


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector: an absent or empty selector selects everything."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _labels(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def object_selector_matches(selector: Mapping[str, Any] | None, request: AdmissionRequest) -> bool:
    """object/matcher.go MatchObjectSelector: the new or the old object's labels."""
    return selector_matches(selector, _labels(request.object)) or (
        request.old_object is not None and selector_matches(selector, _labels(request.old_object))
    )


def namespace_selector_matches(selector: Mapping[str, Any] | None, request: AdmissionRequest, labels: Any) -> bool:
    """namespace/matcher.go MatchNamespaceSelector: cluster-scoped objects always match (the namespace object
    itself excepted); `labels` are the namespace's, with the label every namespace carries."""
    if not request.namespaced or not request.namespace:
        return True
    return selector_matches(selector, {**(labels or {}), NAMESPACE_NAME_LABEL: request.namespace})


def namespace_object(namespace: Mapping[str, Any]) -> Obj:
    """The Namespace as a policy's `namespaceObject` sees it (admission/plugin/cel/filter.go CreateNamespaceObject):
    its spec and status, and the metadata fields copied there (no managedFields, ownerReferences or finalizers)."""
    meta = namespace.get("metadata") or {}
    kept = ("name", "generateName", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
            "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations")  # fmt: skip
    return {
        "metadata": {k: meta[k] for k in kept if k in meta},
        "spec": dict(namespace.get("spec") or {}),
        "status": dict(namespace.get("status") or {}),
    }
