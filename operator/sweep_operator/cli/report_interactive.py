"""interactive.html of `sweepctl report`: every metric per epoch of every trial, each hyper-parameter against the picked
metric, with hover, zoom and a log scale.

Drawn with plotly, its library inlined in the page: it opens offline and fetches nothing.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .common import UsageError
from .report_data import Curves, ParameterSeries, TrialCurve, format_value, loop_metrics, metric_points
from .report_records import RunRecords

INTERACTIVE = "interactive.html"
BEST = "#d62728"  # matplotlib's tab:red, the best trial's colour in the PNGs too
# Hover, zoom and pan are plotly's own; its logo and the selection tools (nothing here reads a selection) go.
PLOTLY_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "modeBarButtonsToRemove": ["select2d", "lasso2d"],
}


def _plotly() -> Any:
    try:
        import plotly.graph_objects as go
    except ModuleNotFoundError:
        raise UsageError(
            "sweepctl report draws its interactive view with plotly: pip install 'trainingsweep-operator[report]'"
        ) from None
    return go


def _script_json(value: Any) -> str:
    """JSON for a <script> element: no `</script>` or `<!--` a hyper-parameter's text could hold ends it early."""
    return json.dumps(value, sort_keys=True).replace("<", "\\u003c")


def _hex(color: Any) -> str:
    from matplotlib.colors import to_hex

    return str(to_hex(color))


def _trial_name(t: TrialCurve) -> str:
    return t.label + (" (best)" if t.best else "") + (" (running)" if t.status == "RUNNING" else "")


def _x_axis(curves: Curves, xs: Sequence[float]) -> dict[str, Any]:
    """Epochs and iterations are counted: a tick per whole one on a short run, never one at 0.25."""
    axis: dict[str, Any] = {"title": {"text": curves.x_label}, "zeroline": False}
    if xs and all(float(x).is_integer() for x in xs):
        span = max(xs) - min(xs)
        axis.update(tickformat="d", dtick=max(1, math.ceil(span / 10)))
    return axis


def _curve_traces(
    records: RunRecords, curves: Curves, metrics: Sequence[str], colors: Mapping[str, str], shown: str
) -> tuple[list[Any], list[float]]:
    """A line per (metric, trial), visible for the shown metric only; the best trial red and wide, its best value
    of the sweep's metric starred, an X where a trial ended before the others."""
    go = _plotly()
    traces, all_xs = [], []
    for metric in metrics:
        points = metric_points(records, metric, curves.x_label)
        for t in curves.trials:
            xs, ys = points.get(t.trial, ([], []))
            if not ys:
                continue
            all_xs += xs
            symbols = ["circle"] * len(ys)
            if t.early_stopped:
                symbols[-1] = "x"
            traces.append(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines+markers",
                    name=_trial_name(t),
                    legendgroup=t.trial,
                    visible=metric == shown,
                    line={"color": colors[t.trial], "width": 3.5 if t.best else 1.6},
                    marker={"symbol": symbols, "size": [6] * (len(ys) - 1) + [11 if t.early_stopped else 6]},
                    meta={"metric": metric, "trial": t.trial, "best": t.best},
                    hovertemplate=f"{html.escape(t.label)} ({t.trial})<br>{curves.x_label} %{{x}}<br>"
                    f"{html.escape(curves.metric_label(metric))} %{{y:.6g}}<extra></extra>",
                )
            )
    best = curves.best
    if best is not None and best.values:
        value = min(best.values) if curves.mode == "min" else max(best.values)
        at = best.epochs[best.values.index(value)]
        traces.append(
            go.Scatter(
                x=[at],
                y=[value],
                mode="markers",
                name=f"best: {best.label}, {curves.metric} {value:.4g}",
                visible=curves.metric == shown,
                marker={"symbol": "star", "size": 18, "color": BEST, "line": {"color": "black", "width": 1}},
                meta={"metric": curves.metric, "trial": best.trial, "best": True, "star": True},
                hovertemplate=f"best trial {html.escape(best.label)} ({best.trial})<br>{curves.x_label} %{{x}}<br>"
                f"{html.escape(curves.metric)} %{{y:.6g}}<extra></extra>",
            )
        )
    return traces, all_xs


