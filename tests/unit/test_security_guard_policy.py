"""The chart's ValidatingAdmissionPolicy that guards the checkpoint guard's marks (issue 15), its CEL evaluated
with cel-python (through the emulator's CelCompiler, sandbox/schema.py) against admission requests: who may set
the escape hatch, remove the finalizer or the sweep label, or change the guard annotation."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

import pytest
from celpy import celtypes

from sweep_contracts import constants
from sweep_sandbox.schema import CelCompiler
from tests.unit.test_chart import NAMESPACE, of_kind, one, render_values

OPERATOR = f"system:serviceaccount:{NAMESPACE}:sweeps-trainingsweep-operator"
KUBERAY = "system:serviceaccount:kuberay-system:kuberay-operator"
ADMINS = "sweeps:guard-admins"
ALICE = ("alice@team-a", ["system:authenticated", "team-a:developers"])
SKIP, GUARD, LABEL, FINALIZER = (
    constants.ANNOTATION_SKIP_VERIFICATION,
    constants.ANNOTATION_GUARD,
    constants.LABEL_SWEEP,
    constants.FINALIZER,
)
GUARD_VALUE = '{"runRoot": "s3://ckpt/sweeps/team-a/digits-r1", "endpointUrl": "", "verify": true}'


@dataclass(frozen=True)
class Decision:
    matched: bool
    denials: tuple[str, ...]

    @property
    def allowed(self) -> bool:
        return not self.denials


class PolicyEvaluator:
    """The API server's evaluation of one ValidatingAdmissionPolicy (k8s.io/apiserver/pkg/admission/plugin/policy/
    validating: dispatcher.go and validator.go): matchConstraints.resourceRules, then every matchCondition must be
    true, then `variables` in order, then each validation; a false one denies with its messageExpression. An
    evaluation error under failurePolicy Fail also denies (never silently admits)."""

    def __init__(self, policy: dict[str, Any]) -> None:
        spec = policy["spec"]
        assert spec["failurePolicy"] == "Fail"
        self.cel = CelCompiler()
        name = policy["metadata"]["name"]
        self.rules = spec["matchConstraints"]["resourceRules"]
        self.conditions = [
            self.cel._program(c["expression"], f"{name} matchCondition {c['name']}") for c in spec["matchConditions"]
        ]
        self.variables = [
            (v["name"], self.cel._program(v["expression"], f"{name} variable {v['name']}")) for v in spec["variables"]
        ]
        self.validations = [
            (
                self.cel._program(v["expression"], f"{name} validation"),
                self.cel._program(v["messageExpression"], f"{name} message"),
            )
            for v in spec["validations"]
        ]

    def _matches(self, group: str, resource: str, operation: str) -> bool:
        return any(
            group in r["apiGroups"] and resource in r["resources"] and operation in r["operations"] for r in self.rules
        )

    def review(
        self,
        *,
        resource: str,
        operation: str,
        user: tuple[str, list[str]],
        new: dict[str, Any],
        old: dict[str, Any] | None = None,
        subresource: str = "",
    ) -> Decision:
        group = "sweeps.dev" if resource == "trainingsweeps" else "ray.io"
        # resourceRules name a subresource as "resource/subresource" (admissionregistration/v1 RuleWithOperations).
        if not self._matches(group, f"{resource}/{subresource}" if subresource else resource, operation):
            return Decision(False, ())
        username, groups = user
        activation: dict[str, Any] = {
            "object": self.cel.to_cel(new),
            "oldObject": self.cel.to_cel(old),
            "request": self.cel.to_cel(
                {
                    "operation": operation,
                    "userInfo": {"username": username, "groups": groups},
                    "resource": {"group": group, "resource": resource},
                    "subResource": subresource,
                }
            ),
        }
        for condition in self.conditions:
            if not self._evaluate(condition, activation):
                return Decision(False, ())
        variables = celtypes.MapType({})
        activation["variables"] = variables
        for name, program in self.variables:
            variables[celtypes.StringType(name)] = program.evaluate(activation)
        denials = []
        for rule, message in self.validations:
            if not self._evaluate(rule, activation):
                denials.append(str(message.evaluate(activation)))
        return Decision(True, tuple(denials))

    @staticmethod
    def _evaluate(program: Any, activation: dict[str, Any]) -> bool:
        result = program.evaluate(activation)
        if not isinstance(result, celtypes.BoolType):  # a CELEvalError is returned, not raised
            raise AssertionError(f"CEL evaluation error (failurePolicy Fail would deny): {result!r}")
        return bool(result)


@functools.cache
def _policy(groups: tuple[str, ...] = (ADMINS,)) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = render_values({"guardPolicy": {"allowedGroups": list(groups)}})
    return one(docs, "ValidatingAdmissionPolicy"), one(docs, "ValidatingAdmissionPolicyBinding")


@pytest.fixture(scope="module")
def policy() -> PolicyEvaluator:
    return PolicyEvaluator(_policy()[0])


def guarded(kind: str = "RayJob", **meta: Any) -> dict[str, Any]:
    metadata = {
        "name": "digits-r1",
        "namespace": "team-a",
        "labels": {LABEL: "digits", "app": "x"},
        "annotations": {GUARD: GUARD_VALUE},
        "finalizers": [FINALIZER],
    }
    metadata.update(meta)
    return {
        "apiVersion": "ray.io/v1" if kind != "TrainingSweep" else "sweeps.dev/v1alpha1",
        "kind": kind,
        "metadata": metadata,
        "spec": {"entrypoint": "python -m training_entrypoints.sweep"},
    }


def edited(obj: dict[str, Any], **changes: Any) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    for key, value in changes.items():
        if value is None:
            new["metadata"].pop(key, None)
        else:
            new["metadata"][key] = value
    return new


RESOURCES = ["trainingsweeps", "rayjobs", "rayclusters"]


@pytest.mark.parametrize("resource", RESOURCES)
def test_a_user_with_patch_rights_cannot_set_the_escape_hatch(policy: PolicyEvaluator, resource: str) -> None:
    old = guarded()
    new = edited(old, annotations={GUARD: GUARD_VALUE, SKIP: "true"})
    decision = policy.review(resource=resource, operation="UPDATE", user=ALICE, old=old, new=new)
    assert decision.matched and len(decision.denials) == 1
    (message,) = decision.denials
    assert SKIP in message and ADMINS in message and "alice@team-a" in message


@pytest.mark.parametrize("resource", RESOURCES)
def test_a_user_cannot_remove_the_finalizer_or_the_label_or_touch_the_guard_annotation(
    policy: PolicyEvaluator, resource: str
) -> None:
    old = guarded()
    cases = {
        "finalizer removed": (edited(old, finalizers=[]), FINALIZER),
        "finalizers dropped": (edited(old, finalizers=None), FINALIZER),
        "label removed": (edited(old, labels={"app": "x"}), LABEL),
        "label re-pointed": (edited(old, labels={LABEL: "other-sweep", "app": "x"}), LABEL),
        "guard annotation re-aimed": (
            edited(old, annotations={GUARD: GUARD_VALUE.replace('""', '"http://169.254.169.254"')}),
            GUARD,
        ),
        "guard annotation removed": (edited(old, annotations={}), GUARD),
    }
    for case, (new, named) in cases.items():
        decision = policy.review(resource=resource, operation="UPDATE", user=ALICE, old=old, new=new)
        assert len(decision.denials) == 1 and named in decision.denials[0], (case, decision)


def test_creating_an_object_with_the_escape_hatch_or_a_guard_annotation_is_refused(policy: PolicyEvaluator) -> None:
    sweep = guarded("TrainingSweep", annotations={SKIP: "true"}, finalizers=None)
    assert policy.review(resource="trainingsweeps", operation="CREATE", user=ALICE, new=sweep).denials
    forged = guarded("RayJob", annotations={GUARD: GUARD_VALUE.replace('""', '"http://10.0.0.1:9000"')})
    (message,) = policy.review(resource="rayjobs", operation="CREATE", user=ALICE, new=forged).denials
    assert GUARD in message


def test_ordinary_edits_pass(policy: PolicyEvaluator) -> None:
    old = guarded(annotations={GUARD: GUARD_VALUE, SKIP: "true"})
    cases = {
        "another annotation": edited(old, annotations={GUARD: GUARD_VALUE, SKIP: "true", "team": "a"}),
        "another label": edited(old, labels={LABEL: "digits", "app": "y"}),
        "the escape hatch removed": edited(old, annotations={GUARD: GUARD_VALUE}),
        "another finalizer added": edited(old, finalizers=[FINALIZER, "example.com/other"]),
    }
    for case, new in cases.items():
        decision = policy.review(resource="rayjobs", operation="UPDATE", user=ALICE, old=old, new=new)
        assert decision.matched and decision.allowed, (case, decision)
    plain = {
        "apiVersion": "sweeps.dev/v1alpha1",
        "kind": "TrainingSweep",
        "metadata": {"name": "digits", "namespace": "team-a"},
    }
    assert policy.review(resource="trainingsweeps", operation="CREATE", user=ALICE, new=plain).allowed


def test_the_allowed_group_may_use_the_escape_hatch_and_remove_the_marks(policy: PolicyEvaluator) -> None:
    old = guarded()
    new = edited(old, annotations={SKIP: "true"}, finalizers=[], labels={})
    admin = ("bob@platform", ["system:authenticated", ADMINS])
    decision = policy.review(resource="rayclusters", operation="UPDATE", user=admin, old=old, new=new)
    assert not decision.matched and decision.allowed
    assert policy.review(resource="rayclusters", operation="UPDATE", user=ALICE, old=old, new=new).denials


def test_the_operator_removes_its_finalizer_and_spreads_the_escape_hatch(policy: PolicyEvaluator) -> None:
    """The guard is the operator: it must still release (controller._guard via kopf) and _propagate_skip."""
    old = guarded("RayCluster")
    operator = (OPERATOR, ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"])
    released = edited(old, finalizers=[])
    assert policy.review(resource="rayclusters", operation="UPDATE", user=operator, old=old, new=released).allowed
    skipped = edited(old, annotations={GUARD: GUARD_VALUE, SKIP: "true"})
    assert policy.review(resource="rayclusters", operation="UPDATE", user=operator, old=old, new=skipped).allowed
    created = guarded("RayJob")
    assert policy.review(resource="rayjobs", operation="CREATE", user=operator, new=created).allowed


def test_kuberay_creates_the_raycluster_with_the_annotations_it_copies(policy: PolicyEvaluator) -> None:
    """KubeRay's constructRayClusterForRayJob copies the RayJob's annotations (guard, and a spread escape hatch)."""
    cluster = guarded("RayCluster", annotations={GUARD: GUARD_VALUE, SKIP: "true"})
    kuberay = (KUBERAY, ["system:serviceaccounts", "system:authenticated"])
    assert policy.review(resource="rayclusters", operation="CREATE", user=kuberay, new=cluster).allowed
    assert policy.review(resource="rayclusters", operation="CREATE", user=ALICE, new=cluster).denials


def test_the_allowed_groups_come_from_values_and_nothing_else_is_matched() -> None:
    policy = PolicyEvaluator(_policy(("corp:sre",))[0])
    old = guarded()
    new = edited(old, finalizers=[])
    assert policy.review(resource="rayjobs", operation="UPDATE", user=("carol", ["corp:sre"]), old=old, new=new).allowed
    assert policy.review(resource="rayjobs", operation="UPDATE", user=("dave", [ADMINS]), old=old, new=new).denials
    assert not policy._matches("", "pods", "UPDATE") and not policy._matches("ray.io", "rayjobs", "DELETE")


def test_the_binding_denies_and_follows_the_watched_namespaces() -> None:
    policy, binding = _policy()
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # cluster-wide
    docs = render_values({"watchNamespaces": ["team-a", "team-b"]})
    (scoped,) = of_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert scoped["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]
    assert not of_kind(render_values({"guardPolicy": {"enabled": False}}), "ValidatingAdmissionPolicy")


@pytest.mark.parametrize("resource", RESOURCES)
def test_only_the_operator_and_kuberay_write_status(policy: PolicyEvaluator, resource: str) -> None:
    """A forged status.guard would aim the guard (and the operator's credentials) elsewhere."""
    old = guarded("TrainingSweep")
    new = {**copy.deepcopy(old), "status": {"guard": {"runRoot": "s3://other/x", "endpointUrl": "http://10.0.0.1"}}}
    (message,) = policy.review(
        resource=resource, operation="UPDATE", user=ALICE, old=old, new=new, subresource="status"
    ).denials
    assert "status" in message and "alice@team-a" in message
    for trusted in (OPERATOR, KUBERAY):
        assert policy.review(
            resource=resource, operation="UPDATE", user=(trusted, []), old=old, new=new, subresource="status"
        ).allowed
    assert not policy.review(
        resource=resource, operation="UPDATE", user=ALICE, old=old, new=new, subresource="scale"
    ).matched
