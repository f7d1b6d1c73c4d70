"""The done-when of issue 26 section 0 on the sandbox with real Ray: a delete of a running sweep (what `kubectl delete
tsw` sends) stops it gracefully. The operator asks the head's Jobs API (the KubeRay stand-in's, on loopback) to stop
the job; the driver gets SIGTERM, lets each running trial report once more and records the stop; the RayJob goes
only after the job stopped, and the guard verified the checkpoints those last reports committed (issue 28 item 5)."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator import ray_jobs
from tests.e2e.test_entrypoints_graceful_stop import slow_sweep
from tests.support.factories import changed
from tests.support.waiting import wait_for
from training_entrypoints import ray_internals
from training_entrypoints.trial_stop import committed_checkpoint_names

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.5  # real Ray changes state in seconds: a faster poll only takes CPU from it (2 cores)


@pytest.mark.timeout(600)
def test_deleting_a_running_sandbox_sweep_stops_it_gracefully_and_verifies_its_last_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kubernetes

    from sweep_sandbox.stack import Sandbox

    # The sandbox runs each driver with its run folder as workdir: the test's train loop comes from the repository.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    name = f"gstop-{uuid.uuid4().hex[:4]}"
    manifest = changed(slow_sweep(), {"metadata.name": name, "spec.deadlines.gracefulStopSeconds": 60})
    with Sandbox(tmp_path / "state") as sandbox:
        api = kubernetes.client.CustomObjectsApi(sandbox.server.api_client())
        sandbox.rewrite_storage(manifest)
        api.create_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, manifest)
        s3 = sandbox.s3.client()

        def get(plural: str, obj: str, group: str = constants.RAY_GROUP) -> dict[str, Any] | None:
            version = constants.VERSION if group == constants.GROUP else constants.RAY_VERSION_API
            try:
                return api.get_namespaced_custom_object(group, version, "default", plural, obj)
            except kubernetes.client.ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        status = wait_for(
            lambda: (
                ((get(constants.PLURAL, name, constants.GROUP) or {}).get("status") or {}).get("runId")
                and get(constants.PLURAL, name, constants.GROUP)["status"]
            ),  # type: ignore[index]  # checked just before
            300,
            POLL_S,
            what="admitted",
        )
        prefix = f"sweeps/default/{name}-{status['runId']}"

        def snapshots() -> dict[str, dict[str, Any]]:
            listed = s3.list_objects_v2(Bucket=sandbox.bucket, Prefix=f"{prefix}/train/").get("Contents") or []
            keys = [o["Key"] for o in listed if o["Key"].endswith(ray_internals.SNAPSHOT_FILENAME)]
            return {
                k.split("/")[-2]: json.loads(s3.get_object(Bucket=sandbox.bucket, Key=k)["Body"].read()) for k in keys
            }

        def driver_saw() -> dict[str, str]:
            """Each trial's latest checkpoint as the driver's Tune has taken it (`_sweep/status.json` trialResults).
            Not the snapshots in S3: Train commits a checkpoint before Tune takes its report, so a report in flight
            at the signal is the trial's "next report" and carries the checkpoint already in S3."""
            try:
                body = s3.get_object(Bucket=sandbox.bucket, Key=f"{prefix}/_sweep/status.json")["Body"].read()
            except s3.exceptions.NoSuchKey:
                return {}
            results = json.loads(body).get("trialResults") or []
            return {t["id"]: t["checkpointUri"].rstrip("/").split("/")[-1] for t in results if t.get("checkpointUri")}

        before = wait_for(
            lambda: (lambda s: s if len(s) == 2 else None)(driver_saw()), 400, POLL_S, what="two trials reported"
        )
        rayjob = get(constants.PLURAL, name, constants.GROUP)["status"]["rayJobName"]  # type: ignore[index]  # exists
        asked_at = time.time()
        api.delete_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, name)

        deleting: dict[str, Any] = {}

        def rayjob_gone() -> bool:
            job = get(constants.RAYJOB_PLURAL, rayjob)
            if job is not None and job["metadata"].get("deletionTimestamp") and not deleting:
                # The head's own view too: the RayJob's jobStatus trails it by KubeRay's next look.
                found = ray_jobs.job_of(job)  # the head Service's name, which reaches the sandbox's Jobs API
                jobs_api = sandbox.standin.jobs_api
                head = jobs_api.job_status(*found) if found and jobs_api is not None else None
                deleting.update(at=time.time(), jobStatus=(job.get("status") or {}).get("jobStatus"), head=head)
            return job is None and get(constants.PLURAL, name, constants.GROUP) is None

        wait_for(rayjob_gone, 240, interval=0.05, what="the sweep and its RayJob released")
        took = time.time() - asked_at
        print(f"deleted {took:.1f} s after the delete was asked")
        assert "STOPPED" in (deleting.get("jobStatus"), deleting.get("head")), (
            f"the RayJob was deleted while its job still ran: {deleting}"
        )
        assert sandbox.standin.jobs_api is not None
        stops = [r for r in sandbox.standin.jobs_api.requests if r[0] == "POST" and r[1].endswith("/stop")]
        assert stops and stops[0][2] < deleting["at"]

        driver = json.loads(s3.get_object(Bucket=sandbox.bucket, Key=f"{prefix}/_sweep/status.json")["Body"].read())
        assert driver["phase"] == "Stopped" and driver["stoppedBy"] == "signal", driver
        after = snapshots()
        for trial in driver["stop"]["trials"]:
            assert trial["reportedAfterStop"], trial
            last = trial["checkpointUri"].rstrip("/").split("/")[-1]
            assert last in committed_checkpoint_names(after[trial["id"]])
            assert last > before[trial["id"]], "the stop's last report is not newer than the driver's before it"
