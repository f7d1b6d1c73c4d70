"""The operator's integration environment: Kubernetes API emulator, KubeRay stand-in, moto S3 and the operator,
all on 127.0.0.1, plus helpers to read what a user would see (status, Events, objects)."""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import kubernetes

from sweep_contracts import constants
from sweep_operator.settings import OperatorLimits, Settings
from sweep_sandbox.emulator import EmulatorServer, build_emulator
from sweep_sandbox.kuberay import KubeRayStandIn, Outcome, ScriptedRunner
from sweep_sandbox.operator_thread import OperatorThread
from tests.support.factories import changed, cpu_sweep, gpu_sweep
from tests.support.waiting import wait_for

TIMEOUT = 60.0  # generous: the CI machine has 2 cores and Ray tests may share them


@dataclass
class S3Switch:
    """The operator's S3 client factory, switchable to a failing endpoint ("S3 down") and back."""

    healthy: Callable[[str, str], Any]
    failing: Callable[[str, str], Any] | None = None
    down: bool = False

    def __call__(self, endpoint: str, region: str) -> Any:
        if self.down and self.failing is not None:
            return self.failing(endpoint, region)
        return self.healthy(endpoint, region)


@dataclass
class OperatorEnv:
    server: EmulatorServer
    runner: ScriptedRunner
    standin: KubeRayStandIn
    operator: OperatorThread
    settings: Settings
    s3_endpoint: str
    s3_client: Any
    bucket: str
    s3_switch: S3Switch
    kueue: Any = None  # the Kueue stand-in, when started with kueue_default_queue
    # How often the waits below read the API. The emulator, the stand-in and the operator share this process (and
    # its GIL), so a test that watches many sweeps at once raises it: its own polling must not starve the operator.
    poll: float = 0.02
    custom: Any = field(init=False)
    core: Any = field(init=False)

    def __post_init__(self) -> None:
        api_client = self.server.api_client()
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)

    # -------------------------------------------------------------- building and applying sweeps
    def new_sweep(self, prefix: str, namespace: str = "default", gpu: bool = False, **changes: Any) -> dict[str, Any]:
        name = f"{prefix}-{uuid.uuid4().hex[:5]}"
        base = gpu_sweep(name, namespace) if gpu else cpu_sweep(name, namespace)
        doc = changed(
            base,
            {
                "spec.storage.uri": f"s3://{self.bucket}/sweeps",
                "spec.storage.endpointUrl": self.s3_endpoint,
                "spec.storage.region": "us-east-1",
                "spec.deletion": {
                    "verifyCheckpoints": True,
                    "verificationTimeoutSeconds": 20,
                    "retryBackoffSeconds": 1,
                    "maxRetryBackoffSeconds": 2,
                },
                "spec.tune.numSamples": 2,
                **{k.replace("__", "."): v for k, v in changes.items()},
            },
        )
        return doc

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        meta = doc["metadata"]
        self.ensure_namespace(meta["namespace"])
        return self.custom.create_namespaced_custom_object(
            constants.GROUP, constants.VERSION, meta["namespace"], constants.PLURAL, copy.deepcopy(doc)
        )

    def sweep(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def status(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return ((self.sweep(name, namespace) or {}).get("status")) or {}

    def wait_status(
        self,
        name: str,
        predicate: Callable[[dict[str, Any]], Any],
        what: str,
        namespace: str = "default",
        timeout: float = TIMEOUT,
    ) -> dict[str, Any]:
        wait_for(lambda: predicate(self.status(name, namespace)), timeout, self.poll, what=f"{name}: {what}")
        return self.status(name, namespace)

    def wait_phase(
        self, name: str, *phases: str, namespace: str = "default", timeout: float = TIMEOUT
    ) -> dict[str, Any]:
        return self.wait_status(name, lambda s: s.get("phase") in phases, f"phase in {phases}", namespace, timeout)

    def condition(self, name: str, type_: str, namespace: str = "default") -> dict[str, Any] | None:
        return next((c for c in self.status(name, namespace).get("conditions") or [] if c["type"] == type_), None)

    def get(self, plural: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, name
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_ray(self, plural: str, name: str, patch: dict[str, Any], namespace: str = "default") -> Any:
        """A merge patch on one of the run's RayJobs or RayClusters, as a user's `kubectl patch` would send it."""
        return self.custom.patch_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, name, patch
        )

    def rayjobs(self, sweep: str, namespace: str = "default") -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(
            constants.RAY_GROUP,
            constants.RAY_VERSION_API,
            namespace,
            constants.RAYJOB_PLURAL,
            label_selector=f"{constants.LABEL_SWEEP}={sweep}",
        )["items"]

    def rayclusters(self, sweep: str, namespace: str = "default") -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(
            constants.RAY_GROUP,
            constants.RAY_VERSION_API,
            namespace,
            constants.RAYCLUSTER_PLURAL,
            label_selector=f"{constants.LABEL_SWEEP}={sweep}",
        )["items"]

    def events(self, name: str, namespace: str = "default") -> list[Any]:
        return [e for e in self.core.list_namespaced_event(namespace).items if e.involved_object.name == name]

    def event_reasons(self, name: str, namespace: str = "default") -> list[str]:
        return [e.reason for e in self.events(name, namespace)]

    def delete_sweep(self, name: str, namespace: str = "default") -> None:
        self.custom.delete_namespaced_custom_object(
            constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name
        )

    def delete_ray(self, plural: str, name: str, namespace: str = "default") -> None:
        self.custom.delete_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, name
        )

    def annotate_sweep(self, name: str, annotations: dict[str, str], namespace: str = "default") -> None:
        self.custom.patch_namespaced_custom_object(
            constants.GROUP,
            constants.VERSION,
            namespace,
            constants.PLURAL,
            name,
            {"metadata": {"annotations": annotations}},
        )

    def ensure_namespace(self, namespace: str) -> None:
        """The tenant's namespace, made first as a platform admin would: the API server (and the emulator here)
        refuses a create in a namespace that does not exist."""
        try:
            self.core.create_namespace({"metadata": {"name": namespace}})
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise

    def namespace_gone(self, namespace: str) -> bool:
        try:
            self.core.read_namespace(namespace)
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False

    @contextlib.contextmanager
    def verifications(self) -> Iterator[list[tuple[str, bool, int]]]:
        """Every verification the guard runs meanwhile, as it saw it: (run root, verified, checkpoints checked)."""
        seen: list[tuple[str, bool, int]] = []
        controller = self.operator.controller
        real_verify = controller.verify

        def spy(client: Any, root: str, **kwargs: Any) -> Any:
            result = real_verify(client, root, **kwargs)
            seen.append((root, result.verified, result.checked))
            return result

        controller.verify = spy
        try:
            yield seen
        finally:
            controller.verify = real_verify

    def pruned(self) -> list[tuple[str, str]]:
        """Fields any write sent that the API server's schemas pruned (kind, path): the operator and the stand-in
        must write none, since a real server drops them silently (issue 12, defect 1)."""
        return list(self.server.emulator.unknown_fields)

    def report_trials_running(self, bucket: str, prefix: str, running: int = 1) -> None:
        """Write the driver's `_sweep/status.json` as a run with trials running: scripted jobs write nothing, and
        the startup clock stops only when a trial runs."""
        import json

        doc = {
            "phase": "Running",
            "trials": {"total": running, "running": running},
            "updatedAt": "2026-12-02T10:00:00Z",
        }
        self.s3_client.put_object(Bucket=bucket, Key=f"{prefix}/_sweep/status.json", Body=json.dumps(doc).encode())

    def run_root(self, name: str, namespace: str = "default") -> tuple[str, str]:
        """(bucket, prefix) of the sweep's current run."""
        run_id = self.wait_status(name, lambda s: s.get("runId"), "runId", namespace)["runId"]
        return self.bucket, f"sweeps/{namespace}/{name}-{run_id}"


def start_operator_env(
    s3_server: Any,
    *,
    limits: OperatorLimits | None = None,
    ttl_seconds_after_finished: int = 1,
    failing_s3: Callable[[str, str], Any] | None = None,
    kueue_default_queue: str = "",
) -> tuple[OperatorEnv, Callable[[], None]]:
    """Start everything; returns the environment and a function that stops it."""
    from sweep_operator.s3 import S3ClientConfig, make_s3_client

    bucket = f"op-{uuid.uuid4().hex[:10]}"
    s3_client = s3_server.client()
    s3_client.create_bucket(Bucket=bucket)
    settings = Settings(
        limits=limits or OperatorLimits(),
        reconcile_seconds=1.0,
        status_poll_seconds=0.5,
        # The production rhythm, scaled down: unchanged documents read up to 2 s apart, progress mirrored each 0.5 s.
        status_poll_max_seconds=2.0,
        progress_mirror_seconds=0.5,
        ttl_seconds_after_finished=ttl_seconds_after_finished,
        s3_endpoint_url=s3_server.endpoint_url,
        s3_region="us-east-1",
        metrics_port=0,
        liveness_port=0,
        kueue_default_queue=kueue_default_queue,
    )
    healthy_clients: dict[tuple[str, str], Any] = {}

    def healthy(endpoint: str, region: str) -> Any:
        key = (endpoint, region)
        if key not in healthy_clients:
            healthy_clients[key] = make_s3_client(S3ClientConfig(endpoint_url=endpoint, region=region, max_attempts=2))
        return healthy_clients[key]

    switch = S3Switch(healthy, failing_s3)
    server = EmulatorServer(build_emulator(auto_create_namespaces=False))
    server.start()
    runner = ScriptedRunner(default=Outcome.succeed(1.0, startup=0.3))
    # The heads' Jobs API on loopback: the operator stops a running job through it before a delete (issue 26).
    standin = KubeRayStandIn(server.api_client(), runner, poll_interval=0.2, dashboard=True)
    standin.start()
    kueue = None
    if kueue_default_queue:  # Kueue mode: its CRDs and webhook exist before the operator starts watching
        from sweep_sandbox.kueue import KueueStandIn

        kueue = KueueStandIn(server.api_client(), server=server, poll_interval=0.1).start()
    operator = OperatorThread(settings, server.url, s3_client_for=switch)
    assert standin.jobs_api is not None  # the heads' names reach it as the cluster's DNS would
    operator.controller.stop_job, operator.controller.job_status = (
        standin.jobs_api.stop_job,
        standin.jobs_api.job_status,
    )
    operator.start()
    env = OperatorEnv(
        server, runner, standin, operator, settings, s3_server.endpoint_url, s3_client, bucket, switch, kueue
    )

    def stop() -> None:
        steps = (env.operator.stop, operator.stop, *((kueue.stop,) if kueue else ()), standin.stop, server.stop)
        for step in steps:
            try:
                step()
            except Exception:  # keep stopping the rest
                pass

    return env, stop
