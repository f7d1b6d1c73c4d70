"""What the operator copies from the run's documents into a sweep's status is bounded: the tenant's code writes
`_sweep/status.json` and `result.json`, and the status is rewritten on every change."""

from __future__ import annotations

import json
from typing import Any

from sweep_operator import status as sweep_status
from tests.unit import test_controller
from tests.unit.test_controller import World, add_sweep

world = test_controller.world  # the controller tests' fixture: a controller on the fake API and S3

# About 450 KiB of JSON: the finding measured 900 KiB, but a status.json over 512 KiB is no longer read at all (the
# operator's memory budget, tests/unit/test_memory_budget.py); within that, the copy is bounded here.
HUGE_CONFIG = {f"param_{i:05d}": "x" * 90 for i in range(4500)}


def _running_with_progress(world: World, best: dict[str, Any]) -> dict[str, Any]:
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Running", jobStatus="RUNNING")
    world.put(
        f"bucket/sweeps/ml/digits-{status['runId']}/_sweep/status.json",
        json.dumps({"trials": {"total": 8, "running": 2}, "bestTrial": best}).encode(),
    )
    world.reconcile("digits")
    return world.kube.objects[("TrainingSweep", "ml", "digits")]


def test_a_huge_best_config_is_replaced_by_a_note_of_its_size(world: World) -> None:
    """A 900 KiB bestTrial.config made a 905 KiB TrainingSweep. The config is copied up to 4 KiB of JSON; over it,
    a short note says it was too large and how large; the sweep object stays small."""
    sweep = _running_with_progress(world, {"id": "t1", "metric": "val_loss", "value": 0.25, "config": HUGE_CONFIG})
    best = sweep["status"]["bestTrial"]
    size = len(json.dumps(HUGE_CONFIG, separators=(",", ":")).encode())
    assert best["config"]["bytes"] == size > 400 * 1024
    assert f"is {size} bytes of JSON, over the 4096" in best["config"]["omitted"]
    assert (best["id"], best["metric"], best["value"]) == ("t1", "val_loss", 0.25)
    assert len(json.dumps(sweep)) < 64 * 1024, "the whole TrainingSweep"


def test_the_best_trials_strings_are_cut_and_wrong_types_left_out(world: World) -> None:
    """bestTrial.id, metric and checkpointUri are the tenant's strings: each is cut to its bound (saying its length);
    a value of another type than the schema's (or a number no API server stores) is left out, since the API server
    would refuse the whole status write."""
    long = "t" * 100_000
    sweep = _running_with_progress(
        world,
        {"id": long, "metric": long, "value": 10**400, "config": {"lr": float("nan")}, "checkpointUri": "s3://" + long},
    )
    best = sweep["status"]["bestTrial"]
    assert len(best["id"]) == sweep_status.MAX_BEST_ID_CHARS and best["id"].endswith("(100000 characters)")
    assert len(best["metric"]) == sweep_status.MAX_BEST_METRIC_CHARS
    assert len(best["checkpointUri"]) == sweep_status.MAX_BEST_URI_CHARS and best["checkpointUri"].startswith("s3://")
    assert "value" not in best and "not plain JSON" in best["config"]["omitted"]
    assert sweep_status.best_trial({"bestTrial": {"id": ["a"], "metric": {"x": 1}, "checkpointUri": 7}}) == {}


def test_a_config_within_the_bound_is_copied_as_it_is() -> None:
    config = {"lr": 0.01, "hidden": 128, "layers": [64, 32], "optimizer": {"name": "adam", "betas": [0.9, 0.999]}}
    best = sweep_status.best_trial({"bestTrial": {"id": "t2", "value": 0.1, "config": config}})
    assert best == {"id": "t2", "value": 0.1, "config": config}
