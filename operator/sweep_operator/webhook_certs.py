"""The webhook's serving certificate when the operator manages it (Kueue's way, no cert-manager): a CA and serving pair
in one shared Secret, renewed before expiry.

The CA is injected into the webhook configurations. Decisions are pure (`decide_renewal`, `issue`);
`WebhookCertificates` and `KubeCertStore` are the thin I/O.
"""

from __future__ import annotations

import base64
import datetime
import enum
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger(__name__)

# Keys of the shared Secret. ca.crt is the bundle the webhook configurations trust: the current CA first, then the
# previous one while it is still valid, so a replica still serving a pair signed by it stays trusted.
CA_BUNDLE, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
SECRET_KEYS = (CA_BUNDLE, CA_KEY, TLS_CERT, TLS_KEY)
WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")


class Renewal(enum.StrEnum):
    NONE = "none"
    SERVING = "serving"  # a new serving pair under the same CA
    CA = "ca"  # a new CA (and serving pair); the old CA stays in the bundle while valid


@dataclass(frozen=True)
class CertPolicy:
    """What the serving certificate must be: its names (the webhook Service's DNS names) and lifetimes."""

    dns_names: tuple[str, ...]
    validity: datetime.timedelta = datetime.timedelta(days=365)
    renew_before: datetime.timedelta = datetime.timedelta(days=30)
    ca_validity: datetime.timedelta = datetime.timedelta(days=3650)
    ca_renew_before: datetime.timedelta = datetime.timedelta(days=365)

    def __post_init__(self) -> None:
        if not self.dns_names:
            raise ValueError("webhook certificate: dns_names is empty; the Service name and namespace are needed")
        if not datetime.timedelta(0) < self.renew_before < self.validity:
            raise ValueError(
                f"webhook certificate: renew_before ({self.renew_before}) must be positive and shorter than "
                f"validity ({self.validity})"
            )
        if not self.renew_before < self.ca_renew_before < self.ca_validity:
            raise ValueError("webhook certificate: the CA must outlive the serving certificate's renewal window")

    @classmethod
    def for_service(cls, service: str, namespace: str, **lifetimes: datetime.timedelta) -> CertPolicy:
        """The names the API server calls the webhook Service by."""
        return cls(dns_names=(f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"), **lifetimes)


@dataclass(frozen=True)
class RenewalDecision:
    renewal: Renewal
    reason: str


def _certs(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem) if pem else []
    except ValueError:
        return []


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    public_key = ca.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        return False
    try:
        public_key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return cert.issuer == ca.subject


def _key_matches(key_pem: bytes, cert: x509.Certificate) -> bool:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _dns_names(cert: x509.Certificate) -> set[str]:
    try:
        return set(
            cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        )
    except x509.ExtensionNotFound:
        return set()


def decide_renewal(data: Mapping[str, bytes], now: datetime.datetime, policy: CertPolicy) -> RenewalDecision:
    """Whether the Secret's pair can be served as it is, needs a new serving certificate, or a new CA."""
    if not data.get(CA_BUNDLE) or not data.get(CA_KEY):
        return RenewalDecision(Renewal.CA, "the Secret holds no CA yet")
    bundle = _certs(data[CA_BUNDLE])
    if not bundle or not _key_matches(data[CA_KEY], bundle[0]):
        return RenewalDecision(Renewal.CA, f"{CA_BUNDLE} or {CA_KEY} does not load, or they do not match")
    ca = bundle[0]
    if ca.not_valid_after_utc - now <= policy.ca_renew_before:
        return RenewalDecision(Renewal.CA, f"the CA expires {ca.not_valid_after_utc.isoformat()}")
    serving = _certs(data.get(TLS_CERT, b""))
    if not serving or not _key_matches(data.get(TLS_KEY, b""), serving[0]):
        return RenewalDecision(Renewal.SERVING, f"{TLS_CERT} or {TLS_KEY} is missing, does not load or do not match")
    cert = serving[0]
    if not _signed_by(cert, ca):
        return RenewalDecision(Renewal.SERVING, "the serving certificate is not signed by the current CA")
    missing = set(policy.dns_names) - _dns_names(cert)
    if missing:
        return RenewalDecision(Renewal.SERVING, f"the serving certificate lacks {', '.join(sorted(missing))}")
    if cert.not_valid_after_utc - now <= policy.renew_before:
        return RenewalDecision(
            Renewal.SERVING, f"the serving certificate expires {cert.not_valid_after_utc.isoformat()}"
        )
    if cert.not_valid_before_utc > now + datetime.timedelta(minutes=5):
        return RenewalDecision(Renewal.SERVING, "the serving certificate is not valid yet (clock skew)")
    return RenewalDecision(Renewal.NONE, f"valid until {cert.not_valid_after_utc.isoformat()}")


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])


