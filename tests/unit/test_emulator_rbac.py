"""The emulator's RBAC at least as strict as kube-apiserver's: the request's attributes as
k8s.io/apiserver/pkg/endpoints/request/requestinfo.go NewRequestInfo reads them, each rule as
plugin/pkg/auth/authorizer/rbac/rbac.go RuleAllows with pkg/apis/rbac/v1/evaluation_helpers.go (VerbMatches,
APIGroupMatches, ResourceMatches, ResourceNameMatches, NonResourceURLMatches), the bindings as
pkg/registry/rbac/validation/rule.go VisitRulesFor and appliesToUser, aggregation as
pkg/controller/clusterroleaggregation syncClusterRole, the refusal as handlers/responsewriters/errors.go Forbidden,
and the bootstrap roles of plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sweep_sandbox import rbac
from sweep_sandbox.admission import UserInfo, service_account_user
from sweep_sandbox.emulator import KubernetesApiEmulator, build_emulator
from sweep_sandbox.emulator_tables import ApiError

ALICE = UserInfo("alice", ("team-a", "system:authenticated"))
ADMIN = UserInfo("root", ("system:masters", "system:authenticated"))


def attributes(method: str, path: str, user: UserInfo = ALICE, **query: str) -> rbac.Attributes:
    return rbac.request_attributes(user, method, path, query)


def test_request_attributes_read_the_verb_namespace_resource_subresource_and_name_as_requestinfo_does() -> None:
    sweeps = "/apis/sweeps.dev/v1alpha1/namespaces/team-a/trainingsweeps"
    read = {
        ("GET", sweeps, ()): ("list", "team-a", "trainingsweeps", "", ""),
        ("GET", sweeps, (("watch", "true"),)): ("watch", "team-a", "trainingsweeps", "", ""),
        ("GET", sweeps, (("fieldSelector", "metadata.name=digits"),)): ("list", "team-a", "trainingsweeps", "", "digits"),
        ("GET", f"{sweeps}/digits", (("watch", "true"),)): ("get", "team-a", "trainingsweeps", "", "digits"),
        ("PATCH", f"{sweeps}/digits/status", ()): ("patch", "team-a", "trainingsweeps", "status", "digits"),
        ("POST", sweeps, ()): ("create", "team-a", "trainingsweeps", "", ""),
        ("DELETE", sweeps, ()): ("deletecollection", "team-a", "trainingsweeps", "", ""),
        ("GET", "/api/v1/namespaces/team-a/pods/p-0/log", ()): ("get", "team-a", "pods", "log", "p-0"),
        # the Namespace object is in its own namespace (a RoleBinding there can grant reading it)
        ("GET", "/api/v1/namespaces/team-a", ()): ("get", "team-a", "namespaces", "", "team-a"),
        ("PUT", "/api/v1/namespaces/team-a/finalize", ()): ("update", "team-a", "namespaces", "finalize", "team-a"),
        ("POST", "/api/v1/namespaces", ()): ("create", "", "namespaces", "", ""),
        ("GET", "/apis/sweeps.dev/v1alpha1/trainingsweeps", ()): ("list", "", "trainingsweeps", "", ""),
    }  # fmt: skip
    for (method, path, query), expected in read.items():
        seen = attributes(method, path, **dict(query))
        assert seen.resource_request, path
        assert (seen.verb, seen.namespace, seen.resource, seen.subresource, seen.name) == expected, (method, path)
    assert attributes("GET", sweeps).api_group == "sweeps.dev"
    for path in (
        "/api",
        "/api/v1",
        "/apis",
        "/apis/sweeps.dev",
        "/apis/sweeps.dev/v1alpha1",
        "/version",
        "/openapi/v3",
    ):
        seen = attributes("GET", path)
        assert (seen.resource_request, seen.verb, seen.path) == (False, "get", path)


def test_a_rule_allows_by_verb_group_resource_and_name_as_rule_allows_does() -> None:
    def allows(rule: dict[str, Any], method: str, path: str, **query: str) -> bool:
        return rbac.rule_allows(attributes(method, path, **query), rule)

    sweeps = "/apis/sweeps.dev/v1alpha1/namespaces/team-a/trainingsweeps"
    read = {"apiGroups": ["sweeps.dev"], "resources": ["trainingsweeps"], "verbs": ["get", "list"]}
    assert allows(read, "GET", sweeps) and allows(read, "GET", f"{sweeps}/digits")
    assert not allows(read, "GET", sweeps, watch="true")  # list is not watch
    assert not allows(read, "PATCH", f"{sweeps}/digits")
    assert not allows({**read, "apiGroups": ["ray.io"]}, "GET", sweeps)
    # a resource never grants its subresources; `resource/sub`, `*/sub` and `*` do (never `resource/*`)
    status = f"{sweeps}/digits/status"
    for resources, allowed in ((["trainingsweeps"], False), (["trainingsweeps/status"], True), (["*/status"], True),
                               (["*"], True), (["trainingsweeps/*"], False), (["*/scale"], False)):  # fmt: skip
        rule = {"apiGroups": ["*"], "resources": resources, "verbs": ["*"]}
        assert allows(rule, "PATCH", status) is allowed, resources
    assert allows(
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}, "GET", "/api/v1/namespaces/a/pods/p/log"
    )
    assert not allows(
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, "GET", "/api/v1/namespaces/a/pods/p/log"
    )
    # resourceNames: that name only; a list or a create has no name (a list pinned by metadata.name has)
    named = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create"], "resourceNames": ["a"]}
    maps = "/api/v1/namespaces/team-a/configmaps"
    assert allows(named, "GET", f"{maps}/a") and not allows(named, "GET", f"{maps}/b")
    assert not allows(named, "GET", maps) and not allows(named, "POST", maps)
    assert allows(named, "GET", maps, fieldSelector="metadata.name=a")
    # non-resource URLs: exact, or a prefix ending in *; a resource rule never grants one
    urls = {"nonResourceURLs": ["/apis/*", "/version"], "verbs": ["get"]}
    assert allows(urls, "GET", "/apis/sweeps.dev/v1alpha1") and allows(urls, "GET", "/version")
    assert not allows(urls, "GET", "/api") and not allows(urls, "POST", "/version")
    assert not allows({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, "GET", "/version")


def test_bindings_name_users_groups_and_service_accounts_as_applies_to_user_does() -> None:
    robot = service_account_user("team-a", "robot")
    assert rbac.applies_to_user(robot, {"kind": "ServiceAccount", "name": "robot", "namespace": "team-a"}, "")
    # a RoleBinding's ServiceAccount without a namespace is the binding's; in a ClusterRoleBinding it names nobody
    assert rbac.applies_to_user(robot, {"kind": "ServiceAccount", "name": "robot"}, "team-a")
    assert not rbac.applies_to_user(robot, {"kind": "ServiceAccount", "name": "robot"}, "")
    assert not rbac.applies_to_user(robot, {"kind": "ServiceAccount", "name": "robot"}, "team-b")
    for group in ("system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"):
        assert rbac.applies_to_user(robot, {"kind": "Group", "name": group}, "team-a")
    assert not rbac.applies_to_user(robot, {"kind": "Group", "name": "system:serviceaccounts:team-b"}, "")
    assert rbac.applies_to_user(ALICE, {"kind": "User", "name": "alice"}, "")
    assert not rbac.applies_to_user(ALICE, {"kind": "User", "name": "team-a"}, "")  # a group is not a user


def store(emulator: KubernetesApiEmulator, *objects: dict[str, Any]) -> None:
    for obj in objects:
        plural = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings", "Role": "roles",
                  "RoleBinding": "rolebindings"}[obj["kind"]]  # fmt: skip
        resource_type = emulator.resource_type(rbac.RBAC_GROUP, "v1", plural)
        assert resource_type is not None
        asyncio.run(emulator.create_object(resource_type, obj["metadata"].get("namespace"), obj))


def refusal(emulator: KubernetesApiEmulator, user: UserInfo, method: str, path: str, **query: str) -> ApiError | None:
    try:
        emulator.authorize_request(user, method, path, query)
    except ApiError as error:
        return error
    return None


def test_edit_in_one_namespace_allows_it_there_only_and_the_refusal_is_the_api_servers() -> None:
    emulator = build_emulator()
    store(emulator, rbac.binding("alice-edit", "edit", [rbac.subject("User", "alice")], "team-a"))
    maps = "/api/v1/namespaces/{}/configmaps"
    assert refusal(emulator, ALICE, "POST", maps.format("team-a")) is None
    assert refusal(emulator, ALICE, "GET", maps.format("team-a"), watch="1") is None
    denied = refusal(emulator, ALICE, "DELETE", maps.format("team-b") + "/settings")
    assert denied is not None and (denied.code, denied.reason) == (403, "Forbidden")
    assert denied.message == (
        'configmaps "settings" is forbidden: User "alice" cannot delete resource "configmaps" in API group "" '
        'in the namespace "team-b"'
    )
    assert denied.body()["details"] == {"name": "settings", "kind": "configmaps"}
    # cluster scope: no RoleBinding counts; a create has no name
    denied = refusal(emulator, ALICE, "POST", "/api/v1/namespaces")
    assert denied is not None
    assert denied.message == (
        'namespaces is forbidden: User "alice" cannot create resource "namespaces" in API group "" at the cluster scope'
    )
    status = "/apis/sweeps.dev/v1alpha1/namespaces/team-a/trainingsweeps/digits/status"
    denied = refusal(emulator, ALICE, "PATCH", status)
    assert denied is not None
    assert denied.message == (
        'trainingsweeps.sweeps.dev "digits" is forbidden: User "alice" cannot patch resource '
        '"trainingsweeps/status" in API group "sweeps.dev" in the namespace "team-a"'
    )
    assert denied.body()["details"] == {"name": "digits", "group": "sweeps.dev", "kind": "trainingsweeps"}
    # discovery for every authenticated user (system:discovery); other paths refused by path
    assert refusal(emulator, ALICE, "GET", "/apis/sweeps.dev/v1alpha1") is None
    denied = refusal(emulator, ALICE, "GET", "/metrics")
    assert denied is not None and denied.message == 'forbidden: User "alice" cannot get path "/metrics"'
    # system:masters is never asked about
    assert refusal(emulator, ADMIN, "DELETE", "/api/v1/namespaces/kube-system") is None


def test_a_binding_to_a_missing_role_is_the_refusals_reason() -> None:
    emulator = build_emulator()
    store(
        emulator,
        rbac.binding("ghost", "no-such-role", [rbac.subject("Group", "team-a")], "team-a"),
        {**rbac.binding("gone", "edit", [rbac.subject("Group", "team-a")], "team-a"),
         "roleRef": {"apiGroup": rbac.RBAC_GROUP, "kind": "Role", "name": "gone"}},
    )  # fmt: skip
    denied = refusal(emulator, ALICE, "GET", "/api/v1/namespaces/team-a/secrets")
    assert denied is not None
    assert denied.message.endswith(
        'in the namespace "team-a": RBAC: [clusterrole.rbac.authorization.k8s.io "no-such-role" not found, '
        'role.rbac.authorization.k8s.io "gone" not found]'
    )


def test_aggregation_fills_admin_edit_and_view_from_labelled_cluster_roles_and_follows_their_changes() -> None:
    emulator = build_emulator()
    clusterroles = emulator.resource_type(rbac.RBAC_GROUP, "v1", "clusterroles")
    assert clusterroles is not None

    def rules(name: str) -> list[dict[str, Any]]:
        role = emulator.store.current(clusterroles, None, name)
        assert role is not None
        return list(role.get("rules") or ())

    sweeps_edit = {"apiGroups": ["sweeps.dev"], "resources": ["trainingsweeps"], "verbs": ["create", "patch"]}
    sweeps_view = {"apiGroups": ["sweeps.dev"], "resources": ["trainingsweeps"], "verbs": ["get", "list", "watch"]}
    assert sweeps_view not in rules("view") and sweeps_edit not in rules("edit")
    store(
        emulator,
        {"kind": "ClusterRole", "metadata": {"name": "sweeps-edit", "labels": {f"{rbac.AGGREGATE_TO}edit": "true"}},
         "rules": [sweeps_edit]},
        {"kind": "ClusterRole", "metadata": {"name": "sweeps-view", "labels": {f"{rbac.AGGREGATE_TO}view": "true"}},
         "rules": [sweeps_view]},
    )  # fmt: skip
    assert sweeps_view in rules("view") and sweeps_view in rules("edit") and sweeps_view in rules("admin")
    assert sweeps_edit in rules("edit") and sweeps_edit in rules("admin") and sweeps_edit not in rules("view")
    # the bootstrap policy's own: edit writes configmaps, view reads pods' logs, only admin writes roles
    write_maps = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}
    assert any(rbac.rule_allows(attributes("POST", "/api/v1/namespaces/a/configmaps"), r) for r in rules("edit"))
    assert not any(rbac.rule_allows(attributes("POST", "/api/v1/namespaces/a/configmaps"), r) for r in rules("view"))
    assert write_maps not in rules("view")
    roles_path = "/apis/rbac.authorization.k8s.io/v1/namespaces/a/roles"
    assert not any(rbac.rule_allows(attributes("POST", roles_path), r) for r in rules("edit"))
    assert any(rbac.rule_allows(attributes("POST", roles_path), r) for r in rules("admin"))
    # a role no longer labelled leaves the aggregate (the controller rewrites it from what it selects now)
    old = emulator.store.current(clusterroles, None, "sweeps-edit")
    assert old is not None
    emulator.replace_object(clusterroles, old, {**old, "metadata": {**old["metadata"], "labels": {}}})
    assert sweeps_edit not in rules("edit") and sweeps_edit not in rules("admin")


def test_the_bootstrap_policy_binds_cluster_admin_discovery_and_basic_user() -> None:
    emulator = build_emulator()
    bindings = {b["metadata"]["name"]: b for b in emulator.rbac_objects().cluster_role_bindings()}
    groups = {name: [s["name"] for s in b["subjects"]] for name, b in bindings.items()}
    assert groups == {
        "cluster-admin": ["system:masters"],
        "system:basic-user": ["system:authenticated"],
        "system:discovery": ["system:authenticated"],
        "system:public-info-viewer": ["system:authenticated", "system:unauthenticated"],
    }
    cluster_admin = emulator.rbac_objects().cluster_role("cluster-admin")
    assert cluster_admin is not None and cluster_admin["rules"][0] == {
        "apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]
    }  # fmt: skip


@pytest.mark.parametrize("verb", ["create", "patch", "delete"])
def test_a_user_with_no_binding_may_only_discover(verb: str) -> None:
    emulator = build_emulator()
    method = {"create": "POST", "patch": "PATCH", "delete": "DELETE"}[verb]
    path = "/apis/sweeps.dev/v1alpha1/namespaces/team-a/trainingsweeps" + ("" if verb == "create" else "/digits")
    denied = refusal(emulator, ALICE, method, path)
    assert denied is not None and f'cannot {verb} resource "trainingsweeps"' in denied.message
    assert refusal(emulator, ALICE, "GET", "/api") is None and refusal(emulator, ALICE, "GET", "/version") is None
