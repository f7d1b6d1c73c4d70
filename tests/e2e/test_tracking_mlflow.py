"""A sweep tracked in a real MLflow server (spec.tracking.mlflow): its trials are child runs of its parent run with
their params and a metric point per report; a restarted driver (a retry of the same run) recovers the run on purpose
and adds to the same runs; a server that goes down makes
the driver say so in its progress document (which the operator mirrors: tests/integration/test_tracking_mirroring.py)
while training goes on, and what it could not log arrives when the server is back."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts import tracking as contract
from sweep_contracts.s3_layout import RunLayout
from sweep_operator.rendering import build_rayjob
from sweep_operator.validation import parse_sweep
from sweep_sandbox.mlflow_server import MlflowServer
from tests.support.factories import changed, cpu_sweep
from tests.support.waiting import GiveUp, wait_for
from training_entrypoints.local import LocalRayCluster, LocalRaySize, run_rayjob

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
STEPS, GATE_AT = 5, 2
EXPERIMENT = "e2e/tracked-sweep"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    with MlflowServer(tmp_path_factory.mktemp("mlflow")) as started:
        yield started


def client(server: MlflowServer) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=server.url)


def sweep_runs(server: MlflowServer) -> tuple[list[Any], list[Any]]:
    """(parent runs, trial runs) of the test's experiment, as the server has them."""
    mlflow = client(server)
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return [], []
    runs = mlflow.search_runs([experiment.experiment_id])
    role = contract.TAG_ROLE
    return (
        [r for r in runs if r.data.tags.get(role) == contract.ROLE_SWEEP],
        [r for r in runs if r.data.tags.get(role) == contract.ROLE_TRIAL],
    )


def steps_logged(server: MlflowServer, run: Any) -> list[int]:
    return sorted(m.step for m in client(server).get_metric_history(run.info.run_id, "score"))


