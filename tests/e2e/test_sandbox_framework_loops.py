"""The Transformers `Trainer` loop and the Lightning loop of examples/loops, side by side in one sandbox sweep on real
Ray (one local Ray per attempt, one trial each): their checkpoints are committed by Ray's own callbacks and proven at
the committed level (`sweepctl verify` exits 0); `sweepctl resume` continues each from its last committed checkpoint
(the resumed trial's first epoch is the next one); deleting the running sweep stops it gracefully through the head's
Jobs API (each trial reports once more, the RayJob goes only after its job stopped), the guard verifies and releases
it, and `sweepctl report` reads the run."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep_contracts import constants
from sweep_operator import ray_jobs
from tests.e2e.framework_loops import HOLD_AFTER_REPORTS
from tests.support.waiting import GiveUp, wait_for
from training_entrypoints import ray_internals
from training_entrypoints.trial_stop import committed_checkpoint_names

pytestmark = pytest.mark.e2e
POLL_S = 0.5  # real Ray changes state in seconds: a faster poll only takes CPU from it (2 cores)
REPO = Path(__file__).resolve().parents[2]
LOOPS = REPO / "examples" / "loops"
FRAMEWORKS = ("hf_trainer", "lightning")
GRACE_S = 60


def _manifest(name: str, hold: Path) -> dict[str, Any]:
    """The Transformers example's sweep, running both examples (one trial each) through the pacing wrapper."""
    doc = yaml.safe_load((LOOPS / "hf_trainer" / "sweep.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["trainLoop"] = "tests.e2e.framework_loops:train_loop"
    # Far more epochs than the test lets run: every stop comes from the test, never from the loops ending.
    spec["paramSpace"] = {"framework": {"grid": list(FRAMEWORKS)}, "epochs": 200, "hold_file": str(hold), "step_s": 2}
    spec["tune"].update({"metric": "val_loss", "numSamples": 1, "maxConcurrentTrials": 2, "searcher": {"type": "grid"}})
    spec["checkpoints"] = {"numToKeep": 50}  # every committed checkpoint stays listed: the epochs are the proof
    spec["deadlines"] = {"activeSeconds": 900, "startupSeconds": 300, "gracefulStopSeconds": GRACE_S}
    spec["failurePolicy"].update({"workerFailures": 0, "controllerFailures": 1, "trialFailures": 0})
    return doc


def driver_saw(s3: Any, bucket: str, prefix: str) -> dict[str, str]:
    """Each trial's latest checkpoint as the driver's Tune has taken it (`_sweep/status.json` trialResults). Not the
    snapshots in S3: Train commits a checkpoint before Tune takes its report, so a report in flight at the stop's
    signal is the trial's "next report" and carries a checkpoint already in S3."""
    try:
        body = s3.get_object(Bucket=bucket, Key=f"{prefix}/_sweep/status.json")["Body"].read()
    except s3.exceptions.NoSuchKey:
        return {}
    results = json.loads(body).get("trialResults") or []
    return {t["id"]: t["checkpointUri"].rstrip("/").split("/")[-1] for t in results if t.get("checkpointUri")}


@pytest.mark.timeout(900)
def test_transformers_and_lightning_loops_verify_resume_from_their_last_checkpoint_stop_gracefully_and_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kubernetes

    from sweep_operator.cli import main as sweepctl
    from sweep_sandbox.stack import Sandbox

    # The examples' directories as `sweepctl sandbox up --code DIR` passes them; the pacing wrapper from the repository.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")  # each report is seen sooner
    name = f"frameworks-{uuid.uuid4().hex[:4]}"
    hold = tmp_path / "hold"
    hold.write_text("the first attempt's trials hold while this file exists")
    code = tuple(LOOPS / f for f in FRAMEWORKS)
    with Sandbox(tmp_path / "state", code_dirs=code) as sandbox:
        api = kubernetes.client.CustomObjectsApi(sandbox.server.api_client())
        core = kubernetes.client.CoreV1Api(sandbox.server.api_client())
        s3 = sandbox.s3.client()
        manifest = _manifest(name, hold)
        sandbox.rewrite_storage(manifest)
        api.create_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, manifest)

        def sweep() -> dict[str, Any] | None:
            try:
                return api.get_namespaced_custom_object(
                    constants.GROUP, constants.VERSION, "default", constants.PLURAL, name
                )
            except kubernetes.client.ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        def status() -> dict[str, Any]:
            return (sweep() or {}).get("status") or {}

        def driver_logs() -> str:
            logs = sorted((tmp_path / "state" / "runs").glob("*/driver.log"))
            return "\n".join(f"--- {p}\n{p.read_text()[-4000:]}" for p in logs)

        run_id = wait_for(lambda: status().get("runId"), 120, POLL_S, what="admitted")
        prefix = f"sweeps/default/{name}-{run_id}"
        run_root = f"s3://{sandbox.bucket}/{prefix}"

        def committed() -> dict[str, list[dict[str, Any]]]:
            """Each trial's committed checkpoints' metrics, in the order Ray committed them, by framework."""
            listed = s3.list_objects_v2(Bucket=sandbox.bucket, Prefix=f"{prefix}/train/").get("Contents") or []
            found: dict[str, list[dict[str, Any]]] = {}
            for key in [o["Key"] for o in listed if o["Key"].endswith(ray_internals.SNAPSHOT_FILENAME)]:
                snapshot = json.loads(s3.get_object(Bucket=sandbox.bucket, Key=key)["Body"].read())
                names = committed_checkpoint_names(snapshot)
                rows = [r["metrics"] for r in snapshot["checkpoint_results"] if r["checkpoint_dir_name"] in names]
                if rows:
                    found[rows[0]["framework"]] = rows
            return found

        def failed_early() -> None:
            if status().get("phase") == "Failed" and hold.exists():
                raise GiveUp(f"the sweep failed: {status().get('message')}\n{driver_logs()}")

        # Attempt 1: both trials hold after their second report; the test waits until Ray committed both
        # checkpoints of each, then lets them fail there.
        def held() -> dict[str, list[dict[str, Any]]] | None:
            failed_early()
            found = committed()
            return found if all(len(found.get(f, [])) == HOLD_AFTER_REPORTS for f in FRAMEWORKS) else None

        first = wait_for(held, 400, 1.0, what="both loops committed two checkpoints")
        last_epoch = {f: float(first[f][-1]["epoch"]) for f in FRAMEWORKS}
        hold.unlink()

        def ended(phase: str, attempts: int) -> dict[str, Any] | None:
            s = status()
            rows = s.get("attempts") or []
            done = s.get("phase") == phase and len(rows) == attempts and rows[-1].get("endedAt")
            return s if done and (s.get("checkpoints") or {}).get("verifiedAt") else None

        one = wait_for(lambda: ended("Failed", 1), 240, POLL_S, what="attempt 1 ended with its trials failed")
        assert one["checkpoints"]["verified"] is True, one["checkpoints"]
        assert one["checkpoints"]["summary"] == f"{2 * HOLD_AFTER_REPORTS} committed", one["checkpoints"]
        endpoint = ["--endpoint-url", sandbox.s3.endpoint_url]
        assert sweepctl(["verify", run_root, *endpoint]) == 0

        # The resume, as a user types it: each trial continues from its last committed checkpoint.
        assert sweepctl(["resume", name, "--kubeconfig", str(sandbox.kubeconfig), "--wait", "120"]) == 0

        def resumed() -> dict[str, list[dict[str, Any]]] | None:
            if status().get("phase") == "Failed" and len(status().get("attempts") or []) == 2:
                raise GiveUp(f"attempt 2 failed: {status().get('message')}\n{driver_logs()}")
            found = committed()
            return found if all(len(found.get(f, [])) > HOLD_AFTER_REPORTS for f in FRAMEWORKS) else None

        second = wait_for(resumed, 400, 1.0, what="both loops committed a checkpoint in the resumed attempt")
        for framework in FRAMEWORKS:
            epochs = [float(m["epoch"]) for m in second[framework]]
            # The resumed attempt's first epoch is the one after the last committed checkpoint: nothing trained again.
            assert epochs[HOLD_AFTER_REPORTS] == last_epoch[framework] + 1, (framework, epochs)
            assert epochs == sorted(set(epochs)), (framework, epochs)
        two = wait_for(
            lambda: s if (s := status()).get("phase") == "Running" else None, 120, POLL_S, what="attempt 2 Running"
        )
        assert len(two["attempts"]) == 2 and two["rayJobName"].endswith("-a2"), two

        # A delete of the running sweep (what `kubectl delete tsw` sends) stops it gracefully: the operator asks the
        # head's Jobs API (the KubeRay stand-in's) to stop the job, each trial reports once more, the RayJob goes only
        # after its job stopped, and the guard verifies the checkpoints those last reports committed.
        rayjob = two["rayJobName"]
        before = wait_for(
            lambda: (lambda saw: saw if len(saw) == len(FRAMEWORKS) else None)(driver_saw(s3, sandbox.bucket, prefix)),
            120,
            POLL_S,
            what="both trials' checkpoints as the driver took them",
        )
        api.delete_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, name)
        deleting: dict[str, Any] = {}

        def released() -> bool:
            jobs = api.list_namespaced_custom_object(
                constants.RAY_GROUP, constants.RAY_VERSION_API, "default", constants.RAYJOB_PLURAL
            )["items"]
            job = next((j for j in jobs if j["metadata"]["name"] == rayjob), None)
            if job is not None and job["metadata"].get("deletionTimestamp") and not deleting:
                # The head's own view too: the RayJob's jobStatus trails it by KubeRay's next look.
                found, jobs_api = ray_jobs.job_of(job), sandbox.standin.jobs_api
                head = jobs_api.job_status(*found) if found and jobs_api is not None else None
                deleting.update(at=time.time(), jobStatus=(job.get("status") or {}).get("jobStatus"), head=head)
            return job is None and sweep() is None

        # A short poll while the held RayJob is being deleted: the guard's verification is all that keeps it there.
        wait_for(released, GRACE_S + 180, 0.1, what="the sweep and its RayJob released after the stop")
        assert "STOPPED" in (deleting.get("jobStatus"), deleting.get("head")), (
            f"the RayJob was deleted while its job still ran: {deleting}"
        )
        assert sandbox.standin.jobs_api is not None
        stops = [r for r in sandbox.standin.jobs_api.requests if r[0] == "POST" and r[1].endswith("/stop")]
        assert stops and stops[0][2] < deleting["at"], (stops, deleting)
        said = {
            e.involved_object.name
            for e in core.list_namespaced_event("default").items
            if e.reason == "CheckpointGuardReleased" and "committed" in (e.message or "")
        }
        assert name in said, said
        driver = json.loads(s3.get_object(Bucket=sandbox.bucket, Key=f"{prefix}/_sweep/status.json")["Body"].read())
        assert driver["phase"] == "Stopped" and driver["stoppedBy"] == "signal", driver
        after = committed()
        listed = s3.list_objects_v2(Bucket=sandbox.bucket, Prefix=f"{prefix}/train/").get("Contents") or []
        snapshots = {
            k.split("/")[-2]: json.loads(s3.get_object(Bucket=sandbox.bucket, Key=k)["Body"].read())
            for k in [o["Key"] for o in listed if o["Key"].endswith(ray_internals.SNAPSHOT_FILENAME)]
        }
        assert len(driver["stop"]["trials"]) == len(FRAMEWORKS), driver["stop"]
        for trial in driver["stop"]["trials"]:
            assert trial["reportedAfterStop"], trial
            last = trial["checkpointUri"].rstrip("/").split("/")[-1]
            assert last in committed_checkpoint_names(snapshots[trial["id"]])
            assert last > before[trial["id"]], "the stop's last report is not newer than the driver's before it"
        for framework in FRAMEWORKS:
            assert len(after[framework]) > len(second[framework]), (framework, after[framework])

        # The run root as it stays: verified from the command line, and reported.
        assert sweepctl(["verify", run_root, *endpoint]) == 0
        out = tmp_path / "report"
        report_args = ["report", "--storage", run_root, *endpoint, "--out", str(out)]
        started = time.monotonic()
        assert sweepctl(report_args) == 0
        data = json.loads((out / "report.json").read_text())
        curves = data["learningCurves"]["trials"]
        assert len(curves) == len(FRAMEWORKS), curves
        for curve in curves:  # each trial's curve runs over both attempts without an epoch trained twice
            assert curve["epochs"] == sorted(set(curve["epochs"])) and len(curve["epochs"]) > HOLD_AFTER_REPORTS
        print(f"report took {time.monotonic() - started:.1f} s")
        assert (out / "report.html").is_file()
