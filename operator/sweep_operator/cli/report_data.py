"""The data behind each figure of `sweepctl report`, as pure functions over `RunRecords`: learning curves,
hyper-parameters, parallel coordinates and the timeline."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..status import epoch_seconds
from .report_records import RunRecords, run_end, run_finished_at

# What Tune adds to every result row and what our trainable adds beside the loop's metrics
# (training_entrypoints.trainable: ranks_reported, <metric>_rank_spread; progress: checkpoint_path): not the loop's.
TUNE_KEYS = frozenset(
    {
        "timestamp",
        "done",
        "training_iteration",
        "time_this_iter_s",
        "time_total_s",
        "time_since_restore",
        "iterations_since_restore",
        "pid",
        "hostname",
        "node_ip",
        "date",
        "trial_id",
        "config",
        "checkpoint_dir_name",
        "checkpoint_path",
        "ranks_reported",
    }
)
SPLIT_PREFIXES = ("train_", "training_", "val_", "validation_", "valid_", "eval_", "test_")
# Counters a loop reports beside its metrics (how many samples, tokens or steps an epoch saw): bookkeeping, not a
# measure of the model, so no curve is drawn for them; the report names the ones it left out.
COUNTER_NAME = re.compile(
    r"(^|_)(samples|examples|tokens|steps|batches|count)$|^(num|n)_|^(global_)?step$", re.IGNORECASE
)
# Tune's schedulers that stop a trial before its last epoch (the operator refuses pbt; fifo runs every trial out).
EARLY_STOPPING_SCHEDULERS = frozenset({"asha", "hyperband", "median"})


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def format_value(value: Any) -> str:
    """A hyper-parameter or metric value as a person reads it (`0.0003`, `64`, `adam`)."""
    number = _finite(value)
    if number is not None and not isinstance(value, int):
        return f"{number:.4g}"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


# ------------------------------------------------------------------------------------------ learning curves


@dataclass(frozen=True)
class TrialCurve:
    trial: str
    config: dict[str, Any]
    status: str  # TERMINATED, RUNNING, ERROR, PENDING (Tune's) or "" when unknown
    epochs: list[float]
    values: list[float]
    best: bool
    early_stopped: bool  # ended before the others' last epoch without an error, under a scheduler that may stop it
    label: str = ""  # the trial's hyper-parameters that vary across trials (`lr=0.1`): legends name trials by them


@dataclass(frozen=True)
class Curves:
    metric: str
    mode: str  # min | max
    x_label: str
    trials: list[TrialCurve]
    varying: list[str]  # hyper-parameters whose value differs between trials
    # Tune's scheduler from the sweep's spec (fifo when unset); None: unknown (the run root alone does not say).
    scheduler: str | None = None
    clashes: list[str] = field(default_factory=list)  # names both a hyper-parameter and a reported metric (lr)

    @property
    def best(self) -> TrialCurve | None:
        return next((t for t in self.trials if t.best), None)

    @property
    def early_stop_note(self) -> str:
        """What the X on a curve's end means: a scheduler's early stop, or (scheduler unknown) only that the trial
        ended before the others."""
        if self.scheduler in EARLY_STOPPING_SCHEDULERS:
            return f"stopped early by the scheduler ({self.scheduler})"
        return "ended before the other trials' last " + self.x_label

    def metric_label(self, metric: str) -> str:
        """A metric's name, marked as a metric where a hyper-parameter has the same name (a scheduled lr)."""
        return f"metric {metric}" if metric in self.clashes else metric

    def parameter_label(self, name: str) -> str:
        return f"config {name}" if name in self.clashes else name

    @property
    def legend_title(self) -> str:
        return "trial: " + ", ".join(map(self.parameter_label, self.varying)) if self.varying else "trial"


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
    return {str(t.get("id")): str(t.get("status") or "") for t in (records.result or {}).get("trialResults") or []}


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


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def varying_parameters(configs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    names = sorted({k for c in configs.values() for k in c})
    return [n for n in names if len({_key(c.get(n)) for c in configs.values()}) > 1]


def trial_labels(configs: Mapping[str, Mapping[str, Any]], varying: Sequence[str]) -> dict[str, str]:
    """Each trial named by its varying hyper-parameters; the trial id is added only where two trials share them
    (repeated samples), and is the label when nothing varies."""
    labels = {t: ", ".join(f"{n}={format_value(c.get(n))}" for n in varying if n in c) for t, c in configs.items()}
    seen: dict[str, int] = {}
    for label in labels.values():
        seen[label] = seen.get(label, 0) + 1
    return {t: (f"{label} ({t})" if seen[label] > 1 and label else label or t) for t, label in labels.items()}


def x_key(records: RunRecords) -> str:
    uses_epoch = all("epoch" in r for rows in records.trial_results.values() for r in rows)
    return "epoch" if uses_epoch else "training_iteration"


def metric_points(records: RunRecords, metric: str, x: str) -> dict[str, tuple[list[float], list[float]]]:
    """(x, metric) of each trial's reports, as Tune recorded rank 0's (`tune/<trial>/result.json`)."""
    points: dict[str, tuple[list[float], list[float]]] = {}
    for trial, rows in sorted(records.trial_results.items()):
        pairs = [(_finite(r.get(x)), _finite(r.get(metric))) for r in rows]
        kept = [(a, b) for a, b in pairs if a is not None and b is not None]
        points[trial] = ([a for a, _ in kept], [b for _, b in kept])
    return points


def scheduler_of(records: RunRecords) -> str | None:
    """spec.tune.scheduler.type (the API's default, fifo, when unset); None without the sweep's spec."""
    if records.sweep is None:
        return None
    scheduler = (records.spec.get("tune") or {}).get("scheduler") or {}
    return str(scheduler.get("type") or "fifo") if isinstance(scheduler, Mapping) else None


def learning_curves(records: RunRecords) -> Curves:
    """The sweep's metric per epoch of every trial, exactly as Tune recorded rank 0's reports."""
    metric, mode = metric_and_mode(records)
    metric = metric or "val_loss"
    statuses, configs, best = _trial_statuses(records), _trial_configs(records), best_trial_id(records)
    x = x_key(records)
    points = metric_points(records, metric, x)
    varying = varying_parameters({t: configs.get(t, {}) for t in points})
    labels = trial_labels({t: configs.get(t, {}) for t in points}, varying)
    last = max((xs[-1] for xs, _ in points.values() if xs), default=None)
    # Under fifo nothing stops a trial: one that ended first ran its own course (fewer epochs, its own stop).
    scheduler = scheduler_of(records)
    may_stop_early = scheduler is None or scheduler in EARLY_STOPPING_SCHEDULERS
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
                early_stopped=may_stop_early and status == "TERMINATED" and finished_early,
                label=labels[trial],
            )
        )
    hyper = {k for t in trials for k in t.config}
    clashes = sorted(hyper & set(reported_metrics(records)))
    return Curves(metric, mode or "min", x, trials, varying, scheduler, clashes)