def tune_results(path: Path) -> list[dict[str, Any]]:
    """A trial's reports as Tune recorded them (tune/<trial>/result.json, a JSON object a line)."""
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def read_json(path: str) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.timeout(600)
def test_trials_are_child_runs_a_restarted_driver_continues_them_and_a_down_server_only_delays_them_R16(
    tmp_path: Path, server: MlflowServer
) -> None:
    gate = tmp_path / "gate"
    gate.write_text("held")
    doc = changed(
        cpu_sweep("tracked"),
        {
            "spec.trainLoop": "tests.support.tracking_loops:gated_scalar",
            "spec.paramSpace": {"x": {"grid": [1, 2]}, "steps": STEPS, "gate_at": GATE_AT, "gate": str(gate)},
            "spec.tune": {
                "metric": "score", "mode": "max", "numSamples": 1, "maxConcurrentTrials": 2,
                "searcher": {"type": "grid"},
            },
            "spec.trial": {"workers": 1, "resourcesPerWorker": {"cpu": "1", "gpu": 0, "memory": "1Gi"}},
            "spec.deadlines": {"activeSeconds": 900, "startupSeconds": 120, "gracefulStopSeconds": 5},
            "spec.failurePolicy": {"workerFailures": 0, "controllerFailures": 1, "preemptionFailures": 0},
            "spec.tracking": {"mlflow": {"trackingUri": server.url, "experimentName": EXPERIMENT}},
        },
    )  # fmt: skip
    rayjob = build_rayjob(parse_sweep(doc), "mlf1", deadline_at=int(time.time()) + 900, storage_uri=str(tmp_path))
    layout = RunLayout(str(tmp_path / "default" / "tracked-mlf1"))
    # The outage must outlast the driver's wait at the end; each call is bounded well below it.
    env = {"SWEEP_TRACKING_FLUSH_TIMEOUT_S": "240", "SWEEP_TRACKING_CALL_TIMEOUT_S": "5"}
    size = LocalRaySize(num_cpus=2, num_gpus=0, resources={"sweep_trial_driver": 2.0})
    with (
        LocalRayCluster(size, env={**os.environ, "PYTHONPATH": str(REPO)}) as cluster,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        # Attempt 1: both trials report the steps before the gate; the server has them as they come.
        stop = threading.Event()
        first = pool.submit(
            run_rayjob, rayjob, cluster=cluster, workdir=REPO, log_dir=tmp_path / "driver1", stop_event=stop,
            env_overrides=env,
        )  # fmt: skip

        def tracked_before_gate() -> bool:
            if first.done():
                raise GiveUp(f"the first driver ended: {first.result().message}")
            _, trials = sweep_runs(server)
            return len(trials) == 2 and all(steps_logged(server, t) == list(range(1, GATE_AT + 1)) for t in trials)

        wait_for(tracked_before_gate, timeout=300, interval=1.0, what="both trials' first reports in MLflow")
        (parent,), trials = sweep_runs(server)
        assert parent.info.status == "RUNNING"
        assert parent.data.tags[contract.TAG_RUN_ID] == "mlf1" and parent.data.tags[contract.TAG_SWEEP] == "tracked"
        for trial in trials:
            assert trial.data.tags["mlflow.parentRunId"] == parent.info.run_id
            assert trial.data.params["x"] in ("1", "2") and trial.data.params["steps"] == str(STEPS)
            assert trial.data.tags[contract.TAG_CHECKPOINT].endswith("checkpoint_epoch-000001")
        status = read_json(layout.status_path) or {}
        assert (status.get("tracking") or {}).get("runId") == parent.info.run_id

        # The driver is stopped mid-trial (a lost attempt); the server goes down before the next driver starts.
        stop.set()
        first.result()
        server.stop()
        second = pool.submit(
            run_rayjob, rayjob, cluster=cluster, workdir=REPO, log_dir=tmp_path / "driver2", env_overrides=env
        )

        def said_unavailable() -> dict[str, Any] | None:
            if second.done():
                raise GiveUp(f"the second driver ended: {second.result().message}")
            block = (read_json(layout.status_path) or {}).get("tracking") or {}
            return block if block.get("available") is False and block.get("runId") is None else None

        warned = wait_for(said_unavailable, timeout=240, interval=0.5, what="the driver's tracking fact: unavailable")
        assert "Connection" in (warned.get("error") or ""), warned
        gate.unlink()  # the trials finish while the server is down: their reports wait in the driver's buffer

        def trials_done() -> bool:
            if second.done():  # the driver waits (bounded) for the server to come back
                raise GiveUp(f"the second driver ended with the server down: {second.result().message}")
            lasts = [rows[-1] for rows in map(tune_results, Path(layout.tune_dir).glob("*/result.json")) if rows]
            return len(lasts) == 2 and all(row.get("step") == STEPS - 1 for row in lasts)

        wait_for(trials_done, timeout=240, interval=0.5, what="both trials' last reports (logged later)")
        buffered = (read_json(layout.status_path) or {}).get("tracking") or {}
        assert buffered.get("available") is False and buffered.get("pending", 0) > 0, buffered
        server.start()
        result = second.result(timeout=300)
    assert result.ok, result.message
    # The restarted driver is a retry of the same run (R16): it found the run's own prefix in use and recovered it on
    # purpose, each trial continued after its last committed checkpoint (no step trained twice), and nothing landed
    # outside the run's prefix.
    assert "recovering run mlf1" in Path(result.log_path).read_text()
    steps = [[row["step"] for row in tune_results(p)] for p in Path(layout.tune_dir).glob("*/result.json")]
    assert steps == [list(range(STEPS))] * 2, steps
    assert sorted(p.name for p in Path(layout.root).parent.iterdir()) == ["tracked-mlf1"]

    final = read_json(layout.result_path) or {}
    assert final["tracking"]["available"] is True and final["tracking"]["pending"] == 0, final["tracking"]
    assert final["tracking"]["dropped"] == 0
    (parent,), trials = sweep_runs(server)  # the same parent, no duplicate trial runs
    assert parent.info.status == "FINISHED" and len(trials) == 2
    assert final["tracking"]["runId"] == parent.info.run_id
    best = {t["id"]: t["checkpointUri"] for t in final["trialResults"]}
    for trial in trials:
        trial_id = trial.data.tags[contract.TAG_TRIAL_ID]
        assert trial.info.status == "FINISHED"
        # Every report of both attempts, one point each: the restarted driver continued the run.
        assert steps_logged(server, trial) == list(range(1, STEPS + 1)), trial_id
        assert trial.data.tags[contract.TAG_BEST_CHECKPOINT] == best[trial_id]
        assert trial.data.tags[contract.TAG_CHECKPOINT].endswith(f"checkpoint_epoch-{STEPS - 1:06d}")
