"""Population-based training's bridge between Tune and Train V2 (training_entrypoints.pbt), with fakes: the pointer a
PBT trial reports to Tune, which Train run a restored trial starts, the seeded run Ray's own checkpoint manager loads,
and the lineage the scheduler records (R7, R13, R18)."""

from __future__ import annotations

import json
import queue
from pathlib import Path
from typing import Any

import pytest
from ray.tune.schedulers import PopulationBasedTraining

from sweep_contracts import s3_layout
from training_entrypoints import pbt
from training_entrypoints.ray_internals import SNAPSHOT_FILENAME


def pointer(trial: str = "t_00000", run: str = "t_00000", checkpoint: str = "checkpoint_epoch-000001") -> Any:
    return pbt.CheckpointPointer(trial, run, checkpoint, 2, {"lr": 0.1})


def snapshot_at(latest: str) -> dict[str, Any]:
    return pbt.seeded_snapshot(latest, {"epoch": 1}, "2.58.0")


def test_a_trial_without_a_pointer_starts_its_first_run_under_its_own_id() -> None:
    assert pbt.choose_train_run("t_00001", None, lambda _: None) == pbt.TrainRunStart("t_00001")


def test_a_trial_restarted_at_its_own_latest_commit_continues_its_own_run_without_a_copy() -> None:
    start = pbt.choose_train_run("t_00000", pointer(), lambda run: snapshot_at("checkpoint_epoch-000001"))
    assert start == pbt.TrainRunStart("t_00000", None, 2)


def test_an_exploited_trial_or_one_whose_run_moved_past_its_pointer_gets_a_new_seeded_run() -> None:
    """Another trial's checkpoint (an exploit), or the trial's own run having committed more than Tune saw: a new
    run, named after the trial and the step, seeded from exactly the pointed checkpoint."""
    exploit = pbt.choose_train_run("t_00003", pointer(), lambda run: None, token=lambda: "abc123")
    assert exploit == pbt.TrainRunStart("t_00003-pbt2-abc123", pointer(), 2)
    moved_on = pbt.choose_train_run("t_00000", pointer(), lambda run: snapshot_at("checkpoint_epoch-000002"))
    assert moved_on.seeded_from == pointer() and moved_on.name.startswith("t_00000-pbt2-")


def test_a_pointer_round_trips_and_refuses_a_path_for_a_name() -> None:
    assert pbt.CheckpointPointer.from_json(pointer().to_json()) == pointer()
    with pytest.raises(ValueError, match="not a directory name"):
        pbt.CheckpointPointer.from_json(pointer(run="../other").to_json())


def write_committed_run(train: Path, run: str, checkpoint: str) -> None:
    folder = train / run / checkpoint
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(b"weights" * 100)
    (folder / "sub").mkdir()
    (folder / "sub" / "shard.bin").write_bytes(b"shard")
    (train / run / SNAPSHOT_FILENAME).write_text(json.dumps(snapshot_at(checkpoint)))


def test_a_seeded_run_is_loaded_by_rays_own_checkpoint_manager_so_any_loop_gets_the_donors_checkpoint(
    tmp_path: Path,
) -> None:
    """R7: the copy, its commit record and a snapshot in Ray 2.58's format: Train V2's CheckpointManager, built as the
    controller builds it for a run of that name, hands the copied checkpoint to the workers (`get_checkpoint()`)."""
    import ray
    from ray.train import CheckpointConfig
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import CheckpointManager
    from ray.train.v2._internal.execution.storage import StorageContext

    train = tmp_path / "train"
    write_committed_run(train, "t_00000", "checkpoint_epoch-000001")
    seeded = pbt.seed_train_run(str(train), "t_00003-pbt2-abc123", pointer())
    copy = Path(seeded) / "checkpoint_epoch-000001"
    assert (copy / "state.pt").read_bytes() == b"weights" * 100 and (
        copy / "sub" / "shard.bin"
    ).read_bytes() == b"shard"
    record = json.loads((copy / s3_layout.COMMIT_RECORD_FILE).read_text())
    assert {f["path"] for f in record["files"]} == {"state.pt", "sub/shard.bin"}
    manager = CheckpointManager(CheckpointConfig(), StorageContext(str(train), "t_00003-pbt2-abc123"))
    latest = manager.latest_checkpoint_result
    assert latest is not None and latest.checkpoint.path.endswith("t_00003-pbt2-abc123/checkpoint_epoch-000001")
    assert latest.metrics == {"epoch": 1}
    assert json.loads((Path(seeded) / SNAPSHOT_FILENAME).read_text())["ray_version"] == ray.__version__


