"""The chart's admission objects in the emulator (issue 25): its guard ValidatingAdmissionPolicy and binding, its
webhook configurations and certificate Secret, and one token per user the policy tells apart (the operator, KubeRay,
a tenant, a guard admin), so kubectl meets the refusals EKS gives."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep_operator.settings import Settings

from . import rbac
from .admission import UserInfo, service_account_user

Obj = dict[str, Any]

RELEASE, RELEASE_NAMESPACE = "sweeps", "sweeps-system"
KUBERAY_NAMESPACE, KUBERAY_SERVICE_ACCOUNT = "kuberay-system", "kuberay-operator"
GUARD_ADMINS = "sweeps:guard-admins"  # the chart's default guardPolicy.allowedGroups
# The sandbox's default context: the platform team (a cluster administrator in the guard's allowed groups)
SANDBOX_ADMIN = UserInfo("sandbox", ("system:masters", GUARD_ADMINS, "system:authenticated"))
ADMISSION_KINDS = (
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
)
CHART_ENV = "SWEEP_SANDBOX_CHART"  # where the chart is, when not beside this package in a checkout


def chart_path() -> Path | None:
    configured = os.environ.get(CHART_ENV)
    candidates = [Path(configured)] if configured else []
    candidates.append(Path(__file__).resolve().parents[2] / "charts" / "trainingsweep-operator")
    return next((path for path in candidates if (path / "Chart.yaml").is_file()), None)


def render(values: Mapping[str, Any] | None = None) -> list[Obj]:
    """The chart's documents as `helm template sweeps -n sweeps-system` renders them (helm-python-sdk)."""
    import helm_python as helm
    import yaml

    path = chart_path()
    if path is None:
        raise FileNotFoundError(f"the trainingsweep-operator chart is not found (set {CHART_ENV})")
    with helm.Chart.load(str(path)) as chart:
        manifests = chart.render(dict(values or {}), name=RELEASE, namespace=RELEASE_NAMESPACE)
    return [
        doc
        for name, text in sorted(manifests.items())
        if not name.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


@dataclass(frozen=True)
class Identity:
    context: str  # the kubeconfig context (and user entry) that carries the token
    token: str
    user: UserInfo


def identities(docs: list[Obj]) -> dict[str, Identity]:
    """The users the guard policy tells apart, named after the chart's operator ServiceAccount."""
    (operator_account,) = [
        d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"].get("namespace") == RELEASE_NAMESPACE
    ]
    users = {
        "operator": service_account_user(RELEASE_NAMESPACE, operator_account["metadata"]["name"]),
        "kuberay": service_account_user(KUBERAY_NAMESPACE, KUBERAY_SERVICE_ACCOUNT),
        "tenant": UserInfo("alice@team-a", ("team-a:developers", "system:authenticated")),
        "guard-admin": UserInfo("sre@platform", (GUARD_ADMINS, "system:authenticated")),
    }
    return {context: Identity(context, f"sandbox-{context}-token", user) for context, user in users.items()}


def operator_settings(docs: list[Obj], settings: Settings, webhook_port: int, cert_dir: Path) -> Settings:
    """`settings` with the chart's webhook wiring (its ConfigMap: Secret, Service, configurations to inject the CA
    into), served on `webhook_port` with the pair written under `cert_dir`."""
    import dataclasses

    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and "SWEEP_WEBHOOK_SERVICE" in (d.get("data") or {})]
    chart = Settings.from_env(config["data"])
    return dataclasses.replace(
        settings,
        webhook_port=webhook_port,
        webhook_cert_dir=str(cert_dir),
        webhook_cert_check_seconds=1.0,
        operator_namespace=chart.operator_namespace,
        webhook_cert_secret=chart.webhook_cert_secret,
        webhook_service=chart.webhook_service,
        webhook_configurations=chart.webhook_configurations,
        kuberay_service_account=chart.kuberay_service_account,
    )


# The ports free_port() chooses from: below the kernel's ephemeral range, which port 0 binds and outgoing connections
# draw from, so nothing the kernel hands out takes the chosen port before its server binds it. SWEEP_SANDBOX_PORTS
# ("low-high") narrows it: the test suite gives each parallel worker a block of its own.
PORTS_ENV = "SWEEP_SANDBOX_PORTS"
DEFAULT_PORTS = "20000-32767"
_handed_out: set[int] = set()
_handing_out = threading.Lock()


def free_port() -> int:
    """A loopback port for a server that takes its port as a setting rather than binding port 0 itself (kopf's
    admission server binds the port it is given, with SO_REUSEPORT). Never the same port twice in one process."""
    low, high = (int(part) for part in os.environ.get(PORTS_ENV, DEFAULT_PORTS).split("-"))
    count = high - low + 1
    first = int.from_bytes(os.urandom(2), "big") % count  # two processes sharing a block rarely start together
    with _handing_out:
        for offset in range(count):
            port = low + (first + offset) % count
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:  # in use (or lingering): the next one
                    continue
            _handed_out.add(port)
            return port
    raise OSError(f"no free loopback port in {low}-{high} ({PORTS_ENV})")


