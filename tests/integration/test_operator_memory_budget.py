"""The operator as its own process (as the chart runs it, told its 512 MiB limit) beside tenants whose code wrote
hostile documents into their run roots in the S3 server: 16 MiB status.json files of nested empty lists, 40 Tune
experiment states of 4 MiB, experiment states of nested lists within the byte budget. Its peak RSS (VmHWM) grows by
less than the memory budget's share for tenants' data, and each sweep is told why (an Event, the guard's finding)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from sweep_contracts import constants, s3_layout
from sweep_operator.memory_budget import MemoryBudget, MiB
from sweep_sandbox.emulator import EmulatorServer
from sweep_sandbox.kuberay import JobPoll, KubeRayStandIn, RunPhase
from tests.support.factories import changed, cpu_sweep
from tests.support.ports import free_port
from tests.support.sweep_factory import tune_experiment_state
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

LIMIT = 512 * MiB  # the chart's default resources.limits.memory
NAMESPACE = "default"
TIMEOUT = 60.0


class GatedRun:
    """A RayJob's run that stays RUNNING until its sweep's gate opens, then succeeds."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def poll(self) -> JobPoll:
        if self.gate.is_set():
            return JobPoll(RunPhase.SUCCEEDED, "Job finished successfully.", math.inf)
        return JobPoll(RunPhase.RUNNING)

    def stop(self) -> None:
        self.gate.set()


class GatedRunner:
    def __init__(self) -> None:
        self.gates: defaultdict[str, threading.Event] = defaultdict(threading.Event)

    def start(self, rayjob: Mapping[str, Any], cluster_name: str) -> GatedRun:
        return GatedRun(self.gates[rayjob["metadata"]["labels"][constants.LABEL_SWEEP]])


def memory(pid: int, field: str) -> int:
    """VmHWM (the peak resident set) or VmRSS of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def nested_empty_lists(size: int) -> bytes:
    return b'{"trials": {"total": 1, "running": 1}, "junk": [' + b"[]," * ((size - 64) // 3) + b"[]]}"


def test_hostile_run_documents_keep_the_operator_within_its_memory_budget(tmp_path: Path, s3_server: Any) -> None:
    s3 = s3_server.client()
    bucket = f"mem-{os.urandom(4).hex()}"
    s3.create_bucket(Bucket=bucket)
    budget = MemoryBudget.from_limit(LIMIT, verifications=10, readers=18)  # the operator's pools (handlers)
    runner = GatedRunner()
    written: list[str] = []
    with EmulatorServer() as server:
        standin = KubeRayStandIn(server.api_client(), runner, poll_interval=0.2).start()
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        liveness = free_port()
        env = {
            **os.environ,
            "SWEEP_LIVENESS_PORT": str(liveness),
            "SWEEP_METRICS_PORT": "0",
            "SWEEP_RECONCILE_SECONDS": "1",
            "SWEEP_STATUS_POLL_SECONDS": "0.5",
            "SWEEP_S3_ENDPOINT_URL": s3_server.endpoint_url,
            "SWEEP_S3_REGION": "us-east-1",
            "SWEEP_MEMORY_LIMIT_BYTES": str(LIMIT),
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log = (tmp_path / "operator.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "sweep_operator", "--kubeconfig", str(kubeconfig)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        api = kubernetes.client.CustomObjectsApi(server.api_client())
        core = kubernetes.client.CoreV1Api(server.api_client())

        def status(name: str) -> dict[str, Any]:
            sweep = api.get_namespaced_custom_object(
                constants.GROUP, constants.VERSION, NAMESPACE, constants.PLURAL, name
            )
            return sweep.get("status") or {}

        def put(key: str, body: bytes) -> None:
            s3.put_object(Bucket=bucket, Key=key, Body=body)
            written.append(key)

        try:
            wait_for(lambda: _healthy(liveness), TIMEOUT, what="the operator process is up")
            names = ["status-a", "status-b", "status-c", "states-many", "states-nested"]
            for name in names:
                doc = changed(
                    cpu_sweep(name, NAMESPACE),
                    {
                        "spec.storage.uri": f"s3://{bucket}/sweeps",
                        "spec.storage.endpointUrl": s3_server.endpoint_url,
                        "spec.storage.region": "us-east-1",
                        "spec.deletion.verificationTimeoutSeconds": 30,
                    },
                )
                api.create_namespaced_custom_object(
                    constants.GROUP, constants.VERSION, NAMESPACE, constants.PLURAL, doc
                )
            roots = {}
            for name in names:
                running = wait_for(
                    lambda name=name: (s := status(name)).get("phase") == "Running" and s,
                    TIMEOUT,
                    what=f"{name} is Running",
                )
                roots[name] = f"sweeps/{NAMESPACE}/{name}-{running['runId']}"
            baseline = memory(proc.pid, "VmRSS")

            for name in names[:3]:  # polled every 0.5 s: parsed, 16 MiB of these took 360 MiB each time
                put(f"{roots[name]}/{s3_layout.STATUS_KEY}", nested_empty_lists(16 * MiB))
            fat_state = tune_experiment_state({"t0": None})
            fat_state["stats"] = {"pad": "x" * (4 * MiB)}
            fat = json.dumps(fat_state).encode()
            for i in range(40):  # read whole and held before, with no count limit
                put(f"{roots['states-many']}/tune/experiment_state-2026-12-02_10-{i:02d}-00.json", fat)
            nested = nested_empty_lists(4 * MiB)  # within the byte budget, parsed to ~90 MiB each before
            for i in range(2):
                put(f"{roots['states-nested']}/tune/experiment_state-2026-12-02_11-{i:02d}-00.json", nested)
            for name in ("states-many", "states-nested"):  # the runs end: the operator verifies them
                runner.gates[name].set()

            def told(name: str) -> bool:
                events = core.list_namespaced_event(NAMESPACE).items
                return any(e.involved_object.name == name and e.reason == "RunDocumentTooLarge" for e in events)

            for name in names[:3]:
                wait_for(lambda name=name: told(name), TIMEOUT, what=f"{name}: a Warning Event names its status.json")
            for name in ("states-many", "states-nested"):
                checked = wait_for(
                    lambda name=name: (status(name).get("checkpoints") or {}).get("problems"),
                    TIMEOUT,
                    what=f"{name}: its end-of-run verification",
                )
                assert [p["kind"] for p in checked] == ["over-budget"], checked
            peak = memory(proc.pid, "VmHWM")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            standin.stop()
            for key in written:  # the S3 server lives on for the session: give its memory back
                s3.delete_object(Bucket=bucket, Key=key)
    growth = peak - baseline
    report = f"operator RSS {baseline / MiB:.0f} MiB before, peak {peak / MiB:.0f} MiB (+{growth / MiB:.0f} MiB)"
    print(report)
    assert growth < budget.tenant_bytes, f"{report}: more than the {budget.tenant_bytes // MiB} MiB budget"
    assert peak < LIMIT, report


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False
