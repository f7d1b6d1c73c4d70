"""`python -m sweep_operator` as its own process, configured only by SWEEP_* variables (the chart's ConfigMap):
kopf's liveness endpoint, Prometheus metrics, a sweep reconciled, and a clean stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from sweep_contracts import constants
from sweep_sandbox.emulator import EmulatorServer
from tests.support.factories import changed, cpu_sweep
from tests.support.ports import free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def http_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    with EmulatorServer() as server:
        yield server


def test_operator_process_serves_liveness_and_metrics_and_reconciles(
    emulator: EmulatorServer, tmp_path: Path, s3_server: Any
) -> None:
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    metrics_port, liveness_port = free_port(), free_port()
    env = {
        **os.environ,
        "SWEEP_METRICS_PORT": str(metrics_port),
        "SWEEP_LIVENESS_PORT": str(liveness_port),
        "SWEEP_RECONCILE_SECONDS": "1",
        "SWEEP_S3_ENDPOINT_URL": s3_server.endpoint_url,
        "SWEEP_MAX_GPUS_PER_SWEEP": "4",
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    log = (tmp_path / "operator.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweep_operator", "--kubeconfig", str(kubeconfig)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: http_get(f"http://127.0.0.1:{liveness_port}/healthz")[0] == 200, 60, what="kopf liveness endpoint"
        )
        api = kubernetes.client.CustomObjectsApi(emulator.api_client())
        doc = changed(cpu_sweep("proc-sweep", "default"), {"spec.storage.endpointUrl": s3_server.endpoint_url})
        api.create_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, doc)
        status = wait_for(
            lambda: (
                api.get_namespaced_custom_object(
                    constants.GROUP, constants.VERSION, "default", constants.PLURAL, "proc-sweep"
                ).get("status")
                or {}
            ).get("rayJobName"),
            60,
            what="the operator process created the RayJob",
        )
        assert api.get_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, "default", constants.RAYJOB_PLURAL, status
        )
        code, body = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert code == 200
        assert 'trainingsweep_sweeps{namespace="default",phase="Starting"} 1.0' in body
        for name in (
            "trainingsweep_reconcile_duration_seconds",
            "trainingsweep_verification_duration_seconds",
            "trainingsweep_deadline_stops_total",
            "trainingsweep_queued_sweeps",
        ):
            assert name in body, name
        # A setting the operator could not use stops it at startup with the variable named.
        bad = subprocess.run(
            [sys.executable, "-m", "sweep_operator", "--kubeconfig", str(kubeconfig)],
            env={**env, "SWEEP_MAX_GPUS_PER_SWEEP": "lots"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad.returncode != 0 and "SWEEP_MAX_GPUS_PER_SWEEP" in bad.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        log.close()
    assert code == 0, (tmp_path / "operator.log").read_text()[-3000:]
