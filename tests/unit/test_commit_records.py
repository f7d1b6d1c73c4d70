"""Commit records (R22, R7): any loop's checkpoints, proven at the committed level from what Ray committed; our helpers'
manifests add the full-state level. The writer (our Train callback), its backfill after a controller died, and the
verifier's two levels, against an in-memory S3 that lists ETags as S3 does."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any

import pytest

from sweep_contracts import commit_record, s3_layout
from sweep_contracts.checkpoint_manifest import FormatError
from sweep_operator import verification as v
from sweep_operator.verification import verify_sweep_checkpoints
from tests.support.fake_s3 import FakeS3
from tests.support.sweep_factory import ray_snapshot, write_sweep
from training_entrypoints import commit_records

BUCKET = "bucket-a"
ROOT = f"s3://{BUCKET}/sweeps/team-a/plain-r1"
TRIAL = "t1"
TRIAL_DIR = f"{ROOT}/train/{TRIAL}"
PLAIN_FILES = {"model.pt": b"m" * 300, "optimizer.pt": b"o" * 120, "extra/notes.txt": b"epoch 3"}


@pytest.fixture
def s3() -> FakeS3:
    fake = FakeS3(versioning={BUCKET: "Enabled"})
    fake.create_bucket(Bucket=BUCKET)
    return fake


@pytest.fixture
def store(s3: FakeS3) -> commit_records.S3Store:
    return commit_records.S3Store(client=s3)


def key(*parts: str) -> str:
    return s3_layout.S3Uri.parse(s3_layout.join(TRIAL_DIR, *parts)).key


def write_plain_checkpoint(s3: FakeS3, name: str, files: dict[str, bytes] = PLAIN_FILES) -> None:
    """What `Checkpoint.from_directory` + `ray.train.report` upload for a loop written as Ray's docs teach: the
    loop's own files, no manifest, and a `dir/` marker as pyarrow writes."""
    s3.put_object(Bucket=BUCKET, Key=key(name) + "/", Body=b"")
    for path, data in files.items():
        s3.put_object(Bucket=BUCKET, Key=key(name, path), Body=data)


def commit(s3: FakeS3, *names: str) -> None:
    """Ray's checkpoint manager's snapshot, naming `names` as committed."""
    s3.put_object(Bucket=BUCKET, Key=key(s3_layout.SNAPSHOT_FILE), Body=json.dumps(ray_snapshot(names)).encode())


def result_json(s3: FakeS3, best: str) -> None:
    doc = {
        "bestTrial": {"id": TRIAL, "metric": "loss", "value": 0.1, "checkpointUri": f"{TRIAL_DIR}/{best}"},
        "trialResults": [{"id": TRIAL, "status": "TERMINATED", "checkpointUri": f"{TRIAL_DIR}/{best}"}],
    }
    s3.put_object(
        Bucket=BUCKET, Key=s3_layout.S3Uri.parse(ROOT).join(s3_layout.RESULT_KEY).key, Body=json.dumps(doc).encode()
    )


def record_of(s3: FakeS3, name: str) -> commit_record.CommitRecord:
    body = s3.get_object(Bucket=BUCKET, Key=key(name, s3_layout.COMMIT_RECORD_FILE))["Body"].read()
    return commit_record.parse_record(body)


class FakeCheckpoint:
    """`ray.train.Checkpoint` as the controller's callbacks receive it: a scheme-less path."""

    def __init__(self, name: str):
        self.path = s3_layout.strip_scheme(f"{TRIAL_DIR}/{name}")


# ---------------------------------------------------------------------------------- the writer


