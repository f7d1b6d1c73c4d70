"""The figures of `sweepctl report`, drawn with matplotlib (headless) from the data of `report_data`: one colour per
trial throughout, the best trial in red.

Legends name trials by their hyper-parameters.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .common import UsageError
from .report_data import (
    EARLY_STOPPING_SCHEDULERS,
    Curves,
    MetricPanel,
    ParallelView,
    ParameterSeries,
    Timeline,
    format_value,
)

BEST = "tab:red"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise UsageError(
            "sweepctl report draws its figures with matplotlib: pip install 'trainingsweep-operator[report]'"
        ) from None

    matplotlib.use("Agg")  # headless: no display on servers and in CI
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def trial_colors(curves: Curves) -> dict[str, Any]:
    """The best trial red, the others from a qualitative map without red, the same in every figure."""
    plt = _pyplot()
    tab20 = plt.get_cmap("tab20").colors  # pairs (dark, light); 6 and 7 are the reds
    palette = [c for i, c in enumerate(tab20) if i % 2 == 0 and i != 6] + [
        c for i, c in enumerate(tab20) if i % 2 == 1 and i != 7
    ]
    others = [t.trial for t in curves.trials if not t.best]
    colors: dict[str, Any] = {trial: palette[i % len(palette)] for i, trial in enumerate(others)}
    colors.update({t.trial: BEST for t in curves.trials if t.best})
    return colors


def _legend_columns(entries: int) -> int:
    return 1 + entries // 24  # a legend no taller than the figure beside it


def _whole_number_ticks(ax: Any, xs: Sequence[float]) -> None:
    """Epochs and iterations are counted: no tick at 0.25 when a run has two of them."""
    from matplotlib.ticker import MaxNLocator

    if xs and all(float(x).is_integer() for x in xs):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def render_learning_curves(curves: Curves) -> bytes:
    plt = _pyplot()
    colors = trial_colors(curves)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for t in curves.trials:
        if not t.values:
            continue
        width = 3.0 if t.best else 1.4
        label = (
            f"{t.label}{' (best)' if t.best else ''}{' (running)' if t.status == 'RUNNING' else ''}"
            f"{f' ({_ended_early(curves)} at {curves.x_label} {t.epochs[-1]:g})' if t.early_stopped else ''}"
            f"{' (errored)' if t.status == 'ERROR' else ''}"
        )
        ax.plot(
            t.epochs,
            t.values,
            marker="o",
            markersize=3,
            linestyle="--" if t.status == "RUNNING" else "-",
            label=label,
            color=colors[t.trial],
            linewidth=width,
            zorder=3 if t.best else 2,
        )
        if t.early_stopped:
            ax.plot(t.epochs[-1], t.values[-1], marker="X", markersize=11, color=colors[t.trial], zorder=4)
        if t.status == "ERROR":
            ax.plot(t.epochs[-1], t.values[-1], marker="s", markersize=9, color="black", zorder=4)
    ax.set_xlabel(curves.x_label)
    _whole_number_ticks(ax, [x for t in curves.trials for x in t.epochs])
    ax.set_ylabel(f"{curves.metric_label(curves.metric)} ({curves.mode})")
    ax.set_title(learning_curves_title(curves))
    ax.grid(alpha=0.3)
    if any(t.values for t in curves.trials):
        ax.legend(
            fontsize=8,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            title=curves.legend_title,
            ncol=_legend_columns(len(curves.trials)),
        )
    return _png(fig)


def _ended_early(curves: Curves) -> str:
    return "stopped early" if curves.scheduler in EARLY_STOPPING_SCHEDULERS else "ended"


def learning_curves_title(curves: Curves) -> str:
    """The X is explained only where a trial has one: under fifo nothing is stopped early."""
    title = f"{curves.metric_label(curves.metric)} per {curves.x_label}"
    return title + (f" (X: {curves.early_stop_note})" if any(t.early_stopped for t in curves.trials) else "")


def _split_style(metric: str) -> str:
    return "--" if metric.startswith(("train_", "training_")) else "-"


def render_metrics(panels: Sequence[MetricPanel], curves: Curves) -> bytes:
    """Every metric the loop reports, a panel per family (train dashed, validation solid: overfitting shows as the
    solid line rising while the dashed one falls)."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    colors = trial_colors(curves)
    labels = {t.trial: t.label + (" (best)" if t.best else "") for t in curves.trials}
    cols = 2 if len(panels) > 1 else 1
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for metric in panel.metrics:
            for trial, (xs, ys) in panel.points[metric].items():
                if ys:
                    best = trial == (curves.best.trial if curves.best else None)
                    ax.plot(
                        xs,
                        ys,
                        linestyle=_split_style(metric),
                        marker="o",
                        markersize=2.5,
                        linewidth=2.4 if best else 1.2,
                        color=colors.get(trial, "tab:gray"),
                        zorder=3 if best else 2,
                    )
        ax.set_title(" vs ".join(map(curves.metric_label, panel.metrics)), fontsize=10)
        ax.set_xlabel(curves.x_label)
        _whole_number_ticks(ax, [x for xs, _ in panel.points[panel.metrics[0]].values() for x in xs])
        ax.set_ylabel(curves.metric_label(panel.name) if panel.name in panel.metrics else panel.name)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_axis_off()
    if not panels:
        axes[0][0].text(0.5, 0.5, "no metric reported yet", ha="center", va="center")
    handles = [Line2D([], [], color=colors[t.trial], linewidth=2, label=labels[t.trial]) for t in curves.trials]
    handles += [
        Line2D([], [], color="black", linestyle="--", label="train split (dashed)"),
        Line2D([], [], color="black", linestyle="-", label="validation / other (solid)"),
    ]
    fig.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.0, 0.98),
        fontsize=8,
        title=curves.legend_title,
        ncol=_legend_columns(len(handles)),
    )
    fig.suptitle(f"every metric the train loop reports, per {curves.x_label}")
    fig.tight_layout()
    return _png(fig)


