"""The API server's admission chain for the emulator: users by bearer token, ValidatingAdmissionPolicies with their
bindings (CEL through schema.CelCompiler), and mutating and validating webhooks called over HTTPS with AdmissionReview
v1, in the order and with the refusals k8s.io/apiserver gives them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import ssl
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jsonpatch
from celpy import celtypes

from .schema_rules import CelCompiler

log = logging.getLogger(__name__)

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


def _cel() -> _Cel:
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
        cel = _cel()
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
        cel = _cel()
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


# ---------------------------------------------------------------------------------------- errors to the client


class AdmissionDenied(Exception):
    """A refusal with the metav1.Status the API server would answer."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


_REASON_CODES = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}


def policy_denied(request: AdmissionRequest, policy: str, binding: str, message: str, reason: str) -> AdmissionDenied:
    """validating/dispatcher.go: admission.NewForbidden's text, the first denial only, the validation's reason
    (Invalid when none) and its code (reasonToCode), the message repeated as the one cause."""
    text = f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {message}"
    reason = reason or "Invalid"
    details = {
        "name": request.name,
        "group": request.group,
        "kind": request.resource,
        "causes": [{"message": text}],
    }
    return AdmissionDenied(
        _REASON_CODES.get(reason, 422), reason, f'{request.qualified} "{request.name}" is forbidden: {text}', details
    )


def webhook_denied(name: str, status: Mapping[str, Any] | None) -> AdmissionDenied:
    """webhook/errors/statuserror.go ToStatusErr: the webhook's status, a code under 400 made 403."""
    status = dict(status or {})
    code = int(status.get("code") or 0)
    if code < 400:
        code = 403
    denied_by = f'admission webhook "{name}" denied the request'
    if status.get("message"):
        message = f"{denied_by}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied_by}: {status['reason']}"
    else:
        message = f"{denied_by} without explanation"
    return AdmissionDenied(code, str(status.get("reason") or ""), message, status.get("details"))


def webhook_unreachable(name: str, error: str) -> AdmissionDenied:
    """A call that failed under failurePolicy Fail: apierrors.NewInternalError(ErrCallingWebhook)."""
    message = f'Internal error occurred: failed calling webhook "{name}": {error}'
    return AdmissionDenied(500, "InternalError", message, {"causes": [{"message": message}]})


# ---------------------------------------------------------------------------------------------------- webhooks


@dataclass
class WebhookCall:
    """One webhook of a Mutating/ValidatingWebhookConfiguration, with the configuration's name."""

    configuration: str
    spec: Obj
    mutating: bool


