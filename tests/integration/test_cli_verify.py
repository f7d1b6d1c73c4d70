"""`sweepctl verify` against moto on 127.0.0.1 (R22): exit 0/1/2, the table, the JSON shape, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sweep_operator.cli import main
from tests.support.moto_direct import MotoDirectWriter
from tests.support.ports import refused_port
from tests.support.sweep_factory import SyntheticSweep, write_sweep

pytestmark = pytest.mark.integration

FAST = ["--max-attempts", "2", "--timeout", "30"]
SWEEPCTL = Path(sys.executable).with_name("sweepctl")  # the console script pyproject installs


@pytest.fixture
def sweep(s3_bucket: str) -> SyntheticSweep:
    return write_sweep(MotoDirectWriter(), s3_bucket, trials=2, checkpoints=2, files=3)


def sweepctl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["verify", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_verified_sweep_exits_0_with_a_table(
    capsys: pytest.CaptureFixture[str], s3_server: Any, sweep: SyntheticSweep
) -> None:
    """R22: exit 0 only when verified; the table has one row per checkpoint."""
    code, out, err = sweepctl(capsys, sweep.root_uri, "--endpoint-url", s3_server.endpoint_url, *FAST)
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0].split() == ["TRIAL", "CHECKPOINT", "FILES", "BYTES", "STATUS", "LEVEL"]
    rows = [line.split() for line in lines[1:5]]
    assert [(r[0], r[1], r[4], r[5]) for r in rows] == [
        (t, c, "verified", "full-state") for t in sweep.trials for c in sweep.checkpoints[t]
    ]
    assert all(r[2] == "3" and r[3] == "768" for r in rows)
    assert lines[-1].startswith(f"VERIFIED {sweep.root_uri}: 4 checkpoint(s), 12 file(s)")
    assert lines[-1].endswith("; 4 full-state")  # the level our helpers' manifests prove
    assert err == ""


def test_json_has_a_top_level_verified_boolean(
    capsys: pytest.CaptureFixture[str], s3_server: Any, sweep: SyntheticSweep
) -> None:
    code, out, _ = sweepctl(capsys, sweep.root_uri, "--endpoint-url", s3_server.endpoint_url, "--json", *FAST)
    doc = json.loads(out)
    assert code == 0 and doc["verified"] is True
    assert {
        "root",
        "deep",
        "checked",
        "bytes",
        "files",
        "problems",
        "warnings",
        "checkpoints",
        "durationSeconds",
        "verifiedAt",
    } <= doc.keys()
    assert doc["checked"] == 4 and doc["problems"] == []
    assert doc["checkpoints"][0].keys() == {
        "trial", "checkpoint", "key", "committed", "files", "bytes", "status", "level"
    }  # fmt: skip
    assert doc["summary"] == f"{doc['checked']} full-state"


def test_missing_file_exits_1_listing_the_problem(
    capsys: pytest.CaptureFixture[str], s3_server: Any, sweep: SyntheticSweep
) -> None:
    key = sweep.delete_file(trial=sweep.trials[1])
    code, out, _ = sweepctl(capsys, sweep.root_uri, "--endpoint-url", s3_server.endpoint_url, *FAST)
    assert code == 1
    assert f"  missing-file: s3://{sweep.bucket}/{key}: listed in the manifest" in out
    assert out.splitlines()[-1].startswith(f"NOT VERIFIED {sweep.root_uri}: 1 problem(s)")

    code, out, _ = sweepctl(capsys, sweep.root_uri, "--endpoint-url", s3_server.endpoint_url, "--json", *FAST)
    doc = json.loads(out)
    assert code == 1 and doc["verified"] is False
    assert doc["problems"] == [{"kind": "missing-file", "key": key, "detail": doc["problems"][0]["detail"]}]


def test_a_deleted_trial_directory_exits_1_naming_the_trial_and_the_record(
    capsys: pytest.CaptureFixture[str], s3_server: Any, sweep: SyntheticSweep
) -> None:
    """Issue 12, defect 6: train/<trial>/ gone, the run's records name its checkpoint: not verified."""
    prefix = sweep.delete_trial_dir(sweep.trials[1])
    code, out, _ = sweepctl(capsys, sweep.root_uri, "--endpoint-url", s3_server.endpoint_url, *FAST)
    assert code == 1
    assert f"  missing-trial: s3://{sweep.bucket}/{prefix}: no object under train/{sweep.trials[1]}/, but" in out
    assert out.splitlines()[-1].startswith(f"NOT VERIFIED {sweep.root_uri}: 1 problem(s)")