def test_a_committed_checkpoint_of_a_plain_loop_gets_a_record_of_every_file_with_its_etag(
    s3: FakeS3, store: commit_records.S3Store
) -> None:
    write_plain_checkpoint(s3, "checkpoint_a")
    commit(s3, "checkpoint_a")
    s3.calls.clear()
    outcome = commit_records.record_checkpoint(f"{TRIAL_DIR}/checkpoint_a", store)
    assert outcome == commit_records.RecordOutcome("checkpoint_a", True, "recorded")
    record = record_of(s3, "checkpoint_a")
    assert record.fingerprint == commit_record.FINGERPRINT_S3_ETAG and not record.backfilled
    assert {(e.path, e.size) for e in record.files} == {(p, len(d)) for p, d in PLAIN_FILES.items()}
    listed = {
        o["Key"]: o["ETag"].strip('"')
        for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=key("checkpoint_a"))["Contents"]
    }
    assert all(listed[key("checkpoint_a", e.path)] == e.fingerprint for e in record.files)
    # reading no checkpoint data: one snapshot read, one listing, one PUT
    assert s3.operations()[:3] == ["get_object", "list_objects_v2", "put_object"]


def test_a_checkpoint_retention_already_deleted_or_never_committed_gets_no_record(
    s3: FakeS3, store: commit_records.S3Store
) -> None:
    write_plain_checkpoint(s3, "checkpoint_a")
    commit(s3, "checkpoint_b")  # Ray kept another one: a worse-scored new checkpoint is deleted at once
    s3.calls.clear()
    outcome = commit_records.record_checkpoint(f"{TRIAL_DIR}/checkpoint_a", store)
    assert outcome.written is False and outcome.why == "not committed"
    assert "put_object" not in s3.operations()


def test_the_callback_records_off_the_controller_loop_and_waits_for_it_at_shutdown(s3: FakeS3) -> None:
    write_plain_checkpoint(s3, "checkpoint_a")
    commit(s3, "checkpoint_a")
    s3.calls.clear()
    gate = threading.Event()
    entered = threading.Event()

    class SlowStore(commit_records.S3Store):
        def write(self, location: str, data: bytes) -> None:
            entered.set()
            assert gate.wait(10)
            super().write(location, data)

    callback = commit_records.CommitRecordCallback(TRIAL_DIR, timeout_s=10)
    slow = SlowStore(client=s3)
    original = commit_records.store_for
    commit_records.store_for = lambda location: slow  # type: ignore[assignment]  # the one store this test watches
    try:
        callback.after_report(None, [{"loss": 1.0}], FakeCheckpoint("checkpoint_a"))  # returns at once
        assert entered.wait(10)
        assert "put_object" not in s3.operations()
        gate.set()
        asyncio.run(callback.before_controller_shutdown())
    finally:
        commit_records.store_for = original
    assert record_of(s3, "checkpoint_a").checkpoint == "checkpoint_a"


def test_the_callback_pickles_without_its_thread_and_ignores_reports_without_a_checkpoint() -> None:
    import pickle

    callback = commit_records.CommitRecordCallback(TRIAL_DIR, timeout_s=5)
    callback.after_report(None, [{"loss": 1.0}], None)
    clone = pickle.loads(pickle.dumps(callback))
    assert clone._pool is None and clone._pending == []


# ---------------------------------------------------------------------------------- backfill after a controller died


