"""The install works on a fresh cluster (issue 28): the default chart needs no cert-manager (the operator's own
certificate, its Secret the only one it may read), cert-manager is an explicit choice, and the README's own
install commands render objects only in namespaces that exist by then, naming the KubeRay they installed."""

from __future__ import annotations

import itertools
import re
import shlex
from typing import Any

import pytest

from sweep_operator.settings import Settings
from tests.unit.test_chart import (
    NAMESPACE,
    REPO,
    of_kind,
    one,
    operator_container,
    render_values,
    settings_env,
)

FULLNAME = "sweeps-trainingsweep-operator"
SECRET = f"{FULLNAME}-webhook-tls"
CERT_MANAGER_KINDS = {"Issuer", "ClusterIssuer", "Certificate"}


def test_the_default_install_renders_no_cert_manager_kind_and_the_operator_keeps_the_certificate() -> None:
    docs = render_values({})
    assert not [d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]
    secret = one(docs, "Secret")
    assert secret["metadata"] == {**secret["metadata"], "name": SECRET, "namespace": NAMESPACE}
    assert "data" not in secret  # the operator writes it; helm upgrades never touch it
    configuration = one(docs, "ValidatingWebhookConfiguration")
    assert "annotations" not in configuration["metadata"]
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]  # injected by the operator
    settings = Settings.from_env(settings_env(docs))
    assert (settings.webhook_cert_secret, settings.operator_namespace) == (SECRET, NAMESPACE)
    mutating = one(docs, "MutatingWebhookConfiguration")
    assert "caBundle" not in mutating["webhooks"][0]["clientConfig"]
    assert settings.webhook_configurations == (
        f"ValidatingWebhookConfiguration/{configuration['metadata']['name']}",
        f"MutatingWebhookConfiguration/{mutating['metadata']['name']}",
    )
    assert settings.webhook_service == f"{FULLNAME}-webhook"
    # The pair lands in an in-memory emptyDir the operator writes (the root filesystem stays read-only).
    container = operator_container(docs)
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == settings.webhook_cert_dir]
    assert mount["readOnly"] is False
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"


def _rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for role in of_kind(docs, "Role") + of_kind(docs, "ClusterRole") for rule in role["rules"]]


@pytest.mark.parametrize("values", [{}, {"watchNamespaces": ["team-a"]}, {"ha": {"enabled": True}}])
def test_the_operator_reads_the_webhook_secret_alone_and_kuberays_account_alone(values: dict[str, Any]) -> None:
    docs = render_values(values)
    secret_rules = [r for r in _rules(docs) if "secrets" in r["resources"]]
    assert secret_rules == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "update"], "resourceNames": [SECRET]}
    ]
    (role,) = [r for r in of_kind(docs, "Role") if r["rules"] == secret_rules]
    assert role["metadata"]["namespace"] == NAMESPACE
    account_rules = [r for r in _rules(docs) if "serviceaccounts" in r["resources"]]
    assert account_rules == [
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get"], "resourceNames": ["kuberay-operator"]}
    ]
    (hooks,) = [r for r in _rules(docs) if "validatingwebhookconfigurations" in r["resources"]]
    assert hooks["resourceNames"] == [FULLNAME] and hooks["verbs"] == ["get", "patch"]
    assert hooks["resources"] == ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"]


@pytest.mark.parametrize("provider", ["cert-manager", "secret"])
def test_cert_manager_and_your_own_secret_are_explicit_choices(provider: str) -> None:
    values: dict[str, Any] = {"webhook": {"certProvider": provider}}
    if provider == "secret":
        values["webhook"] |= {"tls": {"secretName": "mine"}, "caBundle": "TUlORQ=="}
    docs = render_values(values)
    kinds = {d["kind"] for d in docs}
    assert (CERT_MANAGER_KINDS & kinds == {"Issuer", "Certificate"}) is (provider == "cert-manager")
    assert not of_kind(docs, "Secret") and not [r for r in _rules(docs) if "secrets" in r["resources"]]
    assert not [r for r in _rules(docs) if "validatingwebhookconfigurations" in r["resources"]]
    assert Settings.from_env(settings_env(docs)).webhook_cert_secret == ""  # files are mounted
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert next(v for v in pod["volumes"] if v["name"] == "webhook-tls")["secret"]["secretName"] in (SECRET, "mine")