def test_corruption_fails_only_with_deep(
    capsys: pytest.CaptureFixture[str], s3_server: Any, sweep: SyntheticSweep
) -> None:
    """R22: --deep compares sha256; sizes alone pass a same-size corruption."""
    sweep.corrupt_file()
    assert sweepctl(capsys, sweep.root_uri, "--endpoint-url", s3_server.endpoint_url, *FAST)[0] == 0
    code, out, _ = sweepctl(capsys, sweep.root_uri, "--endpoint-url", s3_server.endpoint_url, "--deep", "--json", *FAST)
    doc = json.loads(out)
    assert code == 1 and doc["deep"] is True
    assert [p["kind"] for p in doc["problems"]] == ["checksum-mismatch", "best-checkpoint-unverified"]


def test_the_storage_prefix_is_refused_naming_the_run_roots_under_it(
    capsys: pytest.CaptureFixture[str], s3_server: Any, s3_bucket: str
) -> None:
    """Issue 28: `verify <storage.uri>` holding two runs once printed VERIFIED with 0 checkpoints and exited 0."""
    writer = MotoDirectWriter()
    first = write_sweep(writer, s3_bucket, "sweeps/team-a/digits-r1", trials=1, checkpoints=1, files=1)
    second = write_sweep(writer, s3_bucket, "sweeps/team-b/mnist-r2", trials=1, checkpoints=1, files=1)

    code, out, err = sweepctl(capsys, f"s3://{s3_bucket}/sweeps", "--endpoint-url", s3_server.endpoint_url, *FAST)
    assert (code, out) == (2, ""), out + err
    assert "VERIFIED" not in err
    assert f"s3://{s3_bucket}/sweeps is not a run root: expected s3://bucket/prefix/<namespace>/<sweep>-<runId>" in err
    assert err.splitlines()[-3:] == [
        f"run roots under s3://{s3_bucket}/sweeps:",
        f"  {first.root_uri}",
        f"  {second.root_uri}",
    ]

    code, _, err = sweepctl(capsys, f"s3://{s3_bucket}/sweeps/team-b", "--endpoint-url", s3_server.endpoint_url, *FAST)
    assert code == 2 and err.splitlines()[-1] == f"  {second.root_uri}"
    assert sweepctl(capsys, second.root_uri, "--endpoint-url", s3_server.endpoint_url, *FAST)[0] == 0


def test_a_prefix_with_no_run_under_it_says_so(
    capsys: pytest.CaptureFixture[str], s3_server: Any, s3_bucket: str
) -> None:
    MotoDirectWriter().put_object(Bucket=s3_bucket, Key="notes/readme.txt", Body=b"x")
    code, _, err = sweepctl(capsys, f"s3://{s3_bucket}/notes", "--endpoint-url", s3_server.endpoint_url, *FAST)
    assert code == 2
    assert err.splitlines()[-1] == f"no run root within 3 levels under s3://{s3_bucket}/notes"


def test_wrong_bucket_exits_1_with_the_reason(capsys: pytest.CaptureFixture[str], s3_server: Any) -> None:
    code, out, err = sweepctl(
        capsys, "s3://no-such-bucket-here/sweeps/ns/x-r1", "--endpoint-url", s3_server.endpoint_url, *FAST
    )
    assert code == 1
    assert "NoSuchBucket (HTTP 404)" in out and "Traceback" not in out + err


def test_server_down_exits_1_without_traceback() -> None:
    """The installed console script, end to end: an unreachable endpoint is 'not verified', never a crash."""
    with refused_port() as port:
        proc = subprocess.run(
            [
                str(SWEEPCTL),
                "verify",
                "s3://bucket-a/sweeps/ns/x-r1",
                "--endpoint-url",
                f"http://127.0.0.1:{port}",
                "--json",
                *FAST,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["verified"] is False and "EndpointConnectionError" in doc["problems"][0]["detail"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gs://bucket/x"], "is neither an s3:// URI nor a directory"),
        (["s3://Bad_Bucket/x"], "is not a valid S3 bucket name"),
        (["s3://bucket-a"], "names a bucket, not a run root"),
        (["s3://bucket-a/x", "--timeout", "0"], "--timeout: got 0"),
        (["s3://bucket-a/x", "--concurrency", "0"], "--concurrency: got 0"),
        (["s3://bucket-a/x", "--max-attempts", "0"], "--max-attempts: got 0"),
        (["s3://bucket-a/x", "--endpoint-url", "127.0.0.1:9000"], "--endpoint-url: got '127.0.0.1:9000'"),
    ],
)
def test_input_errors_exit_2_before_any_request(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = sweepctl(capsys, *args)
    assert code == 2
    assert message in err and out == ""


@pytest.mark.parametrize("args", [["--no-such-option", "s3://bucket-a/x"], []])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["verify", *args])
    assert exit_info.value.code == 2
    assert "usage: sweepctl" in capsys.readouterr().err
