"""Population-based training on real Ray (R7, R13, R14, R18, R22): two PBT sweeps side by side on one local Ray, the
digits loop (our helpers) and a plain Ray loop, each 4 trials of 1 worker, 2 at a time, synch, quantile 0.5. The
bottom half of the population continues from the top half's committed checkpoints: its first epoch after the
restart is the donor's next one, with the donor's weights loaded; every trial ends TERMINATED, `sweepctl verify`
passes on the run root, paused trials hold no worker group, and the report draws the lineage.

Both sweeps share the local Ray's 4 CPUs and 4 trial-driver slots (each sweep alone gets 2: maxConcurrentTrials),
so 4 of their trials run at a time. Three epochs and a perturbation interval of 2: one perturbation, after every trial's second epoch, then one epoch
each (an interval of 1 would also pause every trial after its last epoch, for a restart that trains nothing).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts import constants, s3_layout
from sweep_contracts.s3_layout import S3Uri
from sweep_operator.cli import main
from sweep_operator.rendering import build_rayjob
from sweep_operator.validation import parse_sweep
from tests.e2e.stop_probe_loop import PROBE_DIR_ENV
from tests.support.factories import changed, cpu_sweep
from tests.support.waiting import wait_for
from training_entrypoints.local import LocalRayCluster, LocalRaySize, LocalRunResult, run_rayjob

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
BUCKET = "e2e-pbt"
EPOCHS = 3
INTERVAL = 2


def pbt_sweep(name: str, loop: str, param_space: dict[str, Any], metric: str, mutate: str, endpoint: str) -> dict:
    return changed(
        cpu_sweep(name),
        {
            "spec.trainLoop": loop,
            "spec.paramSpace": param_space,
            "spec.tune": {
                "metric": metric,
                "mode": "min",
                "numSamples": 4,
                "maxConcurrentTrials": 2,
                "searcher": {"type": "random", "seed": 3},
                "scheduler": {
                    "type": "pbt",
                    "perturbationInterval": INTERVAL,
                    "hyperparamMutations": [mutate],
                    "quantileFraction": 0.5,
                    "resampleProbability": 0.0,
                    "synch": True,
                },
            },
            "spec.trial": {"workers": 1, "resourcesPerWorker": {"cpu": "1", "gpu": 0, "memory": "1Gi"}},
            "spec.checkpoints": {"numToKeep": 1},
            "spec.storage": {"uri": f"s3://{BUCKET}/sweeps", "region": "us-east-1", "endpointUrl": endpoint},
            "spec.deadlines": {"activeSeconds": 1500, "startupSeconds": 300, "gracefulStopSeconds": 30},
            "spec.failurePolicy": {
                "workerFailures": 0,
                "controllerFailures": 1,
                "preemptionFailures": 0,
                "trialFailures": 0,
                "jobRetries": 0,
            },
        },
    )


@dataclass
class PbtRun:
    name: str
    outcome: LocalRunResult
    root: S3Uri
    client: Any
    endpoint: str

    def read(self, *parts: str) -> Any:
        key = self.root.join(*parts).key
        return json.loads(self.client.get_object(Bucket=self.root.bucket, Key=key)["Body"].read())

    def keys(self, *parts: str) -> list[str]:
        prefix = self.root.join(*parts).prefix
        found: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.root.bucket, Prefix=prefix):
            found += [o["Key"][len(prefix) :] for o in page.get("Contents", [])]
        return found

    def results(self, trial: str) -> list[dict[str, Any]]:
        """Every result the trial reported to Tune, in order (Tune's tune/<trial>/result.json)."""
        key = self.root.join(s3_layout.TUNE_EXPERIMENT_NAME, trial, "result.json").key
        body = self.client.get_object(Bucket=self.root.bucket, Key=key)["Body"].read().decode()
        return [json.loads(line) for line in body.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def cluster(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    """Room for both sweeps at once: 2 trials of one CPU worker each, a trial-driver slot per trial (R5, R15)."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    s3_server.client().create_bucket(Bucket=BUCKET)
    size = LocalRaySize(num_cpus=4, num_gpus=0, resources={constants.TRIAL_DRIVER_RESOURCE: 4.0})
    log = tmp_path_factory.mktemp("ray") / "ray.log"
    with LocalRayCluster(size, env={**os.environ, "PYTHONPATH": str(REPO)}, log_path=log) as started:
        yield started


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the plain loop's rank 0 records Ray's placement groups at each Train run's start."""
    return tmp_path_factory.mktemp("probes")


@pytest.fixture(scope="module")
def runs(
    cluster: LocalRayCluster, s3_server: Any, probes: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, PbtRun]:
    work = tmp_path_factory.mktemp("pbt")
    endpoint = s3_server.endpoint_url
    sweeps = {
        "digits": pbt_sweep(
            "pbt-digits",
            "training_entrypoints.loops.digits_mlp:train_loop",
            {"lr": {"choice": [0.0005, 0.001, 0.2, 0.4]}, "hidden": 16, "epochs": EPOCHS, "batch_size": 256},
            "val_loss",
            "lr",
            endpoint,
        ),
        "plain": pbt_sweep(
            "pbt-plain",
            "tests.e2e.pbt_loops:plain_loop",
            {"x": {"choice": [1, 2, 4, 8]}, "epochs": EPOCHS},
            "loss",
            "x",
            endpoint,
        ),
    }
    outcomes: dict[str, LocalRunResult] = {}

    def run(key: str) -> None:
        doc = sweeps[key]
        rayjob = build_rayjob(parse_sweep(doc), "r1", deadline_at=int(time.time() + 1500))
        outcomes[key] = run_rayjob(
            rayjob,
            cluster=cluster,
            workdir=REPO,
            log_dir=work / f"{key}-logs",
            env_overrides={PROBE_DIR_ENV: str(probes)} if key == "plain" else {},
            poll_interval_s=0.5,
        )

    client = s3_server.client()
    threads = {k: threading.Thread(target=run, args=(k,), name=f"pbt-{k}") for k in sweeps}
    threads["digits"].start()
    # Two Tune drivers on one Ray that start in the same second share a local staging folder (Ray's session dir, the
    # start time to the second, the experiment name) and upload each other's experiment state: the second starts
    # once the first's is in its run root.
    wait_for(
        lambda: (
            client.list_objects_v2(
                Bucket=BUCKET, Prefix=f"sweeps/default/pbt-digits-r1/{s3_layout.TUNE_EXPERIMENT_NAME}/experiment_state-"
            ).get("KeyCount")
            or not threads["digits"].is_alive()
        ),
        timeout=600,
        interval=0.5,
        what="the first sweep's Tune experiment state",
    )
    threads["plain"].start()
    for thread in threads.values():
        thread.join(timeout=1200)
    found = {}
    for key, doc in sweeps.items():
        outcome = outcomes.get(key)
        assert outcome is not None and outcome.ok, (
            key,
            outcome and outcome.message,
            outcome and Path(outcome.log_path).read_text(errors="replace")[-8000:],
        )
        root = S3Uri(BUCKET, f"sweeps/default/{doc['metadata']['name']}-r1")
        found[key] = PbtRun(key, outcome, root, client, endpoint)
    return found


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("key", ["digits", "plain"])
def test_pbt_exploits_continue_from_the_donors_committed_checkpoint_and_every_trial_terminates(
    runs: dict[str, PbtRun], key: str
) -> None:
    """R13, R7: synch PBT with a quantile of 0.5 exploits at its first perturbation; each exploited trial's first
    result after the restart comes from a new Train run seeded with the donor's committed checkpoint, reports the
    donor's next epoch, and the weights it loaded are the donor's (the checksums the loop reports), whether the loop
    uses our helpers (digits) or only `ray.train.get_checkpoint()` (plain)."""
    run = runs[key]
    result = run.read(s3_layout.RESULT_KEY)
    assert result["trials"]["terminated"] == 4 and result["trials"]["errored"] == 0, result["trials"]
    assert sorted(t["status"] for t in result["trialResults"]) == ["TERMINATED"] * 4
    status = run.read(s3_layout.STATUS_KEY)
    lineage = status["lineage"]
    assert lineage["exploits"] >= 1 and lineage["entries"], lineage
    mutated = "lr" if key == "digits" else "x"
    for entry in lineage["entries"]:
        assert entry["trial"] != entry["donor"] and entry["step"] == INTERVAL
        recipient, donor = entry["trial"], entry["donor"]
        after = [r for r in run.results(recipient) if r.get("training_iteration", 0) > INTERVAL]
        assert after, f"{recipient} reported nothing after its exploit"
        first = after[0]
        seeded = first["train_run"]
        assert seeded.startswith(f"{recipient}-pbt{INTERVAL}-"), first
        # The donor's committed checkpoint at the perturbation (its result at that step names it) ...
        (donor_result,) = [r for r in run.results(donor) if r.get("training_iteration") == INTERVAL]
        donor_run, name = donor_result["checkpoint_path"].rstrip("/").split("/")[-2:]
        assert donor_run == donor_result["train_run"] and donor_result["epoch"] == INTERVAL - 1
        # ... is the one the recipient's new Train run was seeded with (Ray's snapshot commits the copy) ...
        snapshot = run.read(s3_layout.TRAIN_DIR, seeded, s3_layout.SNAPSHOT_FILE)
        (copied,) = [r for r in snapshot["checkpoint_results"] if r["checkpoint_dir_name"] == name]
        assert copied["metrics"]["epoch"] == INTERVAL - 1
        source = {k for k in run.keys(s3_layout.TRAIN_DIR, donor_run, name) if k != s3_layout.COMMIT_RECORD_FILE}
        assert source and source <= set(run.keys(s3_layout.TRAIN_DIR, seeded, name)), seeded
        # ... and what its loop loaded: its first epoch is the donor's next one, from the donor's weights.
        assert first["epoch"] == INTERVAL, f"{recipient}'s first epoch after the exploit: {first['epoch']}"
        assert first["loaded_weights_checksum"] == donor_result["weights_checksum"]
        # The recipient trains on with the mutated config: the donor's value of the parameter, changed or not.
        assert set(entry["changes"]) <= {mutated}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("key", ["digits", "plain"])
def test_sweepctl_verify_accepts_a_pbt_run_whose_trials_restored_from_one_another(
    runs: dict[str, PbtRun], key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """R22: every Train run of the run root, the seeded copies included, is committed and recorded."""
    run = runs[key]
    code = main(["verify", str(run.root), "--endpoint-url", run.endpoint, "--min-retention-days", "0"])
    out = capsys.readouterr().out
    assert code == 0, out


def test_paused_trials_hold_no_worker_group(runs: dict[str, PbtRun], probes: Path) -> None:
    """R14, measured from Ray's placement-group table at every Train run's start (the plain loop's rank 0): a paused
    trial holds no worker group (no GPUs in a cluster): under synch every trial pauses at the perturbation, its Train
    run aborted and its placement group removed, and the restarts find those groups REMOVED."""
    seen = [json.loads(p.read_text()) for p in probes.glob("*.json")]
    restarts = [p for p in seen if "-pbt" in p["trial"]]
    assert len(seen) >= 6 and restarts, [p["trial"] for p in seen]
    measured = []
    for probe in seen:
        groups = {
            pg: row for pg, row in probe["table"].items() if any(b.get("CPU", 0) > 0 for b in row["bundles"].values())
        }
        alive = {pg for pg, row in groups.items() if row["state"] != "REMOVED"}
        measured.append((probe["trial"], len(alive), len(groups) - len(alive)))
        # Both sweeps share the local Ray's 4 CPUs: at most 4 trials of the two may hold a group.
        assert len(alive) <= 4 and probe["own"] in alive, measured
    # Under synch every trial of the sweep paused at the perturbation before any restarted: each restart saw the
    # worker groups of the paused trials removed (at least the two that ran beside it before the pause).
    assert all(removed >= 2 for trial, _, removed in measured if "-pbt" in trial), measured
    print("worker groups at each Train run's start (run, alive, removed):", sorted(measured))


def test_the_report_draws_each_trials_lineage(runs: dict[str, PbtRun], tmp_path: Path) -> None:
    """The report shows who continued from whom, at which step, with which change."""
    run = runs["plain"]
    out = tmp_path / "report"
    code = main(["report", "--storage", str(run.root), "--endpoint-url", run.endpoint, "--out", str(out)])
    assert code == 0
    page = (out / "report.html").read_text()
    entry = run.read(s3_layout.STATUS_KEY)["lineage"]["entries"][0]
    assert "Lineage" in page and entry["trial"] in page and entry["donor"] in page
