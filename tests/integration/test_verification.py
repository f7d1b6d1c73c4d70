"""The verifier against an S3 server on 127.0.0.1 over real HTTP (moto), and against servers that fail (R22, R11)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from sweep_operator import verification as v
from sweep_operator.s3 import S3ClientConfig, make_s3_client
from sweep_operator.verification import VerificationResult, verify_sweep_checkpoints
from tests.support.moto_direct import MotoDirectWriter
from tests.support.ports import refused_port
from tests.support.s3_fault_server import FaultyS3Server
from tests.support.sweep_factory import SyntheticSweep, write_sweep

pytestmark = pytest.mark.integration

# Small retry budget and timeouts: failing cases finish in well under a second each.
FAST = {"max_attempts": 2, "connect_timeout_seconds": 1.0, "read_timeout_seconds": 3.0}


@pytest.fixture(scope="module")
def counting_client(s3_server: Any) -> Any:
    """The verifier's client, built by the product's factory, counting S3 operations by name."""
    made = make_s3_client(S3ClientConfig(endpoint_url=s3_server.endpoint_url, **FAST))
    made.operation_counts = Counter()
    made.meta.events.register("before-call.s3.*", lambda model, **_: made.operation_counts.update([model.name]))
    return made


@pytest.fixture
def client(counting_client: Any) -> Any:
    counting_client.operation_counts.clear()
    return counting_client


@pytest.fixture
def sweep(s3_bucket: str) -> SyntheticSweep:
    """Seeded straight into moto's backend (fast); everything the verifier reads still goes over HTTP."""
    return write_sweep(MotoDirectWriter(), s3_bucket, trials=2, checkpoints=2, files=3)


def problems(result: VerificationResult) -> list[tuple[str, str]]:
    return [(p.kind, p.key) for p in result.problems]


def test_complete_sweep_is_verified_by_listing_not_by_head_requests(client: Any, sweep: SyntheticSweep) -> None:
    """R22: complete sweep verified; the cost is the listing, never a HEAD per file."""
    result = verify_sweep_checkpoints(client, sweep.root_uri)
    assert result.verified, result.problems
    assert result.checked == 4 and result.files == 12 and result.bytes == sweep.committed_bytes
    assert result.best_checkpoint_uri == sweep.best_checkpoint_uri
    assert [w.kind for w in result.warnings] == [v.VERSIONING_DISABLED]  # moto buckets start unversioned
    counts = client.operation_counts
    assert counts["HeadObject"] == 0
    assert counts["ListObjectsV2"] == 2  # one paginated pass over train/, one over tune/experiment_state-*
    assert counts["GetObject"] == 2 + 4 + 3  # snapshots, manifests, result.json, status.json, Tune's state


def test_missing_file_is_not_verified(client: Any, sweep: SyntheticSweep) -> None:
    """R22: one file a manifest lists is not in S3."""
    key = sweep.delete_file()
    result = verify_sweep_checkpoints(client, sweep.root_uri)
    assert not result.verified
    assert (v.MISSING_FILE, key) in problems(result)
    # the best checkpoint is the one broken: result.json is flagged too
    assert (v.BEST_CHECKPOINT_UNVERIFIED, sweep.result_key) in problems(result)


def test_truncated_file_is_not_verified(client: Any, sweep: SyntheticSweep) -> None:
    """R22: a partial upload has the wrong size."""
    key = sweep.truncate_file(trial=sweep.trials[1], checkpoint=sweep.checkpoints[sweep.trials[1]][0])
    result = verify_sweep_checkpoints(client, sweep.root_uri)
    assert problems(result) == [(v.SIZE_MISMATCH, key)]
    assert "1 bytes in S3, the manifest says 256" in result.problems[0].detail


def test_same_size_corruption_is_caught_only_by_deep(client: Any, sweep: SyntheticSweep) -> None:
    """R22: sizes cannot see flipped bytes; --deep streams every object and compares sha256."""
    key = sweep.corrupt_file(trial=sweep.trials[1])
    shallow = verify_sweep_checkpoints(client, sweep.root_uri)
    assert shallow.verified
    deep = verify_sweep_checkpoints(client, sweep.root_uri, deep=True)
    assert problems(deep) == [(v.CHECKSUM_MISMATCH, key)]
    assert client.operation_counts["HeadObject"] == 0
    row = next(c for c in deep.checkpoints if c.key + "model.pt" == key or key.startswith(c.key))
    assert row.status == v.CHECKSUM_MISMATCH
    assert deep.checked == 4 and deep.files == 9  # the corrupted checkpoint's files do not count as verified


