"""A user's own code in the sandbox, through kubectl as a user would (R22): `sweepctl sandbox up --code DIR` runs the
loop `sweepctl init` scaffolds (nothing of this project imported) and one that never checkpoints, side by side. The
quiet one gets the operator's Warning Event while it runs; the plain one succeeds with its checkpoints proven at the
committed level, and `kubectl delete tsw` is released by the guard once it verified them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
POLL_S = 0.5  # real Ray changes state in seconds: a faster poll only takes CPU from it (2 cores)
SWEEPCTL = [sys.executable, "-m", "sweep_operator.cli"]

QUIET_LOOP = """
import time

import ray.train


def train_loop(config):
    for epoch in range(int(config.get("epochs", 6))):
        time.sleep(float(config.get("pause", 2.0)))
        ray.train.report({"epoch": epoch, "loss": 1.0 / (epoch + 1)})
"""


@pytest.mark.timeout(900)
def test_sandbox_runs_your_code_warns_while_a_loop_saves_nothing_and_releases_a_plain_loop_after_verifying(
    tmp_path: Path,
) -> None:
    assert subprocess.run([*SWEEPCTL, "init", "demo-loop"], cwd=tmp_path, timeout=60).returncode == 0
    code = tmp_path / "demo-loop"
    (code / "quiet_loop.py").write_text(QUIET_LOOP)
    plain = yaml.safe_load((code / "sweep.yaml").read_text())
    plain["spec"]["paramSpace"].update({"epochs": 2})
    plain["spec"]["tune"].update({"numSamples": 1, "maxConcurrentTrials": 1})
    quiet = json.loads(json.dumps(plain))
    quiet["metadata"]["name"] = "quiet"
    quiet["spec"].update({"trainLoop": "quiet_loop:train_loop", "paramSpace": {"epochs": 6, "pause": 2.0}})
    quiet["spec"]["tune"].update({"metric": "loss", "searcher": {"type": "random"}})

    state = tmp_path / "state"
    output = (tmp_path / "sandbox-up.log").open("w")  # a file, not a pipe nobody reads: a full pipe blocks it
    proc = subprocess.Popen(
        [*SWEEPCTL, "sandbox", "up", "--state-dir", str(state), "--code", str(code)],
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    try:
        wait_for(lambda: (state / "env").exists() or proc.poll() is not None, 90, what="sandbox ready")
        assert proc.poll() is None, (tmp_path / "sandbox-up.log").read_text()
        exports = dict(
            line.removeprefix("export ").split("=", 1) for line in (state / "env").read_text().splitlines() if line
        )
        for manifest in (plain, quiet):  # the sandbox's bucket, as `sweepctl sandbox run` rewrites it
            manifest["spec"]["storage"] = {
                "uri": f"s3://{exports['SWEEP_SANDBOX_BUCKET']}/sweeps",
                "region": "us-east-1",
            }
        kenv = {**os.environ, "KUBECONFIG": str(state / "kubeconfig"), "HOME": str(tmp_path)}
        kubectl = str(Path(sys.executable).with_name("kubectl"))

        def run(*args: str) -> str:
            done = subprocess.run([kubectl, *args], env=kenv, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            return done.stdout

        def sweep(name: str) -> dict[str, Any]:
            return json.loads(run("get", "tsw", name, "-o", "json"))

        def events(name: str) -> list[dict[str, Any]]:
            items = json.loads(run("get", "events", "-o", "json"))["items"]
            return [e for e in items if e["involvedObject"]["name"] == name]

        path = tmp_path / "sweeps.yaml"
        path.write_text(yaml.safe_dump_all([plain, quiet]))
        assert run("apply", "-f", str(path)).count("created") == 2

        # While it runs: the quiet loop's trial has reported 3 times with nothing committed. The Event and the
        # condition come from one pass, but are two writes: each is waited for.
        def warned() -> dict[str, Any] | None:
            status = sweep("quiet").get("status") or {}
            said = [e for e in events("quiet") if e["reason"] == "NoCommittedCheckpoint" and e["type"] == "Warning"]
            committed = [c for c in status.get("conditions") or [] if c["type"] == "CheckpointsCommitted"]
            return (
                {**status, "committed": committed[0]}
                if said and committed and status.get("phase") == "Running"
                else None
            )

        status = wait_for(warned, 300, POLL_S, what="NoCommittedCheckpoint while the quiet sweep runs")
        condition = status["committed"]
        assert condition["status"] == "False" and "nothing to resume from or protect" in condition["message"]

        done = wait_for(
            lambda: (
                s if (s := sweep("demo-loop").get("status") or {}).get("checkpoints", {}).get("verifiedAt") else None
            ),
            600,
            POLL_S,
            what="the plain sweep finished and verified",
        )
        assert done["phase"] == "Succeeded", done
        assert done["checkpoints"]["summary"].endswith(" committed"), done["checkpoints"]
        assert "demo-loop" in run("get", "tsw") and done["checkpoints"]["summary"] in run("get", "tsw", "demo-loop")

        run("delete", "tsw", "demo-loop", "--timeout=300s")
        # the guard verified at the deletion and said what it proved (an Event is read with a wait)
        wait_for(
            lambda: [
                e
                for e in events("demo-loop")
                if e["reason"] == "CheckpointGuardReleased" and "committed" in (e.get("message") or "")
            ],
            120,
            POLL_S,
            what="CheckpointGuardReleased naming the committed level on the sweep",
        )
        run("delete", "tsw", "quiet", "--timeout=300s")
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        output.close()
