"""`sweepctl report NAME [-n NS] [--out DIR]`: a sweep's learning curves, hyper-parameters and timeline as a
self-contained report.html (figures embedded) plus PNGs, from its status and its run root in S3 (or a local dir).

Works while the sweep runs (partial curves) and after the cluster is gone: `--storage RUN_ROOT` reads S3 alone.
Figure data comes from pure functions (`learning_curves`, `parameter_points`, `timeline`) the tests check.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from ..status import epoch_seconds, rfc3339
from .common import EXIT_FAILED, EXIT_OK, UsageError, kube_connection

FIGURES = ("learning_curves.png", "parameters.png", "timeline.png")
REPORT = "report.html"
DATA = "report.json"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="write a sweep's learning curves, hyper-parameter plots and timeline (report.html + PNGs)",
        description="Write report.html (figures embedded), PNG figures and report.json for a TrainingSweep, from its "
        "status and its run root in S3; with --storage, from the run root alone (the cluster may be gone).",
    )
    p.add_argument("name", nargs="?", help="the TrainingSweep (omit with --storage)")
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory (default: ./report-<name>)")
    p.add_argument(
        "--storage",
        metavar="RUN_ROOT",
        help="read this run root (s3://bucket/prefix/<ns>/<sweep>-<runId> or a local directory) instead of the sweep's",
    )
    p.add_argument(
        "--endpoint-url",
        default=None,
        metavar="URL",
        help="S3-compatible endpoint (default: the sweep's, else AWS_ENDPOINT_URL_S3 / AWS)",
    )
    p.add_argument("--region", default=None, metavar="R", help="S3 region (default: the sweep's, else AWS_REGION)")
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="do not verify the checkpoints in S3 (show the status' last verification only)",
    )
    p.set_defaults(func=run)


# ----------------------------------------------------------------------------------------- records


@dataclass
class RunRecords:
    """Everything a report shows, as read (no I/O after this point)."""

    root: str
    sweep: Mapping[str, Any] | None = None  # the TrainingSweep object, when the cluster was read
    progress: Mapping[str, Any] | None = None  # _sweep/status.json
    result: Mapping[str, Any] | None = None  # _sweep/result.json
    trial_results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # tune/<trial>/result.json rows
    trial_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # tune/<trial>/params.json
    verification: Mapping[str, Any] | None = None  # verification.VerificationResult.to_dict()
    events: list[Mapping[str, Any]] = field(default_factory=list)  # {time, object, reason, message}

    @property
    def status(self) -> Mapping[str, Any]:
        return (self.sweep or {}).get("status") or {}

    @property
    def spec(self) -> Mapping[str, Any]:
        return (self.sweep or {}).get("spec") or {}


class RunStore(Protocol):
    def read(self, relative: str) -> bytes | None: ...

    def trial_dirs(self) -> list[str]: ...


class LocalStore:
    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def read(self, relative: str) -> bytes | None:
        path = self.root / relative
        return path.read_bytes() if path.is_file() else None

    def trial_dirs(self) -> list[str]:
        tune = self.root / "tune"
        return sorted(p.name for p in tune.iterdir() if p.is_dir()) if tune.is_dir() else []


class S3Store:
    def __init__(self, client: Any, root: str) -> None:
        from sweep_contracts.s3_layout import S3Uri

        self.client, self.uri = client, S3Uri.parse(root)

    def read(self, relative: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.uri.bucket, Key=self.uri.join(relative).key)["Body"].read()
        except Exception as exc:  # absent: the report shows what there is; any other S3 error is reported
            code = (getattr(exc, "response", None) or {}).get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404"):
                return None
            raise

    def trial_dirs(self) -> list[str]:
        prefix = self.uri.join("tune").prefix
        names: set[str] = set()
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.uri.bucket, Prefix=prefix, Delimiter="/"
        ):
            names.update(p["Prefix"][len(prefix) :].strip("/") for p in page.get("CommonPrefixes", []))
        return sorted(names)


def _json(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _json_lines(data: bytes | None) -> list[dict[str, Any]]:
    rows = []
    for line in (data or b"").decode(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line still being written by a running trial
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_records(store: RunStore, root: str, *, sweep: Mapping[str, Any] | None = None) -> RunRecords:
    """What the run root holds: progress, result, and every trial's Tune results (the per-epoch metrics)."""
    from sweep_contracts import s3_layout

    records = RunRecords(root=root, sweep=sweep)
    records.progress = _json(store.read(s3_layout.STATUS_KEY))
    records.result = _json(store.read(s3_layout.RESULT_KEY))
    for trial in store.trial_dirs():
        rows = _json_lines(store.read(f"{s3_layout.TUNE_EXPERIMENT_NAME}/{trial}/result.json"))
        params = _json(store.read(f"{s3_layout.TUNE_EXPERIMENT_NAME}/{trial}/params.json"))
        if rows or isinstance(params, dict):
            records.trial_results[trial] = rows
            records.trial_params[trial] = {k: v for k, v in (params or {}).items() if not k.startswith("_")}
    return records


