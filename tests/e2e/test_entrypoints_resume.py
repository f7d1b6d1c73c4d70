"""A RayJob retry of the same run: the driver finds the run's own prefix in use and resumes it, on purpose (R16)."""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sweep_contracts.s3_layout import RunLayout
from sweep_operator.rendering import build_rayjob
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep
from training_entrypoints.local import LocalRayCluster, LocalRaySize, run_rayjob

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
STEPS = 16


def committed_steps(layout: RunLayout) -> list[int]:
    snapshots = list(Path(layout.root, "train").glob("*/checkpoint_manager_snapshot.json"))
    if not snapshots:
        return []
    results = json.loads(snapshots[0].read_text())["checkpoint_results"]
    return sorted(int(r["checkpoint_dir_name"][-6:]) for r in results)


@pytest.mark.timeout(600)
def test_a_retried_run_resumes_its_own_experiment_and_checkpoints_R16(tmp_path: Path) -> None:
    """The first attempt dies mid-trial (its driver is stopped, as a lost RayJob attempt would be). The retry
    gets the same SWEEP_RUN_SPEC, sees the run's Tune experiment, says it is recovering, and the trial continues
    from its last committed checkpoint instead of starting over; nothing lands outside the run's prefix."""
    doc = changed(
        cpu_sweep("resume-me"),
        {
            "spec.trainLoop": "tests.support.entrypoint_loops:slow_scalar",
            "spec.paramSpace": {"steps": STEPS, "sleep_s": 0.5},
            "spec.tune": {"metric": "score", "mode": "max", "numSamples": 1, "maxConcurrentTrials": 1},
            "spec.trial": {"workers": 1, "resourcesPerWorker": {"cpu": "1", "gpu": 0, "memory": "1Gi"}},
            "spec.checkpoints": {"numToKeep": 2},
            "spec.deadlines": {"activeSeconds": 900, "startupSeconds": 120, "gracefulStopSeconds": 5},
            "spec.failurePolicy": {"workerFailures": 0, "controllerFailures": 1, "preemptionFailures": 0},
        },
    )
    rayjob = build_rayjob(
        parse_sweep(doc), "retry1", deadline_at=int(time.time()) + 900, storage_uri=str(tmp_path / "store")
    )
    size = LocalRaySize(num_cpus=2, num_gpus=0, resources={"sweep_trial_driver": 1.0})
    with LocalRayCluster(size, env={**os.environ, "PYTHONPATH": str(REPO)}) as cluster:
        stop = threading.Event()
        with ThreadPoolExecutor(max_workers=1) as pool:
            first = pool.submit(
                run_rayjob, rayjob, cluster=cluster, workdir=REPO, log_dir=tmp_path / "attempt1", stop_event=stop
            )
            layout = RunLayout(str(tmp_path / "store" / "default" / "resume-me-retry1"))
            deadline = time.monotonic() + 300
            while len(committed_steps(layout)) < 2 or max(committed_steps(layout)) < 3:
                assert not first.done(), first.result().message
                assert time.monotonic() < deadline, "the first attempt never checkpointed"
                time.sleep(0.5)
            stop.set()
            assert not first.result().ok
        stopped_at = max(committed_steps(layout))
        assert stopped_at < STEPS - 1 and not Path(layout.result_path).exists()

        second = run_rayjob(rayjob, cluster=cluster, workdir=REPO, log_dir=tmp_path / "attempt2")
    print(Path(second.log_path).read_text()[-5000:])
    assert second.ok, second.message
    assert "recovering run retry1" in Path(second.log_path).read_text()
    (trial,) = second.result["trialResults"]
    results = [
        json.loads(line) for line in (Path(layout.tune_dir) / trial["id"] / "result.json").read_text().splitlines()
    ]
    assert results[-1]["step"] == STEPS - 1
    assert results[-1]["resumed_from"] >= stopped_at + 1  # continued after the last committed checkpoint
    assert committed_steps(layout)[-1] == STEPS - 1
    assert sorted(p.name for p in tmp_path.joinpath("store").iterdir()) == ["default"]
    assert sorted(p.name for p in Path(layout.root).parent.iterdir()) == ["resume-me-retry1"]
