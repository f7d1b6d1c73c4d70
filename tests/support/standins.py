"""The fixtures the stand-in test modules share: one emulator a module, a scripted runner, the KubeRay stand-in on it,
and a fresh namespace and API clients a test.

Each call makes a new fixture; a module takes it by assigning it to the fixture's name:

    server = standins.emulator()
    runner = standins.scripted_runner(Outcome.succeed(0.2))
    standin = standins.kuberay()          # needs `server` and `runner`
    ns = standins.namespace("k-")
    custom = standins.kube_api("CustomObjectsApi")    # needs `server`
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sweep_sandbox.emulator import EmulatorServer
from sweep_sandbox.kuberay import KubeRayStandIn, Outcome, ScriptedRunner


def emulator() -> Any:
    """A module-scoped emulator (`server`), stopped when the module is done."""

    @pytest.fixture(scope="module")
    def fixture() -> Iterator[EmulatorServer]:
        with EmulatorServer() as running:
            yield running

    return fixture


def scripted_runner(default: Outcome) -> Any:
    """A module-scoped ScriptedRunner (`runner`) whose unscripted RayJobs do `default`."""

    @pytest.fixture(scope="module")
    def fixture() -> ScriptedRunner:
        return ScriptedRunner(default=default)

    return fixture


def kuberay() -> Any:
    """A module-scoped KubeRay stand-in on `server`, running RayJobs with `runner`."""

    @pytest.fixture(scope="module")
    def fixture(server: EmulatorServer, runner: ScriptedRunner) -> Iterator[KubeRayStandIn]:
        with KubeRayStandIn(server.api_client(), runner, poll_interval=0.1) as running:
            yield running

    return fixture


def clear_injected_errors() -> Any:
    """Autouse: the API errors a test injects into `server` end with the test."""

    @pytest.fixture(autouse=True)
    def fixture(server: EmulatorServer) -> Iterator[None]:
        yield
        server.emulator.errors.clear()

    return fixture


def namespace(prefix: str) -> Any:
    """A namespace of its own for each test: `prefix` and 8 hex digits."""

    @pytest.fixture
    def fixture() -> str:
        return f"{prefix}{uuid.uuid4().hex[:8]}"

    return fixture


def kube_api(name: str) -> Any:
    """A kubernetes.client API of that class (`CustomObjectsApi`, `CoreV1Api`) on `server`."""

    @pytest.fixture
    def fixture(server: EmulatorServer) -> Any:
        import kubernetes.client

        return getattr(kubernetes.client, name)(server.api_client())

    return fixture
