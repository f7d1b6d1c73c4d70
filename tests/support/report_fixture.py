"""Puts the real run root of tests/support/fixtures/report_run_root (4 trials, ASHA, see report-sweep.yaml) into
an S3 bucket as the run wrote it: paths under the root as Ray and our entrypoint record them for S3, and each
checkpoint file the fixture leaves out uploaded as bytes of its manifest's listed size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "report_run_root"
PLACEHOLDER = "@RUN_ROOT@"


def upload_run_root(client: Any, bucket: str, prefix: str, source: Path = FIXTURE) -> str:
    """Upload `source` (the fixture, or a copy `stopped_run_root` rewrote) under `s3://bucket/prefix`; returns that
    run root URI."""
    root = f"s3://{bucket}/{prefix}"
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        relative = path.relative_to(source).as_posix()
        text = path.read_text()
        # Tune's records carry the scheme-less path TuneReportCallback forwards (R18); our _sweep files full URIs.
        text = text.replace(PLACEHOLDER, root if relative.startswith("_sweep/") else root.removeprefix("s3://"))
        client.put_object(Bucket=bucket, Key=f"{prefix}/{relative}", Body=text.encode())
        if path.name == "_manifest.json":
            for entry in json.loads(text)["files"]:
                if not (path.parent / entry["path"]).exists():
                    key = f"{prefix}/{path.parent.relative_to(source).as_posix()}/{entry['path']}"
                    client.put_object(Bucket=bucket, Key=key, Body=b"\0" * entry["size"])
    return root


def stopped_run_root(dest: Path) -> Path:
    """The fixture's run as a delete leaves it in S3: the driver stopped by SIGTERM (Ray's Jobs API stop, the
    guard's graceful stop) wrote `_sweep/status.json` with phase Stopped and its stop record, and no result.json;
    the run root at its real path `<storage>/<namespace>/<sweep>-<runId>`. Returns that run root."""
    import shutil

    root = dest / "sweeps" / "default" / "digits-asha-rep001"
    shutil.copytree(FIXTURE, root)
    (root / "_sweep" / "result.json").unlink()
    status = json.loads((root / "_sweep" / "status.json").read_text())
    status.update(
        phase="Stopped",
        stoppedBy="signal",
        attempt=1,
        attempts=[
            {
                "attempt": 1,
                "startedAt": "2026-12-03T11:47:15Z",
                "endedAt": "2026-12-03T11:48:58Z",
                "phase": "Stopped",
                "deadlineAt": None,
                "numSamples": 4,
                "resumedTrials": [],
                "newTrials": sorted(p.name for p in (root / "tune").iterdir() if p.is_dir()),
            }
        ],
        stop={
            "signal": "SIGTERM",
            "requestedAt": "2026-12-03T11:48:50Z",
            "stoppedAt": "2026-12-03T11:48:58Z",
            "waitedSeconds": 8.0,
            "reportWaitSeconds": 60,
            "timedOut": False,
            "trials": [],
        },
    )
    (root / "_sweep" / "status.json").write_text(json.dumps(status, indent=1))
    return root
