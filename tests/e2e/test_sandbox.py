"""The product a newcomer meets, end to end with real Ray on CPU: `sweepctl sandbox run` and `sandbox up`,
and the checkpoint guard (R22) holding a real sweep whose committed checkpoint lost an object."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep_contracts import constants
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
# Real Ray changes state in seconds: a faster poll of the emulator only takes CPU from it (2 cores).
POLL_S = 0.5
REPO = Path(__file__).resolve().parents[2]
SWEEPCTL = [sys.executable, "-m", "sweep_operator.cli"]


def test_sandbox_run_digits_succeeds_verifies_and_the_guard_releases(tmp_path: Path) -> None:
    """`make demo`'s command: Succeeded, checkpoints verified in S3, deletion released by the guard (R22)."""
    proc = subprocess.run(
        [
            *SWEEPCTL,
            "sandbox",
            "run",
            "--sweep",
            str(REPO / "examples" / "digits-cpu.yaml"),
            "--track",
            "--then-delete",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=tmp_path,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"{out}\n{proc.stderr}\n{(tmp_path / 'state' / 'sandbox.log').read_text()[-4000:]}"
    assert "storage.uri" not in out or "(the sandbox's bucket)" in out
    assert "Succeeded" in out and "trials [" in out
    assert "checkpoints: verified" in out
    assert "NAME" in out and "VERIFIED" in out and "digits-cpu" in out  # the kubectl get tsw table
    assert "CheckpointGuardReleased" in out and "guard: released the sweep" in out
    # Tracked in the sandbox's own MLflow server: its URL said when the sweep starts, the parent run's at the end.
    server = re.search(
        r"sandbox: tracking the trials in MLflow at (http://127\.0\.0\.1:\d+) \(experiment digits-cpu\)", out
    )
    assert server is not None, out
    assert re.search(rf"tracking:    {re.escape(server.group(1))}/\S+ \(MLflow parent run", out), out
    # What README.md's capture shows, line for line in shape (tools/demo_capture.py); the README is regenerated
    # from a run like this one.
    from tools.demo_capture import check

    assert check(out) == [], out
    # It leaves something to look at once its servers are gone: the report and the run root, at the paths it prints.
    # (paths as typed here: relative to the directory it ran in)
    report = tmp_path / "state" / "report" / "report.html"
    assert "report: state/report/report.html   (open it in a browser)" in out and report.stat().st_size > 0
    (kept,) = (tmp_path / "state" / "run-root" / "default").iterdir()
    assert f"verify state/run-root/default/{kept.name}" in out and (kept / "_sweep" / "result.json").is_file()
    verified = subprocess.run([*SWEEPCTL, "verify", str(kept)], capture_output=True, text=True, timeout=300)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _small_digits(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "digits-cpu.yaml").read_text())
    doc["metadata"]["name"] = name
    # One trial, one worker, one epoch: one committed checkpoint is all this test needs.
    doc["spec"]["paramSpace"] = {"lr": 0.05, "hidden": 32, "epochs": 1, "batch_size": 64}
    doc["spec"]["tune"].update({"numSamples": 1, "maxConcurrentTrials": 1})
    doc["spec"]["trial"]["workers"] = 1
    doc["spec"]["deletion"] = {**doc["spec"].get("deletion", {}), "retryBackoffSeconds": 2, "maxRetryBackoffSeconds": 4}
    return doc


def test_guard_holds_sweep_rayjob_and_cluster_until_a_deleted_checkpoint_object_is_restored(tmp_path: Path) -> None:
    """R22 on a real run: one committed checkpoint object deleted from S3 keeps the sweep, its RayJob and its
    RayCluster, with CheckpointsVerified=False naming the object; restoring it lets the deletion finish."""
    import kubernetes

    from sweep_sandbox.stack import Sandbox

    name = f"guarded-{uuid.uuid4().hex[:4]}"
    with Sandbox(tmp_path / "state") as sandbox:
        api = kubernetes.client.CustomObjectsApi(sandbox.server.api_client())
        manifest = _small_digits(name)
        sandbox.rewrite_storage(manifest)
        api.create_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, manifest)

        def status() -> dict[str, Any]:
            obj = api.get_namespaced_custom_object(
                constants.GROUP, constants.VERSION, "default", constants.PLURAL, name
            )
            return obj.get("status") or {}

        final = wait_for(
            lambda: status() if (status().get("checkpoints") or {}).get("verifiedAt") else None,
            600,
            POLL_S,
            what="finished and verified",
        )
        assert final["phase"] == "Succeeded" and final["checkpoints"]["verified"] is True, final
        s3 = sandbox.s3.client()
        _report_matches_what_tune_recorded(sandbox, s3, name, final, tmp_path)
        prefix = f"sweeps/default/{name}-{final['runId']}/train/"
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=sandbox.bucket, Prefix=prefix)["Contents"]]
        victim = next(k for k in keys if "/checkpoint_epoch-" in k and not k.endswith(("/", ".json")))
        body = s3.get_object(Bucket=sandbox.bucket, Key=victim)["Body"].read()
        s3.delete_object(Bucket=sandbox.bucket, Key=victim)

        rayjob, cluster = final["rayJobName"], final["rayClusterName"]
        api.delete_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, name)

        def held() -> dict[str, Any] | None:
            found = status()
            names_victim = any(
                c["type"] == "CheckpointsVerified" and c["status"] == "False" and victim in c["message"]
                for c in found.get("conditions") or []
            )
            return found if names_victim and (found.get("checkpoints") or {}).get("verified") is False else None

        first = wait_for(held, 120, POLL_S, what="CheckpointsVerified=False naming the deleted object")
        # Still held: the guard verified again (its backoff is the manifest's) and held again, not a fixed wait.
        checked = first["checkpoints"]["verifiedAt"]
        wait_for(
            lambda: (again := held()) is not None and again["checkpoints"]["verifiedAt"] != checked,
            120,
            POLL_S,
            what="a second verification that holds",
        )
        for plural, obj in ((constants.RAYJOB_PLURAL, rayjob), (constants.RAYCLUSTER_PLURAL, cluster)):
            assert api.get_namespaced_custom_object(
                constants.RAY_GROUP, constants.RAY_VERSION_API, "default", plural, obj
            )
        assert api.get_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, name)

        s3.put_object(Bucket=sandbox.bucket, Key=victim, Body=body)

        def all_gone() -> bool:
            items = [
                api.list_namespaced_custom_object(g, v, "default", p, label_selector=f"{constants.LABEL_SWEEP}={name}")[
                    "items"
                ]
                for g, v, p in (
                    (constants.GROUP, constants.VERSION, constants.PLURAL),
                    (constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYJOB_PLURAL),
                    (constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYCLUSTER_PLURAL),
                )
            ]
            sweep_gone = not [o for o in items[0] if o["metadata"]["name"] == name] and not _exists(api, name)
            return sweep_gone and not items[1] and not items[2]

        wait_for(all_gone, 120, POLL_S, what="sweep, RayJob and RayCluster released after the restore")


