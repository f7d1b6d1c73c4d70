"""`sweepctl verify DIR`: a local run root (what `run-local --storage DIR` writes) is verified by the same checks as one
in S3, through a read-only reader that serves the directory with S3's listing and ETags; the output names local paths
and says which checks ran."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sweep_operator.cli import main as sweepctl
from sweep_operator.cli.local_run_root import LocalRunRootReader
from tests.support.fake_s3 import FakeS3
from tests.support.sweep_factory import DEFAULT_PREFIX, write_sweep

BUCKET = "local-copy"


def local_run_root(base: Path) -> tuple[Path, object]:
    """A synthetic run written to the fake S3, copied to `base/<prefix>` with its records' S3 locations rewritten to
    local paths, as Ray and the driver record them for a local storage path."""
    s3 = FakeS3()
    s3.create_bucket(Bucket=BUCKET)
    sweep = write_sweep(s3, BUCKET, trials=2, checkpoints=2, files=2, dir_markers=False)
    local = f"{base.as_posix()}/"
    for key, data in s3.buckets[BUCKET].items():
        if key.endswith(".json"):
            data = data.replace(f"s3://{BUCKET}/".encode(), local.encode()).replace(
                f"{BUCKET}/".encode(), local.encode()
            )
        path = base / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return base / DEFAULT_PREFIX, sweep


def test_a_local_run_root_verifies_and_the_verdict_names_its_path_and_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = local_run_root(tmp_path)
    assert sweepctl(["verify", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"VERIFIED {root}: 4 checkpoint(s)" in out, out
    assert "sizes, and ETags where a commit record lists them (sha256 with --deep)" in out
    assert "s3://" not in out and "versioning" not in out  # a directory has no bucket settings to warn about
    assert sweepctl(["verify", str(root), "--deep"]) == 0
    assert "deep (sha256)" in capsys.readouterr().out
    assert sweepctl(["verify", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verified"] is True and doc["root"] == str(root) and "ETags" in doc["checks"]


def test_a_local_file_missing_or_rewritten_is_not_verified_and_named_by_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = local_run_root(tmp_path)
    victim = sorted(p for p in (root / "train").glob("*/checkpoint_*/*") if p.suffix != ".json")[0]
    victim.write_bytes(b"\1" * victim.stat().st_size)  # same size: sizes pass, sha256 does not
    assert sweepctl(["verify", str(root)]) == 0
    capsys.readouterr()
    assert sweepctl(["verify", str(root), "--deep"]) == 1
    out = capsys.readouterr().out
    assert f"{victim}" in out and "NOT VERIFIED" in out, out
    victim.unlink()
    assert sweepctl(["verify", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"missing-file: {victim}" in out, out


def test_a_local_directory_above_the_run_root_lists_the_run_roots_under_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = local_run_root(tmp_path)
    assert sweepctl(["verify", str(tmp_path / "sweeps")]) == 2
    err = capsys.readouterr().err
    assert "is not a run root" in err and f"  {root}" in err, err
    assert sweepctl(["verify", str(tmp_path / "nowhere")]) == 2
    assert "neither an s3:// URI nor a directory" in capsys.readouterr().err


def test_the_reader_lists_pages_and_delimiters_as_s3_and_serves_nothing_outside_its_directory(tmp_path: Path) -> None:
    (tmp_path / "run" / "a").mkdir(parents=True)
    for name in ("a/1", "a/2", "b", "c"):
        (tmp_path / "run" / name).write_bytes(name.encode())
    (tmp_path / "secret").write_bytes(b"x")
    reader = LocalRunRootReader(tmp_path / "run")
    prefix = reader.root.prefix
    page = reader.list_objects_v2(Bucket="", Prefix=prefix, Delimiter="/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == [prefix + "a/"]
    assert [o["Key"][len(prefix) :] for o in page["Contents"]] == ["b", "c"]
    first = reader.list_objects_v2(Bucket="", Prefix=prefix, MaxKeys=3)
    assert first["IsTruncated"] and len(first["Contents"]) == 3
    rest = reader.list_objects_v2(Bucket="", Prefix=prefix, ContinuationToken=first["NextContinuationToken"])
    assert [o["Key"][len(prefix) :] for o in rest["Contents"]] == ["c"] and not rest["IsTruncated"]
    assert first["Contents"][0]["ETag"] == f'"{hashlib.md5(b"a/1").hexdigest()}"'  # S3's single-part ETag
    assert reader.get_object(Bucket="", Key=prefix + "b")["Body"].read() == b"b"
    with pytest.raises(Exception, match="NoSuchKey"):
        reader.get_object(Bucket="", Key=(tmp_path / "secret").as_posix().lstrip("/"))
    with pytest.raises(Exception, match="NoSuchBucket"):
        reader.list_objects_v2(Bucket="other", Prefix="")