# ------------------------------------------------------------------------------------- figure data


@dataclass(frozen=True)
class TrialCurve:
    trial: str
    config: dict[str, Any]
    status: str  # TERMINATED, RUNNING, ERROR, PENDING (Tune's) or "" when unknown
    epochs: list[float]
    values: list[float]
    best: bool
    early_stopped: bool  # ended before the others' last epoch without an error (a scheduler stopped it)


@dataclass(frozen=True)
class Curves:
    metric: str
    mode: str  # min | max
    x_label: str
    trials: list[TrialCurve]

    @property
    def best(self) -> TrialCurve | None:
        return next((t for t in self.trials if t.best), None)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def metric_and_mode(records: RunRecords) -> tuple[str | None, str | None]:
    """tune.metric / tune.mode from the sweep's spec, else what the run's files say."""
    tune = records.spec.get("tune") or {}
    metric, mode = tune.get("metric"), tune.get("mode")
    for doc in (records.result, records.progress, records.status):
        best = (doc or {}).get("bestTrial") or {}
        metric = metric or best.get("metric")
    if metric and mode not in ("min", "max"):
        # Without the spec: the best trial's value is its metric's min or max over the trials (progress.best_trial).
        best_value = _finite(((records.result or records.progress or {}).get("bestTrial") or {}).get("value"))
        finals = [
            v for v in (_best_of(rows, metric, "min") for rows in records.trial_results.values()) if v is not None
        ]
        mode = "max" if best_value is not None and finals and best_value > min(finals) else "min"
    return metric, mode


def _best_of(rows: list[dict[str, Any]], metric: str, mode: str) -> float | None:
    values = [v for v in (_finite(r.get(metric)) for r in rows) if v is not None]
    return (min if mode == "min" else max)(values) if values else None


def _trial_statuses(records: RunRecords) -> dict[str, str]:
    statuses = {}
    for t in (records.result or {}).get("trialResults") or []:
        statuses[str(t.get("id"))] = str(t.get("status") or "")
    return statuses


def _trial_configs(records: RunRecords) -> dict[str, dict[str, Any]]:
    configs = {trial: dict(params) for trial, params in records.trial_params.items()}
    for trial, rows in records.trial_results.items():
        if rows and isinstance(rows[-1].get("config"), dict):
            configs[trial] = {k: v for k, v in rows[-1]["config"].items() if not k.startswith("_")}
    for t in (records.result or {}).get("trialResults") or []:
        configs.setdefault(str(t.get("id")), dict(t.get("config") or {}))
    return configs


def best_trial_id(records: RunRecords) -> str | None:
    for doc in (records.result, records.progress, records.status):
        best = (doc or {}).get("bestTrial") or {}
        if best.get("id"):
            return str(best["id"])
    return None