# ---------------------------------------------------------------------------- every metric the loop reports


@dataclass(frozen=True)
class MetricPanel:
    """One figure panel: the metrics that measure one thing on different splits (train_loss with val_loss), so
    a validation curve turning up while the training one keeps falling (overfitting) shows in one place."""

    name: str
    metrics: list[str]
    points: dict[str, dict[str, tuple[list[float], list[float]]]]  # metric -> trial -> (x, values)


NOT_MEASURES = ("_rank_spread", "_checksum")  # name endings of values a loop reports that measure no model


def reported_metrics(records: RunRecords) -> list[str]:
    """Every numeric value the train loop reported, counters included (Tune's and our own bookkeeping left out, and
    checksums: a fingerprint of the weights, not a measure of the model)."""
    x = x_key(records)
    names: set[str] = set()
    for rows in records.trial_results.values():
        for row in rows:
            names.update(
                k
                for k, v in row.items()
                if _finite(v) is not None and k not in TUNE_KEYS and k != x and not k.endswith(NOT_MEASURES)
            )
    return sorted(names)


def is_counter(name: str) -> bool:
    return bool(COUNTER_NAME.search(name))


def counters(records: RunRecords, curves: Curves) -> list[str]:
    """The counters the loop reported (train_samples): no curve is drawn for them, the report names them."""
    return [m for m in reported_metrics(records) if is_counter(m) and m != curves.metric]


def loop_metrics(records: RunRecords, metric: str | None = None) -> list[str]:
    """The metrics the train loop reported that measure the model: counters left out, the sweep's own `metric`
    always kept."""
    return [m for m in reported_metrics(records) if m == metric or not is_counter(m)]


def metric_family(metric: str) -> str:
    return next((metric[len(p) :] for p in SPLIT_PREFIXES if metric.startswith(p) and len(metric) > len(p)), metric)


