"""The operator's Events say who wrote them: `kubectl describe` shows From: trainingsweep-operator and the Event's
reportingInstance is the operator's pod (kopf's defaults were `kopf` and `dev`). kopf runs with the operator's own
settings (`configure_kopf`) against the Kubernetes API emulator; the real kubectl reads the Events back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_sandbox.emulator import EmulatorServer
from tests.support.factories import cpu_sweep
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

KUBECTL = Path(sys.executable).parent / "kubectl"
G, V, P = constants.GROUP, constants.VERSION, constants.PLURAL


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    with EmulatorServer() as running:
        yield running


def test_events_come_from_the_operator_and_name_its_pod(server: EmulatorServer, tmp_path: Path) -> None:
    import kopf
    import kopf.testing
    import kubernetes.client

    from sweep_operator.handlers import configure_kopf, post_event
    from sweep_operator.settings import Settings

    ns = f"t-{uuid.uuid4().hex[:8]}"
    api = server.api_client()
    core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
    sweep = cpu_sweep("ev")
    sweep["metadata"] = {"name": "ev"}
    # The operator's kopf settings, and one Event posted the way every Event of ours is (handlers.post_event); a
    # registry of its own, so no other test's kopf handlers run here or these there.
    settings = kopf.OperatorSettings()
    configure_kopf(settings, Settings())
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server.url, insecure=True)

    @kopf.on.event(G, V, P, registry=registry)
    def seen(body: kopf.Body, type: str | None, **_: Any) -> None:
        if type in (None, "ADDED"):  # None: the object was there at the initial listing
            post_event(body, "Normal", "Admitted", "admitted (1 workers, 0 GPUs)")

    args = ["run", "--standalone", "--namespace", ns]
    default_registry = kopf.get_default_registry()  # `kopf run` makes the one it is given the process's default
    try:
        with kopf.testing.KopfRunner(args, timeout=30, registry=registry, settings=settings) as runner:
            custom.create_namespaced_custom_object(G, V, ns, P, sweep)
            wait_for(lambda: core.list_namespaced_event(ns).items, 15, what="the operator's Event")
    finally:
        kopf.set_default_registry(default_registry)
    assert runner.exit_code == 0 and runner.exception is None

    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", namespace=ns)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    def kubectl(*args: str) -> str:
        done = subprocess.run([str(KUBECTL), *args], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    (event,) = json.loads(kubectl("get", "events", "-o", "json"))["items"]
    assert event["reportingComponent"] == event["source"]["component"] == "trainingsweep-operator"
    assert event["reportingInstance"] == os.uname().nodename  # in a pod: the pod's name
    described = kubectl("describe", constants.SHORT_NAME, "ev").splitlines()
    header = next(i for i, line in enumerate(described) if line.split()[:4] == ["Type", "Reason", "Age", "From"])
    row: Any = described[header + 2].split()
    assert row[:2] == ["Normal", "Admitted"] and row[3] == "trainingsweep-operator", "\n".join(described)