def learning_curves(records: RunRecords) -> Curves:
    """The metric per epoch of every trial, exactly as Tune recorded rank 0's reports (`tune/<trial>/result.json`)."""
    metric, mode = metric_and_mode(records)
    metric = metric or "val_loss"
    statuses, configs, best = _trial_statuses(records), _trial_configs(records), best_trial_id(records)
    uses_epoch = all("epoch" in r for rows in records.trial_results.values() for r in rows)
    x_key = "epoch" if uses_epoch else "training_iteration"
    points: dict[str, tuple[list[float], list[float]]] = {}
    for trial, rows in sorted(records.trial_results.items()):
        xs, ys = [], []
        for row in rows:
            x, y = _finite(row.get(x_key)), _finite(row.get(metric))
            if x is not None and y is not None:
                xs.append(x)
                ys.append(y)
        points[trial] = (xs, ys)
    last = max((xs[-1] for xs, _ in points.values() if xs), default=None)
    trials = []
    for trial, (xs, ys) in points.items():
        # Before result.json exists, Tune's own `done` on a trial's last result says it ended (finished or stopped).
        rows = records.trial_results[trial]
        status = statuses.get(trial) or (("TERMINATED" if rows[-1].get("done") else "RUNNING") if rows else "")
        finished_early = bool(xs) and last is not None and xs[-1] < last
        trials.append(
            TrialCurve(
                trial=trial,
                config=configs.get(trial, {}),
                status=status,
                epochs=xs,
                values=ys,
                best=trial == best,
                early_stopped=status == "TERMINATED" and finished_early,
            )
        )
    return Curves(metric=metric, mode=mode or "min", x_label=x_key, trials=trials)


@dataclass(frozen=True)
class ParameterSeries:
    name: str
    categorical: bool
    log_scale: bool
    points: list[tuple[Any, float, str]]  # (parameter value, final metric, trial)


def parameter_points(curves: Curves) -> list[ParameterSeries]:
    """Each hyper-parameter that varies across trials against each trial's final reported metric."""
    names = sorted({k for t in curves.trials for k in t.config})
    series = []
    for name in names:
        pts = [(t.config[name], t.values[-1], t.trial) for t in curves.trials if name in t.config and t.values]
        if len({json.dumps(p[0], sort_keys=True, default=str) for p in pts}) < 2:
            continue  # a constant says nothing about the metric
        numeric = all(_finite(p[0]) is not None for p in pts)
        positive = numeric and all(float(p[0]) > 0 for p in pts)
        log_scale = positive and max(float(p[0]) for p in pts) / min(float(p[0]) for p in pts) >= 100
        series.append(ParameterSeries(name=name, categorical=not numeric, log_scale=log_scale, points=pts))
    return series


@dataclass(frozen=True)
class Span:
    lane: str
    label: str
    start: float
    end: float | None  # None: still going at the time of the report
    kind: str  # phase | attempt | trial


@dataclass(frozen=True)
class Marker:
    label: str
    at: float
    kind: str  # deadline | verification | event | finished


@dataclass(frozen=True)
class Timeline:
    spans: list[Span]
    markers: list[Marker]
    now: float


