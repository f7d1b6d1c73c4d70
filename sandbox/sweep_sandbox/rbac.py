"""RBAC in the emulator, as kube-apiserver authorizes a request: system:masters, then Roles, ClusterRoles and their
bindings; the clusterrole-aggregation controller; the bootstrap roles the API server ships; the 403 it answers."""

from __future__ import annotations

import copy
import json
import logging
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .admission import UserInfo, selector_matches
from .emulator_tables import ApiError

if TYPE_CHECKING:
    from .emulator_store import ObjectStore

log = logging.getLogger(__name__)

Obj = dict[str, Any]

RBAC_GROUP = "rbac.authorization.k8s.io"
# k8s.io/apiserver/pkg/authentication/user: the group the privileged-groups authorizer lets through before RBAC
PRIVILEGED_GROUP = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
AGGREGATE_TO = "rbac.authorization.k8s.io/aggregate-to-"
BOOTSTRAPPING_LABEL = {"kubernetes.io/bootstrapping": "rbac-defaults"}
AUTOUPDATE_ANNOTATION = {"rbac.authorization.kubernetes.io/autoupdate": "true"}


# ------------------------------------------------------------------------------------------------ one request


@dataclass(frozen=True)
class Attributes:
    """What the authorizer sees of one request (k8s.io/apiserver/pkg/authorization/authorizer.AttributesRecord)."""

    user: UserInfo
    verb: str
    resource_request: bool = True
    namespace: str = ""
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    path: str = ""


_NAMESPACE_SUBRESOURCES = ("status", "finalize")
_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _exact_name(field_selector: str) -> str:
    """fields.Selector.RequiresExactMatch("metadata.name"): the name a selector pins, else ""."""
    names = set()
    for term in field_selector.split(","):
        key, op, value = term.partition("==") if "==" in term else term.partition("=")
        if op and "!" not in key and key.strip() == "metadata.name":
            names.add(value.strip())
    return names.pop() if len(names) == 1 else ""


def request_attributes(user: UserInfo, method: str, path: str, query: Mapping[str, str]) -> Attributes:
    """k8s.io/apiserver/pkg/endpoints/request/requestinfo.go NewRequestInfo: /api/v1/... and /apis/g/v/... are
    resource requests (shorter paths, /version, /openapi... are not); /namespaces/{ns}/... gives the namespace (the
    Namespace object is its own namespace); the third part is the subresource; a GET without a name is a list or,
    with watch=true, a watch, named by an exact metadata.name field selector; a DELETE without a name is a
    deletecollection."""
    parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return Attributes(user, method.lower(), resource_request=False, path="/" + "/".join(parts))
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    verb = _METHOD_VERBS.get(method.upper(), "")
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    subresource = rest[2] if len(rest) >= 3 else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch") in ("true", "1") else "list"
        name = _exact_name(query.get("fieldSelector", ""))
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(user, verb, True, namespace, group, version, resource, subresource, name)


# --------------------------------------------------------------------------------------------- rule evaluation
# pkg/apis/rbac/v1/evaluation_helpers.go, and RuleAllows in plugin/pkg/auth/authorizer/rbac/rbac.go


def verb_matches(rule: Mapping[str, Any], verb: str) -> bool:
    return any(v in ("*", verb) for v in rule.get("verbs") or ())


def api_group_matches(rule: Mapping[str, Any], group: str) -> bool:
    return any(g in ("*", group) for g in rule.get("apiGroups") or ())


def resource_matches(rule: Mapping[str, Any], combined: str, subresource: str) -> bool:
    """`*`, the exact `resource` or `resource/subresource`, or `*/subresource` (never `resource/*`)."""
    for resource in rule.get("resources") or ():
        if resource in ("*", combined):
            return True
        if subresource and resource == f"*/{subresource}":
            return True
    return False


def resource_name_matches(rule: Mapping[str, Any], name: str) -> bool:
    """No resourceNames means every name; with some, a request without a name (list, create) never matches."""
    names = rule.get("resourceNames") or ()
    return not names or name in names


def non_resource_url_matches(rule: Mapping[str, Any], path: str) -> bool:
    for url in rule.get("nonResourceURLs") or ():
        if url in ("*", path):
            return True
        if url.endswith("*") and path.startswith(url.rstrip("*")):
            return True
    return False