class Admission:
    """The admission chain's state and its calls: the emulator stores the configuration objects and asks here.

    `services` resolves a webhook's `clientConfig.service` (namespace, name) to the host and port that serve it (the
    Service's endpoints: the sandbox registers the operator's webhook port); `clientConfig.url` is called as is.
    """

    def __init__(self) -> None:
        self.users: dict[str, UserInfo] = {}
        self.default_user = DEFAULT_USER  # no token, or one not in `users` (a real server answers 401)
        self.services: dict[tuple[str, str], tuple[str, int]] = {}
        self._policies: dict[str, tuple[str, PolicyEvaluator]] = {}  # name -> (resourceVersion, compiled)
        self._clients: dict[tuple[Any, ...], tuple[asyncio.AbstractEventLoop, aiohttp.ClientSession, Any]] = {}

    def authenticate(self, authorization: str | None) -> UserInfo:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and token.strip() in self.users:
            return self.users[token.strip()]
        return self.default_user

    # ---- ValidatingAdmissionPolicy

    def policy(self, obj: Obj) -> PolicyEvaluator:
        name, version = obj["metadata"]["name"], str(obj["metadata"].get("resourceVersion", ""))
        cached = self._policies.get(name)
        if cached is None or cached[0] != version:
            cached = (version, PolicyEvaluator(obj))
            self._policies[name] = cached
        return cached[1]

    def check_policies(
        self,
        request: AdmissionRequest,
        policies: Sequence[Obj],
        bindings: Sequence[Obj],
        namespace_labels: Mapping[str, str] | None,
        warnings: list[str] | None,
    ) -> None:
        """Every binding of every policy, in name order; the first Deny refuses (dispatcher.go Dispatch)."""
        by_name = {p["metadata"]["name"]: p for p in policies}
        denied: list[AdmissionDenied] = []
        for binding in sorted(bindings, key=lambda b: b["metadata"]["name"]):
            spec = binding.get("spec") or {}
            policy_obj = by_name.get(spec.get("policyName") or "")
            if policy_obj is None:
                continue
            resources = spec.get("matchResources") or {}
            if not namespace_selector_matches(resources.get("namespaceSelector"), request, namespace_labels):
                continue
            if not object_selector_matches(resources.get("objectSelector"), request):
                continue
            decision = self.policy(policy_obj).evaluate(request, namespace_labels)
            if not decision.denials:
                continue
            actions = spec.get("validationActions") or []
            policy_name, binding_name = policy_obj["metadata"]["name"], binding["metadata"]["name"]
            if "Warn" in actions and warnings is not None:
                warnings.extend(
                    f"Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding "
                    f"'{binding_name}': {message}"
                    for message in decision.denials
                )
            if "Deny" in actions:
                denied.append(
                    policy_denied(request, policy_name, binding_name, decision.denials[0], decision.reasons[0])
                )
        if denied:
            raise denied[0]

    # ---- webhooks

    @staticmethod
    def webhooks(configurations: Sequence[Obj], mutating: bool) -> list[WebhookCall]:
        """In the API server's order: configurations by name, webhooks as listed (configuration/*_manager.go)."""
        return [
            WebhookCall(c["metadata"]["name"], dict(w), mutating)
            for c in sorted(configurations, key=lambda c: c["metadata"]["name"])
            for w in c.get("webhooks") or ()
        ]

    def should_call(self, hook: WebhookCall, request: AdmissionRequest, namespace_labels: Any) -> bool:
        """predicates (rules, namespaceSelector, objectSelector), then matchConditions (webhook/generic/webhook.go
        ShouldCallHook; matchconditions/matcher.go). A condition's error refuses under Fail, else skips the hook."""
        spec = hook.spec
        if not any(rule_matches(rule, request) for rule in spec.get("rules") or ()):
            return False
        if not namespace_selector_matches(spec.get("namespaceSelector"), request, namespace_labels):
            return False
        if not object_selector_matches(spec.get("objectSelector"), request):
            return False
        conditions = spec.get("matchConditions") or ()
        if not conditions:
            return True
        cel = _cel()
        activation = cel.activation(request)
        for condition in conditions:
            expression = condition["expression"]
            try:
                program = cel.program(expression, f"{spec['name']} matchCondition {condition['name']}")
                if not cel.boolean(program, activation, expression):
                    return False
            except Exception as error:
                if (spec.get("failurePolicy") or "Fail") == "Fail":
                    raise webhook_unreachable(spec["name"], f"matchCondition {condition['name']}: {error}") from error
                return False
        return True

    async def call(self, hook: WebhookCall, request: AdmissionRequest) -> Obj | None:
        """POST the AdmissionReview; the response, or None for a failed call under failurePolicy Ignore."""
        spec = hook.spec
        name = spec["name"]
        try:
            return await self._post(spec, request)
        except AdmissionDenied:
            raise
        except Exception as error:
            if (spec.get("failurePolicy") or "Fail") == "Ignore":
                log.warning("webhook %s failed, ignored (failurePolicy Ignore): %s", name, error)
                return None
            raise webhook_unreachable(name, f"failed to call webhook: {error}") from error

    def _client(self, url: str, server_hostname: str | None, ca_bundle: str) -> tuple[aiohttp.ClientSession, Any]:
        """A client per (server, name, caBundle), reused across calls as the API server keeps one per webhook client
        configuration with its kept-alive connections (k8s.io/apiserver/pkg/util/webhook/client.go ClientManager,
        cached by the configuration's hash). A new caBundle or endpoint gets a new client; a client belongs to the
        loop it was made in (an emulator restarted in another loop makes its own)."""
        loop = asyncio.get_running_loop()
        parts = urllib.parse.urlsplit(url)
        key = (parts.scheme, parts.netloc, server_hostname, ca_bundle)
        cached = self._clients.get(key)
        if cached is not None and cached[0] is loop and not cached[1].closed:
            return cached[1], cached[2]
        context = ssl.create_default_context()
        if ca_bundle:
            context.load_verify_locations(cadata=base64.b64decode(ca_bundle).decode())
        session = aiohttp.ClientSession()
        self._clients[key] = (loop, session, context)
        return session, context

    async def close(self) -> None:
        """Close the webhook clients made in this loop (the emulator's stop)."""
        loop = asyncio.get_running_loop()
        for key, (owner, session, _) in list(self._clients.items()):
            if owner is loop:
                await session.close()
                del self._clients[key]

    async def _post(self, spec: Obj, request: AdmissionRequest) -> Obj:
        client = spec.get("clientConfig") or {}
        server_hostname = None
        if client.get("url"):
            url = client["url"]
        else:
            service = client.get("service") or {}
            key = (service.get("namespace", ""), service.get("name", ""))
            if key not in self.services:
                raise RuntimeError(f'service "{key[1]}" not found')  # no endpoints: the dial fails
            host, port = self.services[key]
            url = f"https://{host}:{port}{service.get('path') or '/'}"
            server_hostname = f"{key[1]}.{key[0]}.svc"  # the name the serving certificate must carry
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request.review_request()}
        data = json.dumps(review)
        timeout = aiohttp.ClientTimeout(total=float(spec.get("timeoutSeconds") or 10))
        session, context = self._client(url, server_hostname, client.get("caBundle") or "")
        for attempt in (1, 2):
            try:
                async with session.post(
                    url,
                    data=data,
                    headers={"Content-Type": "application/json", "Accept": "application/json"},
                    ssl=context,
                    server_hostname=server_hostname,
                    timeout=timeout,
                ) as answer:
                    if answer.status != 200:
                        raise RuntimeError(f"the server responded with status {answer.status}")
                    body = await answer.json(content_type=None)
                break
            except aiohttp.ServerDisconnectedError:
                # A kept-alive connection the server had closed: Go's transport sends the request again on a new
                # one (net/http transport.go shouldRetryRequest, a reused connection); a second failure is real.
                if attempt == 2:
                    raise
        response = (body or {}).get("response") or {}
        if response.get("uid") != request.uid:
            raise RuntimeError(f"expected response.uid={request.uid!r}, got {response.get('uid')!r}")
        return dict(response)

    async def mutate(self, hooks: Sequence[WebhookCall], request: AdmissionRequest, namespace_labels: Any) -> Obj:
        """mutating/dispatcher.go: each matching webhook in turn sees the object the previous ones made; a
        JSONPatch response is applied; a refusal stops the request. Returns the (possibly new) object."""
        for hook in hooks:
            if not self.should_call(hook, request, namespace_labels):
                continue
            response = await self.call(hook, request)
            if response is None:
                continue
            if not response.get("allowed"):
                raise webhook_denied(hook.spec["name"], response.get("status"))
            if response.get("patch"):
                if response.get("patchType") != "JSONPatch":
                    raise webhook_unreachable(
                        hook.spec["name"], f"unsupported patch type {response.get('patchType')!r}"
                    )
                operations = json.loads(base64.b64decode(response["patch"]))
                try:
                    request.object = jsonpatch.apply_patch(request.object, operations, in_place=False)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
                    raise webhook_unreachable(hook.spec["name"], f"applying the patch: {error}") from error
        return request.object

    async def validate(self, hooks: Sequence[WebhookCall], request: AdmissionRequest, namespace_labels: Any) -> None:
        """validating/dispatcher.go: matching webhooks are called in parallel; any refusal refuses."""
        chosen = [hook for hook in hooks if self.should_call(hook, request, namespace_labels)]
        responses = await asyncio.gather(*(self.call(hook, request) for hook in chosen), return_exceptions=True)
        for hook, response in zip(chosen, responses, strict=True):
            if isinstance(response, BaseException):
                raise response
            if response is not None and not response.get("allowed"):
                raise webhook_denied(hook.spec["name"], response.get("status"))
