"""The chart's ValidatingAdmissionPolicy over the namespaces' GPU-hour ledgers, its CEL evaluated with cel-python
(the emulator's evaluator, strict: an evaluation error fails the test) as the API server evaluates it: the operator
alone creates and replaces a ledger; nobody deletes one, except the namespace controller emptying a terminating
namespace."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_sandbox.admission import StrictPolicyEvaluator as PolicyEvaluator
from tests.unit.test_chart import NAMESPACE, one, render_values

OPERATOR = (f"system:serviceaccount:{NAMESPACE}:sweeps-trainingsweep-operator", ["system:serviceaccounts"])
NAMESPACE_CONTROLLER = ("system:serviceaccount:kube-system:namespace-controller", ["system:serviceaccounts"])
OTHERS = {
    "a tenant with edit": ("alice@team-a", ["team-a:developers", "system:authenticated"]),
    "a guard admin": ("sre@platform", ["sweeps:guard-admins", "system:authenticated"]),
    "a cluster admin": ("root@platform", ["system:masters", "system:authenticated"]),
    "KubeRay": ("system:serviceaccount:kuberay-system:kuberay-operator", ["system:serviceaccounts"]),
    "the garbage collector": ("system:serviceaccount:kube-system:generic-garbage-collector", []),
}
ACTIVE = {"metadata": {"name": "team-a", "uid": "ns-1"}, "spec": {"finalizers": ["kubernetes"]}, "status": {}}
TERMINATING = {
    "metadata": {"name": "team-a", "uid": "ns-1", "deletionTimestamp": "2026-12-08T10:00:00Z"},
    "spec": {"finalizers": ["kubernetes"]},
    "status": {"phase": "Terminating"},
}
LEDGER = {
    "apiVersion": constants.API_VERSION,
    "kind": constants.LEDGER_KIND,
    "metadata": {"name": constants.LEDGER_NAME, "namespace": "team-a", "uid": "l-1", "resourceVersion": "7"},
    "spec": {"gpuHours": 500.0, "windowSeconds": 604800},
    "status": {"usedGpuHours": 212.4, "sweeps": [{"name": "gone", "uid": "u-gone", "deleted": True}]},
}


@functools.cache
def _docs(**values: Any) -> list[dict[str, Any]]:
    return render_values(values)


def ledger_policy(docs: list[dict[str, Any]], kind: str = "ValidatingAdmissionPolicy") -> dict[str, Any]:
    return one([d for d in docs if d["metadata"]["name"].endswith("-gpu-ledger")], kind)


@pytest.fixture(scope="module")
def policy() -> PolicyEvaluator:
    return PolicyEvaluator(ledger_policy(_docs()))


def review(policy: PolicyEvaluator, operation: str, user: tuple[str, list[str]], **kwargs: Any) -> Any:
    return policy.review(resource="gpuhourledgers", operation=operation, user=user, **kwargs)


@pytest.mark.parametrize("user", OTHERS.values(), ids=OTHERS.keys())
def test_only_the_operator_creates_or_replaces_a_namespaces_gpu_hour_ledger(
    policy: PolicyEvaluator, user: tuple[str, list[str]]
) -> None:
    """A ledger written by anyone else could hand a namespace back the hours its deleted sweeps used."""
    emptied = copy.deepcopy(LEDGER)
    emptied["status"] = {"usedGpuHours": 0.0, "sweeps": []}
    writes = {
        "create": {"new": emptied},
        "replace": {"new": emptied, "old": LEDGER},
        "status": {"new": emptied, "old": LEDGER, "subresource": "status"},
    }
    operation = {"create": "CREATE", "replace": "UPDATE", "status": "UPDATE"}
    for case, request in writes.items():
        (message,) = review(policy, operation[case], user, namespace=ACTIVE, **request).denials
        assert "written by the operator only" in message and user[0] in message, case
        assert review(policy, operation[case], OPERATOR, namespace=ACTIVE, **request).allowed, case


@pytest.mark.parametrize("user", [*OTHERS.values(), OPERATOR], ids=[*OTHERS.keys(), "the operator"])
def test_nobody_deletes_a_gpu_hour_ledger(policy: PolicyEvaluator, user: tuple[str, list[str]]) -> None:
    """Deleting the ledger would take the GPU-hours of deleted sweeps with it: the operator, a cluster admin and
    the garbage collector are refused too."""
    (message,) = review(policy, "DELETE", user, new=None, old=LEDGER, namespace=ACTIVE).denials
    assert "is never deleted" in message and "goes only with its namespace" in message and user[0] in message


def test_a_ledger_goes_with_its_namespace() -> None:
    """Once the namespace is terminating (only whoever may delete namespaces starts that), the namespace controller
    empties it, the ledger included: deleting a namespace is never blocked by the policy."""
    policy = PolicyEvaluator(ledger_policy(_docs()))
    decision = review(policy, "DELETE", NAMESPACE_CONTROLLER, new=None, old=LEDGER, namespace=TERMINATING)
    assert decision.matched and decision.allowed
    assert review(policy, "DELETE", NAMESPACE_CONTROLLER, new=None, old=LEDGER, namespace=ACTIVE).denials
    # a terminating namespace takes no new ledger (NamespaceLifecycle), and the operator's last write still passes
    assert review(policy, "UPDATE", OPERATOR, new=LEDGER, old=LEDGER, namespace=TERMINATING).allowed


def test_the_ledger_binding_follows_the_guard_policys_actions_and_namespaces() -> None:
    binding = ledger_policy(_docs(), "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == ledger_policy(_docs())["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"] and "matchResources" not in binding["spec"]
    scoped = ledger_policy(render_values({"watchNamespaces": ["team-a", "team-b"]}), "ValidatingAdmissionPolicyBinding")
    assert scoped["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]
    rules = ledger_policy(_docs())["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": [constants.GROUP],
            "apiVersions": [constants.VERSION],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": [constants.LEDGER_PLURAL, f"{constants.LEDGER_PLURAL}/status"],
        }
    ]
