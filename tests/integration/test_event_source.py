"""The operator's Events say who wrote them: `kubectl describe` shows From: trainingsweep-operator and the Event's
reportingInstance is the operator's pod (kopf's defaults were `kopf` and `dev`). The operator's poster
(`handlers.EventPoster`) posts them against the Kubernetes API emulator, from a reconcile thread and from the event
loop (through its own thread); the real kubectl reads the Events back. A post that cannot reach the API fails nothing."""

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
from tests.support.ports import refused_port
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

KUBECTL = Path(sys.executable).parent / "kubectl"
G, V, P = constants.GROUP, constants.VERSION, constants.PLURAL


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    with EmulatorServer() as running:
        yield running


def test_events_come_from_the_operator_and_name_its_pod(
    server: EmulatorServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    import kubernetes.client

    from sweep_operator.kube import KubeApi, Retry, api_client_for_url
    from sweep_operator.watch_events import EventPoster

    ns = f"t-{uuid.uuid4().hex[:8]}"
    api = server.api_client()
    core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
    sweep = cpu_sweep("ev")
    sweep["metadata"] = {"name": "ev"}
    created = custom.create_namespaced_custom_object(G, V, ns, P, sweep)
    poster = EventPoster(KubeApi(api))
    poster(created, "Normal", "Admitted", "admitted (1 workers, 0 GPUs)")  # a reconcile thread's: posted at once
    assert len(core.list_namespaced_event(ns).items) == 1

    async def from_the_loop() -> None:  # a handler's: never waits on the API in the loop
        poster(created, "Warning", "GuardLabelRemoved", "x" * 2000)

    asyncio.run(from_the_loop())
    wait_for(lambda: len(core.list_namespaced_event(ns).items) == 2, 15, what="the Event posted from the loop")
    with refused_port() as port, caplog.at_level("WARNING", logger="sweep_operator.handlers"):
        unreachable = EventPoster(KubeApi(api_client_for_url(f"http://127.0.0.1:{port}"), Retry(attempts=1)))
        unreachable(created, "Normal", "Admitted", "nobody answers")  # logged, not raised
    assert any("cannot post the Normal Event Admitted" in r.getMessage() for r in caplog.records), caplog.text

    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", namespace=ns)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    def kubectl(*args: str) -> str:
        done = subprocess.run([str(KUBECTL), *args], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    events = json.loads(kubectl("get", "events", "-o", "json"))["items"]
    assert sorted(e["reason"] for e in events) == ["Admitted", "GuardLabelRemoved"]
    for event in events:
        assert event["reportingComponent"] == event["source"]["component"] == "trainingsweep-operator"
        assert event["reportingInstance"] == os.uname().nodename  # in a pod: the pod's name
        assert event["involvedObject"] == {
            "apiVersion": f"{G}/{V}",
            "kind": constants.KIND,
            "name": "ev",
            "uid": created["metadata"]["uid"],
            "namespace": ns,
        }
        assert event["metadata"]["name"].startswith("kopf-event-")
    assert len(next(e for e in events if e["reason"] == "GuardLabelRemoved")["message"]) == 1024
    described = kubectl("describe", constants.SHORT_NAME, "ev").splitlines()
    header = next(i for i, line in enumerate(described) if line.split()[:4] == ["Type", "Reason", "Age", "From"])
    row: Any = described[header + 2].split()
    assert row[:2] == ["Normal", "Admitted"] and row[3] == "trainingsweep-operator", "\n".join(described)