def timeline(records: RunRecords, now: float) -> Timeline:
    """The sweep's life: Queued, Starting, Running (status times), each RayJob attempt (Events), each trial
    (Tune's result timestamps), the deadline and the last verification."""
    status, meta = records.status, (records.sweep or {}).get("metadata") or {}
    created = epoch_seconds(meta.get("creationTimestamp"))
    queued, started, training = (
        epoch_seconds(status.get("queuedAt")),
        epoch_seconds(status.get("startedAt")),
        epoch_seconds(status.get("trainingStartedAt")),
    )
    # With the sweep at hand its status says whether it ended; result.json alone says so only without it.
    finished = (
        epoch_seconds(status.get("finishedAt"))
        if records.sweep is not None
        else epoch_seconds((records.result or {}).get("finishedAt"))
    )
    trial_spans = []
    for trial, rows in sorted(records.trial_results.items()):
        stamps = [(_finite(r.get("timestamp")), _finite(r.get("time_total_s")) or 0.0) for r in rows]
        timed = [(t, d) for t, d in stamps if t is not None]
        if timed:
            first_t, first_total = timed[0]
            trial_spans.append(Span("trials", trial, first_t - first_total, timed[-1][0], "trial"))
    run_start = min((s.start for s in trial_spans), default=None)
    spans: list[Span] = []
    if queued is not None:
        spans.append(Span("phase", "Queued", queued, started or now, "phase"))
    if started is not None:
        spans.append(Span("phase", "Starting", started, training or run_start or finished or now, "phase"))
    running_from = training or (run_start if started is None else None)
    if running_from is not None:
        spans.append(Span("phase", "Running", running_from, finished, "phase"))
    # KubeRay creates a RayCluster per attempt and says so on the RayJob (rayjob_controller.go: CreatedRayCluster).
    attempts = sorted(
        (
            e
            for e in records.events
            if e.get("reason") == "CreatedRayCluster" and epoch_seconds(e.get("time")) is not None
        ),
        key=lambda e: epoch_seconds(e.get("time")) or 0.0,
    )
    for i, event in enumerate(attempts):
        at = epoch_seconds(event.get("time"))
        nxt = epoch_seconds(attempts[i + 1].get("time")) if i + 1 < len(attempts) else finished
        if at is not None:
            spans.append(Span("RayJob attempts", f"attempt {i + 1}", at, nxt, "attempt"))
    if not attempts and (status.get("attemptStartedAt") or started):
        spans.append(
            Span(
                "RayJob attempts",
                "attempt 1",
                epoch_seconds(status.get("attemptStartedAt")) or started or 0.0,
                finished,
                "attempt",
            )
        )
    spans += trial_spans
    markers = []
    if created is not None:
        markers.append(Marker("created", created, "event"))
    if epoch_seconds(status.get("deadlineAt")) is not None:
        markers.append(Marker("deadline", epoch_seconds(status.get("deadlineAt")) or 0.0, "deadline"))
    verified_at = epoch_seconds((records.verification or {}).get("verifiedAt")) or epoch_seconds(
        (status.get("checkpoints") or {}).get("verifiedAt")
    )
    if verified_at is not None:
        markers.append(Marker("verification", verified_at, "verification"))
    if finished is not None:
        markers.append(Marker(f"finished ({status.get('phase') or 'done'})", finished, "finished"))
    if (records.result or {}).get("deadlineReached"):
        markers.append(Marker("deadline reached (Tune stopped)", finished or now, "deadline"))
    return Timeline(spans=spans, markers=sorted(markers, key=lambda m: m.at), now=now)


# ------------------------------------------------------------------------------------------ figures


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on servers and in CI
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def render_learning_curves(curves: Curves) -> bytes:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for t in curves.trials:
        if not t.values:
            continue
        style = {"linewidth": 3.0, "color": "tab:red", "zorder": 3} if t.best else {"linewidth": 1.2, "alpha": 0.8}
        label = (
            f"{t.trial}{' (best)' if t.best else ''}{' (running)' if t.status == 'RUNNING' else ''}"
            f"{f' (stopped early at {curves.x_label} {t.epochs[-1]:g})' if t.early_stopped else ''}"
            f"{' (errored)' if t.status == 'ERROR' else ''}"
        )
        (line,) = ax.plot(
            t.epochs,
            t.values,
            marker="o",
            markersize=3,
            linestyle="--" if t.status == "RUNNING" else "-",
            label=label,
            **style,
        )
        if t.early_stopped:
            ax.plot(t.epochs[-1], t.values[-1], marker="X", markersize=11, color=line.get_color(), zorder=4)
        if t.status == "ERROR":
            ax.plot(t.epochs[-1], t.values[-1], marker="s", markersize=9, color="black", zorder=4)
    ax.set_xlabel(curves.x_label)
    ax.set_ylabel(f"{curves.metric} ({curves.mode})")
    ax.set_title(f"{curves.metric} per {curves.x_label} (X: stopped early by the scheduler)")
    ax.grid(alpha=0.3)
    if any(t.values for t in curves.trials):
        ax.legend(fontsize=8, loc="best")
    return _png(fig)


