"""The Helm chart renders valid, least-privilege manifests that agree with the operator's settings.

Rendering runs Helm's own engine in-process (helm-python-sdk, a ctypes binding; offline: under
strace a render, a schema check and a lint open no socket), so these stay in the unit tier.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from sweep_contracts.constants import CRD_FILENAME, LEDGER_RECORD_NAME
from sweep_operator import settings as operator_settings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "trainingsweep-operator"
RELEASE, NAMESPACE = "sweeps", "sweeps-system"
KUBE_VERSION = "1.33"
OPERATOR_ROLE = "arn:aws:iam::123456789012:role/sweep-operator"
RUNNER_ROLE = "arn:aws:iam::123456789012:role/sweep-runner"

# Kinds kubernetes-validate has no schema for, each checked by a dedicated test below instead.
NOT_IN_KUBERNETES_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "Prometheus Operator CRD",
    ("cert-manager.io/v1", "Issuer"): "cert-manager CRD",
    ("cert-manager.io/v1", "Certificate"): "cert-manager CRD",
    ("kopf.dev/v1", "ClusterKopfPeering"): "kopf peering CRD (crds/kopfpeerings.kopf.dev.yaml)",
    ("kopf.dev/v1", "KopfPeering"): "kopf peering CRD (crds/kopfpeerings.kopf.dev.yaml)",
}

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "watch-namespaces": {"watchNamespaces": ["team-a", "team-b"]},
    "webhook": {"webhook": {"enabled": True}},
    "webhook-off": {
        "webhook": {"enabled": False},
        "guardPolicy": {"enabled": False},
        "networkPolicy": {"enabled": False},
    },
    "webhook-cert-manager": {"webhook": {"enabled": True, "certProvider": "cert-manager"}},
    "webhook-own-certificate": {
        "webhook": {
            "enabled": True,
            "certProvider": "secret",
            "tls": {"secretName": "sweep-webhook-tls"},
            "caBundle": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==",
        }
    },
    "irsa": {
        "serviceAccount": {"roleArn": OPERATOR_ROLE},
        "runner": {"serviceAccount": {"create": True, "roleArn": RUNNER_ROLE}},
        "watchNamespaces": ["team-a", "team-b"],
    },
    "ha": {"ha": {"enabled": True, "replicas": 3}},
    "ha-watch-namespaces": {"ha": {"enabled": True}, "watchNamespaces": ["team-a"]},
    "everything": {
        "watchNamespaces": ["team-a"],
        "ha": {"enabled": True},
        "webhook": {
            "enabled": True,
            "certProvider": "cert-manager",
            "certManager": {"issuerRef": {"kind": "ClusterIssuer", "name": "corp-ca"}},
        },
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
        "serviceAccount": {"roleArn": OPERATOR_ROLE},
        "runner": {"serviceAccount": {"create": True, "roleArn": RUNNER_ROLE}},
        "limits": {"maxGpusPerSweep": 8, "maxActiveSeconds": 86400, "defaultActiveSeconds": 3600},
        "s3": {"region": "us-west-2", "endpointUrl": "https://s3.us-west-2.amazonaws.com"},
        "reconcile": {"statusPollSeconds": 2.5},
    },
}


@functools.cache
def _chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def render_values(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's documents for these values (NOTES.txt left out)."""
    manifests = _chart().render(values, name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


@functools.cache
def _rendered(scenario: str) -> tuple[dict[str, Any], ...]:
    return tuple(render_values(SCENARIOS[scenario]))


def render(scenario: str) -> list[dict[str, Any]]:
    return list(_rendered(scenario))


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def settings_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    return one(docs, "ConfigMap")["data"]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def grants(roles: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, over all rules of the given Roles/ClusterRoles."""
    table: dict[tuple[str, str], set[str]] = {}
    for role in roles:
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    table.setdefault((group, resource), set()).update(rule["verbs"])
    return table


def settings_env_vars() -> set[str]:
    """Every environment variable operator/sweep_operator/settings.py reads."""
    names = set()
    for cls in (operator_settings.Settings, operator_settings.OperatorLimits, operator_settings.TenancyPolicy):
        names.update(f.metadata["env"] for f in dataclasses.fields(cls) if "env" in f.metadata)
    return names


# --- every document is valid Kubernetes -----------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rendered_document_validates_against_kubernetes_schemas(scenario: str) -> None:
    for doc in render(scenario):
        if (doc["apiVersion"], doc["kind"]) in NOT_IN_KUBERNETES_SCHEMAS:
            continue  # skipped on purpose, checked by the webhook / metrics / HA tests
        # Any other kind kubernetes-validate does not know raises SchemaNotFoundError here.
        _validate_once(json.dumps(doc, sort_keys=True))


@functools.cache
def _validate_once(doc: str) -> None:
    """Scenarios share most documents; each distinct one is validated once (a failure is not cached)."""
    kubernetes_validate.validate(json.loads(doc), KUBE_VERSION, strict=True)


def test_the_kinds_skipped_from_schema_validation_are_exactly_the_custom_ones_rendered() -> None:
    def is_builtin(api_version: str) -> bool:
        group = api_version.rpartition("/")[0]
        return "." not in group or group.endswith(".k8s.io")

    rendered = {(d["apiVersion"], d["kind"]) for scenario in SCENARIOS for d in render(scenario)}
    assert {key for key in rendered if not is_builtin(key[0])} == set(NOT_IN_KUBERNETES_SCHEMAS)


def test_chart_crds_validate_and_the_trainingsweep_crd_is_a_byte_identical_copy() -> None:
    assert (CHART / "crds" / CRD_FILENAME).read_bytes() == (REPO / "crds" / CRD_FILENAME).read_bytes(), (
        "charts/trainingsweep-operator/crds/ is stale: run `make crd`"
    )
    crds = [doc for entry in _chart().crds for doc in yaml.safe_load_all(entry["data"]) if doc]
    assert {crd["metadata"]["name"] for crd in crds} == {
        "trainingsweeps.sweeps.dev",
        "gpuhourledgers.sweeps.dev",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }
    for crd in crds:
        kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)


# --- RBAC --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rbac_enumerates_resources_and_verbs_without_wildcards(scenario: str) -> None:
    for role in of_kind(render(scenario), "ClusterRole") + of_kind(render(scenario), "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert not any("*" in item for item in rule.get(field, [])), (role["metadata"]["name"], rule)


NAMESPACED_GRANTS = {
    ("sweeps.dev", "trainingsweeps"): {"get", "list", "watch", "patch", "update"},
    ("sweeps.dev", "trainingsweeps/status"): {"get", "patch", "update"},
    ("sweeps.dev", "trainingsweeps/finalizers"): {"update"},
    ("ray.io", "rayjobs"): {"get", "list", "watch", "create", "patch", "update", "delete"},
    ("ray.io", "rayclusters"): {"get", "list", "watch", "create", "patch", "update", "delete"},
    ("ray.io", "rayjobs/status"): {"get"},
    ("ray.io", "rayclusters/status"): {"get"},
    ("ray.io", "rayjobs/finalizers"): {"update"},
    ("ray.io", "rayclusters/finalizers"): {"update"},
    ("", "events"): {"create", "patch", "get", "list", "watch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    # delete: the worker pods of a RayCluster the guard holds (docs/security.md, "hold the data, not the GPUs")
    ("", "pods"): {"get", "list", "watch", "delete"},
    ("", "services"): {"get"},  # the graceful stop's check of a head's address (docs/security.md)
    ("kueue.x-k8s.io", "workloads"): {"get", "list", "watch"},  # Kueue mode: read the RayJobs' Workloads
    # the namespaces' GPU-hour ledgers: created, then replaced with the resourceVersion precondition; never deleted
    ("sweeps.dev", "gpuhourledgers"): {"get", "list", "watch", "create", "update"},
}
CRD_READ = {("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"}}
NAMESPACES_READ = {("", "namespaces"): {"get", "list", "watch"}}
# Scoped by resourceNames (tests/unit/test_chart_install.py): KubeRay's ServiceAccount, our webhook configurations.
NAMED_CLUSTER_GRANTS = {
    ("", "serviceaccounts"): {"get"},
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): {"get", "patch"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"get", "patch"},
}
WEBHOOK_SECRET_GRANTS = {("", "secrets"): {"get", "update"}}
# The record of the GPU-hour ledgers the operator created, in the release namespace (get/update by name, create)
LEDGER_RECORD_GRANTS = {("", "configmaps"): {"get", "update", "create"}}
RELEASE_NAMESPACE_ROLES = ("-webhook-certificate", "-gpu-ledger-record")


def tenant_roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ClusterRoles aggregated into Kubernetes' default user-facing roles (the namespaces' users' rights)."""
    return [
        r
        for r in of_kind(docs, "ClusterRole")
        if any(key.startswith("rbac.authorization.k8s.io/aggregate-to-") for key in r["metadata"].get("labels", {}))
    ]


def operator_cluster_roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ClusterRoles bound to the operator (the tenants' aggregated roles left out)."""
    return [r for r in of_kind(docs, "ClusterRole") if r not in tenant_roles(docs)]


def test_tenants_may_read_their_gpu_hour_ledger_and_only_read_it() -> None:
    """The ledger reads like a ResourceQuota: the view, edit and admin roles aggregate get/list/watch on it."""
    (viewer,) = [r for r in of_kind(render("defaults"), "ClusterRole") if r["metadata"]["name"].endswith("-viewer")]
    labels = viewer["metadata"]["labels"]
    assert all(labels[f"rbac.authorization.k8s.io/aggregate-to-{r}"] == "true" for r in ("view", "edit", "admin"))
    assert grants([viewer]) == {("sweeps.dev", "gpuhourledgers"): {"get", "list", "watch"}}


def manager_roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Roles of watched namespaces (the release namespace's Roles left out: the webhook certificate's, the
    ledger record's)."""
    return [r for r in of_kind(docs, "Role") if not r["metadata"]["name"].endswith(RELEASE_NAMESPACE_ROLES)]


PEERING = {"get", "list", "watch", "patch"}


def test_cluster_wide_mode_grants_exactly_what_the_operator_touches() -> None:
    docs = render("defaults")
    assert not manager_roles(docs)
    assert grants(of_kind(docs, "Role")) == WEBHOOK_SECRET_GRANTS | LEDGER_RECORD_GRANTS
    (record,) = [r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("-gpu-ledger-record")]
    assert record["metadata"]["namespace"] == NAMESPACE
    assert [r.get("resourceNames") for r in record["rules"]] == [[LEDGER_RECORD_NAME], None]
    assert record["rules"][1]["verbs"] == ["create"]  # create cannot be scoped to a name
    assert grants(operator_cluster_roles(docs)) == NAMESPACED_GRANTS | CRD_READ | NAMESPACES_READ | NAMED_CLUSTER_GRANTS
    for binding in of_kind(docs, "ClusterRoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": one(docs, "ServiceAccount")["metadata"]["name"], "namespace": NAMESPACE}
        ]


def test_watch_namespaces_renders_a_role_per_namespace_and_no_cluster_role_for_namespaced_resources() -> None:
    docs = render("watch-namespaces")
    # no namespaced rights, no namespaces list
    assert grants(operator_cluster_roles(docs)) == CRD_READ | NAMED_CLUSTER_GRANTS
    roles = manager_roles(docs)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert grants([role]) == NAMESPACED_GRANTS
    bindings = [b for b in of_kind(docs, "RoleBinding") if not b["metadata"]["name"].endswith(RELEASE_NAMESPACE_ROLES)]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    assert settings_env(docs)["SWEEP_WATCH_NAMESPACES"] == "team-a,team-b"


# --- the operator Deployment ---------------------------------------------------------------------


def test_operator_container_is_hardened() -> None:
    pod = one(render("defaults"), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = operator_container(render("defaults"))["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    (tmp,) = [m for m in operator_container(render("defaults"))["volumeMounts"] if m["mountPath"] == "/tmp"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == tmp["name"]]
    assert "emptyDir" in volume


def test_liveness_probe_calls_kopfs_endpoint_on_the_configured_port() -> None:
    container = operator_container(render("defaults"))
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    (port,) = [p for p in container["ports"] if p["name"] == probe["port"]]
    assert str(port["containerPort"]) == settings_env(render("defaults"))["SWEEP_LIVENESS_PORT"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_the_operator_learns_its_memory_limit_from_its_own_pod() -> None:
    """The memory budget for tenants' data is sized from the container's limit, given in bytes by the downward API;
    without a limit the downward API would give the node's memory, so the variable is left out (the default applies)."""
    (entry,) = [e for e in operator_container(render("defaults"))["env"] if e["name"] == "SWEEP_MEMORY_LIMIT_BYTES"]
    assert entry["valueFrom"] == {"resourceFieldRef": {"containerName": "operator", "resource": "limits.memory"}}
    unlimited = operator_container(render_values({"resources": {"limits": None}}))
    assert "SWEEP_MEMORY_LIMIT_BYTES" not in {e["name"] for e in unlimited["env"]}
    assert operator_settings.Settings.from_env({"SWEEP_MEMORY_LIMIT_BYTES": str(512 * 1024 * 1024)}).memory_limit_bytes


def test_default_is_one_replica_recreated_without_peering() -> None:
    docs = render("defaults")
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert settings_env(docs)["SWEEP_PEERING_NAME"] == ""
    assert not of_kind(docs, "ClusterKopfPeering") and not of_kind(docs, "PodDisruptionBudget")


def test_ha_runs_several_replicas_sharing_a_cluster_peering() -> None:
    docs = render("ha")
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    peering = one(docs, "ClusterKopfPeering")
    assert settings_env(docs)["SWEEP_PEERING_NAME"] == peering["metadata"]["name"] == "trainingsweep-operator"
    assert grants(of_kind(docs, "ClusterRole"))[("kopf.dev", "clusterkopfpeerings")] == PEERING
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    # kopf names each peer after its pod, so the peering status says which replica works.
    assert {"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in operator_container(docs)[
        "env"
    ]


def test_ha_with_watch_namespaces_uses_a_namespaced_peering_per_namespace() -> None:
    docs = render("ha-watch-namespaces")
    assert [p["metadata"]["namespace"] for p in of_kind(docs, "KopfPeering")] == ["team-a"]
    assert not of_kind(docs, "ClusterKopfPeering")
    assert grants(of_kind(docs, "Role"))[("kopf.dev", "kopfpeerings")] == PEERING
    assert ("kopf.dev", "clusterkopfpeerings") not in grants(of_kind(docs, "ClusterRole"))


# --- settings ConfigMap ---------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_configmap_sets_exactly_the_operator_settings_and_the_operator_accepts_them(scenario: str) -> None:
    docs = render(scenario)
    env = settings_env(docs)
    assert set(env) <= settings_env_vars(), f"not Settings variables: {sorted(set(env) - settings_env_vars())}"
    from_pod = {e["name"] for e in operator_container(docs).get("env") or [] if e["name"] in settings_env_vars()}
    assert from_pod == {"SWEEP_MEMORY_LIMIT_BYTES"}  # what the pod knows of itself (the downward API)
    assert set(env) | from_pod == settings_env_vars(), (
        f"settings the chart does not set: {sorted(settings_env_vars() - set(env) - from_pod)}"
    )
    assert all(isinstance(value, str) for value in env.values())
    parsed = operator_settings.Settings.from_env(env)
    values = _chart().merge_values(SCENARIOS[scenario])
    assert dataclasses.asdict(parsed.limits) == {
        re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower(): value for key, value in values["limits"].items()
    }
    assert parsed.namespaces == tuple(values["watchNamespaces"])
    assert parsed.status_poll_seconds == values["reconcile"]["statusPollSeconds"]
    assert parsed.metrics_port == (values["metrics"]["port"] if values["metrics"]["enabled"] else 0)
    assert parsed.webhook_port == (values["webhook"]["port"] if values["webhook"]["enabled"] else 0)
    deployment = one(docs, "Deployment")
    assert {"configMapRef": {"name": one(docs, "ConfigMap")["metadata"]["name"]}} in operator_container(docs)["envFrom"]
    assert "checksum/settings" in deployment["spec"]["template"]["metadata"]["annotations"]


def test_chart_defaults_are_the_operator_defaults() -> None:
    # Except what only an install knows: the webhook (the chart turns it on, the operator keeps its certificate in the
    # chart's Secret), the release namespace, and where KubeRay runs; a bare operator has none of them.
    expected = dataclasses.replace(
        operator_settings.Settings(),
        webhook_port=9443,
        operator_namespace=NAMESPACE,
        webhook_cert_secret=f"{RELEASE}-trainingsweep-operator-webhook-tls",
        webhook_service=f"{RELEASE}-trainingsweep-operator-webhook",
        webhook_configurations=(
            f"ValidatingWebhookConfiguration/{RELEASE}-trainingsweep-operator",
            f"MutatingWebhookConfiguration/{RELEASE}-trainingsweep-operator",
        ),
        kuberay_service_account="kuberay-system/kuberay-operator",
    )
    assert operator_settings.Settings.from_env(settings_env(render("defaults"))) == expected


# --- IRSA -----------------------------------------------------------------------------------------


def test_service_accounts_carry_their_irsa_roles() -> None:
    accounts = of_kind(render("irsa"), "ServiceAccount")
    (operator_account,) = [a for a in accounts if a["metadata"]["namespace"] == NAMESPACE]
    assert operator_account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": OPERATOR_ROLE}
    runners = [a for a in accounts if a["metadata"]["name"] == "sweep-runner"]
    assert sorted(a["metadata"]["namespace"] for a in runners) == ["team-a", "team-b"]
    for runner in runners:
        assert runner["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": RUNNER_ROLE}


def test_defaults_annotate_nothing_and_create_no_runner_account() -> None:
    (account,) = of_kind(render("defaults"), "ServiceAccount")
    assert "annotations" not in account["metadata"]


# --- webhook --------------------------------------------------------------------------------------


def test_webhook_validates_trainingsweeps_on_the_operators_path_and_port() -> None:
    docs = render("webhook-cert-manager")
    (hook,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["rules"] == [
        {
            "apiGroups": ["sweeps.dev"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["trainingsweeps"],
            "scope": "Namespaced",
        }
    ]
    assert hook["failurePolicy"] == "Fail"
    service_ref = hook["clientConfig"]["service"]
    assert service_ref["path"] == operator_settings.WEBHOOK_PATH
    (service,) = [s for s in of_kind(docs, "Service") if s["metadata"]["name"] == service_ref["name"]]
    assert service_ref["namespace"] == service["metadata"]["namespace"] == NAMESPACE
    (service_port,) = [p for p in service["spec"]["ports"] if p["port"] == service_ref["port"]]
    container = operator_container(docs)
    (container_port,) = [p for p in container["ports"] if p["name"] == service_port["targetPort"]]
    env = settings_env(docs)
    assert str(container_port["containerPort"]) == env["SWEEP_WEBHOOK_PORT"] != "0"
    # The serving certificate: cert-manager writes it to the Secret the pod mounts at the cert dir.
    (certificate,) = [c for c in of_kind(docs, "Certificate") if not c["spec"].get("isCA")]
    annotation = one(docs, "ValidatingWebhookConfiguration")["metadata"]["annotations"][
        "cert-manager.io/inject-ca-from"
    ]
    assert annotation == f"{NAMESPACE}/{certificate['metadata']['name']}"
    assert f"{service['metadata']['name']}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == env["SWEEP_WEBHOOK_CERT_DIR"]]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == certificate["spec"]["secretName"]
    assert {"selfSigned": {}} in [i["spec"] for i in of_kind(docs, "Issuer")]  # the CA chain: test_chart_security.py


def test_webhook_with_own_certificate_carries_the_ca_bundle_and_needs_no_cert_manager() -> None:
    docs = render("webhook-own-certificate")
    configuration = one(docs, "ValidatingWebhookConfiguration")
    assert "annotations" not in configuration["metadata"]
    assert (
        configuration["webhooks"][0]["clientConfig"]["caBundle"]
        == SCENARIOS["webhook-own-certificate"]["webhook"]["caBundle"]
    )
    assert not of_kind(docs, "Certificate") and not of_kind(docs, "Issuer")
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"secretName": "sweep-webhook-tls", "defaultMode": 0o440} in [v.get("secret") for v in volumes]


def test_webhook_only_sees_watched_namespaces_and_an_external_issuer_is_used_as_given() -> None:
    docs = render("everything")
    (hook,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}
    ]
    assert one(docs, "Certificate")["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "corp-ca"}
    assert not of_kind(docs, "Issuer")


def test_webhook_on_by_default_and_off_when_disabled() -> None:
    docs = render("defaults")
    assert one(docs, "ValidatingWebhookConfiguration")
    assert settings_env(docs)["SWEEP_WEBHOOK_PORT"] == "9443"
    docs = render_values({"webhook": {"enabled": False}})
    assert not of_kind(docs, "ValidatingWebhookConfiguration") and not of_kind(docs, "Certificate")
    assert settings_env(docs)["SWEEP_WEBHOOK_PORT"] == "0"


# --- metrics --------------------------------------------------------------------------------------


def test_metrics_service_and_service_monitor_target_the_metrics_port() -> None:
    docs = render("everything")
    (service,) = [s for s in of_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    (port,) = service["spec"]["ports"]
    (container_port,) = [p for p in operator_container(docs)["ports"] if p["name"] == port["targetPort"]]
    assert str(container_port["containerPort"]) == settings_env(docs)["SWEEP_METRICS_PORT"]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"


def test_metrics_off_turns_the_port_off_and_drops_the_service() -> None:
    docs = render_values({"metrics": {"enabled": False}})
    assert settings_env(docs)["SWEEP_METRICS_PORT"] == "0"
    assert not [s for s in of_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]


# --- values: schema, documentation ----------------------------------------------------------------

BAD_VALUES = {
    "negative cap": {"limits": {"maxGpusPerSweep": -1}},
    "zero cap": {"limits": {"maxWorkersPerSweep": 0}},
    "cap as text": {"limits": {"maxActiveSeconds": "3d"}},
    "unknown top-level key": {"replicaCount": 2},
    "unknown nested key": {"limits": {"maxCpusPerSweep": 4}},
    "bad failure policy": {"webhook": {"failurePolicy": "Retry"}},
    "invalid namespace name": {"watchNamespaces": ["Team_A"]},
    "HA with one replica": {"ha": {"enabled": True, "replicas": 1}},
    "not a role ARN": {"serviceAccount": {"roleArn": "sweep-operator"}},
    "root user": {"securityContext": {"runAsUser": 0}},
    "webhook without certificate": {"webhook": {"enabled": True, "certProvider": "secret"}},
    "unknown certificate provider": {"webhook": {"certProvider": "vault"}},
    "kuberay namespace with a quote": {"kuberay": {"namespace": "x' || true || '"}},
}


@pytest.mark.parametrize("values", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_values_schema_rejects_bad_values(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        _chart().render(values, name=RELEASE, namespace=NAMESPACE)
    merged = _chart().merge_values(values)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(merged, json.loads((CHART / "values.schema.json").read_text()))


def test_values_schema_is_valid_and_accepts_every_scenario() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    for values in SCENARIOS.values():
        jsonschema.validate(_chart().merge_values(values), schema)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"limits": {"defaultActiveSeconds": 999999}}, "must not exceed limits.maxActiveSeconds"),
        ({"metrics": {"port": 8080}}, "metrics.port 8080 is already used by liveness.port"),
        (
            {"webhook": {"operatorCertificate": {"validityDays": 30, "renewBeforeDays": 30}}},
            "renewBeforeDays (30) must be less than webhook.operatorCertificate.validityDays (30)",
        ),
    ],
)
def test_render_refuses_values_that_contradict_each_other(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        _chart().render(values, name=RELEASE, namespace=NAMESPACE)


def _values_keys() -> list[tuple[int, str, str]]:
    """(line number, dotted key path, documentation block above it) for every key of values.yaml."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    keys, stack = [], []
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][\w.-]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        stack = [(i, k) for i, k in stack if i < indent] + [(indent, match.group(2))]
        comments = []
        for above in reversed(lines[:number]):
            if not above.strip().startswith("#"):
                break
            comments.insert(0, above.strip())
        keys.append((number + 1, ".".join(k for _, k in stack), "\n".join(comments)))
    return keys


def test_every_values_key_has_a_doc_comment() -> None:
    keys = _values_keys()
    assert len(keys) > 50
    undocumented = [f"values.yaml:{n} {key}" for n, key, doc in keys if "# -- " not in doc]
    assert not undocumented, undocumented


def test_chart_readme_lists_every_value() -> None:
    readme = (CHART / "README.md").read_text()
    missing = [key for _, key, _ in _values_keys() if f"`{key}`" not in readme]
    assert not missing, missing


def test_chart_lints_clean_and_notes_render() -> None:
    report = helm.lint(CHART, strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], problems or report["errors"]
    notes = _chart().render(SCENARIOS["everything"], name=RELEASE, namespace=NAMESPACE)[
        "trainingsweep-operator/templates/NOTES.txt"
    ]
    assert "kubectl get trainingsweeps" in notes and "team-a" in notes


# --- IAM policies documented for IRSA (docs/iam/) -------------------------------------------------

IAM = REPO / "docs" / "iam"


def _statements(name: str) -> list[dict[str, Any]]:
    statements = json.loads((IAM / name).read_text())["Statement"]
    for statement in statements:
        for field in ("Action", "Resource"):
            if isinstance(statement.get(field), str):
                statement[field] = [statement[field]]
    return statements


def test_iam_policies_are_scoped_to_the_bucket_prefix_and_the_operator_only_reads() -> None:
    for name in ("operator-policy.json", "runner-policy.json"):
        for statement in _statements(name):
            assert statement["Effect"] == "Allow"
            assert not any(action.endswith("*") for action in statement["Action"]), (name, statement)
            for resource in statement["Resource"]:
                assert resource in ("arn:aws:s3:::my-checkpoint-bucket", "arn:aws:s3:::my-checkpoint-bucket/sweeps/*")
            if (
                statement["Resource"] == ["arn:aws:s3:::my-checkpoint-bucket"]
                and "s3:ListBucket" in statement["Action"]
            ):
                (condition,) = statement["Condition"].values()
                assert condition == {"s3:prefix": ["sweeps/*"]}
    operator_actions = {a for s in _statements("operator-policy.json") for a in s["Action"]}
    assert operator_actions == {
        "s3:ListBucket",
        "s3:GetObject",
        "s3:GetBucketVersioning",
        "s3:GetLifecycleConfiguration",
    }
    runner_actions = {a for s in _statements("runner-policy.json") for a in s["Action"]}
    assert {
        "s3:GetObject",
        "s3:PutObject",
        "s3:ListBucket",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
    } <= runner_actions


def test_irsa_trust_policies_name_the_service_accounts_the_chart_creates() -> None:
    (operator_trust,) = _statements("operator-trust-policy.json")
    (subject,) = [v for k, v in operator_trust["Condition"]["StringEquals"].items() if k.endswith(":sub")]
    (account,) = of_kind(render("defaults"), "ServiceAccount")
    assert subject == f"system:serviceaccount:{NAMESPACE}:{account['metadata']['name']}"
    (runner_trust,) = _statements("runner-trust-policy.json")
    (subjects,) = [v for k, v in runner_trust["Condition"]["StringEquals"].items() if k.endswith(":sub")]
    runners = [a for a in of_kind(render("irsa"), "ServiceAccount") if a["metadata"]["name"] == "sweep-runner"]
    assert subjects == [f"system:serviceaccount:{a['metadata']['namespace']}:sweep-runner" for a in runners]
