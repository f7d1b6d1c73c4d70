"""The entrypoint end to end on real Ray (CPU, gloo): Tune over Train V2 into moto S3 and local directories.

One local Ray (6 logical CPUs, 3 trial-driver slots) serves every test here; each run renders its RayJob like the
operator and runs `python -m training_entrypoints.sweep` with that RayJob's environment (training_entrypoints.local).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from sweep_contracts import constants
from sweep_contracts.s3_layout import RunLayout, S3Uri
from sweep_operator.rendering import build_rayjob
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep
from tests.support.waiting import wait_for
from training_entrypoints import checkpointing
from training_entrypoints.async_upload import remove_leftovers
from training_entrypoints.local import LocalRayCluster, LocalRaySize, LocalRunResult, run_rayjob

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 3
TRAIN_SIZE = 1440  # digits_mlp: 1797 samples - 357 for validation


def digits_sweep(name: str, storage: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """2 trials (lr grid) x 2 workers of the built-in digits loop, finite retry classes (R12)."""
    return changed(
        cpu_sweep(name),
        {
            "spec.paramSpace": {"lr": {"grid": [0.05, 0.0005]}, "hidden": 32, "epochs": EPOCHS},
            "spec.tune": {
                "metric": "val_loss",
                "mode": "min",
                "numSamples": 1,
                "maxConcurrentTrials": 2,
                "searcher": {"type": "grid"},
                "scheduler": {"type": "fifo"},
            },
            "spec.trial": {"workers": 2, "resourcesPerWorker": {"cpu": "1", "gpu": 0, "memory": "1Gi"}},
            "spec.storage": storage,
            "spec.checkpoints": {"numToKeep": 4},
            "spec.deadlines": {"activeSeconds": 900, "startupSeconds": 120, "gracefulStopSeconds": 10},
            "spec.failurePolicy": {
                "workerFailures": 1,
                "controllerFailures": 1,
                "preemptionFailures": 0,
                "trialFailures": 0,
                "jobRetries": 0,
            },
            **changes,
        },
    )


def run(
    doc: dict[str, Any], cluster: LocalRayCluster, tmp: Path, *, deadline_in_s: float = 900, **kwargs: Any
) -> LocalRunResult:
    sweep = parse_sweep(doc)
    storage = None if doc["spec"]["storage"].get("endpointUrl") else str(tmp / "store")
    rayjob = build_rayjob(sweep, "e2e1", deadline_at=int(time.time() + deadline_in_s), storage_uri=storage)
    outcome = run_rayjob(rayjob, cluster=cluster, workdir=REPO, log_dir=tmp / "logs", **kwargs)
    print(Path(outcome.log_path).read_text()[-6000:])  # shown when a test fails
    return outcome


@pytest.fixture(scope="module")
def local_ray(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    """Logical CPUs above the 2 cores (R15) and the head's trial-driver resource, so the placement is exercised (R5):
    room for the S3 sweep (2 trials x 2 workers) and the deadline sweep (1 worker) at once."""
    size = LocalRaySize(num_cpus=6, num_gpus=0, resources={constants.TRIAL_DRIVER_RESOURCE: 3.0})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cluster = LocalRayCluster(size, env=env, log_path=tmp_path_factory.mktemp("ray") / "ray.log")
    with cluster:
        yield cluster


DEADLINE_IN_S = 120  # far enough for a lone trial to start on 2 busy cores (20-65 s seen)


class DeadlineRun:
    def __init__(self, future: Future[LocalRunResult], layout: RunLayout):
        self.future, self.layout = future, layout


def committed_checkpoints(layout: RunLayout) -> list[str]:
    """Checkpoint names Ray's snapshot commits, over all trials of a run (none before the first commit)."""
    names = []
    for snapshot in Path(layout.root, "train").glob("*/checkpoint_manager_snapshot.json"):
        names += [c["checkpoint_dir_name"] for c in json.loads(snapshot.read_text())["checkpoint_results"]]
    return names


