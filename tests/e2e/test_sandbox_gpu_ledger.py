"""Issue 27 as a platform team and a tenant meet it: `sweepctl sandbox up` with the operator's GPU-hour budget
settings and scripted jobs on emulated GPU pods; `kubectl apply` of one file of 8 sweeps against a namespace budget
that fits one admits exactly one; deleting them all leaves their hours in `kubectl get gpuledger`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.factories import changed, gpu_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
SWEEPCTL = [sys.executable, "-m", "sweep_operator.cli"]
BUDGET_SECONDS = 36  # GPU-seconds per hour: one sweep of 1 GPU x 30 s fits, two do not


def sweeps(bucket: str) -> list[dict[str, Any]]:
    return [
        changed(
            gpu_sweep(f"burst-{i}", "default"),
            {
                "spec.storage": {"uri": f"s3://{bucket}/sweeps", "region": "us-east-1"},
                "spec.trial": {"workers": 1, "resourcesPerWorker": {"cpu": 1, "gpu": 1, "memory": "4Gi"}},
                "spec.tune.maxConcurrentTrials": 1,
                "spec.workerGroup.minReplicas": 1,
                "spec.deadlines": {"activeSeconds": 30, "startupSeconds": 20, "gracefulStopSeconds": 0},
                "spec.deletion": {"verifyCheckpoints": False},  # the platform team's context may skip it
            },
        )
        for i in range(8)
    ]


def test_sandbox_up_with_a_namespace_budget_admits_one_of_eight_and_deletion_keeps_the_hours(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [
            *SWEEPCTL,
            "sandbox",
            "up",
            "--state-dir",
            str(state),
            "--scripted-jobs",
            "600",
            "--namespace-gpu-hour-budget",
            f"default={BUDGET_SECONDS / 3600:.6f}",
            "--gpu-hours-window-seconds",
            "3600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    try:
        wait_for(lambda: (state / "env").exists() or proc.poll() is not None, 90, what="sandbox ready")
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        exports = dict(
            line.removeprefix("export ").split("=", 1) for line in (state / "env").read_text().splitlines() if line
        )
        kenv = {**os.environ, "KUBECONFIG": str(state / "kubeconfig"), "HOME": str(tmp_path)}
        kubectl = str(Path(sys.executable).with_name("kubectl"))

        def kubectl_json(*args: str) -> Any:
            done = subprocess.run([kubectl, *args, "-o", "json"], env=kenv, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)

        path = tmp_path / "burst.yaml"
        path.write_text(yaml.safe_dump_all(sweeps(exports["SWEEP_SANDBOX_BUCKET"])))
        applied = subprocess.run([kubectl, "apply", "-f", str(path)], env=kenv, capture_output=True, text=True)
        assert applied.returncode == 0 and applied.stdout.count("created") == 8, applied.stderr

        def settled() -> list[dict[str, Any]]:
            items = [s.get("status") or {} for s in kubectl_json("get", "tsw")["items"]]
            waiting = [s for s in items if s.get("phase") == "Queued" and "namespace budget" in s.get("message", "")]
            return items if len(items) == 8 and len([s for s in items if s.get("runId")]) + len(waiting) == 8 else []

        statuses = wait_for(settled, 90, 0.5, what="each of the 8 admitted or queued for GPU-hours")
        assert len([s for s in statuses if s.get("runId")]) == 1, statuses
        wait_for(
            lambda: kubectl_json("get", "gpuledger", "gpu-hours")["status"]["usedGpuHours"] > 0,
            60,
            0.5,
            what="the admitted sweep's GPU pod measured in the ledger",
        )
        deleted = subprocess.run(
            [kubectl, "delete", "-f", str(path), "--timeout=90s"], env=kenv, capture_output=True, text=True
        )
        assert deleted.returncode == 0, deleted.stderr
        assert kubectl_json("get", "tsw")["items"] == []
        stored = wait_for(
            lambda: (lambda s: s if any(e.get("deleted") for e in s["sweeps"]) else None)(
                kubectl_json("get", "gpuledger", "gpu-hours")["status"]
            ),
            30,
            0.5,
            what="the admitted sweep's entry kept, marked deleted",
        )
        assert stored["usedGpuHours"] > 0 and stored["reservedGpuHours"] == 0, stored
        table = subprocess.run([kubectl, "get", "gpuledger"], env=kenv, capture_output=True, text=True).stdout
        assert "USED" in table and "LIMIT" in table and "WINDOW" in table and "1h" in table, table
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