def _curves_figure(records: RunRecords, curves: Curves, metrics: Sequence[str], colors: Mapping[str, str]) -> Any:
    go = _plotly()
    traces, xs = _curve_traces(records, curves, metrics, colors, curves.metric)
    figure = go.Figure(traces)
    figure.update_layout(
        title={"text": f"{curves.metric_label(curves.metric)} per {curves.x_label}"},
        xaxis=_x_axis(curves, xs),
        yaxis={"title": {"text": curves.metric_label(curves.metric)}},
        legend={"title": {"text": curves.legend_title}},
        hovermode="closest",
        template="plotly_white",
        margin={"t": 60},
    )
    return figure


def _finals(records: RunRecords, metric: str, x: str) -> dict[str, float]:
    return {trial: ys[-1] for trial, (_, ys) in metric_points(records, metric, x).items() if ys}


def _parameters_figure(
    records: RunRecords,
    curves: Curves,
    series: Sequence[ParameterSeries],
    metrics: Sequence[str],
    colors: Mapping[str, str],
) -> Any | None:
    """Each varying hyper-parameter (a panel each, one y axis) against each trial's final value of the picked
    metric; the best trial a red star."""
    varying = [s for s in series if s.varies]
    if not varying:
        return None
    go = _plotly()
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=len(varying), shared_yaxes=True, horizontal_spacing=0.04)
    configs = {t.trial: t for t in curves.trials}
    for metric in metrics:
        finals = _finals(records, metric, curves.x_label)
        for column, s in enumerate(varying, start=1):
            trials = [t for t in curves.trials if t.trial in finals and s.name in t.config]
            figure.add_trace(
                go.Scatter(
                    x=[format_value(t.config[s.name]) if s.categorical else t.config[s.name] for t in trials],
                    y=[finals[t.trial] for t in trials],
                    mode="markers",
                    showlegend=False,
                    visible=metric == curves.metric,
                    marker={
                        "color": [colors[t.trial] for t in trials],
                        "symbol": ["star" if t.best else "circle" for t in trials],
                        "size": [18 if t.best else 10 for t in trials],
                        "line": {"color": "black", "width": 0.5},
                    },
                    text=[_trial_name(configs[t.trial]) for t in trials],
                    meta={"metric": metric, "parameter": s.name, "best": [t.best for t in trials]},
                    hovertemplate=f"%{{text}}<br>{html.escape(curves.parameter_label(s.name))} %{{x}}<br>final "
                    f"{html.escape(curves.metric_label(metric))} %{{y:.6g}}<extra></extra>",
                ),
                row=1,
                col=column,
            )
            kind = "category" if s.categorical else ("log" if s.log_scale else "linear")
            # A log axis spans two decades or more (report_data): a tick per decade, no crowd of 2..9 between.
            ticks = {"dtick": 1} if kind == "log" else {}
            figure.update_xaxes(title_text=curves.parameter_label(s.name), type=kind, row=1, col=column, **ticks)
    figure.update_yaxes(title_text=f"final {curves.metric_label(curves.metric)}", row=1, col=1)
    figure.update_layout(
        title={"text": "each hyper-parameter vs the trial's final value"},
        hovermode="closest",
        template="plotly_white",
        margin={"t": 60},
    )
    return figure


def _div(figure: Any, div_id: str, height: int) -> str:
    import plotly.io as pio

    return str(
        pio.to_html(
            figure,
            full_html=False,
            include_plotlyjs=False,
            div_id=div_id,
            config=PLOTLY_CONFIG,
            default_height=f"{height}px",
            default_width="100%",
        )
    )


