"""`sweepctl report` from a real run root (tests/support/fixtures/report_run_root: 4 trials under ASHA, real Ray):
the figures' data equals what Tune recorded, the best and the early-stopped trials are marked, a running sweep
gives partial curves, and report.html embeds exactly the PNGs written beside it."""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts.timestamps import epoch_seconds as unix  # the one RFC 3339 reader
from sweep_operator.cli import main as sweepctl
from sweep_operator.cli.report import (
    FIGURES,
    LocalStore,
    learning_curves,
    parameter_points,
    read_records,
    timeline,
    write_report,
)

FIXTURE = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "report_run_root"
EPOCHS = 6  # paramSpace.epochs of tests/support/fixtures/report-sweep.yaml (ASHA maxT)


def tune_rows(root: Path, trial: str) -> list[dict[str, Any]]:
    """What Tune recorded for a trial, read here independently of the report's reader."""
    return [
        json.loads(line) for line in (root / "tune" / trial / "result.json").read_text().splitlines() if line.strip()
    ]


def result_doc(root: Path = FIXTURE) -> dict[str, Any]:
    return json.loads((root / "_sweep" / "result.json").read_text())


def records_of(root: Path) -> Any:
    return read_records(LocalStore(str(root)), str(root))


def test_curves_are_the_metrics_tune_recorded_with_the_best_and_the_stopped_trials_marked() -> None:
    curves = learning_curves(records_of(FIXTURE))
    result = result_doc()
    assert (curves.metric, curves.mode, curves.x_label) == ("val_loss", "min", "epoch")
    assert sorted(t.trial for t in curves.trials) == sorted(t["id"] for t in result["trialResults"])
    for curve in curves.trials:
        rows = tune_rows(FIXTURE, curve.trial)
        assert curve.epochs == [float(r["epoch"]) for r in rows]
        assert curve.values == [r["val_loss"] for r in rows]
        assert curve.config == {k: v for k, v in rows[-1]["config"].items()}
    (best,) = [t for t in curves.trials if t.best]
    assert best.trial == result["bestTrial"]["id"]
    assert min(best.values) == result["bestTrial"]["value"]
    assert best.epochs == [float(e) for e in range(EPOCHS)] and not best.early_stopped
    # ASHA (gracePeriod 1) stopped the other three after their first epoch: TERMINATED, not errored, fewer epochs.
    stopped = {t.trial for t in curves.trials if t.early_stopped}
    assert stopped == {t["id"] for t in result["trialResults"] if t["id"] != best.trial}
    assert all(len(t.values) < EPOCHS and t.status == "TERMINATED" for t in curves.trials if t.trial in stopped)


def test_each_varying_hyper_parameter_is_plotted_against_the_final_metric() -> None:
    curves = learning_curves(records_of(FIXTURE))
    (lr,) = parameter_points(curves)  # batch_size, epochs and hidden are constant in this sweep
    assert lr.name == "lr" and not lr.categorical and lr.log_scale
    expected = sorted(
        (r["config"]["lr"], r["val_loss"], r["trial_id"])
        for r in (tune_rows(FIXTURE, t.trial)[-1] for t in curves.trials)
    )
    assert sorted(lr.points) == expected


def test_timeline_spans_each_trial_from_tunes_timestamps() -> None:
    records = records_of(FIXTURE)
    line = timeline(records, now=2_000_000_000.0)
    trials = {s.label: s for s in line.spans if s.kind == "trial"}
    for trial, span in trials.items():
        rows = tune_rows(FIXTURE, trial)
        assert span.end == rows[-1]["timestamp"]
        assert span.start == pytest.approx(rows[0]["timestamp"] - rows[0]["time_total_s"])
    assert len(trials) == 4
    # Trials ran one at a time (maxConcurrentTrials 1): each starts after the previous ended (1 s timestamp grain).
    ordered = sorted(trials.values(), key=lambda s: s.start)
    assert all(a.end <= b.start + 1.0 for a, b in itertools.pairwise(ordered))
    (finished,) = [m for m in line.markers if m.kind == "finished"]
    assert finished.at == unix(result_doc()["finishedAt"])