def metric_panels(records: RunRecords, curves: Curves) -> list[MetricPanel]:
    """A panel per family of loop metrics (loss: train_loss and val_loss), the sweep's metric's first."""
    families: dict[str, list[str]] = {}
    for metric in loop_metrics(records, curves.metric):
        families.setdefault(metric_family(metric), []).append(metric)
    order = sorted(families, key=lambda f: (f != metric_family(curves.metric), f))
    return [
        MetricPanel(
            name=family,
            metrics=families[family],
            points={m: metric_points(records, m, curves.x_label) for m in families[family]},
        )
        for family in order
    ]


# ------------------------------------------------------------------------------------------ hyper-parameters


@dataclass(frozen=True)
class ParameterSeries:
    name: str
    categorical: bool
    log_scale: bool
    points: list[tuple[Any, float, str]]  # (parameter value, final metric, trial)
    varies: bool = True  # False: searched, but every trial drew the same value (said on the figure)


def searched_parameters(records: RunRecords) -> list[str] | None:
    """The names paramSpace samples from (a distribution, not a constant); None without the sweep's spec."""
    space = records.spec.get("paramSpace")
    if not isinstance(space, Mapping):
        return None
    from sweep_contracts.paramspace import distributions

    try:
        return sorted(distributions(dict(space)))
    except ValueError:
        return None


def parameter_points(curves: Curves, searched: Sequence[str] | None = None) -> list[ParameterSeries]:
    """Each hyper-parameter that varies across trials, and each searched one that did not, against each trial's
    final reported metric."""
    names = sorted({k for t in curves.trials for k in t.config})
    series = []
    for name in names:
        pts = [(t.config[name], t.values[-1], t.trial) for t in curves.trials if name in t.config and t.values]
        varies = len({_key(p[0]) for p in pts}) > 1
        if not pts or not (varies or name in (searched or ())):
            continue
        numeric = all(_finite(p[0]) is not None for p in pts)
        positive = numeric and all(float(p[0]) > 0 for p in pts)
        log_scale = positive and max(float(p[0]) for p in pts) / min(float(p[0]) for p in pts) >= 100
        series.append(ParameterSeries(name, not numeric, log_scale, pts, varies))
    return series


def constant_parameters(curves: Curves, series: Sequence[ParameterSeries]) -> dict[str, Any]:
    """The hyper-parameters every trial shares that no figure shows (paramSpace constants)."""
    shown = {s.name for s in series}
    values: dict[str, Any] = {}
    for t in curves.trials:
        for k, v in t.config.items():
            if k not in shown and k not in curves.varying:
                values.setdefault(k, v)
    return dict(sorted(values.items()))


@dataclass(frozen=True)
class ParallelAxis:
    name: str
    categorical: bool
    log_scale: bool
    values: list[Any]  # one per row of ParallelView.trials


@dataclass(frozen=True)
class ParallelView:
    """Parallel coordinates, as Katib's UI and W&B draw a sweep: one vertical axis per varying hyper-parameter and
    per final metric, one line per trial, coloured by the sweep's metric."""

    trials: list[str]
    labels: list[str]
    best: str | None
    axes: list[ParallelAxis]


def parallel_view(records: RunRecords, curves: Curves, series: Sequence[ParameterSeries]) -> ParallelView:
    finished = [t for t in curves.trials if t.values]
    axes = [
        ParallelAxis(
            curves.parameter_label(s.name), s.categorical, s.log_scale, [t.config.get(s.name) for t in finished]
        )
        for s in series
        if s.varies
    ]
    finals: dict[str, list[Any]] = {f"final {curves.metric}": [t.values[-1] for t in finished]}
    hyper = {k for t in finished for k in t.config}
    for metric in loop_metrics(records, curves.metric):
        if metric == curves.metric or metric in hyper:
            continue  # a metric named as a hyper-parameter (lr, as scheduled) would read as the hyper-parameter
        last = {trial: ys[-1] for trial, (_, ys) in metric_points(records, metric, curves.x_label).items() if ys}
        column = [last.get(t.trial) for t in finished]
        if None not in column and len({_key(v) for v in column}) > 1:
            finals[f"final {metric}"] = column
    axes += [ParallelAxis(name, False, False, values) for name, values in finals.items()]
    best = curves.best.trial if curves.best else None
    return ParallelView([t.trial for t in finished], [t.label for t in finished], best, axes)


# ------------------------------------------------------------------------------------------------ timeline


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
    start: float | None = None  # the run's own extent (the figure's scale): spans and markers, the deadline aside
    end: float | None = None