def render_parameters(series: list[ParameterSeries], curves: Curves) -> bytes:
    plt = _pyplot()
    count = max(1, len(series))
    fig, axes = plt.subplots(1, count, figsize=(4 * count, 3.6), squeeze=False)
    best = curves.best.trial if curves.best else None
    for ax, s in zip(axes[0], series, strict=False):  # no series still draws one (empty) axis
        xs: list[float]
        if s.categorical:
            categories = sorted({str(p[0]) for p in s.points})
            xs = [categories.index(str(p[0])) for p in s.points]
            ax.set_xticks(range(len(categories)), categories)
        else:
            xs = [float(p[0]) for p in s.points]
        ys = [p[1] for p in s.points]
        colors = ["tab:red" if p[2] == best else "tab:blue" for p in s.points]
        ax.scatter(xs, ys, c=colors, s=40, zorder=3)
        if s.log_scale:
            ax.set_xscale("log")
        ax.set_xlabel(s.name)
        ax.set_ylabel(f"final {curves.metric}")
        ax.grid(alpha=0.3)
    if not series:
        axes[0][0].text(0.5, 0.5, "no hyper-parameter varies across trials", ha="center", va="center")
        axes[0][0].set_axis_off()
    fig.suptitle(f"hyper-parameters vs final {curves.metric} (red: best trial)")
    return _png(fig)


def render_timeline(line: Timeline) -> bytes:
    plt = _pyplot()
    lanes = list(dict.fromkeys(["phase", "RayJob attempts"] + [s.lane for s in line.spans]))
    colors = {"Queued": "tab:gray", "Starting": "tab:orange", "Running": "tab:green"}
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * (len(lanes) + len([s for s in line.spans if s.kind == "trial"]))))
    rows: list[str] = []
    for span in line.spans:
        row = span.label if span.kind == "trial" else span.lane
        if row not in rows:
            rows.append(row)
        y = rows.index(row)
        start = datetime.fromtimestamp(span.start, UTC)
        end = datetime.fromtimestamp(span.end if span.end is not None else line.now, UTC)
        ax.barh(
            y,
            end - start,
            left=start,
            height=0.6,
            color=colors.get(span.label, "tab:blue" if span.kind == "trial" else "tab:purple"),
            alpha=0.85 if span.end is not None else 0.45,
            edgecolor="black",
            linewidth=0.5,
        )
        if span.kind != "trial":
            ax.text(start, y, f" {span.label}", va="center", fontsize=8)
    for marker in line.markers:
        at = datetime.fromtimestamp(marker.at, UTC)
        style = {"deadline": ("tab:red", "--"), "verification": ("tab:green", ":"), "finished": ("black", "-")}.get(
            marker.kind, ("gray", ":")
        )
        ax.axvline(
            at, color=style[0], linestyle=style[1], linewidth=1.2, label=f"{marker.label} {at.strftime('%H:%M:%S')}"
        )
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_title("timeline (UTC)")
    if line.markers:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=min(4, len(line.markers)))
    ax.grid(axis="x", alpha=0.3)
    fig.autofmt_xdate()
    return _png(fig)


# ------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Report:
    out: Path
    html: Path
    figures: dict[str, Path]
    data: dict[str, Any]


def figure_data(records: RunRecords, now: float) -> dict[str, Any]:
    """The data behind every figure (also written as report.json)."""
    curves = learning_curves(records)
    return {
        "root": records.root,
        "learningCurves": asdict(curves),
        "parameters": [asdict(s) for s in parameter_points(curves)],
        "timeline": asdict(timeline(records, now)),
        "checkpoints": list((records.verification or {}).get("checkpoints") or []),
    }