def rule_allows(attributes: Attributes, rule: Mapping[str, Any]) -> bool:
    if attributes.resource_request:
        combined = attributes.resource
        if attributes.subresource:
            combined = f"{attributes.resource}/{attributes.subresource}"
        return (
            verb_matches(rule, attributes.verb)
            and api_group_matches(rule, attributes.api_group)
            and resource_matches(rule, combined, attributes.subresource)
            and resource_name_matches(rule, attributes.name)
        )
    return verb_matches(rule, attributes.verb) and non_resource_url_matches(rule, attributes.path)


# ------------------------------------------------------------------------------------------- who a binding names


def service_account_username(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def applies_to_user(user: UserInfo, subject: Mapping[str, Any], namespace: str) -> bool:
    """pkg/registry/rbac/validation/rule.go appliesToUser: a User by name, a Group among the user's groups (so
    system:authenticated and system:serviceaccounts[:<ns>] bind every such user), a ServiceAccount by its username,
    its namespace defaulting to the RoleBinding's (none in a ClusterRoleBinding: it then names nobody)."""
    kind, name = subject.get("kind"), subject.get("name") or ""
    if kind == "User":
        return user.username == name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        sa_namespace = subject.get("namespace") or namespace
        return bool(sa_namespace) and user.username == service_account_username(sa_namespace, name)
    return False


# --------------------------------------------------------------------------------------------- the authorizer


@dataclass(frozen=True)
class RbacObjects:
    """How the authorizer reads the stored RBAC objects (the informer listers kube-apiserver's authorizer uses)."""

    cluster_role_bindings: Callable[[], Iterable[Obj]]
    role_bindings: Callable[[str], Iterable[Obj]]
    cluster_role: Callable[[str], Obj | None]
    role: Callable[[str, str], Obj | None]


def role_reference_rules(objects: RbacObjects, role_ref: Mapping[str, Any], namespace: str) -> list[Obj]:
    """rule.go GetRoleReferenceRules; a missing role is an error with the lister's NotFound message."""
    kind, name = role_ref.get("kind"), role_ref.get("name") or ""
    if kind == "Role":
        role = objects.role(namespace, name) if namespace else None
        if role is None:
            raise LookupError(f'role.{RBAC_GROUP} "{name}" not found')
        return list(role.get("rules") or ())
    if kind == "ClusterRole":
        cluster_role = objects.cluster_role(name)
        if cluster_role is None:
            raise LookupError(f'clusterrole.{RBAC_GROUP} "{name}" not found')
        return list(cluster_role.get("rules") or ())
    raise LookupError(f"unsupported role reference kind: {json.dumps(kind or '')}")


def visit_rules(
    objects: RbacObjects, user: UserInfo, namespace: str, visit: Callable[[str, Obj], bool], errors: list[str]
) -> None:
    """rule.go VisitRulesFor: every ClusterRoleBinding, then the namespace's RoleBindings (a cluster-scoped request
    has none); each binding that names the user contributes its role's rules until `visit` says stop."""
    for binding in objects.cluster_role_bindings():
        if not any(applies_to_user(user, s, "") for s in binding.get("subjects") or ()):
            continue
        try:
            rules = role_reference_rules(objects, binding.get("roleRef") or {}, "")
        except LookupError as error:
            errors.append(str(error))
            continue
        source = f'ClusterRoleBinding "{binding["metadata"]["name"]}"'
        for rule in rules:
            if not visit(source, rule):
                return
    if not namespace:
        return
    for binding in objects.role_bindings(namespace):
        if not any(applies_to_user(user, s, namespace) for s in binding.get("subjects") or ()):
            continue
        try:
            rules = role_reference_rules(objects, binding.get("roleRef") or {}, namespace)
        except LookupError as error:
            errors.append(str(error))
            continue
        source = f'RoleBinding "{binding["metadata"]["name"]}/{namespace}"'
        for rule in rules:
            if not visit(source, rule):
                return


def authorize(objects: RbacObjects, attributes: Attributes) -> tuple[bool, str]:
    """(allowed, reason). The privileged-groups authorizer first (system:masters may do everything), then
    rbac.go Authorize: allowed by the first rule that allows; denied with the resolution errors as the reason."""
    if PRIVILEGED_GROUP in attributes.user.groups:
        return True, ""
    allowed: list[str] = []
    errors: list[str] = []

    def visit(source: str, rule: Obj) -> bool:
        if rule_allows(attributes, rule):
            allowed.append(f"RBAC: allowed by {source}")
            return False
        return True

    visit_rules(objects, attributes.user, attributes.namespace, visit, errors)
    if allowed:
        return True, allowed[0]
    if not errors:
        return False, ""
    # utilerrors.NewAggregate: one error as is, several as [a, b]
    return False, "RBAC: " + (errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")


def forbidden(attributes: Attributes, reason: str = "") -> ApiError:
    """handlers/responsewriters/errors.go Forbidden with forbiddenMessage, through apierrors.NewForbidden:
    `<resource>.<group> "<name>" is forbidden: User "<u>" cannot <verb> resource "<res>[/<sub>]" in API group
    "<g>" in the namespace "<ns>"` (or `at the cluster scope`; `cannot <verb> path "<p>"` off the resources)."""
    username = attributes.user.username
    if not attributes.resource_request:
        text = f"User {json.dumps(username)} cannot {attributes.verb} path {json.dumps(attributes.path)}"
    else:
        resource = attributes.resource
        if attributes.subresource:
            resource = f"{resource}/{attributes.subresource}"
        scope = (
            f"in the namespace {json.dumps(attributes.namespace)}" if attributes.namespace else "at the cluster scope"
        )
        text = (
            f"User {json.dumps(username)} cannot {attributes.verb} resource {json.dumps(resource)} "
            f"in API group {json.dumps(attributes.api_group)} {scope}"
        )
    if reason:
        text = f"{text}: {reason}"
    qualified = attributes.resource
    if attributes.api_group and qualified:
        qualified = f"{qualified}.{attributes.api_group}"
    if not qualified:
        message = f"forbidden: {text}"
    elif not attributes.name:
        message = f"{qualified} is forbidden: {text}"
    else:
        message = f"{qualified} {json.dumps(attributes.name)} is forbidden: {text}"
    details = {
        key: value
        for key, value in (("name", attributes.name), ("group", attributes.api_group), ("kind", attributes.resource))
        if value
    }
    return ApiError(403, "Forbidden", message, details or None)


# ------------------------------------------------------------------------------------------ aggregation


def aggregated_rules(cluster_role: Mapping[str, Any], cluster_roles: Sequence[Obj]) -> list[Obj] | None:
    """pkg/controller/clusterroleaggregation syncClusterRole: the rules of every other ClusterRole a selector of the
    aggregationRule matches, selector by selector, roles by name, each rule once; None for a role without one."""
    aggregation = cluster_role.get("aggregationRule")
    if aggregation is None:
        return None
    own_name = cluster_role["metadata"]["name"]
    rules: list[Obj] = []
    for selector in aggregation.get("clusterRoleSelectors") or ():
        for other in sorted(cluster_roles, key=lambda r: r["metadata"]["name"]):
            if other["metadata"]["name"] == own_name:
                continue
            if not selector_matches(selector, (other.get("metadata") or {}).get("labels") or {}):
                continue
            for rule in other.get("rules") or ():
                if rule not in rules:
                    rules.append(copy.deepcopy(rule))
    return rules


# --------------------------------------------------------------------------------------- the bootstrap policy
# What kube-apiserver creates at start (plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go ClusterRoles and
# ClusterRoleBindings), for the kinds the sandbox serves and the discovery kubectl needs.

_READ = ("get", "list", "watch")
_WRITE = ("create", "delete", "deletecollection", "patch", "update")
_ALL = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def _rule(groups: Sequence[str], resources: Sequence[str], verbs: Sequence[str]) -> Obj:
    return {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}


def _urls(urls: Sequence[str], verbs: Sequence[str] = ("get",)) -> Obj:
    return {"nonResourceURLs": list(urls), "verbs": list(verbs)}


def _cluster_role(name: str, rules: Sequence[Obj] = (), aggregate_to: Sequence[str] = (), selects: str = "") -> Obj:
    labels = {**BOOTSTRAPPING_LABEL, **{f"{AGGREGATE_TO}{to}": "true" for to in aggregate_to}}
    role: Obj = {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": labels, "annotations": dict(AUTOUPDATE_ANNOTATION)},
        "rules": [copy.deepcopy(r) for r in rules],
    }
    if selects:
        role["aggregationRule"] = {"clusterRoleSelectors": [{"matchLabels": {f"{AGGREGATE_TO}{selects}": "true"}}]}
    return role


def _group_binding(name: str, *groups: str) -> Obj:
    return {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": dict(BOOTSTRAPPING_LABEL), "annotations": dict(AUTOUPDATE_ANNOTATION)},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": group} for group in groups],
    }