def test_a_controller_killed_after_rays_snapshot_and_before_the_record_is_backfilled_at_the_trials_restart(
    s3: FakeS3, store: commit_records.S3Store
) -> None:
    """The callback's record never ran (the controller died with it queued); the trial driver's restart backfills
    exactly the missing record, and the run then verifies at the committed level."""
    write_plain_checkpoint(s3, "checkpoint_a")
    write_plain_checkpoint(s3, "checkpoint_b")
    commit(s3, "checkpoint_a")
    assert commit_records.record_checkpoint(f"{TRIAL_DIR}/checkpoint_a", store).written
    # Ray commits checkpoint_b (snapshot written) and the callback queues its record; the controller is killed
    # before the record's PUT (the write never returns; no shutdown or abort hook runs).
    commit(s3, "checkpoint_a", "checkpoint_b")
    result_json(s3, "checkpoint_b")
    killed = threading.Event()
    reached = threading.Event()

    class DyingStore(commit_records.S3Store):
        def write(self, location: str, data: bytes) -> None:
            reached.set()
            killed.wait(10)
            raise OSError("the controller's process is gone")

    callback = commit_records.CommitRecordCallback(TRIAL_DIR, timeout_s=10)
    original = commit_records.store_for
    commit_records.store_for = lambda location: DyingStore(client=s3)  # type: ignore[assignment]  # the dying one
    try:
        callback.after_report(None, [{"loss": 0.5}], FakeCheckpoint("checkpoint_b"))
        assert reached.wait(10)
    finally:
        killed.set()
        commit_records.store_for = original
    before = verify_sweep_checkpoints(s3, ROOT)
    assert not before.verified
    assert (before.problems[0].kind, before.problems[0].key) == (
        v.MISSING_MANIFEST,
        key("checkpoint_b", s3_layout.COMMIT_RECORD_FILE),
    )

    assert commit_records.backfill_trial(TRIAL_DIR, store) == ["checkpoint_b"]
    assert record_of(s3, "checkpoint_b").backfilled and not record_of(s3, "checkpoint_a").backfilled
    assert commit_records.backfill_trial(TRIAL_DIR, store) == []  # idempotent

    after = verify_sweep_checkpoints(s3, ROOT)
    assert after.verified, after.problems
    assert [(c.name, c.level) for c in after.checkpoints] == [
        ("checkpoint_a", "committed"),
        ("checkpoint_b", "committed"),
    ]
    assert after.summary == "2 committed"


def test_the_driver_backfills_every_trial_of_the_run(s3: FakeS3, store: commit_records.S3Store) -> None:
    for trial in ("t1", "t2"):
        s3.put_object(Bucket=BUCKET, Key=f"sweeps/team-a/plain-r1/train/{trial}/checkpoint_x/model.pt", Body=b"x")
        s3.put_object(
            Bucket=BUCKET,
            Key=f"sweeps/team-a/plain-r1/train/{trial}/{s3_layout.SNAPSHOT_FILE}",
            Body=json.dumps(ray_snapshot(["checkpoint_x"])).encode(),
        )
    assert commit_records.backfill_run(f"{ROOT}/train", timeout_s=30, store=store) == [
        "t1/checkpoint_x",
        "t2/checkpoint_x",
    ]


# ---------------------------------------------------------------------------------- the verifier's two levels


@pytest.fixture
def recorded(s3: FakeS3, store: commit_records.S3Store) -> None:
    write_plain_checkpoint(s3, "checkpoint_a")
    commit(s3, "checkpoint_a")
    result_json(s3, "checkpoint_a")
    assert commit_records.record_checkpoint(f"{TRIAL_DIR}/checkpoint_a", store).written


@pytest.mark.usefixtures("recorded")
def test_a_plain_loops_checkpoint_verifies_at_the_committed_level(s3: FakeS3) -> None:
    result = verify_sweep_checkpoints(s3, ROOT)
    assert result.verified, result.problems
    assert result.summary == "1 committed"
    assert result.to_status()["summary"] == "1 committed" and result.to_status()["fullState"] == 0
    (report,) = result.checkpoints
    assert (report.level, report.files, report.bytes) == ("committed", 3, sum(map(len, PLAIN_FILES.values())))


@pytest.mark.usefixtures("recorded")
def test_a_deleted_file_is_named(s3: FakeS3) -> None:
    s3.delete_object(Bucket=BUCKET, Key=key("checkpoint_a", "optimizer.pt"))
    result = verify_sweep_checkpoints(s3, ROOT)
    assert not result.verified
    assert (v.MISSING_FILE, key("checkpoint_a", "optimizer.pt")) in [(p.kind, p.key) for p in result.problems]
    assert result.summary == "failed: missing-file"


@pytest.mark.usefixtures("recorded")
def test_a_same_size_rewrite_is_caught_by_its_etag(s3: FakeS3) -> None:
    s3.put_object(Bucket=BUCKET, Key=key("checkpoint_a", "model.pt"), Body=b"z" * 300)
    result = verify_sweep_checkpoints(s3, ROOT)
    assert not result.verified
    problem = result.problems[0]
    assert (problem.kind, problem.key) == (v.FINGERPRINT_MISMATCH, key("checkpoint_a", "model.pt"))
    assert "rewritten after Ray committed it" in problem.detail


