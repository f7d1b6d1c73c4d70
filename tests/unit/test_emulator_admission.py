"""The emulator's admission chain at least as strict as kube-apiserver's: users by token, the ValidatingAdmissionPolicy
refusal (k8s.io/apiserver .../policy/validating/dispatcher.go Dispatch: first denial, reason -> code, Invalid when
none; Warn adds a warning; an error denies under Fail), a webhook's refusal (.../webhook/errors/statuserror.go
ToStatusErr: a code under 400 becomes 403) and a failed call (Fail: 500 InternalError; Ignore: admitted)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from sweep_sandbox.admission import (
    DEFAULT_USER,
    Admission,
    AdmissionDenied,
    AdmissionRequest,
    UserInfo,
    WebhookCall,
    service_account_user,
    webhook_denied,
)

ALICE = UserInfo("alice", ("team-a", "system:authenticated"))


def request(obj: dict[str, Any], user: UserInfo = ALICE, operation: str = "CREATE") -> AdmissionRequest:
    return AdmissionRequest(operation, "", "v1", "configmaps", "ConfigMap", "team-a", "cm", user, obj)


def policy(reason: str | None = None, **spec: Any) -> dict[str, Any]:
    validation: dict[str, Any] = {"expression": "size(object.data) < 3"}
    if reason:
        validation["reason"] = reason
    return {
        "metadata": {"name": "small", "resourceVersion": "1"},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}
                ]
            },
            "validations": [validation],
            **spec,
        },
    }


def binding(*actions: str) -> dict[str, Any]:
    return {"metadata": {"name": "small-b"}, "spec": {"policyName": "small", "validationActions": list(actions)}}


BIG = {"metadata": {"name": "cm"}, "data": {"a": "1", "b": "2", "c": "3"}}


def test_tokens_name_users_and_anything_else_is_the_default_user() -> None:
    admission = Admission()
    operator = service_account_user("sweeps-system", "op")
    admission.users["t0k"] = operator
    assert admission.authenticate("Bearer t0k") == operator
    assert operator.username == "system:serviceaccount:sweeps-system:op"
    assert "system:serviceaccounts:sweeps-system" in operator.groups
    assert admission.authenticate("Bearer nope") == admission.authenticate(None) == DEFAULT_USER


def test_a_policy_denial_without_a_reason_is_invalid_422_and_with_forbidden_is_403() -> None:
    for reason, code in ((None, 422), ("Forbidden", 403)):
        with pytest.raises(AdmissionDenied) as caught:
            Admission().check_policies(request(BIG), [policy(reason)], [binding("Deny")], {}, [])
        denied = caught.value
        assert (denied.code, denied.reason) == (code, reason or "Invalid")
        text = "ValidatingAdmissionPolicy 'small' with binding 'small-b' denied request: failed expression: "
        assert denied.message == f'configmaps "cm" is forbidden: {text}size(object.data) < 3'
        assert denied.status()["details"]["causes"] == [{"message": text + "size(object.data) < 3"}]


def test_warn_only_warns_and_a_small_object_passes() -> None:
    warnings: list[str] = []
    Admission().check_policies(request(BIG), [policy()], [binding("Warn")], {}, warnings)
    assert warnings == [
        "Validation failed for ValidatingAdmissionPolicy 'small' with binding 'small-b': "
        "failed expression: size(object.data) < 3"
    ]
    Admission().check_policies(request({"metadata": {"name": "cm"}, "data": {}}), [policy()], [binding("Deny")], {}, [])


def test_an_evaluation_error_denies_under_fail_and_is_ignored_under_ignore() -> None:
    broken = {"metadata": {"name": "cm"}}  # no `data`: the expression errors
    with pytest.raises(AdmissionDenied, match="resulted in error"):
        Admission().check_policies(request(broken), [policy()], [binding("Deny")], {}, [])
    Admission().check_policies(request(broken), [policy(failurePolicy="Ignore")], [binding("Deny")], {}, [])


def test_a_binding_to_another_namespace_or_no_binding_matches_nothing() -> None:
    elsewhere = binding("Deny")
    elsewhere["spec"]["matchResources"] = {
        "namespaceSelector": {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-b"]}]
        }
    }
    Admission().check_policies(request(BIG), [policy()], [elsewhere], {}, [])
    Admission().check_policies(request(BIG), [policy()], [], {}, [])


def test_a_webhook_refusal_reads_as_the_api_servers() -> None:
    denied = webhook_denied("v.example.dev", {"code": 200, "message": "no"})
    assert (denied.code, denied.message) == (403, 'admission webhook "v.example.dev" denied the request: no')
    assert webhook_denied("v", {"code": 422, "message": "bad"}).code == 422
    assert webhook_denied("v", None).message == 'admission webhook "v" denied the request without explanation'


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize("failure_policy", ["Fail", "Ignore"])
def test_a_webhook_that_does_not_answer_refuses_under_fail_and_admits_under_ignore(failure_policy: str) -> None:
    spec = {
        "name": "m.example.dev",
        "failurePolicy": failure_policy,
        "timeoutSeconds": 2,
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}],
        "clientConfig": {"url": f"https://127.0.0.1:{_dead_port()}/mutate"},
    }
    hooks = [WebhookCall("c", spec, mutating=True)]
    obj = {"metadata": {"name": "cm"}}

    async def mutate() -> Any:
        admission = Admission()
        try:
            return await admission.mutate(hooks, request(obj), {})
        finally:
            await admission.close()

    if failure_policy == "Ignore":
        assert asyncio.run(mutate()) == obj
        return
    with pytest.raises(AdmissionDenied) as caught:
        asyncio.run(mutate())
    assert caught.value.code == 500
    assert caught.value.message.startswith('Internal error occurred: failed calling webhook "m.example.dev": ')


def test_match_conditions_and_object_selectors_pick_the_webhooks_called() -> None:
    spec: dict[str, Any] = {
        "name": "m",
        "rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"]}],
        "objectSelector": {"matchLabels": {"team": "a"}},
        "matchConditions": [{"name": "named", "expression": "object.metadata.name == 'cm'"}],
    }
    hook, admission = WebhookCall("c", spec, mutating=False), Admission()
    assert admission.should_call(hook, request({"metadata": {"name": "cm", "labels": {"team": "a"}}}), {})
    assert not admission.should_call(hook, request({"metadata": {"name": "cm"}}), {})
    assert not admission.should_call(hook, request({"metadata": {"name": "x", "labels": {"team": "a"}}}), {})
    status = request({"metadata": {"name": "cm", "labels": {"team": "a"}}})
    status.subresource = "status"  # "*" names no subresource
    assert not admission.should_call(hook, status, {})