def _categories(values: Sequence[Any]) -> list[str]:
    return sorted({format_value(v) for v in values})


def render_parameters(series: Sequence[ParameterSeries], curves: Curves) -> bytes:
    plt = _pyplot()
    colors = trial_colors(curves)
    count = max(1, len(series))
    fig, axes = plt.subplots(1, count, figsize=(max(4.2 * count, 6), 3.8), squeeze=False)
    for ax, s in zip(axes[0], series, strict=False):
        xs: list[float]
        if s.categorical or not s.varies:
            categories = _categories([p[0] for p in s.points])
            xs = [categories.index(format_value(p[0])) for p in s.points]
            ax.set_xticks(range(len(categories)), categories)
            ax.set_xlim(-0.6, len(categories) - 0.4)
        else:
            xs = [float(p[0]) for p in s.points]
        ax.scatter(xs, [p[1] for p in s.points], c=[colors.get(p[2], "tab:gray") for p in s.points], s=45, zorder=3)
        if s.log_scale and s.varies:
            ax.set_xscale("log")
        ax.set_xlabel(curves.parameter_label(s.name) + ("" if s.varies else " (did not vary)"))
        ax.set_ylabel(f"final {curves.metric}")
        if not s.varies:
            drew = f"{curves.parameter_label(s.name)}={format_value(s.points[0][0])}"
            ax.set_title(f"searched, but every trial drew {drew}", fontsize=8)
        ax.grid(alpha=0.3)
    if not series:
        axes[0][0].text(0.5, 0.5, "no hyper-parameter varies across trials", ha="center", va="center")
        axes[0][0].set_axis_off()
    fig.suptitle(f"each hyper-parameter vs the trial's final {curves.metric} (red: best trial)")
    fig.tight_layout()
    return _png(fig)


def _normalised(axis_values: Sequence[Any], categorical: bool, log_scale: bool) -> tuple[list[float], list[tuple]]:
    """Values on [0, 1] and (position, text) ticks for one parallel axis."""
    if categorical:
        categories = _categories(axis_values)
        step = 1.0 / max(1, len(categories) - 1)
        spots = {c: (i * step if len(categories) > 1 else 0.5) for i, c in enumerate(categories)}
        return [spots[format_value(v)] for v in axis_values], [(spots[c], c) for c in categories]
    raw = [float(v) for v in axis_values]
    scaled = [math.log10(v) for v in raw] if log_scale else raw
    low, high = min(scaled), max(scaled)
    if high == low:
        return [0.5 for _ in raw], [(0.5, format_value(raw[0]))]
    positions = [(v - low) / (high - low) for v in scaled]
    return positions, [(0.0, format_value(min(raw))), (1.0, format_value(max(raw)))]