def rbac_objects(docs: list[Obj], tenant_namespaces: tuple[str, ...], tenant_role: str = "edit") -> list[Obj]:
    """Who may do what, as on a cluster shared by teams: the chart's Roles, ClusterRoles and bindings (the operator
    holds exactly what the chart grants it; its roles aggregated into the standard ones reach the tenants), KubeRay's
    chart's roles for its operator and for the standard ones, the guard admins (the platform team) bound to
    cluster-admin, and the tenant's group bound to `tenant_role` (the standard `edit`) in each of
    `tenant_namespaces`. The sandbox's default user is in system:masters, which RBAC never stops."""
    chart = [d for d in docs if d["apiVersion"].startswith(f"{rbac.RBAC_GROUP}/")]
    tenant = identities(docs)["tenant"].user
    (team,) = [g for g in tenant.groups if g != rbac.AUTHENTICATED]
    people = [
        rbac.binding("sweeps-guard-admins", "cluster-admin", [rbac.subject("Group", GUARD_ADMINS)]),
        *(
            rbac.binding(f"{team.replace(':', '-')}-{tenant_role}", tenant_role, [rbac.subject("Group", team)], ns)
            for ns in tenant_namespaces
        ),
    ]
    return [*chart, *rbac.kuberay_operator_rbac(KUBERAY_NAMESPACE, KUBERAY_SERVICE_ACCOUNT), *people]


def create_rbac(server: Any, objects: list[Obj]) -> None:
    """Create RBAC objects as the emulator's administrator, in the namespaces they name (made when missing)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    core: Any = k8s.CoreV1Api(server.api_client())
    for namespace in dict.fromkeys(d["metadata"]["namespace"] for d in objects if d["metadata"].get("namespace")):
        try:
            core.create_namespace({"metadata": {"name": namespace}})
        except ApiException as exc:
            if exc.status != 409:
                raise
    api: Any = k8s.RbacAuthorizationV1Api(server.api_client())
    creators = {
        "ClusterRole": lambda d: api.create_cluster_role(d),
        "ClusterRoleBinding": lambda d: api.create_cluster_role_binding(d),
        "Role": lambda d: api.create_namespaced_role(d["metadata"]["namespace"], d),
        "RoleBinding": lambda d: api.create_namespaced_role_binding(d["metadata"]["namespace"], d),
    }
    for kind in creators:
        for doc in objects:
            if doc["kind"] == kind:
                creators[kind](doc)


def install(
    server: Any,
    docs: list[Obj],
    webhook_port: int | None,
    tenant_namespaces: tuple[str, ...] = ("default",),
    tenant_role: str = "edit",
) -> dict[str, Identity]:
    """Register the users, create the namespaces, KubeRay's ServiceAccount, the chart's certificate Secret, its
    admission objects and who may do what (rbac_objects: the tenant has `tenant_role` in `tenant_namespaces`), all
    as the emulator's administrator, and route the webhook Service to `webhook_port` on 127.0.0.1 (the Service's
    endpoints: the operator's webhook server). Returns the identities."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    people = identities(docs)
    for identity in people.values():
        server.emulator.admission.users[identity.token] = identity.user
    api = server.api_client()
    # Any: raw JSON documents in (the typed models would re-spell the chart's YAML)
    core: Any = k8s.CoreV1Api(api)
    admission: Any = k8s.AdmissionregistrationV1Api(api)
    for namespace in dict.fromkeys((RELEASE_NAMESPACE, KUBERAY_NAMESPACE, *tenant_namespaces)):
        try:
            core.create_namespace({"metadata": {"name": namespace}})
        except ApiException as exc:
            if exc.status != 409:
                raise
    core.create_namespaced_service_account(KUBERAY_NAMESPACE, {"metadata": {"name": KUBERAY_SERVICE_ACCOUNT}})
    creators = {
        "ValidatingAdmissionPolicy": admission.create_validating_admission_policy,
        "ValidatingAdmissionPolicyBinding": admission.create_validating_admission_policy_binding,
        "ValidatingWebhookConfiguration": admission.create_validating_webhook_configuration,
        "MutatingWebhookConfiguration": admission.create_mutating_webhook_configuration,
    }
    for doc in docs:
        if doc["kind"] == "Secret" and doc["metadata"].get("namespace") == RELEASE_NAMESPACE:
            core.create_namespaced_secret(RELEASE_NAMESPACE, doc)
    if webhook_port:
        route_webhook_service(server, docs, webhook_port)
    for doc in docs:
        if doc["kind"] in creators:
            creators[doc["kind"]](doc)
    create_rbac(server, rbac_objects(docs, tenant_namespaces, tenant_role))
    return people


def route_webhook_service(server: Any, docs: list[Obj], port: int) -> None:
    """The webhook Service's endpoint: the operator's admission server on 127.0.0.1:`port`."""
    for doc in docs:
        if doc["kind"] == "Service" and doc["metadata"]["name"].endswith("-webhook"):
            server.emulator.admission.services[(RELEASE_NAMESPACE, doc["metadata"]["name"])] = ("127.0.0.1", port)


def wait_for_webhook(server: Any, timeout: float = 20.0) -> None:
    """Until every webhook configuration carries the operator's CA (it injects it at startup) and its port answers."""
    deadline = time.monotonic() + timeout

    def ready() -> bool:
        def stored() -> list[Obj]:
            emulator = server.emulator
            return [
                *emulator.admission_chain.objects("validatingwebhookconfigurations"),
                *emulator.admission_chain.objects("mutatingwebhookconfigurations"),
            ]

        hooks = [w for c in server.call(stored) for w in c.get("webhooks") or ()]
        if not all((w.get("clientConfig") or {}).get("caBundle") for w in hooks):
            return False
        for host, port in server.emulator.admission.services.values():
            try:
                socket.create_connection((host, port), timeout=1).close()
            except OSError:
                return False
        return True

    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError("the operator's webhook did not come up (CA injected, port answering)")
        time.sleep(0.1)
