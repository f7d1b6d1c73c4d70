"""Issue 28, the report as a person reads it: legends name trials by their hyper-parameters, every metric the loop
reports has a panel, every searched hyper-parameter is plotted or said not to vary, the timeline is scaled to the
run, the page holds no Python repr and heads every column, and a report from S3 alone after a delete names the sweep
and the phase its run ended in. Figures are checked on matplotlib's own objects, captured before they become PNGs."""

from __future__ import annotations

import json
import re
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
        boxes = drawn_texts(fig)  # before the PNG: a closed figure draws nothing
        figures[title + " boxes"] = boxes
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


# ------------------------------------------------------------------ the figures as a person reads them, continued


def drawn_texts(fig: Any) -> list[tuple[str, Any]]:
    """Each text matplotlib draws with its box on the canvas; texts it does not draw (ticks outside the view) are
    not there to collide."""
    import matplotlib.text

    boxes: list[tuple[str, Any]] = []
    draw = matplotlib.text.Text.draw

    def recorded(text: Any, renderer: Any) -> None:
        draw(text, renderer)
        if text.get_visible() and text.get_text().strip():
            boxes.append((text.get_text(), text.get_window_extent(renderer)))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matplotlib.text.Text, "draw", recorded)
        fig.canvas.draw()
    return boxes


