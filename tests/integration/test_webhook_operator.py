"""The admission webhook of a running operator (kopf, against the API emulator) at certificate renewal and under
load (issue 15): it refuses a sweep off the tenancy allowlists with the field named, cert-manager's renewal of the
mounted files is served without a restart, and it answers while every verification worker is stuck."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sweep_operator.settings import Settings, TenancyPolicy
from sweep_sandbox.emulator import EmulatorServer
from sweep_sandbox.operator_thread import OperatorThread
from tests.integration.test_webhook_certificate_rotation import Ca, _served_certificate
from tests.support.factories import changed, cpu_sweep
from tests.support.ports import free_port

pytestmark = pytest.mark.integration
DEADLINE = 30.0


def _review(obj: dict[str, Any]) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it for a TrainingSweep CREATE."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "operation": "CREATE",
            "dryRun": False,
            "kind": {"group": "sweeps.dev", "version": "v1alpha1", "kind": "TrainingSweep"},
            "resource": {"group": "sweeps.dev", "version": "v1alpha1", "resource": "trainingsweeps"},
            "namespace": obj["metadata"]["namespace"],
            "name": obj["metadata"]["name"],
            "userInfo": {"username": "alice@team-a", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
        },
    }


class Webhook:
    def __init__(self, port: int, ca: Path) -> None:
        self.url = f"https://127.0.0.1:{port}/validate-trainingsweep"
        self.port = port
        self.trust = ssl.create_default_context(cafile=str(ca))

    async def ask(self, obj: dict[str, Any]) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                self.url,
                data=json.dumps(_review(obj)),
                ssl=self.trust,
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=10),
            ) as response,
        ):
            assert response.status == 200
            return (await response.json())["response"]

    async def until_served(self, der: bytes) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        while await _served_certificate(self.port, self.trust) != der:
            assert loop.time() < deadline, "the operator's webhook did not serve the expected certificate"
            await asyncio.sleep(0.05)


def test_a_running_operators_webhook_refuses_renews_and_answers_under_load(tmp_path: Path) -> None:
    ca = Ca()
    (tmp_path / "ca.crt").write_bytes(ca.pem())
    crt, key, der = ca.issue()
    (tmp_path / "tls.crt").write_bytes(crt)
    (tmp_path / "tls.key").write_bytes(key)
    port = free_port()
    settings = Settings(
        tenancy=TenancyPolicy(allowed_endpoint_hosts=("*.amazonaws.com",)),
        metrics_port=0,
        liveness_port=0,
        webhook_port=port,
        webhook_cert_dir=str(tmp_path),
        webhook_cert_check_seconds=0.1,
        reconcile_seconds=1.0,
        verification_workers=1,
    )
    webhook = Webhook(port, tmp_path / "ca.crt")
    good = changed(cpu_sweep("digits", "team-a"), {})
    forged = changed(cpu_sweep("forged", "team-a"), {"spec.storage.endpointUrl": "http://169.254.169.254"})
    release = threading.Event()
    with EmulatorServer() as server:
        operator = OperatorThread(settings, server.url)
        operator.start()
        try:

            async def scenario() -> None:
                await webhook.until_served(der)
                assert (await webhook.ask(good))["allowed"] is True
                refused = await webhook.ask(forged)
                assert refused["allowed"] is False
                assert "spec.storage.endpointUrl" in refused["status"]["message"]
                assert "*.amazonaws.com" in refused["status"]["message"]
                # cert-manager renews: a new key and certificate under the same CA, no restart.
                renewed_crt, renewed_key, renewed_der = ca.issue()
                (tmp_path / "tls.key").write_bytes(renewed_key)
                (tmp_path / "tls.crt").write_bytes(renewed_crt)
                await webhook.until_served(renewed_der)
                assert operator.running
                # Every verification worker stuck on a hung bucket: the webhook still answers at once.
                pool = operator.controller.verification_pool
                stuck = pool.submit(release.wait, 60)
                loop = asyncio.get_running_loop()
                started = loop.time()
                assert (await webhook.ask(forged))["allowed"] is False
                assert loop.time() - started < 5 and not stuck.done()

            asyncio.run(scenario())
        finally:
            release.set()
            operator.stop()
