"""The guard's finalizer at admission (issue 25, defect 5; issue 30): the chart's MutatingWebhookConfiguration sends
only a RayCluster created with the guard annotation (its matchConditions evaluated as the API server's webhook matcher
does: sweep_sandbox.admission.Admission.should_call), to the path the operator serves, under failurePolicy Fail; the
operator's decision adds the finalizer to those and to nothing else. It also sends every TrainingSweep at its
creation (under webhook.failurePolicy), whose decision adds the finalizer once."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator.settings import Settings
from sweep_operator.webhook_finalizers import (
    MUTATING_WEBHOOK_PATH,
    SWEEP_MUTATING_WEBHOOK_PATH,
    finalizers_at_create,
    sweep_finalizers_at_create,
)
from sweep_sandbox.admission import Admission, AdmissionRequest, UserInfo, WebhookCall
from tests.unit.test_chart import NAMESPACE, RELEASE, of_kind, render_values, settings_env

FULLNAME = f"{RELEASE}-trainingsweep-operator"
KUBERAY = UserInfo("system:serviceaccount:kuberay-system:kuberay-operator", ("system:serviceaccounts",))


def cluster(annotations: dict[str, str] | None = None, finalizers: list[str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "digits-r1-abcde", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if finalizers is not None:
        metadata["finalizers"] = finalizers
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": metadata, "spec": {}}


def request(obj: dict[str, Any], operation: str = "CREATE", resource: str = "rayclusters") -> AdmissionRequest:
    return AdmissionRequest(
        operation, "ray.io", "v1", resource, "RayCluster", "team-a", obj["metadata"]["name"], KUBERAY, obj
    )


def hooks(values: dict[str, Any] | None = None) -> dict[str, WebhookCall]:
    (configuration,) = of_kind(render_values(values or {}), "MutatingWebhookConfiguration")
    return {webhook.spec["name"]: webhook for webhook in Admission.webhooks([configuration], mutating=True)}


def hook(values: dict[str, Any] | None = None) -> WebhookCall:
    return hooks(values)["guard-finalizer.rayclusters.sweeps.dev"]


def sweep_hook(values: dict[str, Any] | None = None) -> WebhookCall:
    return hooks(values)["guard-finalizer.trainingsweeps.sweeps.dev"]


def sweep(finalizers: list[str] | None = None, user: UserInfo = KUBERAY, operation: str = "CREATE") -> AdmissionRequest:
    metadata: dict[str, Any] = {"name": "digits", "namespace": "team-a"}
    if finalizers is not None:
        metadata["finalizers"] = finalizers
    obj = {"apiVersion": "sweeps.dev/v1alpha1", "kind": "TrainingSweep", "metadata": metadata, "spec": {}}
    return AdmissionRequest(
        operation, "sweeps.dev", "v1alpha1", "trainingsweeps", "TrainingSweep", "team-a", "digits", user, obj
    )


GUARDED = {constants.ANNOTATION_GUARD: '{"runRoot": "s3://b/sweeps/team-a/digits-r1"}'}


def test_only_a_raycluster_created_with_the_guard_annotation_is_sent() -> None:
    webhook, admission = hook(), Admission()
    assert admission.should_call(webhook, request(cluster(GUARDED)), {})
    for not_sent in (
        request(cluster()),  # not ours
        request(cluster({"app": "x", constants.LABEL_SWEEP: "digits"})),  # an annotation named like our label
        request(cluster(GUARDED), operation="UPDATE"),
        request(cluster(GUARDED), resource="rayjobs"),
    ):
        assert not admission.should_call(webhook, not_sent, {})


def test_the_webhook_fails_closed_for_ours_only_and_calls_the_operators_path() -> None:
    docs = render_values({})
    spec = hook().spec
    assert spec["failurePolicy"] == "Fail" and spec["sideEffects"] == "None"
    assert spec["admissionReviewVersions"] == ["v1"] and spec["reinvocationPolicy"] == "Never"
    service = spec["clientConfig"]["service"]
    assert service["path"] == MUTATING_WEBHOOK_PATH and service["namespace"] == NAMESPACE
    assert service["name"] == Settings.from_env(settings_env(docs)).webhook_service == f"{FULLNAME}-webhook"
    assert "caBundle" not in spec["clientConfig"]  # the operator injects it (certProvider operator)
    # Only matchConditions pick ours (a label selector would let a tenant's label decide)
    assert "objectSelector" not in spec


def test_the_operator_injects_its_ca_into_the_mutating_configuration_too() -> None:
    settings = Settings.from_env(settings_env(render_values({})))
    assert f"MutatingWebhookConfiguration/{FULLNAME}" in settings.webhook_configurations


@pytest.mark.parametrize(
    "values",
    [{"webhook": {"guardFinalizer": {"enabled": False}}}, {"webhook": {"enabled": False}}],
)
def test_off_renders_no_mutating_webhook_and_injects_nothing_there(values: dict[str, Any]) -> None:
    docs = render_values(values)
    assert not of_kind(docs, "MutatingWebhookConfiguration")
    settings = Settings.from_env(settings_env(docs))
    assert not [c for c in settings.webhook_configurations if c.startswith("MutatingWebhookConfiguration/")]


def test_the_namespaced_install_sends_only_the_watched_namespaces() -> None:
    spec = hook({"watchNamespaces": ["team-a"]}).spec
    admission = Admission()
    other = request(cluster(GUARDED))
    other.namespace = "team-b"
    assert admission.should_call(WebhookCall("x", spec, True), request(cluster(GUARDED)), {})
    assert not admission.should_call(WebhookCall("x", spec, True), other, {})


def test_cert_manager_injects_the_ca_into_the_mutating_configuration() -> None:
    (configuration,) = of_kind(
        render_values({"webhook": {"certProvider": "cert-manager"}}), "MutatingWebhookConfiguration"
    )
    assert "cert-manager.io/inject-ca-from" in configuration["metadata"]["annotations"]


def test_the_decision_adds_the_finalizer_to_guarded_clusters_once() -> None:
    assert finalizers_at_create(cluster(GUARDED)) == [constants.FINALIZER]
    assert finalizers_at_create(cluster(GUARDED, ["ray.io/x"])) == ["ray.io/x", constants.FINALIZER]
    assert finalizers_at_create(cluster(GUARDED, [constants.FINALIZER])) is None
    assert finalizers_at_create(cluster()) is None
    assert finalizers_at_create(cluster({"app": "x"})) is None


TENANT = UserInfo("alice@team-a", ("team-a:developers", "system:authenticated"))


def test_the_configuration_holds_exactly_the_two_finalizer_webhooks() -> None:
    assert set(hooks()) == {"guard-finalizer.rayclusters.sweeps.dev", "guard-finalizer.trainingsweeps.sweeps.dev"}


def test_every_sweep_created_is_sent_and_nothing_else_of_the_sweeps() -> None:
    webhook, admission = sweep_hook(), Admission()
    assert admission.should_call(webhook, sweep(user=TENANT), {})
    assert admission.should_call(webhook, sweep([constants.FINALIZER], user=TENANT), {})  # the decision says no-op
    assert not admission.should_call(webhook, sweep(user=TENANT, operation="UPDATE"), {})  # its own patches, status
    # the sweep webhook never sees RayClusters, nor the RayCluster webhook sweeps
    assert not admission.should_call(webhook, request(cluster(GUARDED)), {})
    assert not admission.should_call(hook(), sweep(user=TENANT), {})


def test_the_sweep_webhook_follows_the_validation_failure_policy_and_calls_its_own_path() -> None:
    spec = sweep_hook().spec
    (validating,) = of_kind(render_values({}), "ValidatingWebhookConfiguration")
    assert spec["failurePolicy"] == validating["webhooks"][0]["failurePolicy"] == "Fail"
    assert sweep_hook({"webhook": {"failurePolicy": "Ignore"}}).spec["failurePolicy"] == "Ignore"
    assert hook({"webhook": {"failurePolicy": "Ignore"}}).spec["failurePolicy"] == "Fail"  # RayClusters' own setting
    assert spec["sideEffects"] == "None" and spec["reinvocationPolicy"] == "Never"
    assert spec["clientConfig"]["service"]["path"] == SWEEP_MUTATING_WEBHOOK_PATH
    assert spec["clientConfig"]["service"] == {
        **hook().spec["clientConfig"]["service"],
        "path": spec["clientConfig"]["service"]["path"],
    }
    assert "objectSelector" not in spec and "matchConditions" not in spec  # every sweep is ours


def test_the_namespaced_install_sends_only_sweeps_of_the_watched_namespaces() -> None:
    spec = sweep_hook({"watchNamespaces": ["team-a"]}).spec
    elsewhere = sweep(user=TENANT)
    elsewhere.namespace = "team-b"
    assert Admission().should_call(WebhookCall("x", spec, True), sweep(user=TENANT), {})
    assert not Admission().should_call(WebhookCall("x", spec, True), elsewhere, {})


def test_the_sweep_decision_adds_the_finalizer_once_and_keeps_the_others() -> None:
    def of(finalizers: list[str] | None) -> dict[str, Any]:
        return sweep(finalizers).object

    assert sweep_finalizers_at_create(of(None)) == [constants.FINALIZER]
    assert sweep_finalizers_at_create(of(["team-a/keep"])) == ["team-a/keep", constants.FINALIZER]
    assert sweep_finalizers_at_create(of([constants.FINALIZER])) is None
    assert sweep_finalizers_at_create({}) == [constants.FINALIZER]
