"""The admission webhook of a running operator, called over HTTPS the way a pod that reaches its port can call it:
a request over the cap is answered 413 before it is parsed, a validation runs off kopf's event loop (a held one
blocks neither the loop nor the guard's finalizer webhook, and the next is refused as busy), and an ordinary review
is answered promptly while 32 threads flood the webhook with forged oversized reviews."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sweep_operator.settings import WEBHOOK_PATH, Settings
from sweep_operator.webhook_bounds import ValidationPool
from sweep_operator.webhook_finalizers import SWEEP_MUTATING_WEBHOOK_PATH
from sweep_sandbox.emulator import EmulatorServer
from sweep_sandbox.operator_thread import OperatorThread
from tests.integration.test_webhook_certificate_rotation import Ca
from tests.support.factories import cpu_sweep
from tests.support.ports import free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

CAP = 256 * 1024  # the default webhook.maxRequestBytes
# Far under the webhook's timeout (10 s, failurePolicy Fail). Under the flood below, an ordinary review took 2.3 to
# 11.4 s before the bounds (idle, 2 cores: kopf parsed and validated each forged review on its event loop), and
# 0.1 to 0.3 s after (up to 1 s beside a CPU hog and another test file).
PROMPT_SECONDS = 3.0


def review(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    """An AdmissionReview as the API server sends it, or as a pod forges one."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "operation": operation,
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


def forged(name: str, size: int) -> bytes:
    """A review of a sweep whose paramSpace makes it `size` bytes (dicts: the costliest to parse per byte)."""
    obj = cpu_sweep(name, "team-a")
    entries = 16
    while True:
        obj["spec"]["paramSpace"]["x"] = {"choice": [{"a": i, "b": [i]} for i in range(entries)]}
        data = json.dumps(review(obj)).encode()
        if len(data) >= size:
            return data
        entries = entries * 5 // 4 + 1


@dataclass
class Webhook:
    port: int
    trust: ssl.SSLContext

    def post(self, path: str, body: bytes | Iterator[bytes], timeout: float = 30.0) -> tuple[int, bytes]:
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.trust, timeout=timeout)
        try:
            headers = {"Content-Type": "application/json"}
            chunked = not isinstance(body, bytes)
            connection.request("POST", path, body=body, headers=headers, encode_chunked=chunked)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def ask(self, path: str, obj: dict[str, Any], timeout: float = 30.0) -> tuple[dict[str, Any], float]:
        """The AdmissionReview's response for `obj` and the seconds it took."""
        started = time.monotonic()
        status, data = self.post(path, json.dumps(review(obj)).encode(), timeout)
        assert status == 200, (status, data[:300])
        return json.loads(data)["response"], time.monotonic() - started


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Webhook, OperatorThread]]:
    certs = tmp_path_factory.mktemp("webhook-tls")
    ca = Ca()
    (certs / "ca.crt").write_bytes(ca.pem())
    crt, key, _ = ca.issue()
    (certs / "tls.crt").write_bytes(crt)
    (certs / "tls.key").write_bytes(key)
    port = free_port()
    settings = Settings(
        metrics_port=0, liveness_port=0, webhook_port=port, webhook_cert_dir=str(certs), reconcile_seconds=1.0
    )
    webhook = Webhook(port, ssl.create_default_context(cafile=str(Path(certs) / "ca.crt")))
    with EmulatorServer() as server:
        operator = OperatorThread(settings, server.url)
        operator.start()
        try:
            wait_for(lambda: webhook.ask(WEBHOOK_PATH, cpu_sweep("ready", "team-a"), timeout=2), 30, 0.1, "webhook")
            yield webhook, operator
        finally:
            operator.stop()


