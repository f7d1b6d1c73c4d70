"""The API server's admission chain for the emulator: policies and mutating and validating webhooks called over
HTTPS with AdmissionReview v1, in the order and with the refusals k8s.io/apiserver gives them."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import jsonpatch

from .admission_policies import PolicyEvaluator, StrictPolicyEvaluator, cel_programs
from .admission_requests import (
    ADMISSION_GROUP,
    DEFAULT_USER,
    NAMESPACE_NAME_LABEL,
    AdmissionRequest,
    Obj,
    UserInfo,
    namespace_object,
    namespace_selector_matches,
    object_selector_matches,
    rule_matches,
    selector_matches,
    service_account_user,
)

log = logging.getLogger(__name__)

# What many importers take from here: the request types live in admission_requests, the policies in
# admission_policies.
__all__ = [
    "ADMISSION_GROUP",
    "DEFAULT_USER",
    "NAMESPACE_NAME_LABEL",
    "Admission",
    "AdmissionDenied",
    "AdmissionRequest",
    "PolicyEvaluator",
    "StrictPolicyEvaluator",
    "UserInfo",
    "WebhookCall",
    "namespace_object",
    "policy_denied",
    "selector_matches",
    "service_account_user",
    "webhook_denied",
    "webhook_unreachable",
]


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
        cel = cel_programs()
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