def test_a_checkpoint_the_donors_snapshot_does_not_commit_is_never_copied(tmp_path: Path) -> None:
    train = tmp_path / "train"
    write_committed_run(train, "t_00000", "checkpoint_epoch-000001")
    (train / "t_00000" / "checkpoint_epoch-000002").mkdir()
    with pytest.raises(pbt.SeedError, match="not committed"):
        pbt.seed_train_run(str(train), "t_00003-pbt2-x", pointer(checkpoint="checkpoint_epoch-000002"))
    assert not (train / "t_00003-pbt2-x").exists()


def run_reporter(items: list[tuple[dict[str, Any], str | None]], committed: str | None = None) -> list[Any]:
    """A PointerReporter over a local queue: `fit` hands `items` as the Train callback would; the fake Tune report
    keeps each result and the pointer its checkpoint holds at the time of the call."""
    reports: list[Any] = []

    def report(metrics: dict[str, Any], checkpoint: Any = None) -> None:
        found = None
        if checkpoint is not None:
            found = json.loads((Path(checkpoint.path) / pbt.POINTER_FILE).read_text())
        reports.append((metrics, found))

    feed: queue.Queue[Any] = queue.Queue()
    reporter = pbt.PointerReporter("t_00001", "t_00001", {"lr": 0.1}, feed, "s3://b/run/train/t_00001", committed)

    def fit() -> None:
        for item in items:
            feed.put(item)

    reporter.run(fit, report=report)
    return reports


def test_every_result_after_the_first_commit_carries_a_pointer_at_the_last_committed_checkpoint_R18() -> None:
    """Tune's PBT saves and clones the checkpoint of a trial's last result: each result points at the newest
    committed Train checkpoint, also a result whose own report had none; `checkpoint_path` as TuneReportCallback."""
    reports = run_reporter([({"loss": 3.0}, None), ({"loss": 2.0}, "checkpoint_a"), ({"loss": 1.0}, None)])
    assert [m["loss"] for m, _ in reports] == [3.0, 2.0, 1.0]
    assert reports[0][1] is None  # nothing committed yet: nothing to clone
    assert reports[1][1]["checkpoint"] == reports[2][1]["checkpoint"] == "checkpoint_a"
    assert [p["iteration"] for _, p in reports[1:]] == [2, 3]
    assert reports[1][0]["checkpoint_path"] == "b/run/train/t_00001/checkpoint_a"
    assert "checkpoint_path" not in reports[2][0] and all(m["train_run"] == "t_00001" for m, _ in reports)


def test_a_seeded_run_points_at_its_copy_before_its_first_new_commit() -> None:
    (only,) = run_reporter([({"loss": 1.0}, None)], committed="checkpoint_epoch-000001")
    assert only[1]["checkpoint"] == "checkpoint_epoch-000001" and only[1]["train_run"] == "t_00001"


def test_a_failed_fit_fails_the_trial_after_its_results_reached_tune() -> None:
    reports: list[Any] = []
    reporter = pbt.PointerReporter("t", "t", {}, queue.Queue(), "/tmp/run/train/t")

    def fit() -> None:
        reporter.report_queue.put(({"loss": 1.0}, "checkpoint_a"))
        raise RuntimeError("worker died")

    with pytest.raises(RuntimeError, match="worker died"):
        reporter.run(fit, report=lambda metrics, checkpoint=None: reports.append(metrics))
    assert len(reports) == 1


class FakeTrial:
    def __init__(self, trial_id: str, config: dict[str, Any]):
        self.trial_id, self.config = trial_id, config


def test_each_exploit_is_recorded_with_donor_step_and_config_change_and_the_lineage_stays_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fake_exploit(self: Any, controller: Any, trial: FakeTrial, donor: FakeTrial) -> None:
        trial.config = {**donor.config, "lr": donor.config["lr"] * 0.8}

    monkeypatch.setattr(PopulationBasedTraining, "_exploit", fake_exploit)
    scheduler = pbt.LineagePBT(hyperparam_mutations={"lr": [0.1, 0.2]}, perturbation_interval=2)
    donor, trial = FakeTrial("t_00000", {"lr": 0.5, "hidden": 8}), FakeTrial("t_00001", {"lr": 0.1, "hidden": 8})
    scheduler._trial_state = {donor: type("State", (), {"last_train_time": 4})()}
    scheduler._exploit(None, trial, donor)
    (entry,) = scheduler.document()["entries"]
    assert (entry["trial"], entry["donor"], entry["step"], entry["changes"]) == (
        "t_00001",
        "t_00000",
        4,
        {"lr": [0.5, 0.4]},
    )
    for _ in range(pbt.LINEAGE_MAX + 5):
        scheduler._exploit(None, trial, donor)
    document = scheduler.document()
    assert document["exploits"] == pbt.LINEAGE_MAX + 6 and len(document["entries"]) == pbt.LINEAGE_MAX
    resumed = pbt.LineagePBT(hyperparam_mutations={"lr": [0.1, 0.2]})
    resumed.restore_lineage(json.loads(json.dumps(document)))
    assert resumed.document() == document


