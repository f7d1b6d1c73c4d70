"""SIGTERM mid-sweep, as Ray's Jobs API stop sends it (the operator's graceful stop, KubeRay's StopJob): real Ray
through the local runner, whose stop models Ray's `JobSupervisor.run` (SIGTERM, SIGKILL after the job's
`RAY_JOB_STOP_WAIT_TIME_S`). Issue 26 section 0, issue 28 item 5."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts import constants, s3_layout
from sweep_operator.rendering import build_rayjob
from sweep_operator.validation import parse_sweep
from tests.e2e.async_upload_loop import release_marker, started_marker
from tests.support.factories import changed, cpu_sweep
from tests.support.waiting import wait_for
from training_entrypoints import local, ray_internals
from training_entrypoints.local import LocalRayCluster, LocalRaySize
from training_entrypoints.trial_stop import committed_checkpoint_names, uncommitted_checkpoint_names

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GRACEFUL_STOP_S = 60
STEP_S = 1.5


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    """One local Ray for the module: room for two trials of one 1-CPU worker and their drivers at once. The
    controller polls its workers every 0.5 s, so each report is seen sooner."""
    size = LocalRaySize(num_cpus=3, num_gpus=0, resources={constants.TRIAL_DRIVER_RESOURCE: 2.0})
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
    with LocalRayCluster(size, env=env, log_path=tmp_path_factory.mktemp("ray") / "ray.log") as cluster:
        yield cluster


def slow_sweep() -> dict[str, Any]:
    """3 trials, 2 at a time (1 worker of 1 CPU each), each reporting a checkpoint every STEP_S for far longer than
    the test runs; no retries (R12)."""
    return changed(
        cpu_sweep("graceful"),
        {
            "spec.trainLoop": "tests.e2e.graceful_stop_loop:train_loop",
            "spec.paramSpace": {"x": {"grid": [1, 2, 3]}, "steps": 400, "step_s": STEP_S},
            "spec.tune": {
                "metric": "score",
                "mode": "max",
                "numSamples": 1,
                "maxConcurrentTrials": 2,
                "searcher": {"type": "grid"},
                "scheduler": {"type": "fifo"},
            },
            "spec.trial": {"workers": 1, "resourcesPerWorker": {"cpu": "1", "gpu": 0, "memory": "1Gi"}},
            "spec.checkpoints": {"numToKeep": 2},
            "spec.deadlines": {"activeSeconds": 900, "startupSeconds": 120, "gracefulStopSeconds": GRACEFUL_STOP_S},
            "spec.failurePolicy": {
                "workerFailures": 0,
                "controllerFailures": 0,
                "preemptionFailures": 0,
                "trialFailures": 0,
                "jobRetries": 0,
            },
        },
    )


def committed(trial_dir: Path) -> str | None:
    """The latest checkpoint Ray's snapshot commits for a trial (None before the first)."""
    try:
        snapshot = json.loads((trial_dir / ray_internals.SNAPSHOT_FILENAME).read_text())
    except (OSError, ValueError):
        return None
    latest = snapshot.get(ray_internals.SNAPSHOT_LATEST_RESULT) or {}
    return latest.get(ray_internals.SNAPSHOT_DIR_NAME)


@pytest.mark.timeout(420)
def test_sigterm_mid_sweep_commits_each_running_trials_next_report_and_exits_within_the_window(
    tmp_path: Path, local_ray: LocalRayCluster
) -> None:
    """Two trials run, one waits. The stop (SIGTERM) starts no new trial; each running trial reports once more, and
    that report's checkpoint is the one Ray's snapshot commits; the driver records the stop in `_sweep/status.json`
    (phase Stopped, stoppedBy signal, each trial's last checkpoint), writes no result (the run stays resumable: R16)
    and exits 0 well inside RAY_JOB_STOP_WAIT_TIME_S, with no uncommitted checkpoint folder left (R11)."""
    rayjob = build_rayjob(parse_sweep(slow_sweep()), "gs1", storage_uri=str(tmp_path / "store"))
    run_root = tmp_path / "store/default/graceful-gs1"
    stop = threading.Event()
    before: dict[str, str] = {}
    stopped_at: list[float] = []

    def stop_once_both_trials_committed() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            trials = sorted((run_root / "train").glob("*")) if (run_root / "train").exists() else []
            latest = {t.name: committed(t) for t in trials}
            if len(latest) == 2 and all(latest.values()):
                before.update({k: v for k, v in latest.items() if v})
                stopped_at.append(time.monotonic())
                stop.set()
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=stop_once_both_trials_committed, daemon=True)
    watcher.start()
    outcome = local.run_rayjob(rayjob, cluster=local_ray, workdir=REPO, log_dir=tmp_path / "logs", stop_event=stop)
    ended = time.monotonic()
    driver_log = Path(outcome.log_path).read_text(errors="replace")
    print(driver_log[-8000:])  # shown when the test fails
    assert stop.is_set(), "the two trials never both committed a checkpoint"
    took = ended - stopped_at[0]
    print(f"stopped {took:.1f} s after the signal")
    assert outcome.returncode == 0 and took < GRACEFUL_STOP_S, "the driver did not stop within its window"

    status = json.loads((run_root / "_sweep/status.json").read_text())
    assert status["phase"] == "Stopped" and status["stoppedBy"] == "signal"
    assert status["stop"]["signal"] == "SIGTERM" and status["stop"]["timedOut"] is False
    assert not (run_root / "_sweep/result.json").exists()
    recorded = {t["id"]: t for t in status["stop"]["trials"]}
    assert set(recorded) == set(before), "the stop waited for other trials than the two running ones"
    train = sorted(p.name for p in (run_root / "train").iterdir())
    assert train == sorted(before), f"a new trial started after the stop: {train}"
    for trial_id, trial in recorded.items():
        assert trial["reportedAfterStop"] is True
        last = os.path.basename(trial["checkpointUri"].rstrip("/"))
        # The report Tune saw after the signal is at least what Train had committed at the signal, and committed:
        # Ray's snapshot names it (a report the trial made while Tune was stopping it may be committed after it: kept
        # too). Not strictly newer: Train commits a checkpoint before its report reaches Tune, and on a loaded machine
        # a report committed just before the signal reaches Tune after it; Tune's view is what the stop waits for
        # (reportedAfterStop), so that report is the trial's report after the stop.
        assert last >= before[trial_id]
        snapshot = json.loads((run_root / "train" / trial_id / ray_internals.SNAPSHOT_FILENAME).read_text())
        assert last in committed_checkpoint_names(snapshot)
        assert (committed(run_root / "train" / trial_id) or "") >= last
        folders = [p.name for p in (run_root / "train" / trial_id).iterdir() if p.is_dir()]
        assert uncommitted_checkpoint_names(folders, snapshot) == [], trial_id
    # The status the operator reads names the same checkpoints for each trial.
    by_id = {t["id"]: t for t in status["trialResults"]}
    assert all(by_id[t]["checkpointUri"] == recorded[t]["checkpointUri"] for t in recorded)