def issue(data: Mapping[str, bytes], renewal: Renewal, now: datetime.datetime, policy: CertPolicy) -> dict[str, bytes]:
    """The Secret's next data for `renewal` (ECDSA P-256; backdated a minute for clocks slightly behind)."""
    if renewal is Renewal.NONE:
        return dict(data)
    start = now - datetime.timedelta(minutes=1)
    if renewal is Renewal.CA:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = _name(f"{policy.dns_names[0]} webhook CA")
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(now + policy.ca_validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        still_valid = [c for c in _certs(data.get(CA_BUNDLE, b""))[:1] if c.not_valid_after_utc > now]
        bundle = b"".join(_pem(c) for c in [ca, *still_valid])
    else:
        bundle = data[CA_BUNDLE]
        ca = _certs(bundle)[0]
        loaded = serialization.load_pem_private_key(data[CA_KEY], password=None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey), "decide_renewal checked the CA key"
        ca_key = loaded
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(policy.dns_names[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(min(now + policy.validity, ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in policy.dns_names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return {CA_BUNDLE: bundle, CA_KEY: _key_pem(ca_key), TLS_CERT: _pem(cert), TLS_KEY: _key_pem(key)}


def parse_webhook_configurations(entries: tuple[str, ...]) -> list[tuple[str, str]]:
    """`Kind/name` entries (SWEEP_WEBHOOK_CONFIGURATIONS) as (kind, name); a bare name is a validating one."""
    parsed = []
    for entry in entries:
        kind, sep, name = entry.rpartition("/")
        kind = kind if sep else WEBHOOK_KINDS[0]
        if kind not in WEBHOOK_KINDS or not name:
            raise ValueError(
                f"webhookConfigurations (SWEEP_WEBHOOK_CONFIGURATIONS): got {entry!r}; entries are "
                f"ValidatingWebhookConfiguration/<name> or MutatingWebhookConfiguration/<name>"
            )
        parsed.append((kind, name))
    return parsed


class CertStore(Protocol):
    """Where the pair lives and who trusts it (the Kubernetes API; an in-memory one in tests)."""

    def read(self) -> tuple[dict[str, bytes], str]:
        """The Secret's data and resourceVersion."""

    def write(self, data: dict[str, bytes], resource_version: str) -> bool:
        """Replace the data if the Secret is still at `resource_version`; False when another replica was first."""

    def inject(self, kind: str, name: str, ca_bundle: bytes) -> bool:
        """Set every webhook's clientConfig.caBundle of one configuration; True when something changed."""


@dataclass(frozen=True)
class SyncResult:
    decision: RenewalDecision
    rotated: bool  # this replica wrote a new pair
    injected: tuple[str, ...]  # configurations whose caBundle changed


class WebhookCertificates:
    """Keeps this replica's certificate files equal to the shared Secret, renewing the Secret when it is due."""

    def __init__(
        self,
        store: CertStore,
        policy: CertPolicy,
        cert_dir: str,
        configurations: list[tuple[str, str]],
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.store, self.policy, self.cert_dir, self.configurations, self.clock = (
            store,
            policy,
            cert_dir,
            configurations,
            clock,
        )

    def sync(self) -> SyncResult:
        rotated = False
        for _ in range(3):  # a lost race re-reads what the winner wrote
            data, version = self.store.read()
            decision = decide_renewal(data, self.clock(), self.policy)
            if decision.renewal is Renewal.NONE:
                break
            log.info("webhook certificate: renewing (%s): %s", decision.renewal.value, decision.reason)
            if self.store.write(issue(data, decision.renewal, self.clock(), self.policy), version):
                rotated = True
        else:
            raise RuntimeError("webhook certificate: the shared Secret kept changing under three renewals")
        self._write_files(data)
        injected = tuple(
            f"{kind}/{name}" for kind, name in self.configurations if self.store.inject(kind, name, data[CA_BUNDLE])
        )
        return SyncResult(decision, rotated, injected)

    def _write_files(self, data: Mapping[str, bytes]) -> None:
        """Key first, then certificate, each replaced atomically (the server re-reads on a change of either)."""
        os.makedirs(self.cert_dir, exist_ok=True)
        for key in (TLS_KEY, TLS_CERT):
            path = os.path.join(self.cert_dir, key)
            try:
                with open(path, "rb") as current:
                    if current.read() == data[key]:
                        continue
            except FileNotFoundError:
                pass
            temporary = f"{path}.tmp"
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data[key])
            os.replace(temporary, path)

    def run(self, stop: threading.Event, interval: float) -> None:
        """Re-sync every `interval` seconds until `stop` (a failed sync is logged; the files keep the last pair)."""
        while not stop.wait(interval):
            try:
                result = self.sync()
            except Exception:
                log.exception("webhook certificate: sync failed; serving the current pair")
                continue
            if result.rotated or result.injected:
                log.info("webhook certificate: %s; CA injected into %s", result.decision.reason, result.injected)


class KubeCertStore:
    """The Secret (created empty by the chart: RBAC cannot scope `create` to one name) and the webhook
    configurations, through the official client; the operator may get/update that one Secret only."""

    def __init__(self, api_client: Any, namespace: str, secret_name: str) -> None:
        from kubernetes import client as k8s

        # Any: raw JSON in and out (the typed models blur base64 text and bytes)
        self.core: Any = k8s.CoreV1Api(api_client)
        self.admission: Any = k8s.AdmissionregistrationV1Api(api_client)
        self.namespace, self.secret_name = namespace, secret_name

    def _secret(self) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            answer = self.core.read_namespaced_secret(self.secret_name, self.namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                raise RuntimeError(
                    f"webhook certificate: Secret {self.namespace}/{self.secret_name} not found; the chart creates "
                    "it (webhook.certProvider=operator)"
                ) from None
            raise
        secret: dict[str, Any] = json.loads(answer.data)
        return secret

    def read(self) -> tuple[dict[str, bytes], str]:
        secret = self._secret()
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        return data, str(secret["metadata"].get("resourceVersion") or "")

    def write(self, data: dict[str, bytes], resource_version: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        secret = self._secret()
        if str(secret["metadata"].get("resourceVersion") or "") != resource_version:
            return False
        secret["data"] = {k: base64.b64encode(v).decode() for k, v in data.items()}
        try:  # the resourceVersion in the body makes the update conditional
            self.core.replace_namespaced_secret(self.secret_name, self.namespace, secret)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def inject(self, kind: str, name: str, ca_bundle: bytes) -> bool:
        read: Callable[..., Any]
        patch: Callable[..., Any]
        if kind == WEBHOOK_KINDS[0]:
            read = self.admission.read_validating_webhook_configuration
            patch = self.admission.patch_validating_webhook_configuration
        else:
            read = self.admission.read_mutating_webhook_configuration
            patch = self.admission.patch_mutating_webhook_configuration
        encoded = base64.b64encode(ca_bundle).decode()
        configuration = json.loads(read(name, _preload_content=False).data)
        operations: list[dict[str, Any]] = []
        for index, webhook in enumerate(configuration.get("webhooks") or []):
            if (webhook.get("clientConfig") or {}).get("caBundle") != encoded:
                # `test` pins the index to the webhook read: a concurrent reorder fails the patch, the next sync redoes it.
                operations.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]})
                operations.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded})
        if not operations:
            return False
        patch(name, operations, _content_type="application/json-patch+json")
        return True