def _table(rows: Iterable[Iterable[Any]], header: Iterable[str]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_report(records: RunRecords, out: Path, now: float | None = None) -> Report:
    """Write the PNG figures, report.html (the same figures inlined: one file to mail or attach) and report.json."""
    now = now if now is not None else datetime.now(UTC).timestamp()
    out.mkdir(parents=True, exist_ok=True)
    curves = learning_curves(records)
    series = parameter_points(curves)
    line = timeline(records, now)
    images = {
        "learning_curves.png": render_learning_curves(curves),
        "parameters.png": render_parameters(series, curves),
        "timeline.png": render_timeline(line),
    }
    figures = {}
    for name, png in images.items():
        (out / name).write_bytes(png)
        figures[name] = out / name
    data = figure_data(records, now)
    (out / DATA).write_text(json.dumps(data, indent=2, default=str) + "\n")
    (out / REPORT).write_text(_html(records, curves, images, now))
    return Report(out=out, html=out / REPORT, figures=figures, data=data)


def _html(records: RunRecords, curves: Curves, images: Mapping[str, bytes], now: float) -> str:
    status = records.status
    meta = (records.sweep or {}).get("metadata") or {}
    title = f"{meta.get('namespace', '')}/{meta.get('name', '')}".strip("/") or records.root
    phase = status.get("phase") or (records.progress or {}).get("phase") or "unknown"
    best = curves.best
    facts = [
        ("run root", records.root),
        ("phase", phase),
        (
            "trials",
            status.get("trialsSummary") or json.dumps((records.result or records.progress or {}).get("trials") or {}),
        ),
        (
            "best trial",
            f"{best.trial} {curves.metric}={min(best.values) if curves.mode == 'min' else max(best.values):.6g} {best.config}"
            if best and best.values
            else "-",
        ),
        ("deadline", status.get("deadlineAt") or "-"),
        ("report written", rfc3339(now)),
    ]
    trials = [
        (
            t.trial,
            t.status or "-",
            ", ".join(f"{k}={v}" for k, v in sorted(t.config.items())),
            len(t.values),
            f"{t.values[-1]:.6g}" if t.values else "-",
            "best" if t.best else ("stopped early" if t.early_stopped else ""),
        )
        for t in curves.trials
    ]
    verification = records.verification or {}
    checkpoints = [
        (c.get("trial"), c.get("checkpoint"), c.get("files"), c.get("bytes"), c.get("status"))
        for c in verification.get("checkpoints") or []
    ]
    if verification:
        verdict = (
            "VERIFIED" if verification.get("verified") else "NOT VERIFIED"
        ) + f" at {verification.get('verifiedAt')}"
    elif status.get("checkpoints"):
        c = status["checkpoints"]
        verdict = f"{'verified' if c.get('verified') else 'NOT verified'} (operator, {c.get('verifiedAt')}): {c.get('checked')} checkpoints, {c.get('bytes')} bytes"
    else:
        verdict = "not verified by this report (--no-verify, or not an S3 run root)"
    problems = [(p.get("kind"), p.get("key"), p.get("detail")) for p in verification.get("problems") or []]
    img = "".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{base64.b64encode(data).decode()}"/>'
        f"<figcaption>{html.escape(name)}</figcaption></figure>"
        for name, data in images.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>TrainingSweep report: {html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:70em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:.9em}}img{{max-width:100%}}figure{{margin:1em 0}}</style>
