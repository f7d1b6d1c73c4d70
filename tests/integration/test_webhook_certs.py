"""The operator-managed webhook certificate end to end (issue 28): a TLS client that trusts only the Secret's CA
bundle completes a handshake with the generated pair under the webhook Service's name, and the pair is kept in
the one shared Secret through the real Kubernetes client (on the API emulator, 127.0.0.1)."""

from __future__ import annotations

import base64
import datetime
import json
import logging
import re
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes import client as k8s

from sweep_operator.kube import api_client_for_url
from sweep_operator.settings import Settings
from sweep_operator.webhook_certs import (
    CA_BUNDLE,
    TLS_CERT,
    TLS_KEY,
    CertPolicy,
    KubeCertStore,
    Renewal,
    WebhookCertificates,
    issue,
)
from sweep_sandbox.emulator import EmulatorServer
from sweep_sandbox.operator_thread import OperatorThread
from tests.support.ports import free_port
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

NAMESPACE, SECRET = "sweeps-system", "sweeps-trainingsweep-operator-webhook-tls"
POLICY = CertPolicy.for_service("sweeps-trainingsweep-operator-webhook", NAMESPACE)
NOW = datetime.datetime.now(datetime.UTC)


def _handshake(cert_dir: Path, ca_bundle: bytes, server_name: str) -> dict[str, object]:
    """Serve one TLS connection on 127.0.0.1 with the files in `cert_dir`; a verifying client connects as the API
    server does (trusting the caBundle, checking the Service's DNS name). Returns the peer certificate it saw."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert_dir / TLS_CERT, cert_dir / TLS_KEY)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            connection, _ = listener.accept()
            with server_context.wrap_socket(connection, server_side=True) as tls:
                tls.recv(1)
        except (OSError, ssl.SSLError) as exc:
            failures.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_context = ssl.create_default_context(cadata=ca_bundle.decode())
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client_context.wrap_socket(raw, server_hostname=server_name) as tls,
        ):
            peer = tls.getpeercert()
            tls.sendall(b"x")
    finally:
        thread.join(timeout=10)
        listener.close()
    assert not failures, failures
    assert peer is not None
    return peer


class FilesOnly:
    """A store without Kubernetes: the handshake needs only the issued pair."""

    def __init__(self) -> None:
        self.data = issue({}, Renewal.CA, NOW, POLICY)

    def read(self) -> tuple[dict[str, bytes], str]:
        return self.data, "1"

    def write(self, data: dict[str, bytes], resource_version: str) -> bool:
        raise AssertionError("a fresh pair needs no renewal")

    def inject(self, kind: str, name: str, ca_bundle: bytes) -> bool:
        return False


@pytest.mark.parametrize("server_name", POLICY.dns_names)
def test_a_client_trusting_the_ca_bundle_completes_a_handshake_with_the_generated_pair(
    tmp_path: Path, server_name: str
) -> None:
    store = FilesOnly()
    WebhookCertificates(store, POLICY, str(tmp_path), []).sync()
    peer = _handshake(tmp_path, store.data[CA_BUNDLE], server_name)
    assert ("DNS", server_name) in peer["subjectAltName"]  # type: ignore[operator]  # getpeercert's tuple of pairs


def test_the_handshake_fails_for_another_name_and_another_ca(tmp_path: Path) -> None:
    store = FilesOnly()
    WebhookCertificates(store, POLICY, str(tmp_path), []).sync()
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(tmp_path, store.data[CA_BUNDLE], "other-webhook.sweeps-system.svc")
    stranger = issue({}, Renewal.CA, NOW, POLICY)[CA_BUNDLE]
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(tmp_path, stranger, POLICY.dns_names[0])


@pytest.fixture(scope="module")
def api() -> Iterator[EmulatorServer]:
    with EmulatorServer() as running:
        yield running


def test_replicas_fill_and_share_the_charts_empty_secret_through_the_kubernetes_client(
    api: EmulatorServer, tmp_path: Path
) -> None:
    client = api_client_for_url(api.url)
    core = k8s.CoreV1Api(client)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": SECRET}, "type": "Opaque"})
    replicas = [
        WebhookCertificates(KubeCertStore(client, NAMESPACE, SECRET), POLICY, str(tmp_path / name), [])
        for name in ("a", "b")
    ]
    first, second = (r.sync() for r in replicas)
    assert first.rotated and not second.rotated
    stored = core.read_namespaced_secret(SECRET, NAMESPACE, _preload_content=False)
    data = {k: base64.b64decode(v) for k, v in json.loads(stored.data)["data"].items()}
    for name in ("a", "b"):
        assert (tmp_path / name / TLS_CERT).read_bytes() == data[TLS_CERT]
    # A write from a stale read is refused (another replica renewed in between) and reported as lost.
    store = KubeCertStore(client, NAMESPACE, SECRET)
    _, version = store.read()
    assert store.write(issue(data, Renewal.SERVING, NOW, POLICY), version)
    assert not store.write(issue(data, Renewal.SERVING, NOW, POLICY), version)
    _handshake(tmp_path / "a", data[CA_BUNDLE], POLICY.dns_names[0])


def test_a_missing_secret_says_the_chart_creates_it(api: EmulatorServer) -> None:
    store = KubeCertStore(api_client_for_url(api.url), NAMESPACE, "absent")
    with pytest.raises(RuntimeError, match=re.escape("webhook.certProvider=operator")):
        store.read()


def _served(port: int, ca_bundle: bytes, server_name: str) -> bytes:
    """The DER certificate a client trusting `ca_bundle` gets from the operator's webhook port."""
    context = ssl.create_default_context(cadata=ca_bundle.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_a_running_operator_fills_the_secret_serves_its_pair_and_says_kuberay_is_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The whole startup hook: the operator (kopf, in a thread) finds the chart's empty Secret, issues the pair,
    serves it on its webhook port before anything else, and logs an ERROR for a KubeRay account that is not there."""
    port = free_port()
    settings = Settings(
        metrics_port=0,
        liveness_port=0,
        webhook_port=port,
        webhook_cert_dir=str(tmp_path / "tls"),
        webhook_cert_check_seconds=0.1,
        operator_namespace="ops",
        webhook_cert_secret="op-webhook-tls",
        webhook_service="op-webhook",
        kuberay_service_account="default/kuberay-operator",
    )
    with EmulatorServer() as server:
        core = k8s.CoreV1Api(api_client_for_url(server.url))
        core.create_namespace({"metadata": {"name": "ops"}})
        core.create_namespaced_secret("ops", {"metadata": {"name": "op-webhook-tls"}, "type": "Opaque"})
        operator = OperatorThread(settings, server.url)
        with caplog.at_level(logging.INFO, logger="sweep_operator.install_checks"):
            operator.start()
        try:
            stored = json.loads(core.read_namespaced_secret("op-webhook-tls", "ops", _preload_content=False).data)
            data = {k: base64.b64decode(v) for k, v in stored["data"].items()}
            served = wait_for(lambda: _try_served(port, data[CA_BUNDLE]), timeout=20)
            assert served == x509.load_pem_x509_certificate(data[TLS_CERT]).public_bytes(serialization.Encoding.DER)
        finally:
            operator.stop()
    # The install check's own ERROR (the certificate sync may log others once the emulator has stopped).
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "sweep_operator.install_checks"]
    assert "default/kuberay-operator does not exist" in error.getMessage()


def _try_served(port: int, ca_bundle: bytes) -> bytes | None:
    try:
        return _served(port, ca_bundle, "op-webhook.ops.svc")
    except (OSError, ssl.SSLError):
        return None