def _report_matches_what_tune_recorded(
    sandbox: Any, s3: Any, name: str, status: dict[str, Any], tmp_path: Path
) -> None:
    """`sweepctl report NAME` on a real sandbox sweep (issue 17): its curve is the val_loss Tune recorded."""
    import json

    from sweep_operator.cli import main as sweepctl

    assert sweepctl(["report", name, "--kubeconfig", str(sandbox.kubeconfig), "--out", str(tmp_path / "report")]) == 0
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    prefix = f"sweeps/default/{name}-{status['runId']}/tune/"
    (key,) = [
        o["Key"]
        for o in s3.list_objects_v2(Bucket=sandbox.bucket, Prefix=prefix)["Contents"]
        if o["Key"].endswith("/result.json")
    ]
    rows = [
        json.loads(line)
        for line in s3.get_object(Bucket=sandbox.bucket, Key=key)["Body"].read().decode().splitlines()
        if line
    ]
    (curve,) = data["learningCurves"]["trials"]
    assert curve["best"] and curve["trial"] == status["bestTrial"]["id"]
    assert curve["values"] == [r["val_loss"] for r in rows] and curve["epochs"] == [float(r["epoch"]) for r in rows]
    assert [c["status"] for c in data["checkpoints"]] == ["verified"]
    assert (tmp_path / "report" / "report.html").stat().st_size > 10_000