def bootstrap_cluster_roles() -> list[Obj]:
    """cluster-admin; admin, edit and view, filled by aggregation (view aggregates into edit, edit into admin) from
    system:aggregate-to-admin/-edit/-view; system:discovery, system:basic-user, system:public-info-viewer."""
    view = [
        _rule([""], ["configmaps", "endpoints", "persistentvolumeclaims", "persistentvolumeclaims/status", "pods",
                     "replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts", "services",
                     "services/status"], _READ),
        _rule([""], ["bindings", "events", "limitranges", "namespaces/status", "pods/log", "pods/status",
                     "replicationcontrollers/status", "resourcequotas", "resourcequotas/status"], _READ),
        _rule([""], ["namespaces"], _READ),
        _rule(["discovery.k8s.io"], ["endpointslices"], _READ),
        _rule(["apps"], ["controllerrevisions", "daemonsets", "daemonsets/status", "deployments", "deployments/scale",
                         "deployments/status", "replicasets", "replicasets/scale", "replicasets/status",
                         "statefulsets", "statefulsets/scale", "statefulsets/status"], _READ),
        _rule(["autoscaling"], ["horizontalpodautoscalers", "horizontalpodautoscalers/status"], _READ),
        _rule(["batch"], ["cronjobs", "cronjobs/status", "jobs", "jobs/status"], _READ),
        _rule(["policy"], ["poddisruptionbudgets", "poddisruptionbudgets/status"], _READ),
        _rule(["networking.k8s.io"], ["ingresses", "ingresses/status", "networkpolicies"], _READ),
    ]  # fmt: skip
    edit = [
        _rule([""], ["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"], _READ),
        _rule([""], ["serviceaccounts"], ["impersonate"]),
        _rule([""], ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"], _WRITE),
        _rule([""], ["pods/eviction"], ["create"]),
        _rule([""], ["configmaps", "events", "persistentvolumeclaims", "replicationcontrollers",
                     "replicationcontrollers/scale", "secrets", "serviceaccounts", "services", "services/proxy"],
              _WRITE),
        _rule([""], ["serviceaccounts/token"], ["create"]),
        _rule(["apps"], ["daemonsets", "deployments", "deployments/rollback", "deployments/scale", "replicasets",
                         "replicasets/scale", "statefulsets", "statefulsets/scale"], _WRITE),
        _rule(["autoscaling"], ["horizontalpodautoscalers"], _WRITE),
        _rule(["batch"], ["cronjobs", "jobs"], _WRITE),
        _rule(["policy"], ["poddisruptionbudgets"], _WRITE),
        _rule(["networking.k8s.io"], ["ingresses", "networkpolicies"], _WRITE),
        _rule(["coordination.k8s.io"], ["leases"], _ALL),
    ]  # fmt: skip
    admin = [
        _rule(["authorization.k8s.io"], ["localsubjectaccessreviews"], ["create"]),
        _rule([RBAC_GROUP], ["rolebindings", "roles"], _ALL),
    ]
    discovery = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz",
                 "/version", "/version/"]  # fmt: skip
    return [
        _cluster_role("cluster-admin", [_rule(["*"], ["*"], ["*"]), _urls(["*"], ["*"])]),
        _cluster_role("admin", selects="admin"),
        _cluster_role("edit", aggregate_to=["admin"], selects="edit"),
        _cluster_role("view", aggregate_to=["edit"], selects="view"),
        _cluster_role("system:aggregate-to-admin", admin, aggregate_to=["admin"]),
        _cluster_role("system:aggregate-to-edit", edit, aggregate_to=["edit"]),
        _cluster_role("system:aggregate-to-view", view, aggregate_to=["view"]),
        _cluster_role("system:discovery", [_urls(discovery)]),
        _cluster_role(
            "system:basic-user",
            [
                _rule(["authorization.k8s.io"], ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], ["create"]),
                _rule(["authentication.k8s.io"], ["selfsubjectreviews"], ["create"]),
            ],
        ),
        _cluster_role("system:public-info-viewer", [_urls(["/healthz", "/livez", "/readyz", "/version", "/version/"])]),
    ]


