"""The admission webhook at certificate renewal (issue 15): cert-manager rewrites tls.crt/tls.key under a
running server; TLS clients see the renewed certificate without a restart, and a pair caught mid-rotation
(the new certificate beside the old key) keeps the old one served instead of taking the server down."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sweep_operator.handlers import ReloadingWebhookServer
from tests.support.ports import free_port

pytestmark = pytest.mark.integration
DEADLINE = 20.0


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


class Ca:
    """What the chart's cert-manager chain makes: a CA certificate (from the self-signed issuer) that signs
    every serving certificate (the CA issuer); the webhook configuration trusts the CA, not one leaf."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name("sweeps-webhook-ca"))
            .issuer_name(_name("sweeps-webhook-ca"))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self) -> tuple[bytes, bytes, bytes]:
        """(certificate PEM, key PEM, certificate DER) for 127.0.0.1, a new key each time (rotationPolicy: Always)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("sweeps-webhook"))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem, cert.public_bytes(serialization.Encoding.DER)


class CountingServer(ReloadingWebhookServer):
    """Counts certificate loads, so the test can wait for the server to have seen a change."""

    loads = 0

    def _build_ssl(self) -> Any:
        try:
            return super()._build_ssl()
        finally:
            self.loads += 1


async def _review(data: Any, **_: Any) -> Any:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": data["request"]["uid"], "allowed": True},
    }


async def _served_certificate(port: int, trust: ssl.SSLContext) -> bytes | None:
    """The DER certificate a verifying TLS client sees, or None while the listener restarts."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=trust)
    except (OSError, ssl.SSLError):
        return None
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return der


async def _until_served(port: int, trust: ssl.SSLContext, der: bytes) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while await _served_certificate(port, trust) != der:
        assert loop.time() < deadline, "the renewed certificate was not served"
        await asyncio.sleep(0.05)


async def _until_loaded(server: CountingServer, count: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while server.loads < count:
        assert loop.time() < deadline, "the server did not re-read its certificate files"
        await asyncio.sleep(0.02)


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    ca = Ca()
    (tmp_path / "ca.crt").write_bytes(ca.pem())
    first_crt, first_key, first_der = ca.issue()
    (tmp_path / "tls.crt").write_bytes(first_crt)
    (tmp_path / "tls.key").write_bytes(first_key)
    port = free_port()
    trust = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

    async def scenario() -> None:
        server = CountingServer(
            addr="127.0.0.1",
            port=port,
            certfile=str(tmp_path / "tls.crt"),
            pkeyfile=str(tmp_path / "tls.key"),
            file_check_interval=0.05,
        )
        configs: list[Any] = []

        async def serve() -> None:
            async with server:
                async for config in server(_review):
                    configs.append(config)

        task = asyncio.create_task(serve())
        try:
            await _until_served(port, trust, first_der)
            # Mid-rotation: the new certificate is there, its key is not yet. The old pair keeps being served.
            second_crt, second_key, second_der = ca.issue()
            loads = server.loads
            (tmp_path / "tls.crt").write_bytes(second_crt)
            await _until_loaded(server, loads + 1)
            assert not task.done(), "the server died on a certificate it could not load"
            await _until_served(port, trust, first_der)
            # The key arrives: the renewed certificate is served, the same server still running.
            (tmp_path / "tls.key").write_bytes(second_key)
            await _until_served(port, trust, second_der)
            async with aiohttp.ClientSession() as session:
                review = {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {"uid": "u1", "operation": "CREATE", "object": {}},
                }
                async with session.post(
                    f"https://127.0.0.1:{port}/validate-trainingsweep",
                    data=json.dumps(review),
                    headers={"Content-Type": "application/json"},
                    ssl=trust,
                ) as response:
                    assert response.status == 200
                    assert (await response.json())["response"] == {"uid": "u1", "allowed": True}
            assert not task.done() and len(configs) >= 2  # restarted its listener in-process, never exited
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
