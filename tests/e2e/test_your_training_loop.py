"""A user's own train loop on real Ray, with nothing imported from this project (R7, R22): the loop `sweepctl init`
scaffolds (written as Ray's docs teach: `torch.save` into a temporary directory, `Checkpoint.from_directory`,
`ray.train.report`) runs into the S3 server and verifies at the committed level; tampering is named; a loop that never
checkpoints is warned about while it runs. One local Ray serves both runs, side by side.
"""

from __future__ import annotations

import contextlib
import io
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
import yaml

from sweep_contracts import constants, s3_layout
from sweep_contracts.checkpoint_coverage import checkpoint_coverage
from sweep_contracts.s3_layout import S3Uri
from sweep_operator.cli import main
from sweep_operator.cli.run_local import ProgressLine
from sweep_operator.rendering import build_rayjob
from sweep_operator.validation import parse_sweep
from training_entrypoints.local import LocalRayCluster, LocalRaySize, LocalRunResult, run_rayjob

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
BUCKET = "e2e-your-loop"

# A loop that reports and never checkpoints: what a user who forgot `checkpoint=` brings.
NO_CHECKPOINT_LOOP = """
import time

import ray.train


def train_loop(config):
    for epoch in range(int(config.get("epochs", 8))):
        time.sleep(float(config.get("pause", 2.0)))
        ray.train.report({"epoch": epoch, "loss": 1.0 / (epoch + 1)})
"""


@dataclass
class PlainRun:
    result: dict[str, Any]  # its _sweep/result.json
    printed: str  # what `sweepctl run-local` said
    client: Any
    root: S3Uri
    endpoint: str


@dataclass
class UncheckpointedRun:
    outcome: LocalRunResult
    documents: list[dict[str, Any]]
    printed: str


def render(manifest: dict[str, Any], run_id: str, storage: str | None = None) -> dict[str, Any]:
    return build_rayjob(parse_sweep(manifest), run_id, deadline_at=int(time.time() + 900), storage_uri=storage)


