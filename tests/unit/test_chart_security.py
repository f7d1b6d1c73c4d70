"""Chart hardening for many teams on one cluster (issue 15): per-namespace runner roles, the tenancy allowlists in
the ConfigMap, the webhook's cert-manager CA chain, readiness beside liveness, the operator's NetworkPolicy and
an image pinned by digest."""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest

from sweep_operator.settings import Settings
from tests.unit.test_chart import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    _chart,
    of_kind,
    one,
    operator_container,
    render_values,
    settings_env,
)

ROLE = "arn:aws:iam::123456789012:role/sweep-runner"
ROLE_A = "arn:aws:iam::123456789012:role/sweep-runner-team-a"
ROLE_B = "arn:aws:iam::123456789012:role/sweep-runner-team-b"
DIGEST = "sha256:" + "ab" * 32


def runners(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        a["metadata"]["namespace"]: a
        for a in of_kind(docs, "ServiceAccount")
        if a["metadata"]["name"] == "sweep-runner"
    }


def test_each_namespace_gets_a_runner_account_with_its_own_role() -> None:
    docs = render_values(
        {
            "watchNamespaces": ["team-a", "team-b", "team-c"],
            "runner": {
                "serviceAccount": {
                    "create": True,
                    "roleArn": ROLE,
                    "annotations": {"owner": "platform"},
                    "perNamespace": {
                        "team-a": {"roleArn": ROLE_A},
                        "team-b": {"roleArn": ROLE_B, "annotations": {"owner": "team-b"}},
                    },
                }
            },
        }
    )
    found = runners(docs)
    assert sorted(found) == ["team-a", "team-b", "team-c"]
    assert found["team-a"]["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": ROLE_A, "owner": "platform"}
    assert found["team-b"]["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": ROLE_B, "owner": "team-b"}
    assert found["team-c"]["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": ROLE, "owner": "platform"}


def test_per_namespace_roles_alone_name_the_namespaces() -> None:
    docs = render_values(
        {
            "runner": {
                "serviceAccount": {
                    "create": True,
                    "perNamespace": {"team-b": {"roleArn": ROLE_B}, "team-a": {"roleArn": ROLE_A}},
                }
            }
        }
    )
    found = runners(docs)
    assert sorted(found) == ["team-a", "team-b"]
    assert found["team-a"]["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": ROLE_A}


def test_tenancy_allowlists_reach_the_operator_through_the_configmap() -> None:
    docs = render_values(
        {
            "tenancy": {
                "allowedServiceAccounts": ["*/sweep-runner", "team-a/team-a-runner"],
                "allowedEndpointHosts": ["*.amazonaws.com", "minio.storage.svc:9000"],
            },
            "limits": {"maxVerificationTimeoutSeconds": 600},
            "verification": {"workers": 2},
            "s3": {"clientCacheSize": 8},
        }
    )
    settings = Settings.from_env(settings_env(docs))
    assert settings.tenancy.allowed_service_accounts == ("*/sweep-runner", "team-a/team-a-runner")
    assert settings.tenancy.allowed_endpoint_hosts == ("*.amazonaws.com", "minio.storage.svc:9000")
    assert settings.limits.max_verification_timeout_seconds == 600
    assert (settings.verification_workers, settings.s3_client_cache_size) == (2, 8)


@pytest.mark.parametrize(
    "values",
    [
        {"tenancy": {"allowedServiceAccounts": ["sweep-runner"]}},  # no namespace part
        {"tenancy": {"allowedEndpointHosts": ["https://minio:9000"]}},  # a URL, not a host
        {"image": {"digest": "sha256:short"}},
        {"runner": {"serviceAccount": {"perNamespace": {"Team_A": {"roleArn": ROLE_A}}}}},
        {"runner": {"serviceAccount": {"perNamespace": {"team-a": {"roleArn": "not-an-arn"}}}}},
        {"guardPolicy": {"validationActions": ["Block"]}},
        {"guardPolicy": {"allowedGroups": ["x' || true || '"]}},  # would break out of the CEL string
    ],
)
def test_bad_security_values_are_refused(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        _chart().render(values, name=RELEASE, namespace=NAMESPACE)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_chart().merge_values(values), json.loads((CHART / "values.schema.json").read_text()))


def test_cert_managers_webhook_certificate_is_signed_by_the_charts_ca_and_renewed_without_a_restart() -> None:
    docs = render_values({"webhook": {"certProvider": "cert-manager"}})
    issuers = {i["metadata"]["name"]: i["spec"] for i in of_kind(docs, "Issuer")}
    certificates = {c["metadata"]["name"]: c["spec"] for c in of_kind(docs, "Certificate")}
    (ca_name,) = [n for n, c in certificates.items() if c.get("isCA")]
    ca = certificates[ca_name]
    assert issuers[ca["issuerRef"]["name"]] == {"selfSigned": {}}
    (ca_issuer,) = [n for n, spec in issuers.items() if spec.get("ca", {}).get("secretName") == ca["secretName"]]
    (serving_name,) = [n for n, c in certificates.items() if not c.get("isCA")]
    serving = certificates[serving_name]
    assert serving["issuerRef"] == {"kind": "Issuer", "name": ca_issuer}
    assert serving["privateKey"]["rotationPolicy"] == "Always"
    assert (serving["duration"], serving["renewBefore"], ca["duration"]) == ("2160h", "360h", "43800h")
    webhook = one(docs, "ValidatingWebhookConfiguration")
    assert webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{serving_name}"
    assert settings_env(docs)["SWEEP_WEBHOOK_CERT_CHECK_SECONDS"] == "10"
    assert Settings.from_env(settings_env(docs)).webhook_cert_check_seconds == 10.0


