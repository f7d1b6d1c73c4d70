"""In-memory comparison (R22): listings against manifests, the best checkpoint, and retention rules (R11)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from sweep_contracts.checkpoint_manifest import ManifestEntry
from sweep_contracts.s3_layout import S3Uri
from sweep_operator import verification as v
from sweep_operator.verification import (
    Manifest,
    TrialObjects,
    assess_checkpoint,
    check_best_checkpoint,
    retention_findings,
)

ROOT = S3Uri.parse("s3://bucket/sweeps/ns/digits-r1")
DIR = "sweeps/ns/digits-r1/train/t1/checkpoint_epoch-000001/"
SHA = "a" * 64


def manifest(*files: tuple[str, int], rank: int | None = 0, world_size: int | None = None) -> Manifest:
    return Manifest(tuple(ManifestEntry(p, s, SHA) for p, s in files), rank, 1, world_size)


def test_listing_groups_checkpoint_dirs_and_keeps_the_snapshot_a_file() -> None:
    """`checkpoint_manager_snapshot.json` starts with `checkpoint_` too; it is a file, not a checkpoint dir."""
    objects = TrialObjects.from_listing(
        "t1",
        {
            "checkpoint_manager_snapshot.json": 900,
            ".validate_storage_marker": 0,
            "checkpoint_epoch-000001/": 0,  # pyarrow's directory marker
            "checkpoint_epoch-000001/model.pt": 10,
            "checkpoint_epoch-000001/sub/": 0,
            "checkpoint_epoch-000001/sub/x.bin": 5,
            "checkpoint_epoch-000002/": 0,
            "other/_manifest.json": 40,
            "logs/out.txt": 3,
        },
    )
    assert objects.has_snapshot
    assert objects.dirs["checkpoint_epoch-000001"] == {"model.pt": 10, "sub/x.bin": 5}
    assert objects.dirs["checkpoint_epoch-000002"] == {}
    assert objects.checkpoint_like_dirs() == ["checkpoint_epoch-000001", "checkpoint_epoch-000002", "other"]


def test_complete_checkpoint_is_verified_with_its_files_and_bytes() -> None:
    contents = {"_manifest.json": 100, "model.pt": 10, "optim/state.pt": 20}
    result = assess_checkpoint(
        "t1",
        "checkpoint_epoch-000001",
        DIR,
        contents,
        {"_manifest.json": manifest(("model.pt", 10), ("optim/state.pt", 20))},
    )
    assert result.problems == ()
    assert result.report.verified and result.report.committed
    assert (result.report.files, result.report.bytes) == (2, 30)
    assert [f.key for f in result.to_hash] == [DIR + "model.pt", DIR + "optim/state.pt"]


def test_committed_checkpoint_with_no_object_is_missing() -> None:
    """R22: the snapshot names a directory that was deleted (or never uploaded)."""
    result = assess_checkpoint("t1", "checkpoint_epoch-000001", DIR, None, {})
    assert [(p.kind, p.key) for p in result.problems] == [(v.MISSING_CHECKPOINT, DIR)]
    assert result.report.status == v.MISSING_CHECKPOINT


def test_committed_checkpoint_with_only_directory_markers_is_missing() -> None:
    result = assess_checkpoint("t1", "checkpoint_epoch-000001", DIR, {}, {})
    assert result.problems[0].kind == v.MISSING_CHECKPOINT
    assert "directory markers" in result.problems[0].detail


def test_checkpoint_with_neither_commit_record_nor_manifest_cannot_be_proven_complete() -> None:
    result = assess_checkpoint("t1", "checkpoint_epoch-000001", DIR, {"model.pt": 10}, {})
    assert [(p.kind, p.key) for p in result.problems] == [(v.MISSING_MANIFEST, DIR + "_commit_record.json")]
    assert "neither a commit record" in result.problems[0].detail and "_manifest.json" in result.problems[0].detail


def test_missing_and_resized_files_are_each_reported() -> None:
    contents = {"_manifest.json": 100, "a": 10, "b": 3}
    result = assess_checkpoint("t1", "c", DIR, contents, {"_manifest.json": manifest(("a", 10), ("b", 30), ("c", 1))})
    assert [(p.kind, p.key) for p in result.problems] == [(v.SIZE_MISMATCH, DIR + "b"), (v.MISSING_FILE, DIR + "c")]
    assert "3 bytes in S3, the manifest says 30" in result.problems[0].detail
    assert result.to_hash == ()  # a failed checkpoint is not worth downloading
    assert result.report.status == v.SIZE_MISMATCH


def test_invalid_manifest_is_a_problem() -> None:
    result = assess_checkpoint(
        "t1", "c", DIR, {"_manifest.json": 3}, {"_manifest.json": v.FormatError("files: got None")}
    )
    assert [(p.kind, p.key) for p in result.problems] == [(v.INVALID_MANIFEST, DIR + "_manifest.json")]


def test_sharded_checkpoint_needs_every_rank_manifest() -> None:
    """R10: per-rank manifests 0..N-1; a gap means one rank's files are unaccounted for."""
    contents = {"_manifest.rank-0000.json": 1, "_manifest.rank-0002.json": 1, "r0.bin": 4, "r2.bin": 4}
    manifests = {
        "_manifest.rank-0000.json": manifest(("r0.bin", 4), rank=0, world_size=3),
        "_manifest.rank-0002.json": manifest(("r2.bin", 4), rank=2, world_size=3),
    }
    result = assess_checkpoint("t1", "c", DIR, contents, manifests)
    assert [(p.kind, p.key) for p in result.problems] == [(v.MISSING_MANIFEST, DIR + "_manifest.rank-0001.json")]


