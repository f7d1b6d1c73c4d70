"""Continuing an ended sweep on real Ray (issue 16): attempt 1 stops at its deadline, attempt 2 reuses the run root
with more time and a raised numSamples, and Tune continues instead of restarting (R16, R7)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from sweep_contracts import constants
from sweep_contracts.s3_layout import RunLayout, checkpoint_dir_name
from sweep_operator.rendering import build_rayjob
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep
from training_entrypoints import resume
from training_entrypoints.checkpointing import MODEL_FILE, state_dict_digest
from training_entrypoints.local import LocalRayCluster, LocalRaySize, run_rayjob, runtime_env_vars

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 4
HOLD_AFTER_EPOCH = 1  # the first trial's second epoch
# Attempt 1's time budget: the driver, two trials starting at once and the second trial's four small epochs took 45 s
# on an idle 2-core machine (Ray workers, torch and gloo start-up; the epochs are ~1 s). The first trial holds after
# its second epoch, so the deadline always comes after it; only the second trial needs the budget.
FIRST_ATTEMPT_S = float(os.environ.get("SWEEPS_CONTINUE_FIRST_ATTEMPT_S", "60"))


def tune_rows(layout: RunLayout, trial_id: str) -> list[dict[str, Any]]:
    path = Path(layout.tune_dir) / trial_id / "result.json"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def experiment_state(layout: RunLayout) -> dict[str, Any]:
    found = resume.newest_experiment_state(layout.tune_dir)
    assert found is not None, f"no Tune experiment state in {layout.tune_dir}"
    return json.loads(Path(found[1]).read_text())


def committed_epochs(layout: RunLayout, trial_id: str) -> list[int]:
    snapshot = json.loads(Path(layout.snapshot_path(trial_id)).read_text())
    return sorted(int(r["checkpoint_dir_name"][-6:]) for r in snapshot["checkpoint_results"])


@pytest.mark.timeout(420)
def test_a_resumed_sweep_continues_its_trials_and_picks_the_best_over_both_attempts_R16_R7(tmp_path: Path) -> None:
    """Attempt 1: two trials at once; the first holds after its second epoch until the deadline stops it, the second
    finishes. Attempt 2 (the run spec's attempt 2, numSamples 2 -> 3, a later deadline) on the same run root: the
    finished trial is not run again, the stopped one continues at epoch 2 from exactly the weights its epoch-1
    checkpoint holds, one new trial with a new configuration runs, and the result covers all three trials."""
    hold = tmp_path / "hold"
    hold.write_text("held while this file exists")
    doc = changed(
        cpu_sweep("continue-me"),
        {
            "spec.trainLoop": "tests.support.entrypoint_loops:digits_resume_probe",
            "spec.paramSpace": {
                "lr": {"loguniform": [0.01, 0.3]},
                "hidden": 32,
                "epochs": EPOCHS,
                "hold_after_epoch": HOLD_AFTER_EPOCH,
                "hold_file": str(hold),
            },
            "spec.tune": {"metric": "val_loss", "mode": "min", "numSamples": 2, "maxConcurrentTrials": 2,
                          "searcher": {"type": "random", "seed": 5}},
            "spec.trial": {"workers": 1, "resourcesPerWorker": {"cpu": "1", "gpu": 0, "memory": "1Gi"}},
            "spec.checkpoints": {"numToKeep": 2},
            "spec.deadlines": {"activeSeconds": 600, "startupSeconds": 120, "gracefulStopSeconds": 1},
            "spec.failurePolicy": {"workerFailures": 0, "controllerFailures": 1, "preemptionFailures": 0},
        },
    )  # fmt: skip
    store = tmp_path / "store"
    size = LocalRaySize(num_cpus=2, num_gpus=0, resources={"sweep_trial_driver": 2.0})
    with LocalRayCluster(size, env={**os.environ, "PYTHONPATH": str(REPO)}) as cluster:
        rayjob = build_rayjob(
            parse_sweep(doc), "cont1", deadline_at=int(time.time() + FIRST_ATTEMPT_S), storage_uri=str(store)
        )
        first = run_rayjob(rayjob, cluster=cluster, workdir=REPO, log_dir=tmp_path / "attempt1")
        print(Path(first.log_path).read_text()[-4000:])
        layout = RunLayout(first.run_root)
        assert first.ok, first.message
        assert first.result["deadlineReached"] and first.result["attempt"] == 1
        held, finished = sorted(t["id"] for t in first.result["trialResults"])
        assert held.endswith("_00000") and finished.endswith("_00001")
        # Tune must have seen the second trial end before the deadline (else it is, rightly, continued in attempt 2).
        done = {t.id: t.done for t in resume.restored_trials(experiment_state(layout))}
        assert [r["epoch"] for r in tune_rows(layout, finished)] == list(range(EPOCHS)) and done[finished], (
            f"the machine is too busy for a {FIRST_ATTEMPT_S:g} s first attempt: raise SWEEPS_CONTINUE_FIRST_ATTEMPT_S"
        )
        assert not done[held]
        assert committed_epochs(layout, held)[-1] == HOLD_AFTER_EPOCH
        saved = torch.load(
            Path(layout.checkpoint_dir(held, checkpoint_dir_name(HOLD_AFTER_EPOCH))) / MODEL_FILE, weights_only=True
        )
        saved_digest = state_dict_digest(saved)
        rows_before = {t: tune_rows(layout, t) for t in (held, finished)}
        finished_snapshot = Path(layout.snapshot_path(finished)).read_bytes()

        # The resume: the same run root, attempt 2 in the run spec, more samples and a new deadline.
        hold.unlink()
        body = json.loads(runtime_env_vars(rayjob)[constants.ENV_RUN_SPEC])
        body["attempt"] = 2
        body["spec"]["tune"]["numSamples"] = 3
        overrides = {constants.ENV_RUN_SPEC: json.dumps(body), constants.ENV_DEADLINE_AT: str(int(time.time() + 300))}
        second = run_rayjob(
            rayjob, cluster=cluster, env_overrides=overrides, workdir=REPO, log_dir=tmp_path / "attempt2"
        )
    print(Path(second.log_path).read_text()[-4000:])
    assert second.ok, second.message
    result = second.result
    assert result["attempt"] == 2 and not result["deadlineReached"]
    assert [(a["attempt"], a["phase"]) for a in result["attempts"]] == [(1, "DeadlineExceeded"), (2, "Succeeded")]
    assert result["trials"] == {"total": 3, "pending": 0, "running": 0, "terminated": 3, "errored": 0}
    new = sorted({t["id"] for t in result["trialResults"]} - {held, finished})
    assert len(new) == 1 and new[0].endswith("_00002")
    assert result["attempts"][1]["resumedTrials"] == [held] and result["attempts"][1]["newTrials"] == new

    # The stopped trial continued after its last checkpoint, from exactly the weights that checkpoint holds.
    resumed_rows = tune_rows(layout, held)[len(rows_before[held]) :]
    assert [r["epoch"] for r in resumed_rows] == list(range(HOLD_AFTER_EPOCH + 1, EPOCHS))
    assert {(r["restored_epoch"], r["restored_digest"]) for r in resumed_rows} == {(HOLD_AFTER_EPOCH, saved_digest)}
    # The finished trial was not run again: no new result, its Train snapshot untouched.
    assert tune_rows(layout, finished) == rows_before[finished]
    assert Path(layout.snapshot_path(finished)).read_bytes() == finished_snapshot
    # The new trial is a new configuration, started fresh.
    configs = {t["id"]: t["config"]["lr"] for t in result["trialResults"]}
    assert len(set(configs.values())) == 3
    assert {r["restored_epoch"] for r in tune_rows(layout, new[0])} == {-1}

    # The best trial over both attempts.
    best_by_rows = min((min(r["val_loss"] for r in tune_rows(layout, t)), t) for t in (held, finished, new[0]))
    assert result["bestTrial"]["id"] == best_by_rows[1]
    assert result["bestTrial"]["value"] == pytest.approx(best_by_rows[0])
    status = json.loads(Path(layout.status_path).read_text())
    assert status["attempt"] == 2 and status["phase"] == "Succeeded" and status["bestTrial"] == result["bestTrial"]