</head><body>
<h1>TrainingSweep {html.escape(title)}</h1>
{_table(facts, ("", ""))}
{img}
<h2>Trials</h2>
{_table(trials, ("trial", "status", "config", curves.x_label + "s", "last " + curves.metric, ""))}
<h2>Checkpoints</h2>
<p>{html.escape(verdict)}</p>
{_table(checkpoints, ("trial", "checkpoint", "files", "bytes", "status")) if checkpoints else ""}
{_table(problems, ("problem", "key", "detail")) if problems else ""}
</body></html>
"""


# ---------------------------------------------------------------------------------------------- CLI


def _sweep_from_cluster(args: argparse.Namespace) -> dict[str, Any]:
    import kubernetes

    from sweep_contracts import constants

    from ..kube import custom_object

    api_client, namespace, _user = kube_connection(args.kubeconfig, args.context, args.namespace)
    api = kubernetes.client.CustomObjectsApi(api_client)
    try:
        sweep = custom_object(
            api.get_namespaced_custom_object(constants.GROUP, constants.VERSION, namespace, constants.PLURAL, args.name)
        )
    except kubernetes.client.ApiException as exc:
        raise UsageError(
            f"TrainingSweep {namespace}/{args.name}: {exc.reason} ({exc.status}); without the cluster, "
            "pass the run root: --storage s3://bucket/prefix/<namespace>/<sweep>-<runId>"
        ) from None
    except Exception as exc:  # connection refused, DNS, TLS
        raise UsageError(f"cannot reach the cluster ({exc}); without it, pass the run root with --storage") from None
    try:
        events = kubernetes.client.CoreV1Api(api_client).list_namespaced_event(namespace).items
        names = {args.name, (sweep.get("status") or {}).get("rayJobName")}
        sweep["_events"] = [
            {
                "time": when.isoformat() if (when := e.last_timestamp or e.event_time or e.first_timestamp) else None,
                "object": e.involved_object.name,
                "kind": e.involved_object.kind,
                "reason": e.reason,
                "message": e.message,
            }
            for e in events
            if e.involved_object.name in names
        ]
    except Exception:  # Events are a nicety (RBAC may forbid them): the timeline has the status' times
        sweep["_events"] = []
    return sweep


def _run_root_of(sweep: Mapping[str, Any]) -> tuple[str | None, str, str]:
    """(run root, endpoint, region) as the operator recorded them (status.guard), else from spec and runId."""
    from sweep_contracts import s3_layout

    status, spec = sweep.get("status") or {}, sweep.get("spec") or {}
    guard, storage = status.get("guard") or {}, spec.get("storage") or {}
    root = guard.get("runRoot")
    if not root and status.get("runId") and storage.get("uri"):
        meta = sweep.get("metadata") or {}
        root = s3_layout.run_root(
            storage["uri"], meta.get("namespace") or "default", meta.get("name") or "", status["runId"]
        )
    return (
        root,
        guard.get("endpointUrl") or storage.get("endpointUrl") or "",
        guard.get("region") or storage.get("region") or "",
    )


def run(args: argparse.Namespace, *, now: Callable[[], float] | None = None) -> int:
    from sweep_contracts import s3_layout

    if not args.name and not args.storage:
        raise UsageError("name a TrainingSweep, or pass its run root with --storage")
    sweep = _sweep_from_cluster(args) if args.name and not args.storage else None
    endpoint, region = args.endpoint_url or "", args.region or ""
    if sweep is not None:
        root, sweep_endpoint, sweep_region = _run_root_of(sweep)
        if root is None:
            raise UsageError(
                f"TrainingSweep {args.name} has no run yet (phase {(sweep.get('status') or {}).get('phase', 'Pending')}): nothing to report"
            )
        endpoint, region = endpoint or sweep_endpoint, region or sweep_region
    else:
        root = args.storage
    events = list(sweep.pop("_events", [])) if sweep is not None else []
    client = None
    if s3_layout.is_s3_uri(root):
        from ..s3 import S3ClientConfig, make_s3_client

        try:
            s3_layout.S3Uri.parse(root)
            client = make_s3_client(S3ClientConfig(endpoint_url=endpoint, region=region, parse_timestamps=False))
        except ValueError as exc:
            raise UsageError(f"--storage: {exc}") from None
        store: RunStore = S3Store(client, root)
    else:
        if not Path(root).is_dir():
            raise UsageError(f"--storage: {root} is neither an s3:// URI nor a directory")
        store = LocalStore(root)
    try:
        records = read_records(store, root, sweep=sweep)
    except Exception as exc:  # S3 refused or unreachable: say so, no traceback
        print(f"sweepctl report: cannot read {root}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    records.events = events
    if client is not None and not args.no_verify:
        from ..verification import verify_sweep_checkpoints

        records.verification = verify_sweep_checkpoints(
            client, root, timeout_seconds=300, min_retention_days=0
        ).to_dict()
    name = args.name or root.rstrip("/").rsplit("/", 1)[-1]
    out = Path(args.out or f"report-{name}")
    report = write_report(records, out, now() if now else None)
    curves = report.data["learningCurves"]
    print(
        f"sweepctl report: {len(curves['trials'])} trial(s), {sum(len(t['values']) for t in curves['trials'])} "
        f"{curves['metric']} point(s) from {root}"
    )
    print(
        f"sweepctl report: wrote {report.html} ({', '.join(sorted(p.name for p in report.figures.values()))}, {DATA})"
    )
    return EXIT_OK