@pytest.mark.parametrize("world_size", [2, 4])
def test_sharded_checkpoint_missing_its_highest_ranks_is_not_verified_R10(world_size: int) -> None:
    """R10: the manifests record the world size, so rank 0's alone (the highest ranks' gone) is not complete."""
    contents = {"_manifest.rank-0000.json": 1, "r0.bin": 4}
    manifests = {"_manifest.rank-0000.json": manifest(("r0.bin", 4), rank=0, world_size=world_size)}
    result = assess_checkpoint("t1", "c", DIR, contents, manifests)
    assert [(p.kind, p.key) for p in result.problems] == [(v.MISSING_MANIFEST, DIR + "_manifest.rank-0001.json")]
    assert f"world size of {world_size}" in result.problems[0].detail
    assert not result.report.verified


def test_per_rank_manifests_that_disagree_on_the_world_size_are_not_verified_R10() -> None:
    contents = {"_manifest.rank-0000.json": 1, "_manifest.rank-0001.json": 1, "r0.bin": 4, "r1.bin": 5}
    manifests = {
        "_manifest.rank-0000.json": manifest(("r0.bin", 4), rank=0, world_size=2),
        "_manifest.rank-0001.json": manifest(("r1.bin", 5), rank=1, world_size=3),
    }
    result = assess_checkpoint("t1", "c", DIR, contents, manifests)
    assert [(p.kind, p.key) for p in result.problems] == [(v.INVALID_MANIFEST, DIR)]
    assert "disagree on worldSize" in result.problems[0].detail


def test_sharded_checkpoint_with_all_ranks_is_verified() -> None:
    contents = {"_manifest.rank-0000.json": 1, "_manifest.rank-0001.json": 1, "r0.bin": 4, "r1.bin": 5}
    manifests = {
        "_manifest.rank-0000.json": manifest(("r0.bin", 4), rank=0, world_size=2),
        "_manifest.rank-0001.json": manifest(("r1.bin", 5), rank=1, world_size=2),
    }
    result = assess_checkpoint("t1", "c", DIR, contents, manifests)
    assert result.problems == () and result.report.bytes == 9


def test_manifest_names_order() -> None:
    names = v.manifest_names(
        {
            "_manifest.rank-0010.json": 1,
            "_manifest.json": 1,
            "_manifest.rank-0002.json": 1,
            "model.pt": 1,
            "x/_manifest.json": 1,
        }
    )
    assert names == ["_manifest.json", "_manifest.rank-0002.json", "_manifest.rank-0010.json"]


# ------------------------------------------------------------------------------ best checkpoint

VERIFIED = [("t1", "checkpoint_epoch-000002")]


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/sweeps/ns/digits-r1/train/t1/checkpoint_epoch-000002",
        "s3://bucket/sweeps/ns/digits-r1/train/t1/checkpoint_epoch-000002/",
        "bucket/sweeps/ns/digits-r1/train/t1/checkpoint_epoch-000002",  # Ray's scheme-less form (R18)
    ],
)
def test_best_checkpoint_among_verified_passes(uri: str) -> None:
    assert check_best_checkpoint(uri, ROOT, VERIFIED) is None


@pytest.mark.parametrize(
    ("uri", "detail"),
    [
        ("s3://bucket/sweeps/ns/digits-r1/train/t1/checkpoint_epoch-000001", "not among the verified"),
        ("s3://bucket/sweeps/ns/digits-r1/train/t2/checkpoint_epoch-000002", "not among the verified"),
        ("s3://bucket/sweeps/ns/digits-r1/train/t1/checkpoint_epoch-000002/model.pt", "not among the verified"),
        ("s3://other/sweeps/ns/digits-r1/train/t1/checkpoint_epoch-000002", "is not under this run"),
        ("s3://bucket/sweeps/ns/digits-r10/train/t1/checkpoint_epoch-000002", "is not under this run"),
    ],
)
def test_best_checkpoint_not_verified_is_a_problem(uri: str, detail: str) -> None:
    """R22: the checkpoint a user will load after the sweep must be one that was verified."""
    finding = check_best_checkpoint(uri, ROOT, VERIFIED)
    assert finding is not None and finding.kind == v.BEST_CHECKPOINT_UNVERIFIED
    assert finding.key == "sweeps/ns/digits-r1/_sweep/result.json"
    assert detail in finding.detail