def bootstrap_cluster_role_bindings() -> list[Obj]:
    """cluster-admin for system:masters; discovery and basic-user for every authenticated user; the public info
    for everyone."""
    return [
        _group_binding("cluster-admin", PRIVILEGED_GROUP),
        _group_binding("system:basic-user", AUTHENTICATED),
        _group_binding("system:discovery", AUTHENTICATED),
        _group_binding("system:public-info-viewer", AUTHENTICATED, UNAUTHENTICATED),
    ]


# ------------------------------------------------------------------------------------- the emulator's side


class Rbac:
    """The emulator's authorizer and its clusterrole-aggregation controller, over the RBAC objects in its store."""

    def __init__(self, store: ObjectStore, replace_object: Callable[[Any, Obj, Obj], Obj]) -> None:
        self.store = store
        self.replace_object = replace_object  # the emulator's writes, as the controller updates through the API

    def rbac_objects(self) -> RbacObjects:
        store = self.store
        types = {plural: store.type_for(RBAC_GROUP, "v1", plural) for plural in
                 ("roles", "rolebindings", "clusterroles", "clusterrolebindings")}  # fmt: skip
        return RbacObjects(
            cluster_role_bindings=lambda: store.live(types["clusterrolebindings"], None),
            role_bindings=lambda namespace: store.live(types["rolebindings"], namespace),
            cluster_role=lambda name: store.current(types["clusterroles"], None, name),
            role=lambda namespace, name: store.current(types["roles"], namespace, name),
        )

    def authorize_request(self, user: UserInfo, method: str, path: str, query: Mapping[str, str]) -> None:
        """The API server's authorization filter, before anything reads the body: a 403 unless allowed."""
        if PRIVILEGED_GROUP in user.groups:  # most of the emulator's traffic: nothing to look up
            return
        attributes = request_attributes(user, method, path, query)
        allowed, reason = authorize(self.rbac_objects(), attributes)
        if not allowed:
            refusal = forbidden(attributes, reason)
            log.info("emulator: RBAC refused %s %s: %s", method, path, refusal.message)  # as the authorizer's V(5) line
            raise refusal

    def bootstrap(self) -> None:
        """Store the bootstrap roles and bindings, as kube-apiserver's rbac/bootstrap-roles post-start hook does."""
        for plural, objects in (
            ("clusterroles", bootstrap_cluster_roles()),
            ("clusterrolebindings", bootstrap_cluster_role_bindings()),
        ):
            resource_type = self.store.type_for(RBAC_GROUP, "v1", plural)
            for obj in objects:
                self.store.ensure(resource_type, obj)

    def committed(self, resource_type: Any, new: Obj | None) -> None:
        """After each commit (the store's observer): a changed ClusterRole may change the aggregated ones."""
        if resource_type.group == RBAC_GROUP and resource_type.plural == "clusterroles":
            self._aggregate_cluster_roles(resource_type)

    def _aggregate_cluster_roles(self, resource_type: Any) -> None:
        """The clusterrole-aggregation controller, at once: every ClusterRole with an aggregationRule gets the rules
        its selectors gather (its own are replaced); a changed one may feed another, until nothing changes."""
        for _ in range(10):  # admin <- edit <- view is the longest chain the bootstrap policy has
            changed = False
            roles = self.store.live(resource_type, None)
            for role in roles:
                rules = aggregated_rules(role, roles)
                if rules is None or rules == (role.get("rules") or []):
                    continue
                self.replace_object(resource_type, role, {**role, "rules": rules})
                changed = True
                break  # the stored roles changed: gather again from what is stored now
            if not changed:
                return


