"""`_sweep/status.json` and `_sweep/result.json`: their shape, the best trial, and the throttled Tune callback."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sweep_contracts.api import BestTrial, TrialCounts
from sweep_contracts.s3_layout import RunLayout
from sweep_operator.status import progress_patch
from sweep_operator.verification import best_checkpoint_uri
from training_entrypoints import storage
from training_entrypoints.progress import (
    SweepProgressCallback,
    TrialSummary,
    best_trial,
    result_document,
    status_document,
    trial_counts,
)

TRIALS = [
    TrialSummary("t0", "TERMINATED", {"lr": 0.1}, 0.30, "s3://b/p/ns/s-r/train/t0/checkpoint_epoch-000002"),
    TrialSummary("t1", "TERMINATED", {"lr": 0.01}, 0.20, "s3://b/p/ns/s-r/train/t1/checkpoint_epoch-000002"),
    TrialSummary("t2", "ERROR", {"lr": 0.5}, None, None, error="RuntimeError: boom"),
    TrialSummary("t3", "PAUSED", {"lr": 0.05}),
    TrialSummary("t4", "RUNNING", {"lr": 0.02}, 0.25),
]


def test_trial_counts_follow_the_trainingsweep_status_fields() -> None:
    counts = trial_counts(TRIALS)
    assert counts == {"total": 5, "pending": 1, "running": 1, "terminated": 2, "errored": 1}
    TrialCounts.model_validate(counts)


@pytest.mark.parametrize(("mode", "expected"), [("min", "t1"), ("max", "t0")])
def test_best_trial_follows_the_mode(mode: str, expected: str) -> None:
    assert best_trial(TRIALS, "val_loss", mode)["id"] == expected


def test_no_best_trial_without_a_metric_or_any_value() -> None:
    assert best_trial(TRIALS, None, None) is None
    assert best_trial([TrialSummary("t", "RUNNING")], "val_loss", "min") is None


def test_result_file_has_the_design_shape_and_every_reader_accepts_it() -> None:
    doc = result_document(
        TRIALS, "val_loss", "min", run={"namespace": "ns", "sweep": "s", "runId": "r"}, deadline_reached=True
    )
    assert doc["bestTrial"] == {
        "id": "t1",
        "metric": "val_loss",
        "value": 0.2,
        "config": {"lr": 0.01},
        "checkpointUri": "s3://b/p/ns/s-r/train/t1/checkpoint_epoch-000002",
    }
    assert doc["trials"]["total"] == 5 and doc["deadlineReached"] is True
    assert doc["errors"] == [{"trial": "t2", "error": "RuntimeError: boom"}]
    assert [t["id"] for t in doc["trialResults"]] == ["t0", "t1", "t2", "t3", "t4"]
    assert doc["finishedAt"].endswith("Z") and (doc["namespace"], doc["sweep"], doc["runId"]) == ("ns", "s", "r")
    data = json.dumps(doc).encode()
    # The operator's status reader, its API model and the verifier read the same file.
    assert best_checkpoint_uri(data) == doc["bestTrial"]["checkpointUri"]
    BestTrial.model_validate(doc["bestTrial"])
    assert progress_patch(json.loads(data))["trialsSummary"] == "3/5 (1 running)"


def test_status_file_carries_phase_counts_best_and_time() -> None:
    doc = status_document(TRIALS, "val_loss", "min")
    assert doc["phase"] == "Running" and doc["trials"]["running"] == 1
    assert doc["bestTrial"]["id"] == "t1" and doc["updatedAt"].endswith("Z")


def test_checkpoint_paths_get_their_scheme_back_under_an_s3_root_R18() -> None:
    """R18: Ray reports checkpoint paths with the scheme stripped; the result file holds full URIs."""
    assert storage.to_uri("bucket/p/train/t/checkpoint_epoch-000001", "s3://bucket/p") == (
        "s3://bucket/p/train/t/checkpoint_epoch-000001"
    )
    assert (
        storage.to_uri("/data/p/train/t/checkpoint_epoch-000001", "/data/p")
        == "/data/p/train/t/checkpoint_epoch-000001"
    )


def fake_trial(trial_id: str, status: str, loss: float | None) -> Any:
    return SimpleNamespace(
        trial_id=trial_id,
        status=status,
        config={"lr": 0.1, "_sweep": {"trialId": trial_id}},
        metric_analysis={"val_loss": {"min": loss, "max": loss}} if loss is not None else {},
        last_result={"checkpoint_path": f"/root/train/{trial_id}/checkpoint_epoch-000000"} if loss is not None else {},
    )


def test_progress_callback_writes_status_at_most_every_interval(tmp_path: Path) -> None:
    now = [100.0]
    layout = RunLayout(str(tmp_path / "run"))
    callback = SweepProgressCallback(layout, "val_loss", "min", interval_s=5.0, clock=lambda: now[0])
    status_path = Path(layout.status_path)

    callback.on_trial_start(1, [fake_trial("a", "RUNNING", None)], None)
    callback.flush()  # written on a background thread
    first = json.loads(status_path.read_text())
    assert first["trials"]["running"] == 1 and first["bestTrial"] is None

    now[0] += 1
    callback.on_trial_result(2, [fake_trial("a", "RUNNING", 0.4)], None, {})
    callback.flush()
    assert json.loads(status_path.read_text()) == first  # throttled

    now[0] += 5
    callback.on_step_end(3, [fake_trial("a", "TERMINATED", 0.4), fake_trial("b", "RUNNING", 0.3)])
    callback.on_experiment_end([fake_trial("a", "TERMINATED", 0.4), fake_trial("b", "RUNNING", 0.3)])  # waits
    latest = json.loads(status_path.read_text())
    assert latest["trials"] == {"total": 2, "pending": 0, "running": 1, "terminated": 1, "errored": 0}
    assert latest["bestTrial"]["id"] == "b" and latest["bestTrial"]["config"] == {"lr": 0.1}  # no sweep context
    assert latest["bestTrial"]["checkpointUri"] == "/root/train/b/checkpoint_epoch-000000"


def test_a_status_that_says_nothing_new_is_not_written_again(tmp_path: Path) -> None:
    """Only the time changed: no write (the operator downloads status.json again only when its ETag changes); a new
    report is written; a failed write is tried again on the next due write."""
    now = [100.0]
    layout = RunLayout(str(tmp_path / "run"))
    callback = SweepProgressCallback(
        layout, "val_loss", "min", interval_s=5.0, clock=lambda: now[0], demand_reader=None
    )
    status_path = Path(layout.status_path)
    writes: list[str] = []
    real_write = storage.write_json

    def counting(path: str, document: dict) -> None:
        writes.append(document["updatedAt"])
        real_write(path, document)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(storage, "write_json", counting)
        callback.on_trial_start(1, [fake_trial("a", "RUNNING", None)], None)
        callback.flush()
        for _ in range(3):  # nothing new: due by time, not written
            now[0] += 6
            callback.on_step_end(2, [fake_trial("a", "RUNNING", None)])
            callback.flush()
        assert len(writes) == 1
        now[0] += 6
        callback.on_trial_result(3, [fake_trial("a", "RUNNING", 0.4)], None, {})  # a new best: written
        callback.flush()
        assert len(writes) == 2 and json.loads(status_path.read_text())["bestTrial"]["id"] == "a"

        def failing(path: str, document: dict) -> None:
            raise OSError("S3 unavailable")

        patch.setattr(storage, "write_json", failing)
        now[0] += 6
        callback.on_step_end(4, [fake_trial("a", "TERMINATED", 0.4)])
        callback.flush()
        patch.setattr(storage, "write_json", counting)
        now[0] += 6
        callback.on_step_end(5, [fake_trial("a", "TERMINATED", 0.4)])  # the same state: written now
        callback.flush()
        assert len(writes) == 3 and json.loads(status_path.read_text())["trials"]["terminated"] == 1


def test_progress_callback_pickles_without_its_trials_or_writer_thread(tmp_path: Path) -> None:
    """Tune pickles callbacks with the experiment (tuner.pkl)."""
    import pickle

    callback = SweepProgressCallback(RunLayout(str(tmp_path / "run")), "val_loss", "min")
    callback.on_trial_start(1, [fake_trial("a", "RUNNING", None)], None)
    restored = pickle.loads(pickle.dumps(callback))
    callback.flush()
    assert restored.trials == [] and restored.layout == callback.layout and restored.metric == "val_loss"


# ------------------------------------------------------------------------------ what Ray waits for (R20)

# Shaped like ray.util.placement_group_table() in ray 2.58.0 (ray/_private/state.py _gen_placement_group_info).
PG_TABLE = {
    "aa01": {
        "placement_group_id": "aa01",
        "name": "",
        "bundles": {0: {"CPU": 2.0}, 1: {"CPU": 2.0}},
        "strategy": "PACK",
        "state": "PENDING",
    },
    "aa02": {
        "placement_group_id": "aa02",
        "name": "",
        "bundles": {0: {"GPU": 1.0, "CPU": 4.0}},
        "strategy": "PACK",
        "state": "PENDING",
    },
    "aa03": {
        "placement_group_id": "aa03",
        "name": "",
        "bundles": {0: {"CPU": 0.0, "sweep_trial_driver": 1.0}},
        "strategy": "PACK",
        "state": "CREATED",
    },
}
NODES = [{"CPU": 6.0, "memory": 1e9, "object_store_memory": 1e8, "sweep_trial_driver": 2.0, "node:127.0.0.1": 1.0}]


def test_pending_block_names_what_ray_waits_for_and_which_bundle_no_node_can_hold_R20() -> None:
    first_seen = {"aa01": 40.0}
    block = progress_summarize(first_seen)
    assert block["trials"] == 2 and block["oldestPendingSeconds"] == 120.0
    groups = [w for w in block["waitingFor"] if w["kind"] == "placementGroup"]
    assert [(g["bundles"], g["pendingSeconds"], g["infeasible"]) for g in groups] == [
        ([{"CPU": 2.0}, {"CPU": 2.0}], 60.0, False),  # waits for CPUs other trials hold
        ([{"CPU": 4.0, "GPU": 1.0}], 0.0, True),  # no node has a GPU: only a new node helps
    ]
    (tasks,) = [w for w in block["waitingFor"] if w["kind"] == "tasksAndActors"]
    assert tasks == {"kind": "tasksAndActors", "bundle": {"CPU": 1.0}, "count": 3, "infeasible": False}
    assert block["clusterResources"] == {"CPU": 6.0, "sweep_trial_driver": 2.0}
    assert set(first_seen) == {"aa01", "aa02"}  # the created group is not waited for


def progress_summarize(first_seen: dict[str, float]) -> dict[str, Any]:
    from training_entrypoints.progress import summarize_pending

    return summarize_pending(
        {"t1": 120.0, "t2": 30.0}, PG_TABLE, NODES, [({"CPU": 1.0}, 3)], first_seen, 100.0, failed_launches=1
    )


def test_status_pending_block_becomes_waiting_for_and_clears_when_nothing_waits_R20() -> None:
    """The operator's pure mapping: one line naming trials, ages, bundles and the hopeless one; None clears it (the
    merge patch removes the field), and result.json, which has no pending block, clears it too."""
    doc = status_document(
        [TrialSummary("t1", "PENDING"), TrialSummary("t2", "PENDING")],
        "val_loss",
        "min",
        pending=progress_summarize({}),
    )
    text = progress_patch(json.loads(json.dumps(doc)))["waitingFor"]
    assert text.startswith(
        "2 trial(s) pending (oldest for 120s); Ray is waiting for placement group PACK of 2 x {CPU: 2} pending 0s"
    )
    assert (
        "placement group PACK of 1 x {CPU: 4, GPU: 1} pending 0s; no node can hold it: the autoscaler must add one"
        in text
    )
    assert "3 task(s)/actor(s) of {CPU: 1}" in text and "1 node launch(es) failed" in text
    assert text.endswith("the cluster has {CPU: 6, sweep_trial_driver: 2}")
    idle = status_document(TRIALS, "val_loss", "min", pending={"trials": 0, "waitingFor": [], "failedLaunches": 0})
    assert progress_patch(idle)["waitingFor"] is None
    final = result_document(TRIALS, "val_loss", "min", run={"namespace": "ns", "sweep": "s", "runId": "r"})
    assert progress_patch(final)["waitingFor"] is None


def test_progress_callback_writes_the_pending_block_with_ages_across_writes_R20(tmp_path: Path) -> None:
    now = [100.0]
    layout = RunLayout(str(tmp_path / "run"))
    reads: list[int] = []

    def demand() -> tuple[dict, list, list, int, int]:
        reads.append(1)
        return {"aa01": PG_TABLE["aa01"]}, NODES, [], 0, 0

    callback = SweepProgressCallback(
        layout, "val_loss", "min", interval_s=5.0, clock=lambda: now[0], demand_reader=demand
    )
    callback.on_step_end(1, [fake_trial("a", "PENDING", None), fake_trial("b", "RUNNING", None)])
    callback.flush()
    now[0] += 30
    callback.on_step_end(2, [fake_trial("a", "PENDING", None), fake_trial("b", "RUNNING", None)])
    callback.flush()
    pending = json.loads(Path(layout.status_path).read_text())["pending"]
    assert (pending["trials"], pending["oldestPendingSeconds"]) == (1, 30.0)
    assert pending["waitingFor"][0]["pendingSeconds"] == 30.0 and len(reads) == 2
    now[0] += 30
    callback.on_step_end(3, [fake_trial("a", "RUNNING", None), fake_trial("b", "RUNNING", None)])
    callback.flush()
    assert json.loads(Path(layout.status_path).read_text())["pending"]["trials"] == 0


def test_a_failing_demand_reader_never_costs_the_status_write(tmp_path: Path) -> None:
    layout = RunLayout(str(tmp_path / "run"))

    def broken() -> tuple[dict, list, list, int, int]:
        raise RuntimeError("GCS unavailable")

    callback = SweepProgressCallback(layout, "val_loss", "min", demand_reader=broken)
    callback.on_step_end(1, [fake_trial("a", "PENDING", None)])
    callback.flush()
    doc = json.loads(Path(layout.status_path).read_text())
    assert doc["trials"]["pending"] == 1 and "pending" not in doc


def test_status_file_names_every_trials_checkpoint_for_the_verifier() -> None:
    """Issue 12, defect 6: the verifier learns from status.json which trials must have checkpoints."""
    from sweep_operator.verification import recorded_checkpoints

    doc = status_document(TRIALS, "val_loss", "min")
    assert recorded_checkpoints(json.dumps(doc).encode(), "status.json") == {
        "t0": "s3://b/p/ns/s-r/train/t0/checkpoint_epoch-000002",
        "t1": "s3://b/p/ns/s-r/train/t1/checkpoint_epoch-000002",
    }