def test_readiness_probe_beside_liveness() -> None:
    container = operator_container(render_values({}))
    assert (
        container["readinessProbe"]["httpGet"]
        == container["livenessProbe"]["httpGet"]
        == {"path": "/healthz", "port": "liveness"}
    )
    assert container["readinessProbe"]["periodSeconds"] == 10


def test_network_policy_admits_only_the_webhook_and_metrics_ports() -> None:
    docs = render_values({})
    policy = one([d for d in docs if not d["metadata"]["name"].endswith("-ray")], "NetworkPolicy")
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ports == ["webhook", "metrics"]
    named = {p["name"] for p in operator_container(docs)["ports"]}
    assert set(ports) <= named and "liveness" not in ports
    scoped = render_values(
        {"networkPolicy": {"metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]}}
    )
    (_, metrics_rule) = one(
        [d for d in scoped if d["metadata"]["name"] == policy["metadata"]["name"]], "NetworkPolicy"
    )["spec"]["ingress"]
    assert metrics_rule["from"] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    closed_docs = render_values(
        {"webhook": {"enabled": False}, "metrics": {"enabled": False}, "networkPolicy": {"rayDashboard": False}}
    )
    closed = one(closed_docs, "NetworkPolicy")
    assert closed["spec"]["ingress"] == []


# On EKS the control plane calls webhooks from its network interfaces in the cluster's subnets (the chart README).
EKS_CONTROL_PLANE = [{"ipBlock": {"cidr": "10.0.0.0/28"}}, {"ipBlock": {"cidr": "10.0.0.16/28"}}]
MALFORMED_PEERS = {
    "no prefix length": [{"ipBlock": {"cidr": "10.0.0.0"}}],
    "no cidr": [{"ipBlock": {"except": ["10.0.0.0/28"]}}],
    "a misspelt key": [{"ipblock": {"cidr": "10.0.0.0/16"}}],
    "an ipBlock with a selector": [{"ipBlock": {"cidr": "10.0.0.0/16"}, "podSelector": {}}],
    "an empty peer": [{}],
    "a bad selector operator": [{"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Equals"}]}}],
}


def test_the_webhook_ingress_is_open_by_default_narrows_to_the_given_peers_and_refuses_malformed_ones() -> None:
    """Open by default, so every install's API server reaches the webhook (a wrong range refuses every sweep under
    failurePolicy Fail); narrowed by networkPolicy.webhookFrom, whose entries are checked before anything renders."""

    def webhook_rule(values: dict[str, Any]) -> dict[str, Any]:
        docs = render_values(values)
        policy = one([d for d in docs if not d["metadata"]["name"].endswith("-ray")], "NetworkPolicy")
        (rule,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "webhook"]
        kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)
        return rule

    assert "from" not in webhook_rule({})
    narrowed = webhook_rule({"networkPolicy": {"webhookFrom": EKS_CONTROL_PLANE}})
    assert narrowed["from"] == EKS_CONTROL_PLANE
    mixed = [
        {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.64.0/18"]}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}, "podSelector": {}},
        {"ipBlock": {"cidr": "fd00:ec2::/56"}},
    ]
    assert webhook_rule({"networkPolicy": {"webhookFrom": mixed}})["from"] == mixed
    schema = json.loads((CHART / "values.schema.json").read_text())
    let_through = []
    for name, peers in MALFORMED_PEERS.items():
        values = {"networkPolicy": {"webhookFrom": peers}}
        try:
            jsonschema.validate(_chart().merge_values(values), schema)
        except jsonschema.ValidationError:
            with pytest.raises(helm.HelmValuesError):  # and Helm refuses to render it
                _chart().render(values, name=RELEASE, namespace=NAMESPACE)
        else:
            let_through.append(name)
    assert not let_through


def test_the_operator_may_reach_the_ray_heads_dashboard_port_in_each_sweep_namespace() -> None:
    """The graceful stop (issue 26) asks each RayJob's head to stop its job on the dashboard port (8265), as KubeRay's
    StopJob does: a policy in each sweep namespace admits the operator's pods there (beside KubeRay and the run's own
    pods, tests/unit/test_chart_network_policies.py); the operator's own egress stays open (its policy has no Egress
    type)."""
    docs = render_values({"watchNamespaces": ["team-a", "team-b"]})
    policies = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-ray")]
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]
    operator = next(d for d in docs if d["kind"] == "NetworkPolicy" and d not in policies)
    assert "Egress" not in operator["spec"]["policyTypes"]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for policy in policies:
        assert {"key": "sweeps.dev/sweep", "operator": "Exists"} in policy["spec"]["podSelector"]["matchExpressions"]
        (rule,) = [r for r in policy["spec"]["ingress"] if r.get("ports") == [{"port": 8265, "protocol": "TCP"}]]
        (peer,) = [p for p in rule["from"] if "podSelector" in p]
        assert peer["podSelector"]["matchLabels"].items() <= pod_labels.items()
        assert peer["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": operator["metadata"]["namespace"]
        }
        kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)
    off = render_values({"watchNamespaces": ["team-a"], "networkPolicy": {"rayDashboard": False}})
    assert not [d for d in off if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-ray")]


def test_image_digest_pins_the_image() -> None:
    assert operator_container(render_values({}))["image"] == "ghcr.io/trainingsweep/trainingsweep-operator:0.1.0"
    pinned = operator_container(render_values({"image": {"digest": DIGEST, "tag": "ignored"}}))
    assert pinned["image"] == f"ghcr.io/trainingsweep/trainingsweep-operator@{DIGEST}"
