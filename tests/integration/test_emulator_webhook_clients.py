"""The emulator's webhook client keeps its connections as the API server does: one cached client per webhook client
configuration (k8s.io/apiserver/pkg/util/webhook/client.go ClientManager, keyed by the configuration's hash) whose
transport reuses kept-alive connections, and a request sent again on a new connection where a reused one was closed by
the server (net/http transport.go shouldRetryRequest). A server that never answers still fails the call."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from sweep_sandbox.emulator import EmulatorServer
from tests.integration.test_webhook_certificate_rotation import Ca

pytestmark = pytest.mark.integration


class CountingWebhook:
    """A TLS HTTP/1.1 server allowing every request (asyncio streams, so each connection is visible). `drop` decides,
    from (connection number, request number on it), to close the connection without answering."""

    def __init__(self, tmp_path: Path, drop: Any = lambda connection, request: False) -> None:
        self.ca = Ca()
        crt, key, _ = self.ca.issue()
        (tmp_path / "tls.crt").write_bytes(crt)
        (tmp_path / "tls.key").write_bytes(key)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
        self.drop = drop
        self.requests: list[tuple[int, int]] = []  # (connection, request on it), in arrival order
        self.connections = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection, number = self.connections, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                review = json.loads(await reader.readexactly(length))
                number += 1
                self.requests.append((connection, number))
                if self.drop(connection, number):
                    return
                body = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": {"uid": review["request"]["uid"], "allowed": True},
                    }
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    def _run(self) -> None:
        async def main() -> None:
            server = await asyncio.start_server(self._serve_connection, "127.0.0.1", 0, ssl=self.context)
            self.port = server.sockets[0].getsockname()[1]
            self._stop = asyncio.Event()
            self._ready.set()
            async with server:
                await self._stop.wait()

        self._loop.run_until_complete(main())

    @contextmanager
    def running(self) -> Iterator[CountingWebhook]:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        assert self._ready.wait(10)
        try:
            yield self
        finally:
            self._loop.call_soon_threadsafe(self._stop.set)
            thread.join(10)

    def configuration(self) -> dict[str, Any]:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "counting"},
            "webhooks": [
                {
                    "name": "count.example.dev",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ],
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self.port}/mutate",
                        "caBundle": base64.b64encode(self.ca.pem()).decode(),
                    },
                }
            ],
        }


@contextmanager
def emulator_with(webhook: CountingWebhook) -> Iterator[k8s.CoreV1Api]:
    with EmulatorServer() as server:
        api = server.api_client()
        k8s.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(webhook.configuration())
        yield k8s.CoreV1Api(api)


def _create(core: k8s.CoreV1Api, name: str) -> None:
    core.create_namespaced_config_map("default", {"metadata": {"name": name}, "data": {}})


def test_webhook_calls_reuse_one_kept_alive_connection(tmp_path: Path) -> None:
    with CountingWebhook(tmp_path).running() as webhook, emulator_with(webhook) as core:
        for i in range(5):
            _create(core, f"cm-{i}")
    # Every create was admitted after a call, and the calls came in turn over the first connection.
    assert webhook.requests == [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]
    assert webhook.connections == 1


def test_a_reused_connection_the_server_closed_is_replaced_and_the_call_sent_again(tmp_path: Path) -> None:
    # The server closes its first connection at the second request there without an answer (an idle close racing
    # the request): the call goes out again on a new connection and the create is admitted.
    webhook = CountingWebhook(tmp_path, drop=lambda connection, request: (connection, request) == (1, 2))
    with webhook.running(), emulator_with(webhook) as core:
        _create(core, "first")
        _create(core, "second")
        _create(core, "third")
        names = {cm.metadata.name for cm in core.list_namespaced_config_map("default").items}
    assert {"first", "second", "third"} <= names
    assert webhook.requests == [(1, 1), (1, 2), (2, 1), (2, 2)]


def test_a_server_that_never_answers_still_refuses_the_create_under_fail(tmp_path: Path) -> None:
    webhook = CountingWebhook(tmp_path, drop=lambda connection, request: True)
    with webhook.running(), emulator_with(webhook) as core:
        with pytest.raises(ApiException) as caught:
            _create(core, "refused")
        assert not core.list_namespaced_config_map("default").items
    assert caught.value.status == 500
    assert 'failed calling webhook "count.example.dev"' in json.loads(caught.value.body)["message"]
    assert webhook.requests == [(1, 1), (2, 1)]  # sent once more on a new connection, then given up
