"""ValidatingAdmissionPolicies with their bindings as the API server evaluates them: matchConstraints, then
matchConditions, validations and auditAnnotations in CEL (through the emulator's CRD-rule compiler)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celpy import celtypes

from .admission_requests import (
    DEFAULT_USER,
    AdmissionRequest,
    UserInfo,
    namespace_object,
    namespace_selector_matches,
    object_selector_matches,
    rule_matches,
)
from .schema_rules import CelCompiler

# ----------------------------------------------------------------------------------------------------------- CEL


class CelError(Exception):
    pass


class _Cel:
    """CEL programs over an admission request, compiled with the emulator's CRD-rule compiler."""

    def __init__(self) -> None:
        self.compiler = CelCompiler()
        self._programs: dict[str, Any] = {}

    def program(self, text: str, where: str) -> Any:
        if text not in self._programs:  # webhooks' matchConditions are met on every request
            self._programs[text] = self.compiler._program(text, where)
        return self._programs[text]

    def activation(self, request: AdmissionRequest) -> dict[str, Any]:
        return {
            "object": self.compiler.to_cel(request.object),
            "oldObject": self.compiler.to_cel(request.old_object),
            "namespaceObject": self.compiler.to_cel(request.namespace_object),
            # the CEL `request` always has subResource (empty for the main resource), never the objects
            "request": self.compiler.to_cel(
                {"subResource": ""} | request.review_request() | {"object": None, "oldObject": None}
            ),
        }

    @staticmethod
    def evaluate(program: Any, activation: Mapping[str, Any], expression: str) -> Any:
        try:
            result = program.evaluate(activation)
        except Exception as error:  # cel-python raises some errors (a missing key) and returns others
            raise CelError(f"expression '{expression}' resulted in error: {error}") from error
        if isinstance(result, Exception):
            raise CelError(f"expression '{expression}' resulted in error: {result}")
        return result

    def boolean(self, program: Any, activation: Mapping[str, Any], expression: str) -> bool:
        result = self.evaluate(program, activation, expression)
        if not isinstance(result, celtypes.BoolType):
            raise CelError(f"expression '{expression}' resulted in error: expected a bool, got {type(result).__name__}")
        return bool(result)


_CEL: _Cel | None = None


def cel_programs() -> _Cel:
    global _CEL
    if _CEL is None:
        _CEL = _Cel()
    return _CEL


# -------------------------------------------------------------------------------- ValidatingAdmissionPolicy


@dataclass(frozen=True)
class Decision:
    matched: bool
    denials: tuple[str, ...]
    reasons: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.denials


