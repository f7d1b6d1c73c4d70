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


def test_an_event_in_a_namespace_being_deleted_is_dropped_quietly(
    server: EmulatorServer, caplog: pytest.LogCaptureFixture
) -> None:
    """NamespaceLifecycle refuses every create in a namespace being deleted, Events included: expected while the guard
    releases a deleted namespace's objects, so an INFO line, not a WARNING with the whole Status."""
    import kubernetes.client

    from sweep_operator.kube import KubeApi
    from sweep_operator.watch_events import EventPoster

    ns = f"t-{uuid.uuid4().hex[:8]}"
    api = server.api_client()
    core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
    sweep = cpu_sweep("held")
    sweep["metadata"] = {"name": "held", "finalizers": [constants.FINALIZER]}
    created = custom.create_namespaced_custom_object(G, V, ns, P, sweep)
    core.delete_namespace(ns)
    wait_for(lambda: core.read_namespace(ns).metadata.deletion_timestamp, 5, what="the namespace Terminating")
    with caplog.at_level("INFO", logger="sweep_operator.watch_events"):
        EventPoster(KubeApi(api))(created, "Normal", "CheckpointGuardReleased", "released")
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "sweep_operator.watch_events"]
    assert lines == [("INFO", f"Normal Event CheckpointGuardReleased on TrainingSweep {ns}/held not posted: its "
                      "namespace is being deleted")], lines  # fmt: skip
    custom.patch_namespaced_custom_object(G, V, ns, P, "held", {"metadata": {"finalizers": []}})


def test_the_event_loops_backlog_is_bounded_and_drops_what_does_not_fit() -> None:
    """client-go's broadcaster queues 1,000 Events and drops past that (watch.DropIfChannelFull); the poster's backlog
    for Events from the event loop is bounded the same way, so a slow or absent API server cannot grow it."""
    import asyncio
    import threading

    from sweep_operator.watch_events import EventPoster

    release, posted = threading.Event(), list[str]()

    class SlowKube:
        def post_event(self, body: Any, type_: str, reason: str, message: str, **_: Any) -> None:
            assert release.wait(30)
            posted.append(reason)

    poster = EventPoster(SlowKube(), instance="op-0", backlog=2)  # type: ignore[arg-type]  # KubeApi's one method

    async def burst() -> None:
        for i in range(6):
            poster({"kind": "TrainingSweep", "metadata": {"name": "s", "namespace": "ml"}}, "Normal", f"R{i}", "m")

    asyncio.run(burst())
    assert poster.dropped >= 3  # two queued, at most one more taken by the poster's thread
    release.set()
    wait_for(lambda: len(posted) == 6 - poster.dropped, 15, what="what was queued, posted")
    assert posted == sorted(posted) and posted[0] == "R0"