# The picker shows one metric's traces in every figure (their `meta.metric`), the checkbox sets every y axis's scale.
PICKER_SCRIPT = """
(function () {
  const labels = JSON.parse(document.getElementById("metric-labels").textContent);
  const picker = document.getElementById("metric");
  const logScale = document.getElementById("log-scale");
  const figures = ["curves", "parameters"].map((id) => document.getElementById(id)).filter((gd) => gd && gd.data);
  const yAxes = (gd) => Object.keys(gd.layout).filter((key) => /^yaxis\\d*$/.test(key));
  function show() {
    const metric = picker.value;
    for (const gd of figures) {
      const indices = gd.data.map((_, i) => i);
      Plotly.restyle(gd, {visible: gd.data.map((trace) => trace.meta.metric === metric)}, indices);
    }
    const curves = document.getElementById("curves");
    Plotly.relayout(curves, {"title.text": labels[metric].title, "yaxis.title.text": labels[metric].label});
    const parameters = document.getElementById("parameters");
    if (parameters && parameters.data) {
      Plotly.relayout(parameters, {"yaxis.title.text": "final " + labels[metric].label});
    }
  }
  function scale() {
    for (const gd of figures) {
      const update = {};
      for (const axis of yAxes(gd)) update[axis + ".type"] = logScale.checked ? "log" : "linear";
      Plotly.relayout(gd, update);
    }
  }
  picker.addEventListener("change", show);
  logScale.addEventListener("change", scale);
})();
"""


def render_interactive(
    records: RunRecords, curves: Curves, series: Sequence[ParameterSeries], colors: Mapping[str, Any], title: str
) -> str:
    """The whole page: plotly.js inlined once, the two figures, the picker and the log-scale switch."""
    from plotly import __version__ as plotly_version
    from plotly.offline import get_plotlyjs

    metrics = loop_metrics(records, curves.metric)
    metrics = sorted(metrics, key=lambda m: (m != curves.metric, m))
    if curves.metric not in metrics:
        metrics.insert(0, curves.metric)
    hex_colors = {trial: _hex(color) for trial, color in colors.items()}
    labels = {
        m: {"label": curves.metric_label(m), "title": f"{curves.metric_label(m)} per {curves.x_label}"} for m in metrics
    }
    options = "".join(
        f'<option value="{html.escape(m)}"{" selected" if m == curves.metric else ""}>'
        f"{html.escape(curves.metric_label(m))}{' (the sweep&#39;s metric)' if m == curves.metric else ''}</option>"
        for m in metrics
    )
    parameters = _parameters_figure(records, curves, series, metrics, hex_colors)
    best = curves.best
    best_line = (
        f"Best trial: {html.escape(best.label)} ({html.escape(best.trial)}), red in every figure, its best "
        f"{html.escape(curves.metric)} starred."
        if best
        else "No best trial recorded yet."
    )
    stopped = (
        f" An X ends a trial that {html.escape(curves.early_stop_note)}."
        if any(t.early_stopped for t in curves.trials)
        else ""
    )
    parameters_html = (
        _div(parameters, "parameters", 420)
        if parameters is not None
        else "<p>No hyper-parameter varies across trials.</p>"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>TrainingSweep {html.escape(title)}: interactive view</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222}}.controls{{display:flex;gap:2em;
align-items:center;margin:.8em 0}}p{{max-width:70em}}.note{{color:#555;font-size:.9em}}</style>
<script>{get_plotlyjs()}</script>
</head><body>
<h1>TrainingSweep {html.escape(title)}: interactive view</h1>
<p>{best_line}{stopped} Hover a point for its trial and value; drag to zoom, double-click to zoom out; click a trial
in the legend to hide it, double-click to show it alone.</p>
<div class="controls">
<label>metric <select id="metric">{options}</select></label>
<label><input type="checkbox" id="log-scale"> log scale (y)</label>
</div>
<script type="application/json" id="metric-labels">{_script_json(labels)}</script>
{_div(_curves_figure(records, curves, metrics, hex_colors), "curves", 520)}
{parameters_html}
<p class="note">The figures and the data of <a href="report.html">report.html</a>, beside this page. Drawn with
plotly {html.escape(plotly_version)}, its library inlined: this page fetches nothing.</p>
<script>{PICKER_SCRIPT}</script>
</body></html>
"""