# ------------------------------------------------------------------------------- what other installs bring
# The roles a cluster running this product has besides the API server's and our chart's: KubeRay's chart's, and the
# bindings a platform team makes for its people.


def subject(kind: str, name: str, namespace: str = "") -> Obj:
    """A RoleBinding subject as `kubectl create rolebinding --user/--group/--serviceaccount` writes it."""
    if kind == "ServiceAccount":
        return {"kind": kind, "name": name, "namespace": namespace}
    return {"apiGroup": RBAC_GROUP, "kind": kind, "name": name}


def binding(name: str, cluster_role: str, subjects: Sequence[Obj], namespace: str | None = None) -> Obj:
    """A ClusterRoleBinding of `cluster_role`, or with `namespace` a RoleBinding of it there."""
    metadata: Obj = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "RoleBinding" if namespace is not None else "ClusterRoleBinding",
        "metadata": metadata,
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": cluster_role},
        "subjects": [copy.deepcopy(s) for s in subjects],
    }


KUBERAY_OPERATOR_ROLE = "kuberay-operator"


def kuberay_operator_rbac(namespace: str, service_account: str) -> list[Obj]:
    """KubeRay's chart in cluster-wide mode (ray-project/kuberay helm-chart/kuberay-operator: role.yaml with
    _helpers.tpl role.consistentRules, rolebinding.yaml, aggregate-clusterroles.yaml), for the kinds the emulator
    serves: the operator's ClusterRole and its binding, and the view and edit roles aggregated into the standard
    ones (edit writes RayJobs and RayClusters, never their status)."""
    crud = ("create", "delete", "get", "list", "patch", "update", "watch")
    operator = {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRole",
        "metadata": {"name": KUBERAY_OPERATOR_ROLE},
        "rules": [
            _rule([""], ["events", "pods/status", "services"], crud),
            _rule([""], ["pods"], ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")),
            _rule([""], ["pods/proxy", "services/status"], ("get", "patch", "update")),
            _rule([""], ["secrets"], ("create", "get", "list", "watch")),
            _rule([""], ["serviceaccounts"], ("create", "delete", "get", "list", "watch")),
            _rule([""], ["services/proxy"], ("create", "get", "patch", "update")),
            _rule(["batch"], ["jobs"], crud),
            _rule(["coordination.k8s.io"], ["leases"], ("create", "get", "list", "update")),
            _rule(["networking.k8s.io"], ["networkpolicies"], ("create", "delete", "get", "list", "update", "watch")),
            _rule(["ray.io"], ["rayclusters", "raycronjobs", "rayjobs", "rayservices"], crud),
            _rule(["ray.io"], ["rayclusters/finalizers", "raycronjobs/finalizers", "rayjobs/finalizers",
                               "rayservices/finalizers"], ["update"]),
            _rule(["ray.io"], ["rayclusters/status", "raycronjobs/status", "rayjobs/status", "rayservices/status"],
                  ("get", "patch", "update")),
            _rule([RBAC_GROUP], ["rolebindings"], ("create", "delete", "get", "list", "watch")),
            _rule([RBAC_GROUP], ["roles"], ("create", "delete", "get", "list", "update", "watch")),
        ],
    }  # fmt: skip
    ray = ["rayclusters", "rayjobs", "rayservices"]
    view = {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": f"{KUBERAY_OPERATOR_ROLE}-aggregate-view",
            "labels": {f"{AGGREGATE_TO}{to}": "true" for to in ("admin", "edit", "view")},
        },
        "rules": [_rule(["ray.io"], [r for kind in ray for r in (kind, f"{kind}/status")], _READ)],
    }
    edit = {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": f"{KUBERAY_OPERATOR_ROLE}-aggregate-edit",
            "labels": {f"{AGGREGATE_TO}{to}": "true" for to in ("admin", "edit")},
        },
        "rules": [_rule(["ray.io"], ray, ("create", "delete", "deletecollection", "get", "list", "patch", "update",
                                          "watch"))],
    }  # fmt: skip
    operator_binding = binding(
        KUBERAY_OPERATOR_ROLE, KUBERAY_OPERATOR_ROLE, [subject("ServiceAccount", service_account, namespace)]
    )
    return [operator, view, edit, operator_binding]