@pytest.fixture(scope="module")
def deadline_run(local_ray: LocalRayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeadlineRun]:
    """A sweep whose deadline stops it, started first and left running in the background once its trial has
    committed a checkpoint: the rest of its wait for the deadline overlaps the other runs (the S3 sweep asks for it)."""
    doc = changed(
        digits_sweep("slow-scalar", {"uri": "s3://unused/sweeps", "region": "us-east-1"}),
        {
            "spec.trainLoop": "tests.support.entrypoint_loops:slow_scalar",
            "spec.paramSpace": {"steps": 1000, "sleep_s": 0.5},
            "spec.tune": {"metric": "score", "mode": "max", "numSamples": 1, "maxConcurrentTrials": 1},
            "spec.trial": {"workers": 1, "resourcesPerWorker": {"cpu": "1", "gpu": 0, "memory": "1Gi"}},
            "spec.checkpoints": {"numToKeep": 2},
            "spec.deadlines": {"activeSeconds": 900, "startupSeconds": 120, "gracefulStopSeconds": 5},
        },
    )
    tmp = tmp_path_factory.mktemp("deadline")
    layout = RunLayout(str(tmp / "store" / "default" / "slow-scalar-e2e1"))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="deadline-run") as pool:
        future = pool.submit(run, doc, local_ray, tmp, deadline_in_s=DEADLINE_IN_S)
        while not committed_checkpoints(layout) and not future.done():
            time.sleep(0.5)
        yield DeadlineRun(future, layout)


# ---------------------------------------------------------------------------------- S3 sweep


class S3Run:
    def __init__(self, outcome: LocalRunResult, client: Any, root: S3Uri):
        self.outcome, self.client, self.root = outcome, client, root

    def key(self, *parts: str) -> str:
        return self.root.join(*parts).key

    def keys(self, *parts: str) -> list[str]:
        prefix = self.root.join(*parts).prefix
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.root.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def exists(self, *parts: str) -> bool:
        return bool(self.client.list_objects_v2(Bucket=self.root.bucket, Prefix=self.key(*parts))["KeyCount"])

    def read(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.root.bucket, Key=key)["Body"].read()

    def json(self, *parts: str) -> Any:
        return json.loads(self.read(self.key(*parts)))

    def tune_results(self, trial_id: str) -> list[dict[str, Any]]:
        """Every result Tune recorded for a trial (rank 0's metrics as TuneReportCallback forwarded them)."""
        text = self.read(self.key("tune", trial_id, "result.json")).decode()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def committed(self, trial_id: str) -> list[dict[str, Any]]:
        return self.json("train", trial_id, "checkpoint_manager_snapshot.json")["checkpoint_results"]


