"""Issue 28, the report as a person reads it: legends name trials by their hyper-parameters, every metric the loop
reports has a panel, every searched hyper-parameter is plotted or said not to vary, the timeline is scaled to the
run, the page holds no Python repr and heads every column, and a report from S3 alone after a delete names the sweep
and the phase its run ended in. Figures are checked on matplotlib's own objects, captured before they become PNGs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import matplotlib.dates as mdates
import pytest

from sweep_contracts.timestamps import epoch_seconds as unix
from sweep_operator.cli import report_figures
from sweep_operator.cli.report import write_report
from sweep_operator.cli.report_data import (
    learning_curves,
    loop_metrics,
    metric_panels,
    parallel_view,
    parameter_points,
    timeline,
)
from sweep_operator.cli.report_records import LocalStore, read_records, run_end, sweep_identity
from tests.support.report_fixture import FIXTURE, stopped_run_root

NOW = 2_000_000_000.0
LR = {"48bfa_00000": "lr=0.1", "48bfa_00001": "lr=0.0003", "48bfa_00002": "lr=0.03", "48bfa_00003": "lr=0.003"}


def records_of(root: Path = FIXTURE) -> Any:
    return read_records(LocalStore(str(root)), str(root))


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Every figure the report draws, by its title, as matplotlib objects (the PNG is still written)."""
    figures: dict[str, Any] = {}
    png = report_figures._png

    def keep(fig: Any) -> bytes:
        title = fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()
        figures[title] = fig
        fig.canvas.draw()
        texts = [t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text"))]
        figures[title + " texts"] = texts
        return png(fig)

    monkeypatch.setattr(report_figures, "_png", keep)
    yield figures


def legend_texts(fig: Any) -> list[str]:
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


class Tables(HTMLParser):
    """Each <table>: its header cells and its rows' cells."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict[str, Any]] = []
        self.cell: str | None = None

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag == "table":
            self.tables.append({"header": [], "rows": []})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        elif tag in ("th", "td"):
            self.cell = tag
            (self.tables[-1]["header"] if tag == "th" else self.tables[-1]["rows"][-1]).append("")

    def handle_data(self, data: str) -> None:
        if self.cell == "th":
            self.tables[-1]["header"][-1] += data
        elif self.cell == "td":
            self.tables[-1]["rows"][-1][-1] += data

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td"):
            self.cell = None


def test_legends_name_trials_by_their_hyper_parameters(tmp_path: Path, drawn: dict[str, Any]) -> None:
    curves = learning_curves(records_of())
    assert {t.trial: t.label for t in curves.trials} == LR and curves.varying == ["lr"]
    write_report(records_of(), tmp_path / "r", now=NOW)
    curve_legend = legend_texts(drawn["val_loss per epoch (X: ended before the other trials' last epoch)"])
    assert curve_legend[0] == "lr=0.1 (best)"
    assert all(label.startswith("lr=") for label in curve_legend) and not any("48bfa" in t for t in curve_legend)
    metric_legend = legend_texts(drawn["every metric the train loop reports, per epoch"])
    assert set(LR.values()) <= {t.removesuffix(" (best)") for t in metric_legend}
    page = (tmp_path / "r" / "report.html").read_text()
    trials = next(t for t in _tables(page) if t["header"][0] == "trial")
    # The loop also reports a metric named lr (its schedule): the column says it is the hyper-parameter.
    assert trials["header"][1] == "config lr" and {r[0]: "lr=" + r[1] for r in trials["rows"][1:]} == LR


def test_every_metric_the_loop_reports_gets_a_panel_and_counters_are_named_not_drawn(
    tmp_path: Path, drawn: dict[str, Any]
) -> None:
    records = records_of()
    reported = {k for path in FIXTURE.glob("tune/*/result.json") for line in path.open() for k in json.loads(line)}
    loop = {"train_loss", "val_loss", "val_accuracy", "lr"}
    assert loop | {"train_samples", "val_samples"} <= reported and set(loop_metrics(records)) == loop
    panels = metric_panels(records, learning_curves(records))
    assert next(p.metrics for p in panels) == ["train_loss", "val_loss"]  # the sweep's metric's family first
    assert sorted(m for p in panels for m in p.metrics) == sorted(loop)
    report = write_report(records, tmp_path / "r", now=NOW)
    assert report.data["countersNotDrawn"] == ["train_samples", "val_samples"]
    said = "Counters are not drawn (how much data an epoch saw, not how the model does): train_samples, val_samples."
    assert said in report.html.read_text()
    fig = drawn["every metric the train loop reports, per epoch"]
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["train_loss vs val_loss", "val_accuracy", "metric lr"]
    loss = fig.axes[0]
    styles = {line.get_linestyle() for line in loss.get_lines()}
    assert styles == {"--", "-"}  # train dashed, validation solid: overfitting shows in one panel


def test_a_searched_hyper_parameter_that_did_not_vary_is_said(tmp_path: Path, drawn: dict[str, Any]) -> None:
    records = records_of()
    records.sweep = {
        "metadata": {"name": "digits-asha", "namespace": "default"},
        "spec": {"paramSpace": {"lr": {"grid": [0.1, 0.0003, 0.03, 0.003]}, "hidden": {"choice": [32]}, "epochs": 6}},
        "status": {"phase": "Succeeded"},
    }
    report = write_report(records, tmp_path / "r", now=NOW)
    assert [(p["name"], p["varies"]) for p in report.data["parameters"]] == [("hidden", False), ("lr", True)]
    fig = drawn["each hyper-parameter vs the trial's final val_loss (red: best trial)"]
    assert [ax.get_xlabel() for ax in fig.axes] == ["hidden (did not vary)", "config lr"]
    page = report.html.read_text()
    assert "Searched but did not vary (every trial drew the same value): hidden=32." in page
    assert "Same in every trial (fixed in paramSpace): batch_size=64, epochs=6." in page
    # From the run root alone the spec is unknown: what did not vary is said as such.
    alone = write_report(records_of(), tmp_path / "s", now=NOW).html.read_text()
    assert "Same in every trial (did not vary across trials): batch_size=64, epochs=6, hidden=32." in alone


def test_the_timeline_is_scaled_to_the_run_not_to_the_deadline(tmp_path: Path, drawn: dict[str, Any]) -> None:
    records = records_of()
    records.sweep = {
        "metadata": {"name": "digits-asha", "namespace": "default"},
        "status": {
            "phase": "Succeeded",
            "startedAt": "2026-12-03T11:47:00Z",
            "deadlineAt": "2026-12-03T17:47:00Z",  # six hours: the run took two minutes
            "finishedAt": "2026-12-03T11:48:58Z",
        },
    }
    line = timeline(records, NOW)
    assert (line.start, line.end) == (unix("2026-12-03T11:47:00Z"), unix("2026-12-03T11:48:58Z"))
    write_report(records, tmp_path / "r", now=NOW)
    (ax,) = next(f for f in drawn.values() if hasattr(f, "axes") and f.axes[0].get_title().startswith("timeline")).axes

    left, right = (mdates.num2date(x).timestamp() for x in ax.get_xlim())
    assert unix("2026-12-03T11:46:50Z") < left <= line.start and line.end <= right < unix("2026-12-03T11:49:10Z")
    notes = legend_texts(ax.figure)
    assert "deadline 17:47:00, 6.0 h after the run's end (off the chart)" in notes[0] + " ".join(notes)
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks and all(len(t) == 8 and t.count(":") == 2 for t in ticks)  # whole clock times, HH:MM:SS


def _tables(page: str) -> list[dict[str, Any]]:
    parser = Tables()
    parser.feed(page)
    return parser.tables


def test_the_page_has_no_python_reprs_and_every_column_is_headed(tmp_path: Path) -> None:
    records = records_of()
    records.verification = {
        "verified": False,
        "verifiedAt": "2026-12-03T11:49:07Z",
        "checkpoints": [{"trial": "48bfa_00000", "checkpoint": "c5", "files": 2, "bytes": 10, "status": "verified"}],
        "problems": [{"kind": "missing", "key": "k", "detail": "d"}],
    }
    page = write_report(records, tmp_path / "r", now=NOW).html.read_text()
    assert "{'" not in page and '{"' not in page and "[{" not in page and "None" not in page
    tables = _tables(page)
    assert len(tables) == 3
    for table in tables:
        assert table["header"] and all(h.strip() for h in table["header"]), table["header"]
        assert all(len(row) == len(table["header"]) for row in table["rows"][1:]), table
    assert page.count("<figcaption>") == 5 and "<figcaption>learning_curves.png" not in page


def test_parallel_coordinates_have_an_axis_per_varying_parameter_and_final_metric(
    tmp_path: Path, drawn: dict[str, Any]
) -> None:
    records = records_of()
    curves = learning_curves(records)
    view = parallel_view(records, curves, parameter_points(curves))
    assert [a.name for a in view.axes] == ["config lr", "final val_loss", "final train_loss", "final val_accuracy"]
    assert dict(zip(view.trials, view.axes[0].values, strict=True)) == {
        t: float(label.removeprefix("lr=")) for t, label in LR.items()
    }
    assert view.axes[1].values == [t.values[-1] for t in curves.trials] and view.best == "48bfa_00000"
    write_report(records, tmp_path / "r", now=NOW)
    ax = drawn["parallel coordinates: one line per trial"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "config lr (log)",
        "final val_loss",
        "final train_loss",
        "final val_accuracy",
    ]
    assert len([line for line in ax.get_lines() if len(line.get_xdata()) == 4]) == 4


def test_a_report_from_s3_alone_after_a_delete_names_the_sweep_and_its_end_phase(tmp_path: Path) -> None:
    root = stopped_run_root(tmp_path)
    records = records_of(root)
    assert sweep_identity(records) == ("default", "digits-asha")
    end = run_end(records)
    assert (end.phase, end.run_phase) == ("Stopped", "Stopped") and "SIGTERM" in end.detail
    report = write_report(records, tmp_path / "r", now=NOW)
    page = report.html.read_text()
    assert "<h1>TrainingSweep default/digits-asha</h1>" in page
    assert "<dt>phase</dt><dd>Stopped: the driver recorded Stopped at" in page
    assert report.data["sweep"] == {"namespace": "default", "name": "digits-asha"}
    markers = {m["kind"]: m for m in report.data["timeline"]["markers"]}
    assert markers["finished"]["label"] == "ended Stopped" and markers["finished"]["at"] == unix("2026-12-03T11:48:58Z")
    attempts = [s["label"] for s in report.data["timeline"]["spans"] if s["kind"] == "attempt"]
    assert attempts == ["attempt 1: Stopped"]


def test_a_deleting_sweep_shows_its_phase_and_the_phase_its_run_ended_in(tmp_path: Path) -> None:
    records = records_of(stopped_run_root(tmp_path))
    records.sweep = {"metadata": {"name": "digits-asha", "namespace": "default"}, "status": {"phase": "Deleting"}}
    end = run_end(records)
    assert (end.phase, end.run_phase) == ("Deleting", "Stopped")
    assert end.detail.startswith("the sweep is Deleting; its run: Stopped (the driver recorded Stopped")


def test_a_run_root_without_an_end_record_says_so_and_a_result_says_how_it_ended(tmp_path: Path) -> None:
    """A driver killed before it recorded an end leaves status.json at Running: the report does not call the run
    finished; with result.json (an older driver's status.json), the result's own outcome is the phase."""
    root = stopped_run_root(tmp_path)
    status = json.loads((root / "_sweep" / "status.json").read_text())
    (root / "_sweep" / "status.json").write_text(json.dumps({**status, "phase": "Running", "stop": None}))
    end = run_end(records_of(root))
    assert end.run_phase == "Running" and "no end recorded" in end.detail
    records = records_of(FIXTURE)
    records.progress = {**(records.progress or {}), "phase": "Running"}
    records.result = {**(records.result or {}), "deadlineReached": True}
    assert run_end(records).run_phase == "DeadlineExceeded"