def test_missing_manifest_is_not_verified(client: Any, sweep: SyntheticSweep) -> None:
    """R22: without its manifest, and with no commit record, a checkpoint cannot be proven complete."""
    key = sweep.delete_manifest(checkpoint=sweep.checkpoints[sweep.trials[0]][0])
    result = verify_sweep_checkpoints(client, sweep.root_uri)
    record = key.rsplit("/", 1)[0] + "/_commit_record.json"
    assert problems(result) == [(v.MISSING_MANIFEST, record)]


def test_sharded_checkpoint_missing_one_rank_manifest_is_not_verified(
    client: Any, s3_client: Any, s3_bucket: str
) -> None:
    """R10/R22: per-rank manifests; losing rank 1's leaves its shards unaccounted for (written through boto3)."""
    sharded = write_sweep(s3_client, s3_bucket, trials=1, checkpoints=1, files=6, ranks=3)
    assert verify_sweep_checkpoints(client, sharded.root_uri).verified
    key = sharded.delete_manifest(rank=1)
    result = verify_sweep_checkpoints(client, sharded.root_uri)
    assert (v.MISSING_MANIFEST, key) in problems(result)


def test_sharded_checkpoint_missing_its_highest_rank_manifest_is_not_verified_R10(
    client: Any, s3_client: Any, s3_bucket: str
) -> None:
    """R10: the manifests record the world size, so the last rank's manifest (no gap below it) is missed too."""
    sharded = write_sweep(
        s3_client, s3_bucket, prefix="sweeps/team-a/sharded-r2", trials=1, checkpoints=1, files=6, ranks=3
    )
    key = sharded.delete_manifest(rank=2)
    result = verify_sweep_checkpoints(client, sharded.root_uri)
    assert (v.MISSING_MANIFEST, key) in problems(result)
    assert not result.verified


def test_a_deleted_trial_directory_is_not_verified_R22(client: Any, sweep: SyntheticSweep) -> None:
    """The records that survive (status.json, result.json, Tune's experiment state) say the trial checkpointed."""
    prefix = sweep.delete_trial_dir(sweep.trials[1])
    result = verify_sweep_checkpoints(client, sweep.root_uri)
    assert (v.MISSING_TRIAL, prefix) in problems(result)
    sweep.delete_train_dir()
    result = verify_sweep_checkpoints(client, sweep.root_uri)
    assert [p.kind for p in result.problems].count(v.MISSING_TRIAL) == 2 and not result.verified


def test_missing_snapshot_is_not_verified(client: Any, sweep: SyntheticSweep) -> None:
    """R22: checkpoint dirs but no Ray commit record: nobody can say which are complete."""
    key = sweep.delete_snapshot(sweep.trials[1])
    result = verify_sweep_checkpoints(client, sweep.root_uri)
    assert problems(result) == [(v.MISSING_SNAPSHOT, key)]


def test_snapshot_naming_a_deleted_checkpoint_is_not_verified(client: Any, sweep: SyntheticSweep) -> None:
    """R22: Ray's snapshot still names a checkpoint whose objects are gone."""
    prefix = sweep.delete_checkpoint_dir(trial=sweep.trials[1], checkpoint=sweep.checkpoints[sweep.trials[1]][0])
    result = verify_sweep_checkpoints(client, sweep.root_uri)
    assert problems(result) == [(v.MISSING_CHECKPOINT, prefix)]


def test_uncommitted_checkpoint_dir_is_a_warning_only(client: Any, sweep: SyntheticSweep) -> None:
    """R22: a dir no snapshot names (an interrupted save) is reported, not held against the run."""
    prefix = sweep.add_uncommitted_checkpoint()
    result = verify_sweep_checkpoints(client, sweep.root_uri)
    assert result.verified
    assert (v.UNCOMMITTED_CHECKPOINT, prefix) in [(w.kind, w.key) for w in result.warnings]
    assert [c.status for c in result.checkpoints if c.key == prefix] == [v.UNCOMMITTED]


def test_best_checkpoint_unverified_is_not_verified(client: Any, sweep: SyntheticSweep) -> None:
    """R22: result.json points users at a checkpoint Ray never committed."""
    key = sweep.point_best_at_uncommitted()
    result = verify_sweep_checkpoints(client, sweep.root_uri)
    assert problems(result) == [(v.BEST_CHECKPOINT_UNVERIFIED, key)]


