"""The operator-managed webhook certificate (issue 28): when the shared Secret needs a new serving pair or a new CA,
what is issued (valid for the Service's names, signed by the CA the webhook configurations trust), and replicas
converging on one Secret."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from sweep_operator.webhook_certs import (
    CA_BUNDLE,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    CertPolicy,
    Renewal,
    WebhookCertificates,
    decide_renewal,
    issue,
    parse_webhook_configurations,
)

NOW = datetime.datetime(2026, 12, 5, tzinfo=datetime.UTC)
POLICY = CertPolicy.for_service("sweeps-trainingsweep-operator-webhook", "sweeps-system")
DAY = datetime.timedelta(days=1)


def fresh(now: datetime.datetime = NOW, policy: CertPolicy = POLICY) -> dict[str, bytes]:
    return issue({}, Renewal.CA, now, policy)


def leaf(data: dict[str, bytes]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data[TLS_CERT])


def bundle(data: dict[str, bytes]) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(data[CA_BUNDLE])


def verifies(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    public_key = ca.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    try:
        public_key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    except Exception:
        return False
    return True


def test_an_empty_secret_needs_a_ca_and_a_fresh_one_needs_nothing() -> None:
    assert decide_renewal({}, NOW, POLICY).renewal is Renewal.CA
    assert decide_renewal({CA_BUNDLE: b"", CA_KEY: b"", TLS_CERT: b"", TLS_KEY: b""}, NOW, POLICY).renewal is Renewal.CA
    assert decide_renewal(fresh(), NOW, POLICY).renewal is Renewal.NONE


def test_the_serving_certificate_is_renewed_before_it_expires_under_the_same_ca() -> None:
    data = fresh()
    expires = leaf(data).not_valid_after_utc
    assert decide_renewal(data, expires - POLICY.renew_before - DAY, POLICY).renewal is Renewal.NONE
    due = expires - POLICY.renew_before + DAY
    decision = decide_renewal(data, due, POLICY)
    assert decision.renewal is Renewal.SERVING and "expires" in decision.reason
    renewed = issue(data, decision.renewal, due, POLICY)
    assert renewed[CA_BUNDLE] == data[CA_BUNDLE] and renewed[CA_KEY] == data[CA_KEY]
    assert renewed[TLS_KEY] != data[TLS_KEY] and leaf(renewed).not_valid_after_utc > expires
    assert decide_renewal(renewed, due, POLICY).renewal is Renewal.NONE


def test_a_ca_near_its_end_is_replaced_and_the_old_one_stays_trusted_while_valid() -> None:
    data = fresh()
    (old_ca,) = bundle(data)
    due = old_ca.not_valid_after_utc - POLICY.ca_renew_before + DAY
    assert decide_renewal(data, due, POLICY).renewal is Renewal.CA
    renewed = issue(data, Renewal.CA, due, POLICY)
    new_ca, kept = bundle(renewed)
    assert kept == old_ca and new_ca != old_ca
    assert verifies(leaf(renewed), new_ca) and verifies(leaf(data), kept)  # both replicas' pairs are trusted
    assert decide_renewal(renewed, due, POLICY).renewal is Renewal.NONE


@pytest.mark.parametrize(
    "spoil",
    ["key of another pair", "signed by another CA", "service renamed", "garbage"],
)
def test_a_pair_that_does_not_fit_gets_a_new_serving_certificate(spoil: str) -> None:
    data, other = fresh(), fresh()
    policy = POLICY
    if spoil == "key of another pair":
        data[TLS_KEY] = other[TLS_KEY]
    elif spoil == "signed by another CA":
        data[TLS_CERT], data[TLS_KEY] = other[TLS_CERT], other[TLS_KEY]
    elif spoil == "service renamed":
        policy = CertPolicy.for_service("renamed-webhook", "sweeps-system")
    else:
        data[TLS_CERT] = b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"
    assert decide_renewal(data, NOW, policy).renewal is Renewal.SERVING
    renewed = issue(data, Renewal.SERVING, NOW, policy)
    assert decide_renewal(renewed, NOW, policy).renewal is Renewal.NONE


def test_the_serving_certificate_names_the_service_and_serves_tls_only() -> None:
    cert = leaf(fresh())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [
        "sweeps-trainingsweep-operator-webhook.sweeps-system.svc",
        "sweeps-trainingsweep-operator-webhook.sweeps-system.svc.cluster.local",
    ]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    (ca,) = bundle(fresh())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_lifetimes_that_cannot_work_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="renew_before"):
        CertPolicy(dns_names=("a.b.svc",), validity=DAY, renew_before=2 * DAY)
    with pytest.raises(ValueError, match="dns_names"):
        CertPolicy(dns_names=())
    with pytest.raises(ValueError, match="SWEEP_WEBHOOK_CONFIGURATIONS"):
        parse_webhook_configurations(("Deployment/x",))
    assert parse_webhook_configurations(("a", "MutatingWebhookConfiguration/b")) == [
        ("ValidatingWebhookConfiguration", "a"),
        ("MutatingWebhookConfiguration", "b"),
    ]


class MemoryStore:
    """The shared Secret with resourceVersion preconditions, and the webhook configurations' caBundles."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.version = 1
        self.bundles: dict[tuple[str, str], bytes] = {}
        self.writes = 0
        self.before_write: list[dict[str, bytes]] = []  # another replica's write that lands first

    def read(self) -> tuple[dict[str, bytes], str]:
        return dict(self.data), str(self.version)

    def write(self, data: dict[str, bytes], resource_version: str) -> bool:
        if self.before_write:
            self.data, self.version = self.before_write.pop(), self.version + 1
        if resource_version != str(self.version):
            return False
        self.data, self.version, self.writes = dict(data), self.version + 1, self.writes + 1
        return True

    def inject(self, kind: str, name: str, ca_bundle: bytes) -> bool:
        changed = self.bundles.get((kind, name)) != ca_bundle
        self.bundles[(kind, name)] = ca_bundle
        return changed