@pytest.mark.usefixtures("recorded")
def test_an_unreadable_commit_record_holds(s3: FakeS3) -> None:
    s3.put_object(Bucket=BUCKET, Key=key("checkpoint_a", s3_layout.COMMIT_RECORD_FILE), Body=b'{"version": 1}')
    result = verify_sweep_checkpoints(s3, ROOT)
    assert [p.kind for p in result.problems][:1] == [v.INVALID_COMMIT_RECORD]


def test_our_helpers_manifests_are_full_state_and_a_mix_says_both(s3: FakeS3, store: commit_records.S3Store) -> None:
    sweep = write_sweep(s3, BUCKET, trials=2, checkpoints=1, files=2, file_size=32)
    assert verify_sweep_checkpoints(s3, sweep.root_uri).summary == "2 full-state"
    plain_trial = sweep.trials[0]
    name = sweep.checkpoints[plain_trial][0]
    # trial 0's checkpoint as a plain loop leaves it: no manifest; both get their commit record
    s3.delete_object(Bucket=BUCKET, Key=sweep.manifest_keys(plain_trial, name)[0])
    for trial in sweep.trials:
        assert commit_records.backfill_trial(f"{sweep.root_uri}/train/{trial}", store) == [name]
    mixed = verify_sweep_checkpoints(s3, sweep.root_uri)
    assert mixed.verified, mixed.problems
    assert mixed.summary == "2 committed (1 full-state)"
    assert sorted(c.level for c in mixed.checkpoints) == ["committed", "full-state"]


def test_summaries_say_none_and_failed() -> None:
    assert v.VerificationResult("s3://b/r", True, False, 0, 0, 0, (), (), (), None, 0, 0.0, "t").summary == "none"
    problem = v.Finding(v.TIMEOUT, "r/", "slow")
    assert v.VerificationResult("s3://b/r", False, False, 0, 0, 0, (problem,), (), (), None, 0, 0.0, "t").summary == (
        "failed: timeout"
    )


# ---------------------------------------------------------------------------------- the document


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"version": 2}, "version"),
        ({"version": 1, "checkpoint": "a/b", "fingerprint": "s3-etag", "files": [{}]}, "checkpoint"),
        ({"version": 1, "checkpoint": "c", "fingerprint": "md5", "files": [{}]}, "fingerprint"),
        ({"version": 1, "checkpoint": "c", "fingerprint": "s3-etag", "files": []}, "files"),
        (
            {
                "version": 1,
                "checkpoint": "c",
                "fingerprint": "s3-etag",
                "files": [{"path": "../x", "size": 1, "fingerprint": "e"}],
            },
            "files[0].path",
        ),
        (
            {
                "version": 1,
                "checkpoint": "c",
                "fingerprint": "s3-etag",
                "files": [{"path": "x", "size": -1, "fingerprint": "e"}],
            },
            "files[0].size",
        ),
        (
            {
                "version": 1,
                "checkpoint": "c",
                "fingerprint": "s3-etag",
                "files": [{"path": "x", "size": 1, "fingerprint": ""}],
            },
            "files[0].fingerprint",
        ),
    ],
)
def test_a_record_that_proves_nothing_is_refused_naming_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(FormatError, match="^" + re.escape(field)):
        commit_record.parse_record(json.dumps(doc).encode())


def test_the_local_store_fingerprints_by_sha256(tmp_path: Any) -> None:
    trial = tmp_path / "train" / "t1"
    (trial / "checkpoint_a").mkdir(parents=True)
    (trial / "checkpoint_a" / "model.pt").write_bytes(b"weights")
    (trial / s3_layout.SNAPSHOT_FILE).write_text(json.dumps(ray_snapshot(["checkpoint_a"])))
    assert commit_records.record_checkpoint(str(trial / "checkpoint_a")).written
    doc = commit_record.parse_record((trial / "checkpoint_a" / s3_layout.COMMIT_RECORD_FILE).read_bytes())
    import hashlib

    assert doc.fingerprint == "sha256"
    assert doc.files == (commit_record.RecordEntry("model.pt", 7, hashlib.sha256(b"weights").hexdigest()),)