@pytest.fixture(scope="module")
def s3_run(
    local_ray: LocalRayCluster, deadline_run: DeadlineRun, s3_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> S3Run:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto logs every request
    client = s3_server.client()
    client.create_bucket(Bucket="e2e-entrypoints")
    doc = digits_sweep(
        "digits-s3",
        {"uri": "s3://e2e-entrypoints/sweeps", "region": "us-east-1", "endpointUrl": s3_server.endpoint_url},
    )
    outcome = run(doc, local_ray, tmp_path_factory.mktemp("s3run"))
    assert outcome.ok, outcome.message
    return S3Run(outcome, client, S3Uri.parse(outcome.run_root))


@pytest.mark.timeout(600)
def test_two_trial_sweep_into_s3_writes_the_design_layout_and_the_best_trial_R11_R16_R17_R19(s3_run: S3Run) -> None:
    """One Train run per trial under train/<trialId> (R17), the Tune experiment under tune/ (R19), progress and
    result files under _sweep/, all inside this run's own prefix (R16)."""
    layout = RunLayout(s3_run.outcome.run_root)
    assert s3_run.outcome.run_root == "s3://e2e-entrypoints/sweeps/default/digits-s3-e2e1"
    result = s3_run.json("_sweep", "result.json")
    status = s3_run.json("_sweep", "status.json")
    assert result == s3_run.outcome.result and status["phase"] == "Succeeded"
    assert result["trials"] == {"total": 2, "pending": 0, "running": 0, "terminated": 2, "errored": 0}
    assert status["trials"] == result["trials"] and status["bestTrial"]["id"] == result["bestTrial"]["id"]

    trials = {t["id"]: t for t in result["trialResults"]}
    best_id = min(trials, key=lambda t: trials[t]["value"])
    best = result["bestTrial"]
    assert best["id"] == best_id and best["metric"] == "val_loss" and best["config"]["lr"] == 0.05
    final_losses = {t: s3_run.tune_results(t)[-1]["val_loss"] for t in trials}
    assert best["value"] == pytest.approx(min(final_losses.values()))
    assert best["checkpointUri"] == f"{layout.trial_dir(best_id)}/checkpoint_epoch-{EPOCHS - 1:06d}"

    for trial_id in trials:
        assert s3_run.exists("train", trial_id, "checkpoint_manager_snapshot.json")
        assert s3_run.exists("tune", trial_id, "result.json")
        # TuneReportCallback forwards the checkpoint's path with the scheme stripped (R18).
        forwarded = s3_run.tune_results(trial_id)[-1]["checkpoint_path"]
        assert forwarded == f"{layout.trial_dir(trial_id)}/checkpoint_epoch-{EPOCHS - 1:06d}".removeprefix("s3://")
    assert any(k.endswith("tuner.pkl") for k in s3_run.keys("tune"))


@pytest.mark.timeout(600)
def test_manifests_match_every_committed_object_and_the_verifier_agrees_R7_R10(s3_run: S3Run) -> None:
    """Every checkpoint Ray's snapshot commits holds the full state (R7) and a manifest whose sizes and sha256
    match the objects (R10); the operator's verifier, reading the same layout, verifies the run."""
    from sweep_operator.verification import verify_sweep_checkpoints

    for trial in s3_run.outcome.result["trialResults"]:
        committed = [c["checkpoint_dir_name"] for c in s3_run.committed(trial["id"])]
        assert committed == [f"checkpoint_epoch-{e:06d}" for e in range(EPOCHS)]
        for name in committed:
            manifest = s3_run.json("train", trial["id"], name, "_manifest.json")
            assert (manifest["rank"], manifest["epoch"]) == (0, int(name[-6:]))
            assert {f["path"] for f in manifest["files"]} == {
                "model.pt", "optimizer.pt", "lr_scheduler.pt", "rng.pt", "train_state.json"
            }  # fmt: skip
            for entry in manifest["files"]:
                body = s3_run.read(s3_run.key("train", trial["id"], name, entry["path"]))
                assert len(body) == entry["size"]
                assert hashlib.sha256(body).hexdigest() == entry["sha256"]

    verdict = verify_sweep_checkpoints(s3_run.client, s3_run.root, deep=True, min_retention_days=0)
    assert verdict.verified, verdict.reason
    assert verdict.checked == 2 * EPOCHS
    assert verdict.best_checkpoint_uri == s3_run.outcome.result["bestTrial"]["checkpointUri"]


@pytest.mark.timeout(600)
def test_every_rank_reports_once_per_epoch_R8(s3_run: S3Run) -> None:
    """R8: each of Tune's results came from a report every rank made (ranks_reported = world size), once per epoch."""
    for trial in s3_run.outcome.result["trialResults"]:
        results = s3_run.tune_results(trial["id"])
        assert [r["epoch"] for r in results] == list(range(EPOCHS))
        assert [r["ranks_reported"] for r in results] == [2] * EPOCHS


def _evaluate(state: dict[str, torch.Tensor], hidden: int, indices: range | None = None) -> float:
    from training_entrypoints.loops import digits_mlp

    model = digits_mlp.build_model(hidden)
    model.load_state_dict(state)
    model.eval()
    _, val = digits_mlp.load_datasets()
    x, y = val.tensors
    if indices is not None:
        x, y = x[list(indices)], y[list(indices)]
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(model(x), y, reduction="sum").item() / len(y)


@pytest.mark.timeout(600)
def test_reported_metric_is_the_mean_over_all_ranks_not_rank_zeros_R9_R3(s3_run: S3Run) -> None:
    """R9: the reported val_loss equals the final model evaluated on the whole validation set (every rank's shard),
    not rank 0's half; every rank reports the same value. R3: the epoch covered each training sample exactly once,
    and the ranks' models stayed identical (else the whole-set evaluation of rank 0's weights would differ)."""
    best = s3_run.outcome.result["bestTrial"]
    results = s3_run.tune_results(best["id"])
    assert all(r["val_loss_rank_spread"] == 0 for r in results)
    assert all(r["train_samples"] == TRAIN_SIZE for r in results)

    last = results[-1]
    key = S3Uri.parse(best["checkpointUri"]).join("model.pt").key
    state = torch.load(io.BytesIO(s3_run.read(key)), weights_only=True)
    assert last["val_loss"] == pytest.approx(_evaluate(state, hidden=32), rel=1e-5)
    rank0_only = _evaluate(state, hidden=32, indices=range(0, 357, 2))
    assert abs(last["val_loss"] - rank0_only) > 1e-4


# --------------------------------------------------------------------------- failure injection


@pytest.mark.timeout(600)
def test_a_worker_failure_resumes_from_the_last_checkpoint_with_identical_state_R7_R12(
    s3_run: S3Run, local_ray: LocalRayCluster, tmp_path: Path
) -> None:
    """Rank 1 raises at epoch 1 (workerFailures=1, R12): Train restarts the worker group from checkpoint 0, the
    epochs continue at 1, and every checkpoint equals the one of the uninterrupted twin (the S3 sweep's lr=0.05
    trial, same loop and config): model, optimizer, LR scheduler, each rank's RNG and the epoch (R7)."""
    fail_at = 1
    doc = digits_sweep(
        "digits-resume",
        {"uri": "s3://unused/sweeps", "region": "us-east-1"},
        **{
            "spec.trainLoop": "tests.support.entrypoint_loops:digits_with_one_failure",
            "spec.paramSpace": {
                "fail_at_epoch": fail_at,
                "marker_dir": str(tmp_path),
                "lr": 0.05,
                "hidden": 32,
                "epochs": EPOCHS,
            },
            "spec.tune": {"metric": "val_loss", "mode": "min", "numSamples": 1, "maxConcurrentTrials": 1},
        },
    )
    outcome = run(doc, local_ray, tmp_path)
    assert outcome.ok, outcome.message
    (failed,) = [t["id"] for t in outcome.result["trialResults"]]
    assert (tmp_path / f"{failed}.failed").read_text() == str(fail_at)
    twin = next(t["id"] for t in s3_run.outcome.result["trialResults"] if t["config"]["lr"] == 0.05)

    layout = RunLayout(outcome.run_root)
    lines = (Path(layout.tune_dir) / failed / "result.json").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == list(range(EPOCHS))  # continued, not restarted

    for epoch in range(EPOCHS):
        name = f"checkpoint_epoch-{epoch:06d}"
        resumed = Path(layout.checkpoint_dir(failed, name))
        assert checkpointing.manifest_problems(resumed) == []
        for file in ("model.pt", "optimizer.pt", "lr_scheduler.pt", "rng.pt"):
            uninterrupted = torch.load(
                io.BytesIO(s3_run.read(s3_run.key("train", twin, name, file))), weights_only=True
            )
            assert_same(torch.load(resumed / file, weights_only=True), uninterrupted, f"{name}/{file}")
        twin_state = s3_run.json("train", twin, name, "train_state.json")
        assert (
            json.loads((resumed / "train_state.json").read_text())
            == twin_state
            == {"epoch": epoch, "step": 0, "extra": {}}
        )


def assert_same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


# ------------------------------------------------------------------------------ deadline, capacity


@pytest.mark.timeout(600)
def test_a_deadline_stops_the_sweep_gracefully_with_its_checkpoints_persisted(deadline_run: DeadlineRun) -> None:
    """Tune's time budget ends gracefulStopSeconds before SWEEP_DEADLINE_AT: the trial stops, the driver exits 0
    with deadlineReached, and every checkpoint the snapshot commits is complete."""
    outcome = deadline_run.future.result()
    assert outcome.ok, outcome.message
    assert outcome.duration_s < DEADLINE_IN_S + 30
    assert outcome.result["deadlineReached"] is True and outcome.status["phase"] == "DeadlineExceeded"
    (trial,) = outcome.result["trialResults"]
    layout = deadline_run.layout
    committed = committed_checkpoints(layout)
    assert committed, "no checkpoint persisted before the deadline"
    for name in committed:
        assert checkpointing.manifest_problems(layout.checkpoint_dir(trial["id"], name)) == []
    last = max(committed)
    assert int(last[-6:]) < 999  # stopped long before the loop's end
    assert trial["checkpointUri"] == layout.checkpoint_dir(trial["id"], last)


@pytest.mark.timeout(300)
def test_an_unsatisfiable_request_fails_in_bounded_time_naming_asked_and_available_R12_R14(
    local_ray: LocalRayCluster, tmp_path: Path
) -> None:
    """4 workers x 2 CPUs never fit 6 CPUs: with a short worker-group start timeout and finite controller failures
    (R12) the trial fails instead of waiting forever, and the driver says what was asked and what exists (R14)."""
    doc = digits_sweep(
        "too-big",
        {"uri": "s3://unused/sweeps", "region": "us-east-1"},
        **{
            "spec.trial": {"workers": 4, "resourcesPerWorker": {"cpu": "2", "gpu": 0, "memory": "1Gi"}},
            "spec.paramSpace": {"lr": 0.05, "hidden": 32, "epochs": 1},
            "spec.tune": {"metric": "val_loss", "mode": "min", "numSamples": 1, "maxConcurrentTrials": 1},
            "spec.failurePolicy": {"workerFailures": 0, "controllerFailures": 0, "preemptionFailures": 0},
        },
    )
    started = time.monotonic()
    outcome = run(
        doc, local_ray, tmp_path, check_fit=False, env_overrides={constants.ENV_WORKER_GROUP_START_TIMEOUT: "5"}
    )
    assert outcome.returncode == 1
    assert time.monotonic() - started < 150
    assert "each trial asks for 4 train worker(s) x {CPU: 2}" in outcome.message
    assert "the cluster has {CPU: 6, sweep_trial_driver: 3}" in outcome.message
    assert outcome.result["trials"]["errored"] == 1


# ---------------------------------------------------------------------------------- asynchronous upload


@pytest.mark.timeout(600)
def test_async_uploads_commit_what_the_verifier_proves_and_a_refused_upload_fails_its_trial(
    local_ray: LocalRayCluster, s3_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Asynchronous uploads through our helpers (`report_epoch(upload="async")`: manifest hashed on the upload thread)
    and through a loop's own `CheckpointUploadMode.ASYNC` commit checkpoints the verifier proves, at the full-state and
    the committed level; the same helpers against a bucket that refuses checkpoint writes fail their trial with S3's
    AccessDenied. No local checkpoint directory is left behind either way."""
    from sweep_operator.cli import main
    from tests.support.s3_deny_proxy import DenyingS3Proxy

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    s3_server.client().create_bucket(Bucket="e2e-async")
    local_ok, local_denied = tmp_path / "local-ok", tmp_path / "local-denied"
    local_ok.mkdir()
    local_denied.mkdir()
    loop = {
        "spec.trainLoop": "tests.e2e.async_report_loops:train_loop",
        "spec.trial": {"workers": 1, "resourcesPerWorker": {"cpu": "1", "gpu": 0, "memory": "1Gi"}},
    }
    params = {"lr": 0.05, "hidden": 32, "epochs": EPOCHS}
    uploaded = digits_sweep(
        "digits-async",
        {"uri": "s3://e2e-async/sweeps", "region": "us-east-1", "endpointUrl": s3_server.endpoint_url},
        **loop,
        **{"spec.paramSpace": {**params, "style": {"grid": ["helpers", "plain"]}, "local_dir": str(local_ok)}},
    )
    # A Deny on the checkpoint folders only, as a bucket policy would: Tune's and the driver's own writes go through.
    with DenyingS3Proxy(s3_server.endpoint_url, deny={"s3:PutObject"}, deny_paths="/checkpoint_epoch-") as proxy:
        refused = digits_sweep(
            "digits-refused",
            {"uri": "s3://e2e-async/sweeps", "region": "us-east-1", "endpointUrl": proxy.endpoint_url},
            **loop,
            **{
                "spec.paramSpace": {**params, "style": "helpers", "local_dir": str(local_denied)},
                "spec.tune": {"metric": "val_loss", "mode": "min", "numSamples": 1, "maxConcurrentTrials": 1},
                "spec.failurePolicy": {"workerFailures": 0, "controllerFailures": 0, "preemptionFailures": 0},
            },
        )
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="async-runs") as pool:
            ok_run = pool.submit(run, uploaded, local_ray, tmp_path / "ok")
            refused_run = pool.submit(run, refused, local_ray, tmp_path / "refused")
            ok, failed = ok_run.result(), refused_run.result()
        assert proxy.denied, "no checkpoint write reached the proxy"

    assert ok.ok, ok.message
    capsys.readouterr()
    code = main(["verify", ok.run_root, "--endpoint-url", s3_server.endpoint_url, "--min-retention-days", "0",
                 "--deep", "--json"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    verdict = json.loads(out)
    assert verdict["checked"] == 2 * EPOCHS
    assert verdict["summary"] == f"{2 * EPOCHS} committed ({EPOCHS} full-state)", verdict["summary"]
    ok_s3 = S3Run(ok, s3_server.client(), S3Uri.parse(ok.run_root))
    (helpers,) = [t["id"] for t in ok.result["trialResults"] if t["config"]["style"] == "helpers"]
    assert [r["uploaded_async"] for r in ok_s3.tune_results(helpers)] == [False] + [True] * (EPOCHS - 1)

    assert not failed.ok and failed.result["trials"]["errored"] == 1
    ((error,),) = [[e["error"] for e in failed.result["errors"]]]
    assert "ACCESS_DENIED" in error and "checkpoint_epoch-000000" in error, error
    written = S3Run(failed, s3_server.client(), S3Uri.parse(failed.run_root)).keys("train")
    assert not [k for k in written if "/checkpoint_epoch-" in k], written  # nothing of a checkpoint

    # Our helpers' directories and the plain loop's `mkdtemp()` ones (torch keeps its own caches there too).
    # A worker killed while it wrote the checkpoint after a refused one cannot remove that one: the next async upload
    # on the machine removes what dead processes left (async_upload.remove_leftovers), and nothing else is left.
    def nothing_left() -> bool:
        for folder in (local_ok, local_denied):
            remove_leftovers(folder)
        return not [p for f in (local_ok, local_denied) for p in f.iterdir() if p.name.startswith(("sweep-", "tmp"))]

    wait_for(nothing_left, timeout=60, what="no local checkpoint directory left once their processes are gone")