def _trial_spans(records: RunRecords, labels: Mapping[str, str]) -> list[Span]:
    spans = []
    for trial, rows in sorted(records.trial_results.items()):
        stamps = [(_finite(r.get("timestamp")), _finite(r.get("time_total_s")) or 0.0) for r in rows]
        timed = [(t, d) for t, d in stamps if t is not None]
        if timed:
            first_t, first_total = timed[0]
            spans.append(Span("trials", labels.get(trial) or trial, first_t - first_total, timed[-1][0], "trial"))
    return spans


def _attempt_spans(records: RunRecords, finished: float | None) -> list[Span]:
    """Each RayJob attempt: KubeRay's CreatedRayCluster Events (one cluster per attempt), else the status' attempt
    start, else (S3 alone) the attempts the driver recorded in status.json."""
    created = sorted(
        t for t in (epoch_seconds(e.get("time")) for e in records.events if e.get("reason") == "CreatedRayCluster") if t
    )
    if created:
        ends: list[float | None] = [*created[1:], finished]
        return [Span("RayJob attempts", f"attempt {i + 1}", at, ends[i], "attempt") for i, at in enumerate(created)]
    status = records.status
    if status.get("attemptStartedAt") or status.get("startedAt"):
        began = epoch_seconds(status.get("attemptStartedAt")) or epoch_seconds(status.get("startedAt")) or 0.0
        return [Span("RayJob attempts", "attempt 1", began, finished, "attempt")]
    recorded = (records.progress or {}).get("attempts") if records.sweep is None else None
    spans = []
    for row in recorded if isinstance(recorded, list) else []:
        start = epoch_seconds(row.get("startedAt")) if isinstance(row, Mapping) else None
        if start is not None:
            label = f"attempt {row.get('attempt')}: {row.get('phase') or '?'}"
            spans.append(Span("RayJob attempts", label, start, epoch_seconds(row.get("endedAt")), "attempt"))
    return spans


def _markers(records: RunRecords, finished: float | None, now: float) -> list[Marker]:
    status = records.status
    markers = []
    created = epoch_seconds(((records.sweep or {}).get("metadata") or {}).get("creationTimestamp"))
    if created is not None:
        markers.append(Marker("created", created, "event"))
    deadline = epoch_seconds(status.get("deadlineAt"))
    if deadline is not None:
        markers.append(Marker("deadline", deadline, "deadline"))
    verified_at = epoch_seconds((records.verification or {}).get("verifiedAt")) or epoch_seconds(
        (status.get("checkpoints") or {}).get("verifiedAt")
    )
    if verified_at is not None:
        markers.append(Marker("verification", verified_at, "verification"))
    if finished is not None:
        markers.append(Marker(f"ended {run_end(records).run_phase}", finished, "finished"))
    if (records.result or {}).get("deadlineReached"):
        markers.append(Marker("deadline reached (Tune stopped)", finished or now, "deadline"))
    return sorted(markers, key=lambda m: m.at)


def timeline(records: RunRecords, now: float, labels: Mapping[str, str] | None = None) -> Timeline:
    """The sweep's life: Queued, Starting, Running (status times), each RayJob attempt, each trial (Tune's result
    timestamps, lanes named by `labels`), the deadline and the last verification; scaled to the run itself."""
    status = records.status
    queued, started, training = (epoch_seconds(status.get(k)) for k in ("queuedAt", "startedAt", "trainingStartedAt"))
    finished = run_finished_at(records)
    trial_spans = _trial_spans(records, labels or {})
    run_start = min((s.start for s in trial_spans), default=None)
    spans: list[Span] = []
    if queued is not None:
        spans.append(Span("phase", "Queued", queued, started or now, "phase"))
    if started is not None:
        spans.append(Span("phase", "Starting", started, training or run_start or finished or now, "phase"))
    running_from = training or (run_start if started is None else None)
    if running_from is not None:
        spans.append(Span("phase", "Running", running_from, finished, "phase"))
    spans += _attempt_spans(records, finished) + trial_spans
    markers = _markers(records, finished, now)
    # The deadline is hours away for a short run: the run's own span sets the scale, the deadline is said.
    moments = [s.start for s in spans] + [s.end if s.end is not None else now for s in spans]
    moments += [m.at for m in markers if m.kind != "deadline"]
    start, end = (min(moments), max(moments)) if moments else (None, None)
    return Timeline(spans=spans, markers=markers, now=now, start=start, end=end)