def render_parallel(view: ParallelView, curves: Curves) -> bytes:
    """Parallel coordinates: an axis per varying hyper-parameter and final metric, a line per trial coloured by
    the sweep's metric (darker is better), the best trial red."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(7.0, 2.4 * len(view.axes)), 5.2))
    if len(view.axes) < 2 or not view.trials:
        ax.text(0.5, 0.5, "not enough finished trials or varying values to compare", ha="center", va="center")
        ax.set_axis_off()
        return _png(fig)
    columns, ticks = zip(*(_normalised(a.values, a.categorical, a.log_scale) for a in view.axes), strict=True)
    metric = [float(v) for v in next(a for a in view.axes if a.name == f"final {curves.metric}").values]
    cmap = plt.get_cmap("viridis" if curves.mode == "min" else "viridis_r")
    norm = plt.Normalize(min(metric), max(metric) if max(metric) > min(metric) else min(metric) + 1)
    xs = list(range(len(view.axes)))
    for row, trial in enumerate(view.trials):
        ys = [column[row] for column in columns]
        best = trial == view.best
        color = BEST if best else cmap(norm(metric[row]))
        ax.plot(xs, ys, color=color, linewidth=3.0 if best else 1.6, marker="o", zorder=3 if best else 2)
    # Each line named at its right end where there is room: the best first, then any whose end is clear of the named.
    ends = [columns[-1][row] for row in range(len(view.trials))]
    named: list[float] = []
    for row in sorted(range(len(view.trials)), key=lambda r: view.trials[r] != view.best):
        if all(abs(ends[row] - y) >= 0.06 for y in named):
            named.append(ends[row])
            ax.annotate(view.labels[row], (xs[-1], ends[row]), xytext=(8, 0), textcoords="offset points", fontsize=8)
    for x, axis, axis_ticks in zip(xs, view.axes, ticks, strict=True):
        ax.axvline(x, color="black", linewidth=1.0, zorder=1)
        for y, text in axis_ticks:
            # A numeric axis's lowest and highest values sit below and above it, clear of the lines between axes.
            side = axis.categorical or 0.0 < y < 1.0
            place = (x - 0.05, y, "right", "center") if side else (x, -0.05 if y == 0.0 else 1.05, "center", "center")
            ax.text(
                place[0],
                place[1],
                text,
                ha=place[2],
                va=place[3],
                fontsize=8,
                color="dimgray",
                zorder=5,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.85},
            )
    ax.set_xticks(xs, [a.name + (" (log)" if a.log_scale else "") for a in view.axes])
    ax.set_yticks([])
    ax.set_ylim(-0.1, 1.1)
    ax.set_xlim(-0.4, xs[-1] + 0.6)
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    # Below the axes: the right is where the trials are named.
    bar = fig.colorbar(
        plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, orientation="horizontal", pad=0.12, fraction=0.05, aspect=60
    )
    bar.set_label(f"final {curves.metric} ({curves.mode} is better; red: best trial)")
    ax.set_title("parallel coordinates: one line per trial")
    return _png(fig)


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _marker_note(at: float, start: float, end: float) -> str:
    when = datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S")
    if at > end:
        return f"{when}, {_duration(at - end)} after the run's end (off the chart)"
    if at < start:
        return f"{when}, {_duration(start - at)} before the run (off the chart)"
    return when


def render_timeline(line: Timeline, colors: Mapping[str, Any] | None = None) -> bytes:
    """The run's phases, attempts and trials against UTC time, the axis scaled to the run's own start and end;
    a deadline beyond them is said in the legend, not drawn hours away. Each span has a row of its own, named on
    the axis, so a phase of seconds beside one of minutes never puts two labels on one spot."""
    plt = _pyplot()
    import matplotlib.dates as mdates

    phase_colors = {"Queued": "tab:gray", "Starting": "tab:orange", "Running": "tab:green"}
    rows = list(dict.fromkeys(s.label for s in line.spans))
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.42 * max(1, len(rows))))
    start = line.start if line.start is not None else line.now
    end = line.end if line.end is not None and line.end > start else start + 60
    middle = start + (end - start) / 2
    for span in line.spans:
        y = rows.index(span.label)
        left = datetime.fromtimestamp(span.start, UTC)
        stop = span.end if span.end is not None else line.now
        color = phase_colors.get(span.label, (colors or {}).get(span.label, "tab:blue"))
        if span.kind == "attempt":
            color = "tab:purple"
        ax.barh(
            y,
            datetime.fromtimestamp(stop, UTC) - left,
            left=left,
            height=0.6,
            color=color,
            alpha=0.85 if span.end is not None else 0.45,
            edgecolor="black",
            linewidth=0.5,
        )
        # The duration after the bar's start; a bar starting in the right half has it before, inside the axes.
        if span.start < middle:
            ax.text(left, y, f" {_duration(stop - span.start)}", va="center", ha="left", fontsize=8)
        else:
            ax.text(left, y, f"{_duration(stop - span.start)} ", va="center", ha="right", fontsize=8)
    pad = max(1.0, 0.03 * (end - start))
    for marker in line.markers:
        inside = start - pad <= marker.at <= end + pad
        style = {"deadline": ("tab:red", "--"), "verification": ("tab:green", ":"), "finished": ("black", "-")}.get(
            marker.kind, ("gray", ":")
        )
        at = datetime.fromtimestamp(min(max(marker.at, start - pad), end + pad), UTC)
        ax.axvline(
            at,
            color=style[0],
            linestyle=style[1],
            linewidth=1.2 if inside else 0,
            label=f"{marker.label} {_marker_note(marker.at, start - pad, end + pad)}",
        )
    ax.set_xlim(datetime.fromtimestamp(start - pad, UTC), datetime.fromtimestamp(end + pad, UTC))
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(tz=UTC, minticks=4, maxticks=9))
    # Whole clock times, with the day only when the run spans days (ConciseDateFormatter's bare "30" reads badly).
    long_run = end - start > 86400
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M" if long_run else "%H:%M:%S", tz=UTC))
    day = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d")
    ax.set_xlabel(f"time (UTC, {day})")
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_title(f"timeline of the run ({_duration(end - start)})")
    if line.markers:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=min(2, len(line.markers)))
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)