def test_pbt_creates_the_whole_population_at_once_R13() -> None:
    """A generator limited to maxConcurrentTrials would hand PBT populations of two; the trial-driver slots limit
    how many run."""
    from sweep_operator.validation import parse_sweep
    from tests.support.factories import changed, cpu_sweep
    from training_entrypoints.search import build_searcher

    spec = parse_sweep(
        changed(
            cpu_sweep(),
            {"spec.tune.numSamples": 4, "spec.tune.scheduler": {"type": "pbt", "hyperparamMutations": ["lr"]}},
        )
    ).spec
    assert build_searcher(spec).max_concurrent == 0


def test_the_operator_mirrors_the_lineage_into_the_sweep_status_bounded_and_typed() -> None:
    """The driver's `lineage` (tenant-written) becomes `status.lineage`: the newest entries, each value of its schema
    type, the changes as text; the whole status validates against the CRD's model."""
    from sweep_contracts.api import SweepStatus
    from sweep_contracts.status_models import MAX_LINEAGE_ENTRIES
    from sweep_operator.status import progress_patch

    entries = [
        {
            "trial": f"t_{i:05d}",
            "donor": "t_00000",
            "step": 2 * i,
            "changes": {"lr": [0.5, 0.4], "x": "bad"},
            "at": "now",
        }
        for i in range(MAX_LINEAGE_ENTRIES + 3)
    ]
    entries.append({"trial": ["not text"], "step": True})
    patch = progress_patch({"trials": {}, "lineage": {"exploits": 99, "entries": entries}})
    lineage = patch["lineage"]
    assert lineage["exploits"] == 99 and len(lineage["entries"]) == MAX_LINEAGE_ENTRIES
    assert lineage["entries"][-1] == {"changes": []}
    assert lineage["entries"][0]["changes"] == [{"param": "lr", "before": "0.5", "after": "0.4"}]
    SweepStatus.model_validate({"lineage": lineage})
    assert "lineage" not in progress_patch({"trials": {}})


def test_the_report_draws_each_trials_line_from_the_run_or_the_sweep_status() -> None:
    """From the run's status.json ({param: [before, after]}) or the sweep's status ([{param, before, after}])."""
    from sweep_operator.cli.report_html import _lineage_section
    from sweep_operator.cli.report_records import RunRecords

    run_doc = {
        "lineage": {"exploits": 3, "entries": [{"trial": "t_1", "donor": "t_0", "step": 2, "changes": {"x": [8, 4]}}]}
    }
    section = _lineage_section(RunRecords(root="r", progress=run_doc))
    assert "<h2>Lineage</h2>" in section and "the newest 1 of 3" in section
    assert "t_1 \u2500 step 2: from t_0 (x: 8 \u2192 4) \u2500\u25b6 t_1" in section
    sweep = {"status": {"lineage": {"exploits": 1, "entries": [
        {"trial": "t_2", "donor": "t_3", "step": 4, "changes": [{"param": "lr", "before": "0.5", "after": "0.4"}]}
    ]}}}  # fmt: skip
    assert "from t_3 (lr: 0.5 \u2192 0.4)" in _lineage_section(RunRecords(root="r", sweep=sweep))
    assert _lineage_section(RunRecords(root="r", progress={})) == ""


def test_the_report_draws_no_curve_of_a_weights_checksum() -> None:
    """The digits loop reports checksums of its weights (what a restart loaded): fingerprints, not model measures."""
    from sweep_operator.cli.report_data import reported_metrics
    from sweep_operator.cli.report_records import RunRecords

    rows = [{"epoch": 1, "val_loss": 0.5, "weights_checksum": 12.5, "loaded_weights_checksum": 11.0}]
    assert reported_metrics(RunRecords(root="r", trial_results={"t_0": rows})) == ["val_loss"]