class PolicyEvaluator:
    """The API server's evaluation of one ValidatingAdmissionPolicy (k8s.io/apiserver/pkg/admission/plugin/policy/
    validating: dispatcher.go and validator.go): matchConstraints.resourceRules, then every matchCondition must be
    true, then `variables` in order, then each validation; a false one denies with its messageExpression (else its
    message, else "failed expression: ..."). An evaluation error denies under failurePolicy Fail (the default) and
    is ignored under Ignore; `strict` raises it instead (the unit tests' mode)."""

    def __init__(self, policy: Mapping[str, Any], strict: bool = False) -> None:
        spec = policy["spec"]
        self.name = policy["metadata"]["name"]
        self.failure_policy = spec.get("failurePolicy") or "Fail"
        self.strict = strict
        cel = cel_programs()
        self.cel = cel.compiler
        constraints = spec.get("matchConstraints") or {}
        self.rules = constraints.get("resourceRules") or []
        self.exclude = constraints.get("excludeResourceRules") or []
        self.namespace_selector = constraints.get("namespaceSelector")
        self.object_selector = constraints.get("objectSelector")
        name = self.name
        self.conditions = [
            (c["expression"], cel.program(c["expression"], f"{name} matchCondition {c['name']}"))
            for c in spec.get("matchConditions") or ()
        ]
        self.variables = [
            (v["name"], v["expression"], cel.program(v["expression"], f"{name} variable {v['name']}"))
            for v in spec.get("variables") or ()
        ]
        self.validations = [
            (
                v["expression"],
                cel.program(v["expression"], f"{name} validation"),
                v.get("message") or "",
                cel.program(v["messageExpression"], f"{name} message") if v.get("messageExpression") else None,
                v.get("reason") or "",
            )
            for v in spec.get("validations") or ()
        ]

    def _matches(self, group: str, resource: str, operation: str) -> bool:
        plural, _, sub = resource.partition("/")
        probe = AdmissionRequest(operation, group, "v1", plural, "", "ns", "", DEFAULT_USER, {}, subresource=sub)
        return self.matches_resource(probe)

    def matches_resource(self, request: AdmissionRequest) -> bool:
        # resourceRules pin no versions here (matchPolicy Equivalent): the version is not compared
        probe = copy.copy(request)
        probe.version = "*"

        def any_rule(rules: Sequence[Mapping[str, Any]]) -> bool:
            return any(rule_matches({**r, "apiVersions": ["*"]}, probe) for r in rules)

        return any_rule(self.rules) and not any_rule(self.exclude)

    def review(
        self,
        *,
        resource: str,
        operation: str,
        user: tuple[str, list[str]],
        new: dict[str, Any] | None,
        old: dict[str, Any] | None = None,
        subresource: str = "",
        namespace: dict[str, Any] | None = None,
    ) -> Decision:
        """One request by resource name (the unit tests' shorthand): group from the resource, no namespace labels;
        `new` None on a DELETE (of `old`); `namespace` the request's Namespace object (namespaceObject)."""
        group = "sweeps.dev" if resource in ("trainingsweeps", "gpuhourledgers") else "ray.io"
        username, groups = user
        subject = new if new is not None else old or {}
        request = AdmissionRequest(
            operation,
            group,
            "v1alpha1" if group == "sweeps.dev" else "v1",
            resource,
            str(subject.get("kind") or ""),
            (subject.get("metadata") or {}).get("namespace"),
            (subject.get("metadata") or {}).get("name") or "",
            UserInfo(username, tuple(groups)),
            new,
            old,
            subresource=subresource,
            namespace_object=namespace_object(namespace) if namespace is not None else None,
        )
        return self.evaluate(request)

    def evaluate(self, request: AdmissionRequest, namespace_labels: Mapping[str, str] | None = None) -> Decision:
        if not self.matches_resource(request):
            return Decision(False, ())
        if not namespace_selector_matches(self.namespace_selector, request, namespace_labels):
            return Decision(False, ())
        if not object_selector_matches(self.object_selector, request):
            return Decision(False, ())
        cel = cel_programs()
        activation = cel.activation(request)
        try:
            for expression, condition in self.conditions:
                if not cel.boolean(condition, activation, expression):
                    return Decision(False, ())
            variables = celtypes.MapType({})
            activation["variables"] = variables
            for name, expression, program in self.variables:
                # cel-go evaluates a variable where it is first used; here at once, so an unused variable's
                # error denies too (the chart's variables are all used)
                variables[celtypes.StringType(name)] = cel.evaluate(program, activation, expression)
            denials, reasons = [], []
            for expression, rule, message, message_program, reason in self.validations:
                if cel.boolean(rule, activation, expression):
                    continue
                text = message or f"failed expression: {expression.strip()}"
                if message_program is not None:
                    # validator.go: a failed messageExpression falls back to the message
                    with contextlib.suppress(CelError):
                        text = str(cel.evaluate(message_program, activation, "messageExpression"))
                denials.append(text)
                reasons.append(reason)
            return Decision(True, tuple(denials), tuple(reasons))
        except CelError as error:
            if self.strict:
                raise AssertionError(f"CEL evaluation error (failurePolicy Fail would deny): {error}") from error
            if self.failure_policy == "Ignore":
                return Decision(False, ())
            return Decision(True, (str(error),), ("",))


class StrictPolicyEvaluator(PolicyEvaluator):
    """Raises on a CEL evaluation error (unit tests of the chart's policy: an error must never pass as a denial)."""

    def __init__(self, policy: Mapping[str, Any]) -> None:
        super().__init__(policy, strict=True)