def test_more_than_1000_keys_are_paginated(client: Any, s3_bucket: str) -> None:
    """R22 at scale: one trial of 1100+ keys spans two ListObjectsV2 pages; a file on page 2 is still checked."""
    big = write_sweep(MotoDirectWriter(), s3_bucket, trials=1, checkpoints=1, files=1100, file_size=8)
    assert verify_sweep_checkpoints(client, big.root_uri).verified
    last = sorted(big.files[(big.trials[0], big.checkpoints[big.trials[0]][0])])[-1]
    key = big.delete_file(path=last)
    client.operation_counts.clear()
    result = verify_sweep_checkpoints(client, big.root_uri)
    assert problems(result)[0] == (v.MISSING_FILE, key)
    assert result.objects_listed > 1000
    assert client.operation_counts["ListObjectsV2"] == 3  # one pass over train/: two pages; one of Tune's states


def test_wrong_bucket_is_not_verified(client: Any) -> None:
    result = verify_sweep_checkpoints(client, "s3://no-such-bucket-here/sweeps/ns/digits-r1")
    assert not result.verified
    assert result.problems[0].kind == v.S3_ERROR
    assert "NoSuchBucket (HTTP 404)" in result.reason


def test_empty_run_root_is_not_verified(client: Any, sweep: SyntheticSweep) -> None:
    """A mistyped run id lists nothing: that must not read as 'nothing to lose'."""
    result = verify_sweep_checkpoints(client, sweep.root_uri + "x")
    assert [p.kind for p in result.problems] == [v.EMPTY_RUN_ROOT]


def test_short_lifecycle_rule_and_versioning_are_reported(client: Any, s3_client: Any, sweep: SyntheticSweep) -> None:
    """R11: a bucket rule expiring the run's objects in 7 days is a warning; versioning on silences its warning."""
    s3_client.put_bucket_versioning(Bucket=sweep.bucket, VersioningConfiguration={"Status": "Enabled"})
    s3_client.put_bucket_lifecycle_configuration(
        Bucket=sweep.bucket,
        LifecycleConfiguration={
            "Rules": [
                {"ID": "scratch", "Status": "Enabled", "Filter": {"Prefix": "sweeps/"}, "Expiration": {"Days": 7}},
                {"ID": "logs", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 1}},
            ]
        },
    )
    result = verify_sweep_checkpoints(client, sweep.root_uri)
    assert result.verified
    assert [(w.kind, "'scratch'" in w.detail) for w in result.warnings] == [(v.LIFECYCLE_EXPIRATION, True)]


def test_server_down_is_not_verified_with_the_reason() -> None:
    """R22 fail closed: nothing listens on the endpoint."""
    with refused_port() as port:
        down = make_s3_client(S3ClientConfig(endpoint_url=f"http://127.0.0.1:{port}", **FAST))
        result = verify_sweep_checkpoints(down, "s3://bucket-a/sweeps/ns/digits-r1")
    assert not result.verified
    assert "EndpointConnectionError" in result.reason


@pytest.mark.parametrize(
    ("status", "code"),
    [(503, "SlowDown"), (503, "ServiceUnavailable"), (500, "InternalError"), (403, "AccessDenied")],
)
def test_server_errors_are_not_verified_after_bounded_retries(status: int, code: str) -> None:
    """R22 fail closed: 5xx and throttling are retried by botocore (max_attempts), then reported; 403 is not retried."""
    with FaultyS3Server(status, code) as server:
        faulty = make_s3_client(S3ClientConfig(endpoint_url=server.endpoint_url, **FAST))
        result = verify_sweep_checkpoints(faulty, "s3://bucket-a/sweeps/ns/digits-r1", concurrency=1)
    assert not result.verified
    assert f"{code} (HTTP {status})" in result.reason
    listing = next(p for p in result.problems if p.key.endswith("/train/"))
    if status >= 500:
        assert "after 2 attempt(s)" in listing.detail
    # 1 listing (+ result.json, versioning, lifecycle submitted alongside), each at most max_attempts times
    assert server.requests <= 4 * FAST["max_attempts"]


def test_server_that_never_answers_hits_the_overall_timeout() -> None:
    """spec.deletion.verificationTimeoutSeconds: a hung endpoint yields 'not verified' on time, not a hang."""
    with FaultyS3Server(hang=True) as server:
        hung = make_s3_client(S3ClientConfig(endpoint_url=server.endpoint_url, max_attempts=1, read_timeout_seconds=30))
        started = time.monotonic()
        result = verify_sweep_checkpoints(hung, "s3://bucket-a/sweeps/ns/digits-r1", timeout_seconds=0.5)
        elapsed = time.monotonic() - started
    assert [p.kind for p in result.problems] == [v.TIMEOUT]
    assert elapsed < 3