def overlapping_texts(boxes: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of drawn texts sharing more than a pixel each way."""
    return [
        (a, b)
        for i, (a, box_a) in enumerate(boxes)
        for b, box_b in boxes[i + 1 :]
        if min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0) > 1
        and min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0) > 1
    ]


def with_sweep(records: Any, scheduler: str | None = None) -> Any:
    """The fixture's run as the cluster tells it: queued 1 s, starting 3 s, running two minutes (a phase of seconds
    beside one of minutes), under `scheduler`."""
    tune: dict[str, Any] = {"metric": "val_loss", "mode": "min"}
    if scheduler:
        tune["scheduler"] = {"type": scheduler}
    records.sweep = {
        "metadata": {"name": "digits-asha", "namespace": "default", "creationTimestamp": "2026-12-03T11:46:58Z"},
        "spec": {"tune": tune},
        "status": {
            "phase": "Succeeded",
            "queuedAt": "2026-12-03T11:46:59Z",
            "startedAt": "2026-12-03T11:47:00Z",
            "trainingStartedAt": "2026-12-03T11:47:03Z",
            "deadlineAt": "2026-12-03T17:47:00Z",
            "finishedAt": "2026-12-03T11:48:58Z",
        },
    }
    return records


def test_no_label_overlaps_another_in_any_figure(tmp_path: Path, drawn: dict[str, Any]) -> None:
    """The timeline drew Starting (3 s) and Running on one lane, their labels on top of each other."""
    write_report(with_sweep(records_of(), "asha"), tmp_path / "r", now=NOW)
    figures = [title for title, fig in drawn.items() if hasattr(fig, "canvas")]
    assert len(figures) == 5
    for title in figures:
        boxes = drawn[title + " boxes"]
        assert len(boxes) >= 5 and overlapping_texts(boxes) == [], title
    (timeline,) = [title for title in figures if title.startswith("timeline")]
    assert {"Queued", "Starting", "Running", "attempt 1"} <= {text for text, _ in drawn[timeline + " boxes"]}


def test_the_x_is_explained_only_where_a_scheduler_may_have_stopped_a_trial(
    tmp_path: Path, drawn: dict[str, Any]
) -> None:
    """Under fifo nothing stops a trial early: no X and no note. Under asha the note names the scheduler; from the
    run root alone the scheduler is unknown and the X says only that the trial ended before the others."""
    fifo = write_report(with_sweep(records_of(), "fifo"), tmp_path / "fifo", now=NOW)
    assert not any(t["early_stopped"] for t in fifo.data["learningCurves"]["trials"])
    assert "val_loss per epoch" in drawn and "stopped early" not in fifo.html.read_text()
    assert not any("stopped early" in t or "ended at" in t for t in legend_texts(drawn["val_loss per epoch"]))
    unset = learning_curves(with_sweep(records_of(), None))  # the API's default scheduler is fifo
    assert unset.scheduler == "fifo" and not any(t.early_stopped for t in unset.trials)

    asha = write_report(with_sweep(records_of(), "asha"), tmp_path / "asha", now=NOW)
    title = "val_loss per epoch (X: stopped early by the scheduler (asha))"
    assert "lr=0.0003 (stopped early at epoch 0)" in legend_texts(drawn[title])
    trials = next(t for t in _tables(asha.html.read_text()) if t["header"][0] == "trial")
    assert sorted(r[-1] for r in trials["rows"][1:]) == ["best trial"] + ["stopped early by the scheduler (asha)"] * 3

    write_report(records_of(), tmp_path / "alone", now=NOW)
    title = "val_loss per epoch (X: ended before the other trials' last epoch)"
    assert "lr=0.0003 (ended at epoch 0)" in legend_texts(drawn[title])


def test_epochs_are_ticked_in_whole_numbers(tmp_path: Path, drawn: dict[str, Any]) -> None:
    """A run of two epochs had ticks at 0.25, 0.5, 0.75 on every curve."""
    import shutil

    root = tmp_path / "run"
    shutil.copytree(FIXTURE, root)
    best = root / "tune" / "48bfa_00000" / "result.json"
    best.write_text("\n".join(best.read_text().splitlines()[:2]) + "\n")
    write_report(records_of(root), tmp_path / "r", now=NOW)
    (curves,) = [fig for title, fig in drawn.items() if title.startswith("val_loss per epoch") and hasattr(fig, "axes")]
    metrics = drawn["every metric the train loop reports, per epoch"]
    for ax in [*curves.axes, *(ax for ax in metrics.axes if ax.get_title())]:
        low, high = ax.get_xlim()
        ticks = [float(x) for x in ax.get_xticks() if low <= x <= high]
        assert len(ticks) >= 2 and all(x.is_integer() for x in ticks), (ax.get_title(), ticks)


def test_counters_are_told_by_their_names() -> None:
    from sweep_operator.cli.report_data import is_counter

    counted = ["train_samples", "val_samples", "samples", "num_tokens", "n_examples", "global_step", "step"]
    counted += ["train_steps", "tokens", "val_batches", "error_count"]
    measured = ["val_loss", "train_loss", "lr", "val_accuracy", "nll", "perplexity", "step_time_s", "sample_weight"]
    assert [n for n in counted if not is_counter(n)] == [] and [n for n in measured if is_counter(n)] == []


def test_a_metric_and_a_hyper_parameter_of_one_name_are_told_apart(tmp_path: Path, drawn: dict[str, Any]) -> None:
    """The loop reports its scheduled lr as a metric beside the hyper-parameter lr: the figures, the table and the
    interactive view say which is which; a name only one of them uses stays bare."""
    report = write_report(records_of(), tmp_path / "r", now=NOW)
    metrics = drawn["every metric the train loop reports, per epoch"]
    assert "metric lr" in [ax.get_title() for ax in metrics.axes] and "metric lr" in [
        ax.get_ylabel() for ax in metrics.axes
    ]
    assert "trial: config lr" in [legend.get_title().get_text() for legend in metrics.legends]
    assert [
        ax.get_xlabel() for ax in drawn["each hyper-parameter vs the trial's final val_loss (red: best trial)"].axes
    ] == ["config lr"]
    interactive = report.interactive.read_text()
    assert '<option value="lr">metric lr</option>' in interactive and '"title_text": "config lr"' not in interactive
    assert "config lr" in interactive
    no_lr_metric = records_of()
    for rows in no_lr_metric.trial_results.values():
        for row in rows:
            row.pop("lr")
    drawn.clear()
    write_report(no_lr_metric, tmp_path / "s", now=NOW)
    labels = drawn["each hyper-parameter vs the trial's final val_loss (red: best trial)"].axes[0].get_xlabel()
    assert labels == "lr" and "metric lr" not in str(drawn)


def test_the_interactive_view_is_one_file_that_fetches_nothing(tmp_path: Path) -> None:
    """plotly.js inlined, no element that loads anything, every loop metric offered (the sweep's first), and a
    hyper-parameter's text cannot close the page's scripts."""
    records = records_of()
    for i, rows in enumerate(records.trial_results.values()):
        rows[-1]["config"]["note"] = f"</script><script>document.title='x{i}'</script>"
    page = write_report(records, tmp_path / "r", now=NOW).interactive.read_text()
    assert "plotly.js v" in page and len(page) > 3_000_000
    assert not re.search(r"<(script|img|iframe|link)[^>]*\s(src|href)=", page, re.IGNORECASE)
    assert page.count("<script") == page.count("</script>") == 5  # the library, two figures, the labels, the picker
    options = re.findall(r'<option value="([^"]+)"', page)
    assert options == ["val_loss", "lr", "train_loss", "val_accuracy"]
    assert "val_loss (the sweep&#39;s metric)" in page