def test_timeline_from_the_sweep_status_has_phases_attempts_deadline_and_verification() -> None:
    records = records_of(FIXTURE)
    records.sweep = {
        "metadata": {"name": "digits-asha", "namespace": "default", "creationTimestamp": "2026-12-03T11:40:00Z"},
        "status": {
            "phase": "Succeeded",
            "queuedAt": "2026-12-03T11:40:01Z",
            "startedAt": "2026-12-03T11:45:00Z",
            "trainingStartedAt": "2026-12-03T11:47:10Z",
            "deadlineAt": "2026-12-03T12:15:00Z",
            "finishedAt": "2026-12-03T11:49:05Z",
            "checkpoints": {"verified": True, "verifiedAt": "2026-12-03T11:49:07Z"},
        },
    }
    line = timeline(records, now=2_000_000_000.0)
    phases = {s.label: (s.start, s.end) for s in line.spans if s.kind == "phase"}
    t = unix
    assert phases == {
        "Queued": (t("2026-12-03T11:40:01Z"), t("2026-12-03T11:45:00Z")),
        "Starting": (t("2026-12-03T11:45:00Z"), t("2026-12-03T11:47:10Z")),
        "Running": (t("2026-12-03T11:47:10Z"), t("2026-12-03T11:49:05Z")),
    }
    assert [s.label for s in line.spans if s.kind == "attempt"] == ["attempt 1"]
    assert {m.kind: m.at for m in line.markers if m.kind in ("deadline", "verification")} == {
        "deadline": t("2026-12-03T12:15:00Z"),
        "verification": t("2026-12-03T11:49:07Z"),
    }
    records.events = [
        {"time": "2026-12-03T11:46:00Z", "reason": "CreatedRayCluster"},
        {"time": "2026-12-03T11:45:30Z", "reason": "Running"},
        {"time": "2026-12-03T11:45:01Z", "reason": "CreatedRayCluster"},
    ]
    attempts = [s for s in timeline(records, now=2_000_000_000.0).spans if s.kind == "attempt"]
    assert [(s.label, s.start, s.end) for s in attempts] == [
        ("attempt 1", t("2026-12-03T11:45:01Z"), t("2026-12-03T11:46:00Z")),
        ("attempt 2", t("2026-12-03T11:46:00Z"), t("2026-12-03T11:49:05Z")),
    ]


def test_a_running_sweep_gives_partial_curves(tmp_path: Path) -> None:
    """Mid-run: no result.json yet, the best trial's results file still growing (its last line half-written)."""
    root = tmp_path / "run"
    shutil.copytree(FIXTURE, root)
    (root / "_sweep" / "result.json").unlink()
    best = result_doc()["bestTrial"]["id"]
    rows = (root / "tune" / best / "result.json").read_text().splitlines()
    (root / "tune" / best / "result.json").write_text("\n".join(rows[:3]) + "\n" + rows[3][:40])
    curves = learning_curves(records_of(root))
    (curve,) = [t for t in curves.trials if t.trial == best]
    assert curve.values == [r["val_loss"] for r in tune_rows(FIXTURE, best)[:3]]
    assert curve.best and curve.status == "RUNNING" and not curve.early_stopped  # best so far: _sweep/status.json
    # Tune marked the ASHA-stopped trials' last results done: they show as stopped before the sweep ends.
    assert {t.trial for t in curves.trials if t.early_stopped} == {t["id"] for t in result_doc()["trialResults"]} - {
        best
    }


def test_report_html_embeds_the_pngs_written_beside_it(tmp_path: Path) -> None:
    report = write_report(records_of(FIXTURE), tmp_path / "out", now=2_000_000_000.0)
    page = report.html.read_text()
    embedded = [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]
    assert embedded == [report.figures[name].read_bytes() for name in FIGURES]
    for data in embedded:
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
    assert "http://" not in page and "https://" not in page  # self-contained: nothing to fetch
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["learningCurves"]["trials"][0]["values"] == [
        r["val_loss"] for r in tune_rows(FIXTURE, data["learningCurves"]["trials"][0]["trial"])
    ]
    assert result_doc()["bestTrial"]["id"] in page


def test_sweepctl_report_on_a_local_run_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sweepctl(["report", "--storage", str(FIXTURE), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "4 trial(s), 9 val_loss point(s)" in out
    written = ["report.html", "interactive.html", "report.json"]
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == sorted([*FIGURES, *written])


def test_sweepctl_report_needs_a_name_or_a_run_root(capsys: pytest.CaptureFixture[str]) -> None:
    assert sweepctl(["report"]) == 2
    assert "name a TrainingSweep, or pass its run root with --storage" in capsys.readouterr().err