def test_a_backfill_lists_only_the_checkpoints_that_lack_a_record(tmp_path: Any) -> None:
    """A local directory's files are hashed to be listed: a recorded checkpoint (a large model, say) is not read again
    at every trial start and at the driver's end."""
    trial = tmp_path / "train" / "t1"
    for name in ("checkpoint_a", "checkpoint_b"):
        (trial / name).mkdir(parents=True)
        (trial / name / "model.pt").write_bytes(name.encode())
    (trial / s3_layout.SNAPSHOT_FILE).write_text(json.dumps(ray_snapshot(["checkpoint_a", "checkpoint_b"])))
    assert commit_records.record_checkpoint(str(trial / "checkpoint_a")).written
    listed: list[str] = []

    class Watched(commit_records.LocalStore):
        def list(self, location: str) -> dict[str, tuple[int, str]]:
            listed.append(location.rsplit("/", 1)[-1])
            return super().list(location)

    assert commit_records.backfill_trial(str(trial), Watched()) == ["checkpoint_b"]
    assert listed == ["checkpoint_b"]


def _md5(data: bytes) -> str:
    import hashlib

    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def test_a_file_restored_by_one_put_of_the_same_bytes_is_the_same_content_a_rewrite_is_not() -> None:
    """pyarrow (so Ray) uploads even a small file as a one-part multipart upload: its ETag is md5(md5(bytes))-1. A
    restore by a plain PUT of the same bytes lists md5(bytes): the same content, recognised both ways; other bytes,
    or a several-part upload that cannot be compared with one PUT's, are not."""
    data = b"weights" * 100
    one_part = _md5(bytes.fromhex(_md5(data))) + "-1"
    assert commit_record.same_content(one_part, _md5(data))
    assert commit_record.same_content(_md5(data), one_part)
    assert commit_record.same_content(_md5(data), _md5(data))
    assert not commit_record.same_content(one_part, _md5(b"other" * 100))
    assert not commit_record.same_content(_md5(bytes.fromhex(_md5(data))) + "-2", _md5(data))
    assert not commit_record.same_content("not-an-etag-1", _md5(data))


def test_the_verifier_takes_a_faithful_restore_of_a_multipart_upload(s3: FakeS3, store: commit_records.S3Store) -> None:
    data = PLAIN_FILES["model.pt"]
    write_plain_checkpoint(s3, "checkpoint_a")
    commit(s3, "checkpoint_a")
    result_json(s3, "checkpoint_a")
    assert commit_records.record_checkpoint(f"{TRIAL_DIR}/checkpoint_a", store).written
    # as Ray's upload left it: the record names the one-part multipart ETag of model.pt
    raw = s3.get_object(Bucket=BUCKET, Key=key("checkpoint_a", s3_layout.COMMIT_RECORD_FILE))["Body"].read()
    doc = json.loads(raw)
    for entry in doc["files"]:
        if entry["path"] == "model.pt":
            entry["fingerprint"] = _md5(bytes.fromhex(_md5(data))) + "-1"
    s3.put_object(Bucket=BUCKET, Key=key("checkpoint_a", s3_layout.COMMIT_RECORD_FILE), Body=json.dumps(doc).encode())
    assert verify_sweep_checkpoints(s3, ROOT).verified  # FakeS3 lists one PUT's md5, as S3 does
    s3.put_object(Bucket=BUCKET, Key=key("checkpoint_a", "model.pt"), Body=b"n" * len(data))  # same size, other bytes
    assert [p.kind for p in verify_sweep_checkpoints(s3, ROOT).problems][:1] == [v.FINGERPRINT_MISMATCH]