def upload_sweep(gate: Path) -> dict[str, Any]:
    """One trial of one worker whose two reports each upload asynchronously through a gate the test opens."""
    return changed(
        slow_sweep(),
        {
            "metadata.name": "uploads",
            "spec.trainLoop": "tests.e2e.async_upload_loop:train_loop",
            "spec.paramSpace": {"steps": 2, "gate_dir": str(gate)},
            "spec.tune": {"metric": "score", "mode": "max", "numSamples": 1, "maxConcurrentTrials": 1,
                          "searcher": {"type": "random"}, "scheduler": {"type": "fifo"}},
        },
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_a_stop_waits_for_the_asynchronous_upload_in_flight_which_commits_within_the_window(
    tmp_path: Path, local_ray: LocalRayCluster
) -> None:
    """SIGTERM while a report's asynchronous upload is in flight (held until the driver's stop says it waits for it):
    the stop waits, the upload commits (Ray's snapshot names it, no folder is left uncommitted), and the stop record
    says it waited for one upload, which committed, and missed none. Without the wait the upload would be held until
    the abort killed it."""
    gate = tmp_path / "gate"
    gate.mkdir()
    rayjob = build_rayjob(parse_sweep(upload_sweep(gate)), "gs2", storage_uri=str(tmp_path / "store"))
    run_root = tmp_path / "store/default/uploads-gs2"
    log_dir = tmp_path / "logs"
    first, second = s3_layout.checkpoint_dir_name(0), s3_layout.checkpoint_dir_name(1)
    stop = threading.Event()
    progress: list[str] = []

    def trial_committed() -> str | None:
        trials = list((run_root / "train").glob("*")) if (run_root / "train").exists() else []
        return committed(trials[0]) if trials else None

    def driver_waits_for(name: str) -> bool:
        log = (log_dir / "driver.log").read_text(errors="replace") if (log_dir / "driver.log").exists() else ""
        return any("the stop waits" in line and name in line for line in log.splitlines())

    def drive() -> None:
        wait_for(started_marker(gate, first).exists, timeout=200, interval=0.2, what="the first upload")
        release_marker(gate, first).touch()
        wait_for(lambda: trial_committed() == first, timeout=60, interval=0.2, what="the first commit")
        wait_for(started_marker(gate, second).exists, timeout=60, interval=0.2, what="the second upload")
        progress.append("stopping while the second upload is in flight")
        stop.set()
        wait_for(lambda: driver_waits_for(second), timeout=60, interval=0.2, what="the stop's wait for the upload")
        progress.append("the driver waits for it")
        release_marker(gate, second).touch()

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    outcome = local.run_rayjob(rayjob, cluster=local_ray, workdir=REPO, log_dir=log_dir, stop_event=stop)
    print(Path(outcome.log_path).read_text(errors="replace")[-8000:])  # shown when the test fails
    assert progress == ["stopping while the second upload is in flight", "the driver waits for it"], progress
    assert outcome.returncode == 0

    status = json.loads((run_root / "_sweep/status.json").read_text())
    assert status["phase"] == "Stopped" and status["stop"]["signal"] == "SIGTERM"
    uploads = status["stop"]["uploads"]
    assert (uploads["waitedFor"], uploads["committed"], uploads["notWaitedFor"]) == (1, 1, []), uploads
    assert uploads["message"] == "waited for 1 checkpoint upload(s) in flight; 1 committed"
    (trial,) = status["stop"]["trials"]
    assert (trial["uploadsWaitedFor"], trial["uploadsCommitted"], trial["uploadsNotWaitedFor"]) == (1, 1, [])
    trial_dir = run_root / "train" / trial["id"]
    snapshot = json.loads((trial_dir / ray_internals.SNAPSHOT_FILENAME).read_text())
    assert committed(trial_dir) == second and second in committed_checkpoint_names(snapshot)
    assert (trial_dir / second / "step").read_text() == "1"
    folders = [p.name for p in trial_dir.iterdir() if p.is_dir()]
    assert uncommitted_checkpoint_names(folders, snapshot) == []
