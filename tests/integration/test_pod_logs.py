"""The emulator's pods/log as kube-apiserver and the kubelet answer it (through the real kubectl and the client),
the Job's generated selector, and the KubeRay stand-in's submitter pod whose log is the driver's output.

Sources: kubernetes pkg/registry/core/pod/strategy.go LogLocation, pkg/apis/core/validation ValidatePodLogOptions,
pkg/kubelet/kubelet_pods.go validateContainerLogStatus, pkg/registry/batch/job/strategy.go generateSelector.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from sweep_contracts import constants
from sweep_sandbox.emulator import EmulatorServer
from sweep_sandbox.kuberay import KubeRayStandIn, Outcome, ScriptedRunner
from tests.support.factories import cpu_sweep
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KUBECTL = Path(sys.executable).parent / "kubectl"
DRIVER_OUTPUT = "sweep: new run\nTrial 1a2b3_00000 started\nsweep: 1 trial(s) terminated\n"


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    with EmulatorServer() as running:
        yield running


@pytest.fixture(scope="module")
def runner() -> ScriptedRunner:
    return ScriptedRunner(default=Outcome("succeed", 0.5, log=DRIVER_OUTPUT))


@pytest.fixture(scope="module")
def standin(server: EmulatorServer, runner: ScriptedRunner) -> Iterator[KubeRayStandIn]:
    standin = KubeRayStandIn(
        server.api_client(),
        runner,
        poll_interval=0.1,
        emulate_pods=True,
        container_logs=server.emulator.container_logs,
    )
    with standin as running:
        yield running


@pytest.fixture
def ns(server: EmulatorServer) -> str:
    name = f"l-{uuid.uuid4().hex[:8]}"
    kubernetes.client.CoreV1Api(server.api_client()).create_namespace({"metadata": {"name": name}})
    return name


@pytest.fixture
def core(server: EmulatorServer) -> Any:
    return kubernetes.client.CoreV1Api(server.api_client())


@pytest.fixture
def kubectl(server: EmulatorServer, tmp_path: Path, ns: str) -> Any:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", namespace=ns)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(KUBECTL), *args], env=env, capture_output=True, text=True, timeout=60)

    return run


def _pod(core: Any, ns: str, name: str, containers: tuple[str, ...] = ("main",), **spec: Any) -> dict[str, Any]:
    body = {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": c, "image": "busybox"} for c in containers], **spec},
    }
    return core.api_client.sanitize_for_serialization(core.create_namespaced_pod(ns, body))


def _status(core: Any, ns: str, name: str, status: dict[str, Any]) -> None:
    core.patch_namespaced_pod_status(name, ns, {"status": status})


def _running(name: str, container_id: str = "containerd://abc") -> dict[str, Any]:
    return {
        "name": name,
        "image": "busybox",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "containerID": container_id,
        "state": {"running": {"startedAt": "2026-12-07T10:00:00Z"}},
    }


def _log_error(core: Any, ns: str, pod: str, **options: Any) -> tuple[int, str]:
    with pytest.raises(kubernetes.client.ApiException) as caught:
        core.read_namespaced_pod_log(pod, ns, **options)
    import json

    return caught.value.status, json.loads(caught.value.body)["message"]


def test_a_pod_log_as_the_api_and_the_kubelet_serve_it(
    server: EmulatorServer, core: Any, kubectl: Any, ns: str
) -> None:
    server.emulator.container_logs.register(ns, "two", "main", lambda: b"one\ntwo\nthree\n")
    _pod(core, ns, "two", ("main", "side"))
    # Not bound to a node: an empty log, not an error (LogLocation returns no location).
    assert core.read_namespaced_pod_log("two", ns, container="main") == ""
    assert _log_error(core, ns, "two") == (
        400,
        "a container name must be specified for pod two, choose one of: [main side]",
    )
    assert _log_error(core, ns, "two", container="nope") == (400, "container nope is not valid for pod two")
    assert _log_error(core, ns, "two", container="main", tail_lines=-1)[0] == 422
    core.patch_namespaced_pod("two", ns, {"spec": {"nodeName": "node-0"}})
    waiting = {**_running("main"), "state": {"waiting": {"reason": "ContainerCreating"}}, "ready": False}
    waiting.pop("containerID")
    _status(core, ns, "two", {"phase": "Pending", "containerStatuses": [waiting]})
    refused = kubectl("logs", "two", "-c", "main")
    assert refused.returncode != 0
    assert 'container "main" in pod "two" is waiting to start: ContainerCreating' in refused.stderr
    assert _log_error(core, ns, "two", container="side") == (400, 'container "side" in pod "two" is not available')
    _status(core, ns, "two", {"phase": "Running", "containerStatuses": [_running("main"), _running("side", "x://2")]})
    shown = kubectl("logs", "two", "-c", "main")
    assert (shown.returncode, shown.stdout) == (0, "one\ntwo\nthree\n"), shown.stderr
    assert kubectl("logs", "two", "-c", "main", "--tail", "2").stdout == "two\nthree\n"
    assert kubectl("logs", "two", "-c", "side").stdout == ""  # a container nobody registered printed nothing
    assert core.read_namespaced_pod_log("two", ns, container="main", limit_bytes=5) == "one\nt"
    assert _log_error(core, ns, "two", container="main", previous=True) == (
        400,
        'previous terminated container "main" in pod "two" not found',
    )
    missing = kubectl("logs", "nope")
    assert 'error from server (NotFound): pods "nope" not found' in missing.stderr


def test_a_job_gets_the_selector_and_labels_the_api_server_generates(
    core: Any, server: EmulatorServer, ns: str
) -> None:
    batch = kubernetes.client.BatchV1Api(server.api_client())
    body = {
        "metadata": {"name": "submit"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}},
    }
    job = batch.api_client.sanitize_for_serialization(batch.create_namespaced_job(ns, body))
    uid = job["metadata"]["uid"]
    assert job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert job["spec"]["template"]["metadata"]["labels"] == {
        "job-name": "submit",
        "batch.kubernetes.io/job-name": "submit",
        "controller-uid": uid,
        "batch.kubernetes.io/controller-uid": uid,
    }


def test_the_submitter_pod_runs_while_the_job_runs_and_its_log_is_the_drivers(
    server: EmulatorServer, standin: KubeRayStandIn, core: Any, kubectl: Any, ns: str
) -> None:
    from sweep_operator.rendering import build_rayjob
    from sweep_operator.validation import parse_sweep

    sweep = cpu_sweep("logs", ns)
    sweep["metadata"]["uid"] = str(uuid.uuid4())
    rayjob = build_rayjob(parse_sweep(sweep), "lg0001")
    # No sweep object here: an ownerReference to none would be collected, a finalizer nobody removes would stay.
    rayjob["metadata"].pop("ownerReferences", None)
    rayjob["metadata"].pop("finalizers", None)
    custom = kubernetes.client.CustomObjectsApi(server.api_client())
    custom.create_namespaced_custom_object(
        constants.RAY_GROUP, constants.RAY_VERSION_API, ns, constants.RAYJOB_PLURAL, rayjob
    )
    name = rayjob["metadata"]["name"]
    selector = f"batch.kubernetes.io/job-name={name}"

    def submitter_pod(phase: str) -> dict[str, Any] | None:
        items = core.api_client.sanitize_for_serialization(core.list_namespaced_pod(ns, label_selector=selector))
        pods = [p for p in items["items"] if (p.get("status") or {}).get("phase") == phase]
        return pods[0] if pods else None

    running = wait_for(lambda: submitter_pod("Running"), timeout=30, what="the submitter pod Running")
    owner = running["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Job", name, True)
    done = wait_for(lambda: submitter_pod("Succeeded"), timeout=30, what="the submitter pod Succeeded")
    assert done["metadata"]["name"] == running["metadata"]["name"]
    # `kubectl logs job/NAME` finds the pod by the Job's selector, as on a cluster, and prints the driver's output.
    shown = kubectl("logs", f"job/{name}")
    assert (shown.returncode, shown.stdout) == (0, DRIVER_OUTPUT), shown.stderr