def test_no_best_checkpoint_is_nothing_to_check() -> None:
    assert check_best_checkpoint(None, ROOT, []) is None


# ------------------------------------------------------------------------------ retention (R11)

TODAY = date(2026, 12, 2)
ENABLED = {"Status": "Enabled"}


def kinds(findings: list[v.Finding]) -> list[str]:
    return [f.kind for f in findings]


@pytest.mark.parametrize(("versioning", "expected"), [({}, "not enabled"), ({"Status": "Suspended"}, "suspended")])
def test_versioning_off_is_a_retention_warning(versioning: dict, expected: str) -> None:
    """R11: without versioning a deleted checkpoint is gone for good."""
    findings = retention_findings(versioning, [], ROOT, 30, TODAY)
    assert kinds(findings) == [v.VERSIONING_DISABLED]
    assert expected in findings[0].detail


def test_versioned_bucket_without_rules_has_no_warning() -> None:
    assert retention_findings(ENABLED, [], ROOT, 30, TODAY) == []


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (
            {"ID": "short", "Status": "Enabled", "Filter": {"Prefix": "sweeps/"}, "Expiration": {"Days": 7}},
            [v.LIFECYCLE_EXPIRATION],
        ),
        ({"ID": "bucket", "Status": "Enabled", "Filter": {}, "Expiration": {"Days": 7}}, [v.LIFECYCLE_EXPIRATION]),
        (
            {"ID": "legacy", "Status": "Enabled", "Prefix": "sweeps/ns/", "Expiration": {"Days": 1}},
            [v.LIFECYCLE_EXPIRATION],
        ),
        (
            {
                "ID": "inner",
                "Status": "Enabled",
                "Filter": {"Prefix": "sweeps/ns/digits-r1/tune/"},
                "Expiration": {"Days": 1},
            },
            [v.LIFECYCLE_EXPIRATION],
        ),
        ({"ID": "long", "Status": "Enabled", "Filter": {"Prefix": "sweeps/"}, "Expiration": {"Days": 30}}, []),
        ({"ID": "off", "Status": "Disabled", "Filter": {"Prefix": "sweeps/"}, "Expiration": {"Days": 1}}, []),
        ({"ID": "elsewhere", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 1}}, []),
        (
            {
                "ID": "sibling",
                "Status": "Enabled",
                "Filter": {"Prefix": "sweeps/ns/digits-r10"},
                "Expiration": {"Days": 1},
            },
            [],
        ),
        (
            {
                "ID": "tagged",
                "Status": "Enabled",
                "Filter": {"And": {"Prefix": "sweeps/", "Tags": [{"Key": "tmp", "Value": "1"}]}},
                "Expiration": {"Days": 2},
            },
            [v.LIFECYCLE_EXPIRATION],
        ),
        (
            {
                "ID": "glacier",
                "Status": "Enabled",
                "Filter": {"Prefix": ""},
                "Transitions": [{"Days": 3, "StorageClass": "GLACIER"}],
            },
            [v.LIFECYCLE_TRANSITION],
        ),
        (
            {
                "ID": "dated",
                "Status": "Enabled",
                "Filter": {},
                "Expiration": {"Date": datetime(2026, 12, 10, tzinfo=UTC)},
            },
            [v.LIFECYCLE_EXPIRATION],
        ),
        (
            {"ID": "far", "Status": "Enabled", "Filter": {}, "Expiration": {"Date": datetime(2028, 1, 1, tzinfo=UTC)}},
            [],
        ),
        (
            {
                "ID": "noncurrent",
                "Status": "Enabled",
                "Filter": {},
                "NoncurrentVersionExpiration": {"NoncurrentDays": 1},
            },
            [v.LIFECYCLE_NONCURRENT_EXPIRATION],
        ),
        (
            {
                "ID": "mpu",
                "Status": "Enabled",
                "Filter": {},
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
            },
            [],
        ),
    ],
)
def test_lifecycle_rules_shorter_than_the_minimum_are_warnings(rule: dict, expected: list[str]) -> None:
    """R11: a rule that expires or moves the run's objects within the minimum retention is reported."""
    findings = retention_findings(ENABLED, [rule], ROOT, 30, TODAY)
    assert kinds(findings) == expected
    for finding in findings:
        assert repr(rule["ID"]) in finding.detail and "30-day minimum" in finding.detail


def test_tag_filter_is_named_in_the_warning() -> None:
    rule = {
        "ID": "t",
        "Status": "Enabled",
        "Filter": {"Tag": {"Key": "tmp", "Value": "yes"}},
        "Expiration": {"Days": 2},
    }
    (finding,) = retention_findings(ENABLED, [rule], ROOT, 30, TODAY)
    assert "tagged tmp=yes" in finding.detail