def test_a_review_over_the_cap_is_answered_413_before_it_is_parsed(served: tuple[Webhook, OperatorThread]) -> None:
    webhook, _ = served
    big = forged("big", CAP + 40 * 1024)  # under aiohttp's own 1 MiB: kopf alone would parse it
    status, text = webhook.post(WEBHOOK_PATH, big)
    assert status == 413
    assert f"{len(big)} bytes" in text.decode() and f"at most {CAP} bytes" in text.decode()
    # Without a length (chunked), the read stops at the cap.
    status, _ = webhook.post(WEBHOOK_PATH, iter([big[i : i + 65536] for i in range(0, len(big), 65536)]))
    assert status == 413
    # Under the byte cap, with more JSON elements than a sweep's review ever has: refused before json.loads.
    nested = cpu_sweep("nested", "team-a")
    nested["spec"]["paramSpace"]["x"] = {"choice": [[] for _ in range(40_000)]}
    body = json.dumps(review(nested)).encode()
    assert len(body) < CAP
    status, text = webhook.post(WEBHOOK_PATH, body)
    assert status == 413 and "JSON elements" in text.decode()
    # The guard's finalizer webhook is served by the same server, with the same cap.
    assert webhook.post(SWEEP_MUTATING_WEBHOOK_PATH, big)[0] == 413
    answer, _ = webhook.ask(WEBHOOK_PATH, cpu_sweep("digits", "team-a"))
    assert answer["allowed"] is True


def test_a_held_validation_blocks_neither_the_loop_nor_the_finalizer_webhook_and_the_next_is_refused_busy(
    served: tuple[Webhook, OperatorThread],
) -> None:
    webhook, operator = served
    assert operator.wiring is not None
    controller = operator.controller
    validate = controller.admission_problems
    entered, release = threading.Event(), threading.Event()

    def held(body: Any, old: Any) -> list[str]:
        if body["metadata"]["name"] == "held":
            entered.set()
            release.wait(30)
        return validate(body, old)

    pool = getattr(operator.wiring, "validation_pool", None)
    operator.wiring.validation_pool = ValidationPool(workers=1, waiting=0)  # one validation at a time, none waiting
    controller.admission_problems = held  # type: ignore[method-assign]  # a validation that takes as long as we say
    holder = threading.Thread(target=lambda: webhook.ask(WEBHOOK_PATH, cpu_sweep("held", "team-a")))
    try:
        holder.start()
        wait_for(entered.is_set, 10, what="the held validation to start")
        # The loop is free: the guard's finalizer webhook answers, and the next validation is refused at once.
        patched, took = webhook.ask(SWEEP_MUTATING_WEBHOOK_PATH, cpu_sweep("guarded", "team-a"), timeout=5)
        assert patched["allowed"] is True and patched.get("patch") and took < PROMPT_SECONDS
        busy, took = webhook.ask(WEBHOOK_PATH, cpu_sweep("next", "team-a"), timeout=5)
        assert busy["allowed"] is False and busy["status"]["code"] == 429 and took < PROMPT_SECONDS
        assert "busy" in busy["status"]["message"] and "retry" in busy["status"]["message"]
    finally:
        release.set()
        holder.join(30)
        controller.admission_problems = validate  # type: ignore[method-assign]  # the real one back
        operator.wiring.validation_pool = pool
    assert webhook.ask(WEBHOOK_PATH, cpu_sweep("after", "team-a"))[0]["allowed"] is True


def test_an_ordinary_review_is_answered_promptly_while_a_pod_floods_the_webhook(
    served: tuple[Webhook, OperatorThread],
) -> None:
    webhook, _ = served
    flood_body = forged("forged", 900 * 1024)
    answers: Counter[int | str] = Counter()
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            try:
                answers[webhook.post(WEBHOOK_PATH, flood_body)[0]] += 1
            except OSError as exc:  # the server may close a connection it refused mid-upload
                answers[type(exc).__name__] += 1

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(32)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: answers.total() >= 64, 60, 0.05, "the flood to be answered")
        took = []
        for name in ("one", "two", "three"):
            answer, seconds = webhook.ask(WEBHOOK_PATH, cpu_sweep(name, "team-a"))
            assert answer["allowed"] is True
            took.append(seconds)
        patched, seconds = webhook.ask(SWEEP_MUTATING_WEBHOOK_PATH, cpu_sweep("guarded", "team-a"))
        assert patched["allowed"] is True and patched.get("patch")
        took.append(seconds)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert max(took) < PROMPT_SECONDS, took
    assert answers[413] >= 64, answers