def _exists(api: Any, name: str) -> bool:
    import kubernetes

    try:
        api.get_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, name)
        return True
    except kubernetes.client.ApiException as exc:
        return exc.status != 404


def _marked_processes(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_sandbox_up_serves_kubectl_and_sigterm_leaves_nothing_running(tmp_path: Path) -> None:
    state = tmp_path / "state"
    marker = f"SWEEP_TEST_MARKER={uuid.uuid4().hex}"
    env = {**os.environ, marker.split("=")[0]: marker.split("=")[1]}
    proc = subprocess.Popen(
        [*SWEEPCTL, "sandbox", "up", "--state-dir", str(state), "--mlflow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        wait_for(lambda: (state / "env").exists() or proc.poll() is not None, 90, what="sandbox ready")
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        exports = dict(
            line.removeprefix("export ").split("=", 1) for line in (state / "env").read_text().splitlines() if line
        )
        assert set(exports) == {
            "KUBECONFIG",
            "AWS_ENDPOINT_URL",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION",
            "SWEEP_SANDBOX_BUCKET",
            "PATH",  # this interpreter's bin first: the tested kubectl and kubectl-sweep (issue 28, item 9)
        }
        assert exports["PATH"].startswith(str(Path(sys.executable).parent)), exports["PATH"]
        kenv = {**os.environ, "KUBECONFIG": str(state / "kubeconfig")}
        kubectl = str(Path(sys.executable).with_name("kubectl"))
        manifest = yaml.safe_load((REPO / "examples" / "review-scalar.yaml").read_text())
        manifest["spec"]["suspend"] = True  # no RayJob: this test is about the sandbox, not training
        path = tmp_path / "sweep.yaml"
        path.write_text(yaml.safe_dump(manifest))

        def kubectl_ok(*args: str) -> str:
            done = subprocess.run([kubectl, *args], env=kenv, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert "created" in kubectl_ok("apply", "-f", str(path))
        wait_for(
            lambda: "Suspended" in kubectl_ok("get", "tsw", "review-scalar"),
            30,
            POLL_S,
            what="Suspended in kubectl get tsw",
        )
        assert "review-scalar" in kubectl_ok("get", "trainingsweeps", "-o", "name")
        # --mlflow: the tracking server sweeps can name, up and answering (and stopped with the rest below).
        printed: list[str] = []
        while proc.stdout and len(printed) < 12 and printed[-1:] != [""]:  # its ready message, printed at once
            printed.append(proc.stdout.readline())
            if printed[-1].strip().startswith("MLflow "):
                break
        mlflow = printed[-1].split()[1] if printed and printed[-1].strip().startswith("MLflow ") else ""
        assert mlflow.startswith("http://127.0.0.1:"), printed
        with urllib.request.urlopen(f"{mlflow}/health", timeout=10) as reply:
            assert reply.status == 200
        assert "Events" in kubectl_ok("describe", "tsw", "review-scalar")
        kubectl_ok("delete", "tsw", "review-scalar", "--timeout=60s")
        assert (
            "No resources found"
            in subprocess.run([kubectl, "get", "tsw"], env=kenv, capture_output=True, text=True, timeout=60).stderr
        )
        assert _marked_processes(marker), "the marker must be visible in the sandbox's own environment"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0
    output = proc.stdout.read() if proc.stdout else ""
    assert "sandbox: stopped." in output
    # The sandbox reaps what it started before it exits; a loaded machine may still be tearing a process down.
    try:
        wait_for(lambda: _marked_processes(marker) == [], 15, 0.2, what="the sandbox's processes gone")
    except TimeoutError:
        raise AssertionError(f"a process started by the sandbox outlived it: {_marked_processes(marker)}") from None
