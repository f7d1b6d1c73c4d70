"""Which trials must have checkpoints comes from the run's surviving records, not from what is left in train/ (R22).

Records: `_sweep/status.json` and `_sweep/result.json` (`trialResults`), and Tune's `tune/experiment_state-*.json`
(each trial's last result carries the checkpoint path TuneReportCallback forwarded, R18).
"""

from __future__ import annotations

import json

import pytest

from sweep_contracts import s3_layout
from sweep_operator import verification as v
from sweep_operator.verification import experiment_state_checkpoints, recorded_checkpoints, verify_sweep_checkpoints
from tests.support.fake_s3 import FakeS3
from tests.support.sweep_factory import EXPERIMENT_STATE_NAME, REAL_TUNE_EXPERIMENT_STATE, SyntheticSweep, write_sweep

BUCKET = "bucket-a"


@pytest.fixture
def s3() -> FakeS3:
    fake = FakeS3(versioning={BUCKET: "Enabled"})
    fake.create_bucket(Bucket=BUCKET)
    return fake


@pytest.fixture
def sweep(s3: FakeS3) -> SyntheticSweep:
    return write_sweep(s3, BUCKET, trials=3, checkpoints=2, files=2, file_size=16)


def verify(s3: FakeS3, sweep: SyntheticSweep) -> v.VerificationResult:
    return verify_sweep_checkpoints(s3, sweep.root_uri)


def kinds_and_keys(result: v.VerificationResult) -> list[tuple[str, str]]:
    return [(p.kind, p.key) for p in result.problems]


def strip_status_and_result(s3: FakeS3, sweep: SyntheticSweep) -> None:
    s3.delete_object(Bucket=BUCKET, Key=sweep.result_key)
    s3.delete_object(Bucket=BUCKET, Key=sweep.root.join(s3_layout.STATUS_KEY).key)


def test_the_complete_synthetic_run_is_verified(s3: FakeS3, sweep: SyntheticSweep) -> None:
    result = verify(s3, sweep)
    assert result.verified, result.problems