@pytest.fixture(scope="module")
def cluster(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    """Room for the first two runs at once: 2 + 1 trials of one CPU worker, a trial-driver slot each (R5, R15)."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto logs every request
    s3_server.client().create_bucket(Bucket=BUCKET)
    size = LocalRaySize(num_cpus=5, num_gpus=0, resources={constants.TRIAL_DRIVER_RESOURCE: 3.0})
    log = tmp_path_factory.mktemp("ray") / "ray.log"
    with LocalRayCluster(size, env={**os.environ, "PYTHONPATH": str(REPO)}, log_path=log) as started:
        yield started


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`sweepctl init demo-loop` in an empty directory: the loop package and its sweep."""
    work = tmp_path_factory.mktemp("your-loop")
    here = os.getcwd()
    os.chdir(work)
    try:
        assert main(["init", "demo-loop"]) == 0
    finally:
        os.chdir(here)
    return work / "demo-loop"


def scaffold_sweep(scaffold: Path, endpoint: str) -> dict[str, Any]:
    """The scaffold's sweep, its storage the S3 server."""
    manifest = yaml.safe_load((scaffold / "sweep.yaml").read_text())
    manifest["spec"]["storage"] = {"uri": f"s3://{BUCKET}/sweeps", "region": "us-east-1", "endpointUrl": endpoint}
    return manifest


@pytest.fixture(scope="module")
def runs(
    cluster: LocalRayCluster, scaffold: Path, s3_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[PlainRun, UncheckpointedRun]:
    work = tmp_path_factory.mktemp("runs")
    plain = scaffold_sweep(scaffold, s3_server.endpoint_url)
    quiet = work / "quiet"
    quiet.mkdir()
    (quiet / "quiet_loop.py").write_text(NO_CHECKPOINT_LOOP)
    unsaved = {
        **plain,
        "metadata": {"name": "quiet", "namespace": "default"},
        "spec": {
            **plain["spec"],
            "trainLoop": "quiet_loop:train_loop",
            "paramSpace": {"epochs": 8, "pause": 2.0},
            "tune": {**plain["spec"]["tune"], "numSamples": 1, "metric": "loss", "searcher": {"type": "random"}},
        },
    }
    documents: list[dict[str, Any]] = []
    printed = io.StringIO()
    progress = ProgressLine(1, warn_after_reports=3)

    def seen(document: dict[str, Any]) -> None:
        documents.append(document)
        progress(document)

    quiet_outcome: dict[str, LocalRunResult] = {}

    def run_quiet() -> None:
        quiet_outcome["run"] = run_rayjob(
            render(unsaved, "quiet1", storage=str(work / "quiet-store")),
            cluster=cluster,
            workdir=REPO,
            code_dirs=[quiet],
            log_dir=work / "quiet-logs",
            on_progress=seen,
            poll_interval_s=0.5,
        )

    background = threading.Thread(target=run_quiet, name="quiet-run")
    here = os.getcwd()
    saved = os.environ.get("AWS_ENDPOINT_URL_S3")
    with contextlib.redirect_stderr(printed):
        background.start()
        # `sweepctl run-local` as a user types it, from the directory `sweepctl init` ran in (its own local Ray);
        # the sandbox's S3 server stands in for the bucket, through the variable Ray and boto3 both read.
        os.chdir(scaffold.parent)
        os.environ["AWS_ENDPOINT_URL_S3"] = s3_server.endpoint_url
        try:
            code = main(
                ["run-local", "-f", "demo-loop/sweep.yaml", "--storage", f"s3://{BUCKET}/sweeps", "--run-id", "plain1",
                 "--log-dir", str(work / "plain-logs")]
            )  # fmt: skip
        finally:
            os.chdir(here)
            if saved is None:
                os.environ.pop("AWS_ENDPOINT_URL_S3", None)
            else:
                os.environ["AWS_ENDPOINT_URL_S3"] = saved
        background.join(timeout=900)
    said = printed.getvalue()
    assert code == 0 and "run-local: succeeded" in said, (
        said[-4000:] + (work / "plain-logs" / "driver.log").read_text()[-6000:]
    )
    result = quiet_outcome.get("run")
    assert result is not None and result.ok, (
        result and result.message,
        result and Path(result.log_path).read_text()[-6000:],
    )
    client = s3_server.client()
    root = S3Uri(BUCKET, "sweeps/default/demo-loop-plain1")
    plain_result = json.loads(client.get_object(Bucket=BUCKET, Key=root.join(s3_layout.RESULT_KEY).key)["Body"].read())
    return (
        PlainRun(plain_result, said, client, root, s3_server.endpoint_url),
        UncheckpointedRun(result, documents, said),
    )


def verify(run: PlainRun, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["verify", str(run.root), "--endpoint-url", run.endpoint, "--min-retention-days", "0", *extra])
    return code, capsys.readouterr().out


def committed_files(run: PlainRun) -> list[str]:
    """Keys of the files Ray committed (the loop's own, not our record), over every trial."""
    keys = []
    for trial in run.result["trialResults"]:
        prefix = run.root.join("train", trial["id"]).prefix
        snapshot = json.loads(
            run.client.get_object(Bucket=run.root.bucket, Key=prefix + s3_layout.SNAPSHOT_FILE)["Body"].read()
        )
        for item in snapshot["checkpoint_results"]:
            listing = run.client.list_objects_v2(
                Bucket=run.root.bucket, Prefix=prefix + item["checkpoint_dir_name"] + "/"
            )
            keys += [
                o["Key"] for o in listing.get("Contents", []) if not o["Key"].endswith(("/", "_commit_record.json"))
            ]
    return keys


@pytest.mark.timeout(900)
def test_a_loop_written_as_ray_teaches_verifies_at_the_committed_level(
    runs: tuple[PlainRun, UncheckpointedRun], capsys: pytest.CaptureFixture[str]
) -> None:
    """No manifest of ours in any checkpoint; every committed one has Ray's files and our commit record, and the
    verifier proves them all at the committed level (R22)."""
    run, _ = runs
    result = run.result
    assert result["trials"]["terminated"] == 2
    keys = committed_files(run)
    assert keys and not any(k.endswith(s3_layout.MANIFEST_FILE) for k in keys)
    assert all(k.endswith("/checkpoint.pt") for k in keys)
    code, out = verify(run, capsys, "--json")
    doc = json.loads(out)
    assert code == 0, out
    checkpoints = doc["checkpoints"]
    assert {c["level"] for c in checkpoints} == {"committed"} and len(checkpoints) == doc["checked"] >= 2
    assert doc["summary"] == f"{doc['checked']} committed"
    assert all(row["checkpointUri"] for row in result["trialResults"])


@pytest.mark.timeout(900)
def test_a_deleted_or_rewritten_file_is_named_and_restoring_it_verifies_again(
    runs: tuple[PlainRun, UncheckpointedRun], capsys: pytest.CaptureFixture[str]
) -> None:
    run, _ = runs
    key = committed_files(run)[0]
    original = run.client.get_object(Bucket=run.root.bucket, Key=key)["Body"].read()
    try:
        # Same size, other bytes: only the ETag the record took tells.
        run.client.put_object(Bucket=run.root.bucket, Key=key, Body=bytes(b ^ 0xFF for b in original))
        code, out = verify(run, capsys)
        assert code == 1 and f"fingerprint-mismatch: s3://{run.root.bucket}/{key}" in out, out
        run.client.delete_object(Bucket=run.root.bucket, Key=key)
        code, out = verify(run, capsys)
        assert code == 1 and f"missing-file: s3://{run.root.bucket}/{key}" in out, out
    finally:
        # Restored by one plain PUT of the same bytes (Ray's pyarrow uploaded it in one part): the same content.
        run.client.put_object(Bucket=run.root.bucket, Key=key, Body=original)
    code, out = verify(run, capsys)
    assert code == 0 and "committed" in out, out


@pytest.mark.timeout(900)
def test_the_report_draws_a_plain_loops_run_and_says_its_level(
    runs: tuple[PlainRun, UncheckpointedRun], tmp_path: Path
) -> None:
    run, _ = runs
    out = tmp_path / "report"
    code = main(["report", "--storage", str(run.root), "--endpoint-url", run.endpoint, "--out", str(out)])
    assert code == 0
    page = (out / "report.html").read_text()
    assert "committed" in page and "<img" in page


@pytest.mark.timeout(900)
def test_a_loop_that_never_checkpoints_is_warned_while_it_runs(runs: tuple[PlainRun, UncheckpointedRun]) -> None:
    """The driver's progress, while the trial still runs, already shows a trial past warnAfterReports without a
    committed checkpoint: the operator's condition and Event come from that document, run-local prints it."""
    _, quiet = runs
    running = [
        d
        for d in quiet.documents
        if any(r.get("status") == "RUNNING" for r in d.get("trialResults") or [])
        and (checkpoint_coverage(d, 3) or None) is not None
    ]
    assert running, quiet.documents
    coverage = checkpoint_coverage(running[0], 3)
    assert coverage is not None and not coverage.ok
    assert "run-local: warning: no trial has committed a checkpoint" in quiet.printed
    final = checkpoint_coverage(quiet.outcome.result, 3)
    assert final is not None and [t.ended for t in final.without] == [True]


def tune_rows(client: Any, root: S3Uri, trial: str) -> list[dict[str, Any]]:
    got = client.get_object(Bucket=root.bucket, Key=root.join("tune", trial, "result.json").key)
    return [json.loads(line) for line in got["Body"].read().decode().splitlines() if line]


def committed_epochs(client: Any, root: S3Uri) -> dict[str, list[int]]:
    """{trial: the epochs its committed checkpoints hold}, from Ray's snapshots (none before the first commit)."""
    found: dict[str, list[int]] = {}
    listing = client.list_objects_v2(Bucket=root.bucket, Prefix=root.join("train").prefix)
    for obj in listing.get("Contents", []):
        if obj["Key"].endswith("/" + s3_layout.SNAPSHOT_FILE):
            snapshot = json.loads(client.get_object(Bucket=root.bucket, Key=obj["Key"])["Body"].read())
            trial = obj["Key"].split("/")[-2]
            found[trial] = sorted(int(r["metrics"]["epoch"]) for r in snapshot["checkpoint_results"])
    return found


@pytest.mark.timeout(900)
def test_a_stopped_plain_loop_resumes_from_its_last_committed_checkpoint_and_every_checkpoint_stays_proven(
    cluster: LocalRayCluster, scaffold: Path, s3_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's driver is stopped once the trial has committed checkpoints (a lost RayJob attempt); the retry of the
    same run continues the trial from its last committed checkpoint through `ray.train.get_checkpoint()`, and every
    checkpoint either attempt committed verifies at the committed level (its record written, or backfilled)."""
    epochs = 12
    manifest = scaffold_sweep(scaffold, s3_server.endpoint_url)
    manifest["metadata"]["name"] = "resumed-loop"
    manifest["spec"]["paramSpace"] = {"lr": 0.05, "hidden": 16, "epochs": epochs, "batch_size": 128}
    manifest["spec"]["tune"].update({"numSamples": 1, "maxConcurrentTrials": 1})
    rayjob = render(manifest, "retry1")
    client = s3_server.client()
    root = S3Uri(BUCKET, "sweeps/default/resumed-loop-retry1")
    stop = threading.Event()
    first: dict[str, LocalRunResult] = {}

    def run_first() -> None:
        first["run"] = run_rayjob(
            rayjob, cluster=cluster, workdir=REPO, code_dirs=[scaffold], log_dir=tmp_path / "a1", stop_event=stop
        )

    background = threading.Thread(target=run_first, name="first-attempt")
    background.start()
    deadline = time.monotonic() + 600
    while not (done := committed_epochs(client, root)) or max(max(e) for e in done.values()) < 2:
        assert background.is_alive(), first["run"].message
        assert time.monotonic() < deadline, "the first attempt never checkpointed"
        time.sleep(0.5)
    stop.set()
    background.join(timeout=300)
    assert "stopped on request" in (first["run"].message or ""), first["run"].message  # the driver's graceful stop
    ((trial, kept),) = committed_epochs(client, root).items()
    stopped_at = max(kept)
    rows_before = len(tune_rows(client, root, trial))
    assert stopped_at < epochs - 1

    second = run_rayjob(rayjob, cluster=cluster, workdir=REPO, code_dirs=[scaffold], log_dir=tmp_path / "a2")
    log = Path(second.log_path).read_text()
    assert second.ok, log[-6000:]
    assert "recovering run retry1" in log
    resumed = [r["epoch"] for r in tune_rows(client, root, trial)[rows_before:]]
    assert resumed[0] == stopped_at + 1 and resumed[-1] == epochs - 1, resumed
    capsys.readouterr()
    code = main(["verify", str(root), "--endpoint-url", s3_server.endpoint_url, "--min-retention-days", "0"])
    out = capsys.readouterr().out
    assert code == 0 and "committed" in out, out
