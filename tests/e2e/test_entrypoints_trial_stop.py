"""A trial Tune stops frees its Train worker group (real Ray through `sweepctl run-local`, room for one trial's workers).

Without Train's `abort()` on a stop, the stopped trial's placement group stays reserved until the driver exits
(Ray #54305, #58515) and the next trial's worker group never starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep_operator.cli import main
from tests.e2e.stop_probe_loop import PROBE_DIR_ENV
from tests.support.factories import changed, cpu_sweep
from training_entrypoints import trial_stop

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MAX_T = 2
# x=3 scores best and runs to maxT, stopped by Tune on its last report; the others fall below ASHA's cutoff at the
# first rung with 3 reports still to make: their controllers are held in a report nobody reads when Tune stops them
# (the case where the abort has to drain the report queue to get through).
X_GRID = [3, 1, 0, -1]
STEPS = 4


def asha_sweep() -> dict[str, Any]:
    """4 trials, one at a time; one worker per trial that takes every logical CPU the local Ray has, so a trial's
    worker group fits only once the last one's placement group is gone; no retries (R12), so a leak fails fast."""
    return changed(
        cpu_sweep("asha-stop"),
        {
            "spec.trainLoop": "tests.e2e.stop_probe_loop:train_loop",
            "spec.paramSpace": {"x": {"grid": X_GRID}, "steps": STEPS, "steps_at_x_3": MAX_T},
            "spec.tune": {
                "metric": "score",
                "mode": "max",
                "numSamples": 1,
                "maxConcurrentTrials": 1,
                "searcher": {"type": "grid"},
                "scheduler": {"type": "asha", "maxT": MAX_T, "gracePeriod": 1},
            },
            "spec.trial": {
                "workers": 1,
                "resourcesPerWorker": {"cpu": str(os.cpu_count() or 1), "gpu": 0, "memory": "1Gi"},
            },
            "spec.checkpoints": {"numToKeep": 2},
            "spec.deadlines": {"activeSeconds": 600, "startupSeconds": 120, "gracefulStopSeconds": 10},
            "spec.failurePolicy": {
                "workerFailures": 0,
                "controllerFailures": 0,
                "preemptionFailures": 0,
                "trialFailures": 0,
                "jobRetries": 0,
            },
        },
    )


def worker_group_ids(table: dict[str, Any]) -> set[str]:
    """Train worker groups ask for CPUs; Tune's trial-driver groups ask for the trial-driver slot only."""
    return {pg for pg, row in table.items() if any(b.get("CPU", 0) > 0 for b in row["bundles"].values())}


@pytest.mark.timeout(420)
def test_asha_stops_free_each_trials_worker_group_so_all_four_trials_run_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ASHA stops three trials at the first rung and the best one on its last report, at maxT (R13); each stop ends
    the trial's Train run through `TrainController.abort()`, so when the next trial's worker group is up, no earlier
    group is alive (R14). The stopped trials end TERMINATED and the sweep Succeeded on its own (R12: no retry hides a
    leak); the checkpoint folders the stops left uncommitted are gone (R11), the committed ones kept (R7)."""
    probes = tmp_path / "probes"
    probes.mkdir()
    monkeypatch.setenv(PROBE_DIR_ENV, str(probes))
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")  # the controller sees each report sooner (default 2)
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(yaml.safe_dump(asha_sweep()))
    monkeypatch.chdir(REPO)  # the driver's workdir (PYTHONPATH) must hold tests.e2e.stop_probe_loop

    code = main(
        [
            "run-local", "-f", str(manifest),
            "--storage", str(tmp_path / "store"),
            "--run-id", "stop1",
            "--log-dir", str(tmp_path / "logs"),
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    driver_log = (tmp_path / "logs" / "driver.log").read_text(errors="replace")
    print(out, err[-3000:], driver_log[-8000:])  # shown when the test fails
    assert code == 0, "the sweep did not succeed: see the driver log above"

    run_root = tmp_path / "store/default/asha-stop-stop1"
    result = json.loads((run_root / "_sweep/result.json").read_text())
    assert result["trials"] == {"total": 4, "pending": 0, "running": 0, "terminated": 4, "errored": 0}
    assert sorted(t["status"] for t in result["trialResults"]) == ["TERMINATED"] * 4
    assert result["bestTrial"]["config"]["x"] == 3
    assert json.loads((run_root / "_sweep/status.json").read_text())["phase"] == "Succeeded"

    # Each trial's rank 0 saw the placement-group table once its own worker group was up.
    seen = sorted((json.loads(p.read_text()) for p in probes.glob("*.json")), key=lambda d: d["at"])
    assert len(seen) == 4, [d["trial"] for d in seen]
    for earlier_count, probe in enumerate(seen):
        earlier = [d["own"] for d in seen[:earlier_count]]
        alive = {pg for pg in worker_group_ids(probe["table"]) if probe["table"][pg]["state"] != "REMOVED"}
        assert alive == {probe["own"]}, f"{probe['trial']} started with worker groups {alive} alive"
        assert all(probe["table"].get(pg, {"state": "REMOVED"})["state"] == "REMOVED" for pg in earlier)

    # Every stop left its trial with committed checkpoints only.
    for trial_dir in sorted((run_root / "train").iterdir()):
        snapshot = json.loads((trial_dir / "checkpoint_manager_snapshot.json").read_text())
        folders = [p.name for p in trial_dir.iterdir() if p.is_dir()]
        assert trial_stop.uncommitted_checkpoint_names(folders, snapshot) == [], trial_dir.name
        assert any(name.startswith("checkpoint_") for name in folders), trial_dir.name