def test_a_deleted_trial_directory_is_not_verified_R22(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """Today's main read a vanished train/<trial>/ as a trial that never checkpointed."""
    prefix = sweep.delete_trial_dir(sweep.trials[1])
    result = verify(s3, sweep)
    assert not result.verified
    assert (v.MISSING_TRIAL, prefix) in kinds_and_keys(result)
    assert "result.json records its checkpoint" in next(p.detail for p in result.problems if p.kind == v.MISSING_TRIAL)


def test_all_of_train_deleted_is_not_verified_one_problem_per_trial_R22(s3: FakeS3, sweep: SyntheticSweep) -> None:
    sweep.delete_train_dir()
    result = verify(s3, sweep)
    assert not result.verified
    missing = [p.key for p in result.problems if p.kind == v.MISSING_TRIAL]
    assert missing == [sweep.trial_prefix(t) for t in sweep.trials]
    assert v.NO_CHECKPOINTS not in [w.kind for w in result.warnings]


def test_tunes_experiment_state_alone_still_names_the_trials_R22(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """status.json and result.json gone too: Tune's own record of the trials' checkpoints is enough to hold."""
    strip_status_and_result(s3, sweep)
    sweep.delete_train_dir()
    result = verify(s3, sweep)
    assert [p.kind for p in result.problems] == [v.MISSING_TRIAL] * 3
    assert all(f"tune/{EXPERIMENT_STATE_NAME} records its checkpoint" in p.detail for p in result.problems)


def test_status_json_alone_still_names_the_trials_R22(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """A sweep deleted while running: no result.json yet, Tune's state not synced; the driver's status names them."""
    s3.delete_object(Bucket=BUCKET, Key=sweep.result_key)
    s3.delete_object(Bucket=BUCKET, Key=sweep.root.join("tune", EXPERIMENT_STATE_NAME).key)
    prefix = sweep.delete_trial_dir()
    result = verify(s3, sweep)
    assert kinds_and_keys(result) == [(v.MISSING_TRIAL, prefix)]
    assert "_sweep/status.json records its checkpoint" in result.problems[0].detail


def test_a_trial_left_with_only_its_storage_marker_is_not_verified(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """Snapshot and checkpoint dirs deleted, Ray's marker left: the records say it had a checkpoint."""
    trial = sweep.trials[2]
    sweep.delete_trial_dir(trial)
    s3.put_object(Bucket=BUCKET, Key=sweep.trial_prefix(trial) + ".validate_storage_marker", Body=b"")
    result = verify(s3, sweep)
    assert kinds_and_keys(result) == [(v.MISSING_SNAPSHOT, sweep.snapshot_key(trial))]


def test_a_snapshot_that_commits_nothing_for_a_recorded_trial_is_not_verified(
    s3: FakeS3, sweep: SyntheticSweep
) -> None:
    from tests.support.sweep_factory import ray_snapshot

    trial = sweep.trials[1]
    for name in sweep.checkpoints[trial]:
        sweep.delete_checkpoint_dir(trial, name)
    sweep.write_snapshot_bytes(json.dumps(ray_snapshot([])).encode(), trial)
    result = verify(s3, sweep)
    assert kinds_and_keys(result) == [(v.MISSING_CHECKPOINT, sweep.trial_prefix(trial))]


def test_a_trial_the_records_show_without_a_checkpoint_needs_none(s3: FakeS3) -> None:
    """Fail closed only on evidence: a trial that errored before its first report has nothing to protect."""
    sweep = write_sweep(s3, BUCKET, trials=2, checkpoints=1, files=1, file_size=8)
    rows = [dict(r) for r in sweep.trial_results] + [{"id": "trial_0099", "status": "ERROR", "checkpointUri": None}]
    sweep.trial_results = rows
    sweep.set_best_checkpoint_uri(sweep.best_checkpoint_uri)
    result = verify(s3, sweep)
    assert result.verified, result.problems


def test_result_json_naming_a_trial_checkpoint_that_is_not_committed_is_not_verified(
    s3: FakeS3, sweep: SyntheticSweep
) -> None:
    trial = sweep.trials[1]
    prefix = sweep.add_uncommitted_checkpoint(trial)
    sweep.trial_results[1] = {**sweep.trial_results[1], "checkpointUri": f"s3://{BUCKET}/{prefix.rstrip('/')}"}
    sweep.set_best_checkpoint_uri(sweep.best_checkpoint_uri)
    result = verify(s3, sweep)
    assert kinds_and_keys(result) == [(v.RECORDED_CHECKPOINT_UNVERIFIED, sweep.result_key)]
    assert f"trial {trial}'s checkpoint" in result.problems[0].detail


@pytest.mark.parametrize("record", ["status", "experiment-state"])
def test_an_unreadable_record_is_not_verified(s3: FakeS3, sweep: SyntheticSweep, record: str) -> None:
    """Which trials must have checkpoints is then unknown: fail closed."""
    key = sweep.root.join(s3_layout.STATUS_KEY if record == "status" else f"tune/{EXPERIMENT_STATE_NAME}").key
    s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"trialResults": "not a list", "trial_data": 3}')
    result = verify(s3, sweep)
    assert kinds_and_keys(result) == [(v.INVALID_RECORD, key)]


def test_the_real_tune_experiment_state_is_read() -> None:
    """The fixture is Tune 2.58.0's own file (a real run whose trials reported checkpoint_path)."""
    found = experiment_state_checkpoints(REAL_TUNE_EXPERIMENT_STATE.read_bytes(), "experiment_state")
    assert found == {
        "993a1_00000": "bucket/run/train/t1/checkpoint_epoch-000001",
        "993a1_00001": "bucket/run/train/t3/checkpoint_epoch-000001",
    }


def test_recorded_checkpoints_reads_trial_results_and_the_best_trial() -> None:
    doc = {
        "trialResults": [{"id": "a", "checkpointUri": "s3://b/x/train/a/c1"}, {"id": "b", "checkpointUri": None}],
        "bestTrial": {"id": "c", "checkpointUri": "s3://b/x/train/c/c2"},
    }
    assert recorded_checkpoints(json.dumps(doc).encode(), "status.json") == {
        "a": "s3://b/x/train/a/c1",
        "c": "s3://b/x/train/c/c2",
    }
    assert recorded_checkpoints(b'{"trials": {"total": 2}}', "status.json") == {}
    with pytest.raises(v.FormatError, match=r"trialResults\[0\]"):
        recorded_checkpoints(b'{"trialResults": [{"checkpointUri": "s3://b/k"}]}', "status.json")