CONFIGURATIONS = [("ValidatingWebhookConfiguration", "sweeps-trainingsweep-operator")]


def replica(store: MemoryStore, cert_dir: Path, now: datetime.datetime = NOW) -> WebhookCertificates:
    return WebhookCertificates(store, POLICY, str(cert_dir), CONFIGURATIONS, clock=lambda: now)


def test_replicas_share_one_secret_and_serve_the_same_pair(tmp_path: Path) -> None:
    store = MemoryStore()
    first = replica(store, tmp_path / "a").sync()
    assert first.rotated and first.injected == ("ValidatingWebhookConfiguration/sweeps-trainingsweep-operator",)
    second = replica(store, tmp_path / "b").sync()
    assert not second.rotated and not second.injected and store.writes == 1
    for name in (TLS_CERT, TLS_KEY):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes() == store.data[name]
    assert store.bundles[CONFIGURATIONS[0]] == store.data[CA_BUNDLE]
    assert (tmp_path / "a" / TLS_KEY).stat().st_mode & 0o077 == 0


def test_a_replica_that_loses_the_race_serves_the_winners_pair(tmp_path: Path) -> None:
    store = MemoryStore()
    winner = fresh()
    store.before_write.append(winner)
    result = replica(store, tmp_path).sync()
    assert not result.rotated and store.writes == 0
    assert (tmp_path / TLS_CERT).read_bytes() == winner[TLS_CERT]


def test_a_due_renewal_rewrites_the_secret_and_the_files_once(tmp_path: Path) -> None:
    store = MemoryStore()
    replica(store, tmp_path).sync()
    old_cert = (tmp_path / TLS_CERT).read_bytes()
    later = leaf(store.data).not_valid_after_utc - POLICY.renew_before + DAY
    result = replica(store, tmp_path, later).sync()
    assert result.rotated and not result.injected  # same CA: the configurations already trust it
    assert (tmp_path / TLS_CERT).read_bytes() != old_cert
    assert not replica(store, tmp_path, later).sync().rotated
