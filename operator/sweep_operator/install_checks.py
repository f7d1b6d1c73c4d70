"""What the operator checks and sets up about its install at startup: KubeRay's identity, which the guard policy trusts,
and the webhook's own certificate."""

from __future__ import annotations

import datetime
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from .settings import Settings

log = logging.getLogger(__name__)

KUBERAY_IDENTITY_METRIC = "trainingsweep_kuberay_identity_missing"


@dataclass(frozen=True)
class IdentityCheck:
    ok: bool
    message: str


def judge_kuberay_identity(service_account: str, exists: bool | None, error: str = "") -> IdentityCheck:
    """`exists`: the ServiceAccount `namespace/name` was found (True), is absent (False), could not be read (None)."""
    if not service_account:
        return IdentityCheck(True, "KubeRay's identity is not checked (SWEEP_KUBERAY_SERVICE_ACCOUNT is empty)")
    namespace, _, name = service_account.partition("/")
    user = f"system:serviceaccount:{namespace}:{name}"
    if exists:
        return IdentityCheck(True, f"KubeRay's ServiceAccount {service_account} exists; the guard policy trusts {user}")
    consequence = (
        f"the guard policy trusts {user} only, so a KubeRay running as another identity cannot create this "
        f"operator's RayClusters with their guard annotation nor write their status. Set the chart's "
        f"kuberay.namespace and kuberay.serviceAccountName to where KubeRay runs (its `helm install -n`; "
        f"installed without -n it is default/kuberay-operator)"
    )
    if exists is None:
        return IdentityCheck(False, f"cannot check KubeRay's ServiceAccount {service_account} ({error}); {consequence}")
    return IdentityCheck(False, f"KubeRay's ServiceAccount {service_account} does not exist: {consequence}")


# One gauge per registry: kopf retries a failed startup handler, and a registry refuses a second of the same name.
_GAUGES: weakref.WeakKeyDictionary[CollectorRegistry, Gauge] = weakref.WeakKeyDictionary()


def _missing_gauge(registry: CollectorRegistry) -> Gauge:
    if registry not in _GAUGES:
        _GAUGES[registry] = Gauge(
            KUBERAY_IDENTITY_METRIC,
            "1 when the KubeRay ServiceAccount the guard policy trusts (chart values kuberay.*) was not found at startup",
            registry=registry,
        )
    return _GAUGES[registry]


def check_kuberay_identity(
    settings: Settings, read_service_account: Callable[[str, str], bool], registry: CollectorRegistry | None
) -> IdentityCheck:
    """Look the ServiceAccount up (`read_service_account` answers whether it exists, raising when it cannot tell)
    and say so loudly when it is missing: Helm's `lookup` cannot (nothing under `helm template` or Argo CD)."""
    exists: bool | None
    error = ""
    if settings.kuberay_service_account:
        namespace, _, name = settings.kuberay_service_account.partition("/")
        try:
            exists = read_service_account(namespace, name)
        except Exception as exc:  # a 403 or an unreachable API server: reported, never fatal
            exists, error = None, f"{type(exc).__name__}: {exc}"
    else:
        exists = True
    result = judge_kuberay_identity(settings.kuberay_service_account, exists, error)
    if result.ok:
        log.info("%s", result.message)
    else:
        log.error("%s", result.message)
    if registry is not None and settings.kuberay_service_account:
        _missing_gauge(registry).set(0 if result.ok else 1)
    return result


def kube_service_account_reader(api_client: Any) -> Callable[[str, str], bool]:
    def read(namespace: str, name: str) -> bool:
        from kubernetes import client as k8s
        from kubernetes.client.exceptions import ApiException

        try:
            k8s.CoreV1Api(api_client).read_namespaced_service_account(name, namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    return read


def start_webhook_certificate(settings: Settings, api_client: Any) -> threading.Event | None:
    """webhook.certProvider=operator: bring the shared Secret and the files up to date now (kopf's admission server
    starts after the startup handlers and reads the files), then keep them so in a thread; the Event stops it."""
    if not (settings.webhook_port and settings.webhook_cert_secret):
        return None
    from .webhook_certs import CertPolicy, KubeCertStore, WebhookCertificates, parse_webhook_configurations

    policy = CertPolicy.for_service(
        settings.webhook_service,
        settings.operator_namespace,
        validity=datetime.timedelta(days=settings.webhook_cert_validity_days),
        renew_before=datetime.timedelta(days=settings.webhook_cert_renew_before_days),
    )
    certificates = WebhookCertificates(
        KubeCertStore(api_client, settings.operator_namespace, settings.webhook_cert_secret),
        policy,
        settings.webhook_cert_dir,
        parse_webhook_configurations(settings.webhook_configurations),
    )
    result = certificates.sync()
    log.info(
        "webhook certificate from Secret %s/%s: %s%s",
        settings.operator_namespace,
        settings.webhook_cert_secret,
        result.decision.reason,
        f"; CA injected into {', '.join(result.injected)}" if result.injected else "",
    )
    stop = threading.Event()
    threading.Thread(
        target=certificates.run,
        args=(stop, settings.webhook_cert_sync_seconds),
        name="webhook-certificate",
        daemon=True,
    ).start()
    return stop


def run_startup_checks(settings: Settings, api_client: Any, registry: CollectorRegistry | None) -> None:
    """The startup hook's body (handlers.py): the certificate first, since the webhook cannot serve without it."""
    start_webhook_certificate(settings, api_client)
    if settings.kuberay_service_account:
        check_kuberay_identity(settings, kube_service_account_reader(api_client), registry)
