"""The operator under faults (issue 12): a guarded object whose label is removed, `kill -9` of the operator process
at each phase of a run, and 10% random API errors over 200 sweeps. Emulator, KubeRay stand-in and moto on
127.0.0.1; the operator in-process or as `python -m sweep_operator`."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from sweep_contracts import constants
from sweep_sandbox.emulator import ApiError, EmulatorServer, ErrorInjector, RequestTarget
from sweep_sandbox.kuberay import KubeRayStandIn, Outcome, ScriptedRunner
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server)
    try:
        yield environment
    finally:
        stop()


def test_removing_the_label_does_not_unguard_a_rayjob_or_its_cluster(env: OperatorEnv) -> None:
    """Defect 7: kopf drops the finalizer of an object no deletion handler matches any more; the operator's filter
    also matches our finalizer and guard annotation, so a label edit leaves the objects guarded (with an Event)."""
    doc = env.new_sweep("label")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang())
    env.apply(doc)
    bucket, prefix = env.run_root(name)
    synthetic = write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    status = env.wait_phase(name, "Running")
    rayjob, cluster = status["rayJobName"], status["rayClusterName"]
    wait_for(
        lambda: (
            constants.FINALIZER
            in (env.get(constants.RAYCLUSTER_PLURAL, cluster) or {}).get("metadata", {}).get("finalizers", [])
        ),
        TIMEOUT,
        what="the cluster guarded",
    )
    unlabel = {"metadata": {"labels": {constants.LABEL_SWEEP: None}}}
    for plural, obj in ((constants.RAYJOB_PLURAL, rayjob), (constants.RAYCLUSTER_PLURAL, cluster)):
        env.custom.patch_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, "default", plural, obj, unlabel
        )
    for obj in (rayjob, cluster):  # the operator saw the edit: a state change, not a sleep
        wait_for(lambda o=obj: "GuardLabelRemoved" in env.event_reasons(o), TIMEOUT, what=f"{obj}: GuardLabelRemoved")
    for plural, obj in ((constants.RAYJOB_PLURAL, rayjob), (constants.RAYCLUSTER_PLURAL, cluster)):
        current = env.get(plural, obj)
        assert current and constants.FINALIZER in current["metadata"]["finalizers"], f"{obj} lost the guard's finalizer"
        assert constants.LABEL_SWEEP not in (current["metadata"].get("labels") or {})
    missing = synthetic.delete_file()
    env.delete_ray(constants.RAYJOB_PLURAL, rayjob)
    wait_for(
        lambda: sum(r == "CheckpointsNotVerified" for r in env.event_reasons(rayjob)) >= 2,
        TIMEOUT,
        what="the unlabelled RayJob held through two verifications",
    )
    assert env.get(constants.RAYJOB_PLURAL, rayjob) is not None and missing
    write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    wait_for(
        lambda: (
            env.get(constants.RAYJOB_PLURAL, rayjob) is None and env.get(constants.RAYCLUSTER_PLURAL, cluster) is None
        ),
        TIMEOUT,
        what="released after verification",
    )
    wait_for(  # kopf posts the Event on its own queue: the RayJob can be seen gone first
        lambda: "CheckpointGuardReleased" in env.event_reasons(rayjob),
        TIMEOUT,
        what="the CheckpointGuardReleased Event",
    )


class RandomErrors(ErrorInjector):
    """Answers a share of the operator's requests (kopf's and its client's, told by User-Agent) with 500, 503 or
    429; watches are spared so the run stays short. Deterministic per seed."""

    def __init__(self, rate: float, agents: tuple[str, ...], seed: int = 12) -> None:
        super().__init__()
        self.rate, self.agents = rate, agents
        self._rng = random.Random(seed)
        self.answered: dict[int, int] = {}

    def take(self, verb: str, path: str, target: RequestTarget | None, user_agent: str = "") -> ApiError | None:
        scripted = super().take(verb, path, target, user_agent)
        if scripted is not None or verb == "watch" or not user_agent.startswith(self.agents):
            return scripted
        with self._lock:
            if self._rng.random() >= self.rate:
                return None
            code = self._rng.choice((500, 503, 429))
            self.answered[code] = self.answered.get(code, 0) + 1
        return ApiError(
            code,
            {500: "InternalError", 503: "ServiceUnavailable", 429: "TooManyRequests"}[code],
            f"injected random error {code}",
            {"retryAfterSeconds": 1} if code == 429 else None,
        )


def test_two_hundred_sweeps_converge_under_ten_percent_api_errors(s3_server: Any) -> None:
    """Every sweep gets exactly one RayJob and finishes; every deletion goes through the guard, which verifies the
    checkpoints each run left: exactly the runs with a corrupted checkpoint are held (verification saw the missing
    file), every other one is released as verified, and the held ones go once repaired (issue 25: an empty-root
    release looks the same whether the guard is right or wrong, so every run has real checkpoints)."""
    env, stop = start_operator_env(s3_server)
    env.poll = 0.25  # 200 sweeps to watch: the test's own reads stay a small share of the shared process
    try:
        env.operator.controller.kube.api_client.user_agent = "sweep-operator-under-test"
        injector = RandomErrors(0.10, ("kopf/", "sweep-operator-under-test"))
        env.server.emulator.errors = injector
        seen: list[tuple[str, bool, int, frozenset[str]]] = []  # what each verification saw (Events may be lost)
        controller = env.operator.controller
        real_verify = controller.verify

        def spy(client: Any, root: str, **kwargs: Any) -> Any:
            result = real_verify(client, root, **kwargs)
            seen.append((root, result.verified, result.checked, frozenset(p.kind for p in result.problems)))
            return result

        controller.verify = spy
        ns = "chaos"
        names = []
        for i in range(200):
            doc = env.new_sweep(f"c{i:03d}", namespace=ns)
            env.runner.script(doc["metadata"]["name"], Outcome.succeed(0.5))
            names.append(doc["metadata"]["name"])
            env.apply(doc)
        for name in names:
            env.wait_phase(name, "Succeeded", namespace=ns, timeout=240)
        rayjobs = env.custom.list_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, ns, constants.RAYJOB_PLURAL
        )["items"]
        per_sweep = [rj["metadata"]["labels"][constants.LABEL_SWEEP] for rj in rayjobs]
        assert sorted(per_sweep) == sorted(names), "exactly one RayJob per sweep"
        assert sum(injector.answered.values()) > 100, f"the operator met errors: {injector.answered}"
        runs = {}
        for name in names:  # each run leaves real checkpoints; every twentieth loses a file
            _, prefix = env.run_root(name, ns)
            runs[name] = (prefix, write_sweep(env.s3_client, env.bucket, prefix, trials=1, checkpoints=1, files=1))
        corrupted = set(names[::20])
        for name in corrupted:
            runs[name][1].delete_file()
        for name in names:
            env.delete_sweep(name, ns)

        def sweeps_left() -> set[str]:
            items = env.custom.list_namespaced_custom_object(constants.GROUP, constants.VERSION, ns, constants.PLURAL)
            return {s["metadata"]["name"] for s in items["items"]}

        def saw(name: str, verified: bool, kind: str = "") -> bool:
            root = f"s3://{env.bucket}/{runs[name][0]}"
            return any(
                r == root and v is verified and (not kind or kind in k) and (c > 0 or not v) for r, v, c, k in seen
            )

        wait_for(lambda: sweeps_left() <= corrupted, 240, interval=0.25, what="every intact run released")
        wait_for(lambda: all(saw(name, False, "missing-file") for name in corrupted), 240, interval=0.25, what="held")
        assert sweeps_left() == corrupted, "exactly the corrupted runs are held"
        intact = set(names) - corrupted
        assert all(saw(name, True) for name in intact), "every intact run was released on a verification that passed"
        events = env.core.list_namespaced_event(ns).items
        # A cluster KubeRay deleted when its job ended (before the run wrote checkpoints) is rightly released as
        # "nothing to protect", told on it and its sweep; no sweep's own deletion may be released that way.
        bypassed = {
            e.involved_object.name
            for e in events
            if e.reason == "CheckpointGuardBypassed" and (e.message or "").startswith("TrainingSweep ")
        }
        assert not bypassed & set(names), f"released without verification: {sorted(bypassed & set(names))}"
        for name in corrupted:
            write_sweep(env.s3_client, env.bucket, runs[name][0], trials=1, checkpoints=1, files=1)
        wait_for(lambda: not sweeps_left(), 240, interval=0.25, what="the repaired runs released")
    finally:
        stop()


# ------------------------------------------------------------------------------------------ kill -9


class OperatorProcess:
    """`python -m sweep_operator` against the emulator; `kill()` is SIGKILL (no shutdown code runs)."""

    def __init__(self, kubeconfig: Path, s3_endpoint: str, log: Path) -> None:
        self.kubeconfig, self.s3_endpoint, self.log_path = kubeconfig, s3_endpoint, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        env = {
            **os.environ,
            "SWEEP_RECONCILE_SECONDS": "1",
            "SWEEP_STATUS_POLL_SECONDS": "0.5",
            "SWEEP_S3_ENDPOINT_URL": self.s3_endpoint,
            "SWEEP_S3_REGION": "us-east-1",
            "SWEEP_METRICS_PORT": "0",
            "SWEEP_LIVENESS_PORT": "0",
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.starts += 1
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sweep_operator", "--kubeconfig", str(self.kubeconfig)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def test_kill_9_at_each_phase_converges_without_duplicates_or_unverified_release(
    tmp_path: Path, s3_server: Any, s3_client: Any
) -> None:
    """kill -9 when the sweep is admitted, when its RayJob exists, while it runs and while its deletion is held:
    a new process converges, the RayJob is created once, and the deletion waits for a verified run."""
    bucket = "kill-nine"
    s3_client.create_bucket(Bucket=bucket)
    with EmulatorServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        runner = ScriptedRunner(default=Outcome.hang())
        standin = KubeRayStandIn(server.api_client(), runner, poll_interval=0.2)
        standin.start()
        operator = OperatorProcess(kubeconfig, s3_server.endpoint_url, tmp_path / "operator.log")
        custom = kubernetes.client.CustomObjectsApi(server.api_client())
        core = kubernetes.client.CoreV1Api(server.api_client())
        try:
            from tests.support.factories import changed, cpu_sweep

            doc = changed(
                cpu_sweep("nine", "default"),
                {
                    "spec.storage.uri": f"s3://{bucket}/sweeps",
                    "spec.storage.endpointUrl": s3_server.endpoint_url,
                    "spec.storage.region": "us-east-1",
                    "spec.deletion": {
                        "verifyCheckpoints": True,
                        "verificationTimeoutSeconds": 20,
                        "retryBackoffSeconds": 1,
                        "maxRetryBackoffSeconds": 2,
                    },
                },
            )

            def sweep() -> dict[str, Any] | None:
                try:
                    return custom.get_namespaced_custom_object(
                        constants.GROUP, constants.VERSION, "default", constants.PLURAL, "nine"
                    )
                except kubernetes.client.ApiException as exc:
                    if exc.status == 404:
                        return None
                    raise

            def rayjobs() -> list[dict[str, Any]]:
                return custom.list_namespaced_custom_object(
                    constants.RAY_GROUP, constants.RAY_VERSION_API, "default", constants.RAYJOB_PLURAL
                )["items"]

            operator.start()
            custom.create_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, doc)
            # 1. admitted: kopf put the guard's finalizer on; the RayJob may or may not exist yet.
            wait_for(
                lambda: constants.FINALIZER in ((sweep() or {}).get("metadata") or {}).get("finalizers", []),
                60,
                what="finalizer",
            )
            operator.kill()
            operator.start()
            # 2. RayJob created.
            wait_for(rayjobs, 60, what="the RayJob")
            operator.kill()
            operator.start()
            # 3. Running.
            status = wait_for(
                lambda: (sweep() or {}).get("status", {}).get("phase") == "Running" and sweep()["status"],
                60,
                what="Running",
            )
            root = status["guard"]["runRoot"]
            synthetic = write_sweep(s3_client, bucket, root.split("/", 3)[3], trials=2, checkpoints=1, files=1)
            operator.kill()
            operator.start()
            # 4. Deleting, with a file missing: held.
            synthetic.delete_file()
            custom.delete_namespaced_custom_object(
                constants.GROUP, constants.VERSION, "default", constants.PLURAL, "nine"
            )

            def held_checks() -> int:
                return len(
                    [
                        e
                        for e in core.list_namespaced_event("default").items
                        if e.involved_object.name == "nine" and e.reason == "CheckpointsNotVerified"
                    ]
                )

            wait_for(lambda: held_checks() >= 1, 60, what="the deletion held")
            operator.kill()
            before = held_checks()
            operator.start()
            wait_for(lambda: held_checks() >= before + 2, 60, what="the new process re-checks and still holds")
            assert sweep() is not None and len(rayjobs()) == 1
            write_sweep(s3_client, bucket, root.split("/", 3)[3], trials=2, checkpoints=1, files=1)
            wait_for(lambda: sweep() is None and not rayjobs(), 60, what="released after the repair")
            created = [
                c
                for c in server.emulator.changes.since(0)
                if c.type == "ADDED" and c.resource.plural == constants.RAYJOB_PLURAL
            ]
            assert len(created) == 1, f"one RayJob ever created, got {len(created)}"
            assert operator.starts == 5
        finally:
            operator.stop()
            standin.stop()