def test_auto_takes_the_operators_certificate_where_no_api_versions_are_known() -> None:
    """Our renderer, `helm template` and Argo CD know no cluster APIs; a real install with cert-manager would."""
    docs = render_values({"webhook": {"certProvider": "auto"}})
    assert not CERT_MANAGER_KINDS & {d["kind"] for d in docs}
    assert one(docs, "Secret")["metadata"]["name"] == SECRET


# --- the README's own install commands -----------------------------------------------------------------------------


def _install_section() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Installing on EKS")
    return readme[start : readme.index("\n## ", start + 1)]


def _commands() -> list[list[str]]:
    """Each shell command of the install section's code blocks, placeholders filled as a user would."""
    blocks = re.findall(r"```sh\n(.*?)```", _install_section(), flags=re.S)
    text = "\n".join(blocks).replace("\\\n", " ")
    text = text.replace("<account>", "123456789012").replace("<registry>", "123456789012.dkr.ecr.us-west-2")
    return [shlex.split(line.replace("{", "'{").replace("}", "}'")) for line in text.splitlines() if line.strip()]


def _set_values(arguments: list[str]) -> dict[str, Any]:
    """`--set a.b=c` as Helm parses it: dotted paths, `{x,y}` lists, true/false and integers typed."""
    values: dict[str, Any] = {}
    for flag, assignment in itertools.pairwise(arguments):
        if flag != "--set":
            continue
        path, _, raw = assignment.partition("=")
        value: Any = raw
        if raw.startswith("{") and raw.endswith("}"):
            value = [item for item in raw[1:-1].split(",") if item]
        elif raw in ("true", "false"):
            value = raw == "true"
        elif raw.isdigit():
            value = int(raw)
        *parents, leaf = path.split(".")
        node = values
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return values


def _flag(arguments: list[str], *names: str) -> str | None:
    for flag, value in itertools.pairwise(arguments):
        if flag in names:
            return value
    return None


def test_the_readmes_install_renders_only_into_namespaces_that_exist_and_names_its_kuberay() -> None:
    commands = _commands()
    (chart,) = [c for c in commands if c[:2] == ["helm", "install"] and "charts/trainingsweep-operator" in c]
    (kuberay,) = [c for c in commands if c[:2] == ["helm", "install"] and "kuberay/kuberay-operator" in c]
    release, namespace = chart[2], _flag(chart, "-n", "--namespace")
    assert "--create-namespace" in chart and namespace == NAMESPACE and release == "sweeps"
    created = {c[3] for c in commands if c[:3] == ["kubectl", "create", "namespace"]}
    created |= {namespace}
    values = _set_values(chart)
    # KubeRay is installed where the chart is told it runs.
    kuberay_namespace = _flag(kuberay, "-n", "--namespace")
    assert "--create-namespace" in kuberay and kuberay_namespace == values["kuberay"]["namespace"]
    assert values["image"]["repository"].endswith("/trainingsweep-operator")
    docs = render_values(values)
    namespaced = [d for d in docs if "namespace" in d["metadata"]]
    assert {d["metadata"]["namespace"] for d in namespaced} <= created, {
        (d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]) for d in namespaced
    }
    runners = [d for d in of_kind(docs, "ServiceAccount") if d["metadata"]["name"] == "sweep-runner"]
    assert [r["metadata"]["namespace"] for r in runners] == ["ml-team"]
    # The operator checks for the very ServiceAccount the guard policy trusts.
    settings = Settings.from_env(settings_env(docs))
    assert settings.kuberay_service_account == f"{kuberay_namespace}/kuberay-operator"
    assert not [d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]


def test_the_readme_builds_the_images_it_installs_and_names_the_eks_security_group_rule() -> None:
    commands = _commands()
    built = {_flag(c, "-t") for c in commands if c[:2] == ["docker", "build"]}
    pushed = {c[2] for c in commands if c[:2] == ["docker", "push"]}
    assert {"docker/Dockerfile.operator", "docker/Dockerfile.train"} <= {_flag(c, "-f") for c in commands}
    assert built == pushed and len(built) == 2
    section = _install_section()
    (rule,) = [c for c in commands if c[:3] == ["aws", "ec2", "authorize-security-group-ingress"]]
    assert "--source-group" in rule and "cluster security group" in section
    port = settings_env(render_values({}))["SWEEP_WEBHOOK_PORT"]
    assert _flag(rule, "--port") == port
