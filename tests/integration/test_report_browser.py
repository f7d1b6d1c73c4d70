"""report.html in a real browser (issue 28): headless Chromium renders the report of the fixture's run, read from S3
alone, to a screenshot that is not blank and shows the figures (the best trial's red), with nothing on the console.
Skips without Chromium; under SWEEPS_REQUIRE_CHROMIUM=1 (.ci/run sets it) a missing Chromium is a failure."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from sweep_operator.cli import main as sweepctl
from tests.support.report_fixture import stopped_run_root, upload_run_root

pytestmark = pytest.mark.integration

REQUIRE_CHROMIUM = "SWEEPS_REQUIRE_CHROMIUM"
# Chromium logs each console message of the page as `INFO:CONSOLE:<line>] "<message>", source: <url>`.
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)")


def _chromium() -> str:
    path = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if path is None:
        message = "chromium not installed: `apt-get update && apt-get install -y chromium` brings it"
        if os.environ.get(REQUIRE_CHROMIUM) == "1":
            pytest.fail(f"{message} ({REQUIRE_CHROMIUM}=1: required here)", pytrace=False)
        pytest.skip(message)
    return path


def screenshot(page: Path, png: Path, profile: Path) -> list[str]:
    """Render `page` with headless Chromium into `png`; returns the page's console messages."""
    done = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={png}",
            "--window-size=1400,4400",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert png.is_file(), f"chromium wrote no screenshot (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return [m.group(1) for m in map(CONSOLE.search, done.stderr.splitlines()) if m]


def pixels(png: Path) -> tuple[int, int, int]:
    """(all pixels, non-white pixels, pixels of the best trial's red: matplotlib's tab:red #d62728)."""
    import numpy
    from PIL import Image

    rgb = numpy.asarray(Image.open(png).convert("RGB")).astype(int).reshape(-1, 3)
    non_white = int((rgb.min(axis=1) < 245).sum())
    red = int((numpy.abs(rgb - (214, 39, 40)).max(axis=1) < 25).sum())
    return len(rgb), non_white, red


def test_console_messages_are_caught(tmp_path: Path) -> None:
    """The check below would pass on a broken page if Chromium's console were not read: show that it is."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><body><p>x</p><script>console.error("boom"); nope();</script></body></html>')
    messages = screenshot(page, tmp_path / "broken.png", tmp_path / "profile")
    assert any("boom" in m for m in messages) and any("Uncaught ReferenceError" in m for m in messages), messages


def test_the_report_renders_in_chromium_with_its_figures_and_no_console_errors(
    s3_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("PIL", reason="Pillow comes with matplotlib")
    client = s3_server.client()
    bucket = f"rep-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    root = upload_run_root(client, bucket, "sweeps/default/digits-asha-rep001")
    out = tmp_path / "report"
    endpoint = ["--endpoint-url", s3_server.endpoint_url, "--region", "us-east-1"]
    code = sweepctl(["report", "--storage", root, *endpoint, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    page = (out / "report.html").read_text()
    assert "<h1>TrainingSweep default/digits-asha</h1>" in page
    png = tmp_path / "report.png"
    messages = screenshot(out / "report.html", png, tmp_path / "profile")
    assert messages == [], messages
    total, non_white, red = pixels(png)
    assert non_white > 0.03 * total, f"the screenshot is nearly blank: {non_white} of {total} pixels not white"
    assert red > 500, f"no figure drawn: {red} pixels of the best trial's red"


def test_a_report_from_s3_alone_after_a_delete_names_the_sweep_and_the_phase_its_run_ended_in(
    s3_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sweep and its cluster are gone; the driver, stopped by the delete, left status.json at Stopped."""
    client = s3_server.client()
    bucket = f"rep-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    source = stopped_run_root(tmp_path / "local")
    root = upload_run_root(client, bucket, "sweeps/team-a/digits-asha-rep001", source)
    endpoint = ["--endpoint-url", s3_server.endpoint_url, "--region", "us-east-1"]
    assert sweepctl(["report", "--storage", root, *endpoint, "--out", str(tmp_path / "r")]) == 0, capsys.readouterr()
    page = (tmp_path / "r" / "report.html").read_text()
    assert "<h1>TrainingSweep team-a/digits-asha</h1>" in page
    assert "<dt>phase</dt><dd>Stopped: the driver recorded Stopped at 2026-12-03T11:48:58Z (stopped by SIGTERM" in page
