"""`sweepctl report NAME [-n NS] [--out DIR]`: a sweep's learning curves, metrics, hyper-parameters and timeline as a
self-contained report.html, PNGs and an interactive.html.

Read from its status and its run root in S3 (or a local dir); `--storage RUN_ROOT` reads S3 alone. Reading:
report_records; figure data: report_data; drawing: report_figures, report_interactive; page: report_html.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .common import EXIT_FAILED, EXIT_OK, UsageError, api_error_text, kube_connection
from .report_data import (
    Curves,
    ParameterSeries,
    constant_parameters,
    counters,
    learning_curves,
    metric_panels,
    parallel_view,
    parameter_points,
    searched_parameters,
    timeline,
)
from .report_figures import (
    render_learning_curves,
    render_metrics,
    render_parallel,
    render_parameters,
    render_timeline,
    trial_colors,
)
from .report_html import Figure, parameters_caption, render_html, title_of
from .report_interactive import INTERACTIVE, render_interactive
from .report_records import LocalStore, RunRecords, RunStore, S3Store, read_records, run_end, sweep_identity

__all__ = ["LocalStore", "RunRecords", "S3Store", "learning_curves", "parameter_points", "read_records", "timeline"]

FIGURES = ("learning_curves.png", "metrics.png", "parameters.png", "parallel_coordinates.png", "timeline.png")
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


# ------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Report:
    out: Path
    html: Path
    interactive: Path
    figures: dict[str, Path]
    data: dict[str, Any]


@dataclass(frozen=True)
class ReportData:
    """What every figure shows, computed once."""

    curves: Curves
    series: list[ParameterSeries]
    searched: bool  # the sweep's paramSpace says which hyper-parameters were searched
    constants: dict[str, Any]


def report_data(records: RunRecords) -> ReportData:
    curves = learning_curves(records)
    searched = searched_parameters(records)
    series = parameter_points(curves, searched)
    return ReportData(curves, series, searched is not None, constant_parameters(curves, series))


def figure_data(records: RunRecords, now: float) -> dict[str, Any]:
    """The data behind every figure (also written as report.json)."""
    data = report_data(records)
    curves = data.curves
    namespace, name = sweep_identity(records)
    return {
        "root": records.root,
        "sweep": {"namespace": namespace, "name": name},
        "phase": asdict(run_end(records)),
        "learningCurves": asdict(curves),
        "metrics": [asdict(p) for p in metric_panels(records, curves)],
        "countersNotDrawn": counters(records, curves),
        "parameters": [asdict(s) for s in data.series],
        "sameInEveryTrial": data.constants,
        "parallelCoordinates": asdict(parallel_view(records, curves, data.series)),
        "timeline": asdict(timeline(records, now, {t.trial: t.label for t in curves.trials})),
        "checkpoints": list((records.verification or {}).get("checkpoints") or []),
    }


def _figures(records: RunRecords, data: ReportData, now: float) -> list[Figure]:
    curves = data.curves
    panels = metric_panels(records, curves)
    line = timeline(records, now, {t.trial: t.label for t in curves.trials})
    colors = trial_colors(curves)
    lane_colors = {t.label: colors[t.trial] for t in curves.trials}
    varying = ", ".join(map(curves.parameter_label, curves.varying)) or "none vary"
    legend = f"Trials are named by the hyper-parameters that vary ({varying})."
    stopped = f", X where a trial {curves.early_stop_note}" if any(t.early_stopped for t in curves.trials) else ""
    left_out = counters(records, curves)
    not_drawn = (
        f" Counters are not drawn (how much data an epoch saw, not how the model does): {', '.join(left_out)}."
        if left_out
        else ""
    )
    shown = ", ".join(curves.metric_label(m) for p in panels for m in p.metrics)
    return [
        Figure(
            "learning_curves.png",
            f"Learning curves: {curves.metric}",
            f"The sweep's metric {curves.metric} ({curves.mode} is better) at each {curves.x_label} of every trial, "
            f"as Tune recorded it; the best trial in red{stopped}. {legend}",
            render_learning_curves(curves),
        ),
        Figure(
            "metrics.png",
            "Every metric the loop reports",
            f"One panel per metric the train loop reports ({shown}); "
            "training splits dashed, validation solid, so a validation curve rising while training keeps falling "
            f"(overfitting) shows in one panel. Colours as above. {legend}{not_drawn}",
            render_metrics(panels, curves),
        ),
        Figure(
            "parameters.png",
            "Hyper-parameters",
            f"Each trial's final {curves.metric} against each hyper-parameter. "
            + parameters_caption(data.series, data.constants, data.searched),
            render_parameters(data.series, curves),
        ),
        Figure(
            "parallel_coordinates.png",
            "Parallel coordinates",
            "One vertical axis per hyper-parameter that varies and per final metric, one line per trial, coloured "
            f"by its final {curves.metric}; the best trial in red.",
            render_parallel(parallel_view(records, curves, data.series), curves),
        ),
        Figure(
            "timeline.png",
            "Timeline",
            "The run's phases, RayJob attempts and trials in UTC, scaled to the run itself; a deadline or event "
            "beyond it is listed under the chart with its distance from the run.",
            render_timeline(line, lane_colors),
        ),
    ]


def write_report(records: RunRecords, out: Path, now: float | None = None) -> Report:
    """Write the PNG figures, report.html (the same figures inlined: one file to mail or attach), interactive.html
    (plotly, its library inlined: about 5 MB) and report.json."""
    now = now if now is not None else datetime.now(UTC).timestamp()
    out.mkdir(parents=True, exist_ok=True)
    data = report_data(records)
    figures = _figures(records, data, now)
    paths = {}
    for figure in figures:
        (out / figure.name).write_bytes(figure.png)
        paths[figure.name] = out / figure.name
    document = figure_data(records, now)
    (out / DATA).write_text(json.dumps(document, indent=2, default=str) + "\n")
    (out / REPORT).write_text(render_html(records, data.curves, figures, now, data.constants, INTERACTIVE))
    colors = trial_colors(data.curves)
    page = render_interactive(records, data.curves, data.series, colors, title_of(records))
    (out / INTERACTIVE).write_text(page)
    return Report(out=out, html=out / REPORT, interactive=out / INTERACTIVE, figures=paths, data=document)


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
            f"{api_error_text(exc, args.name)}; without the cluster, "
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
        f"sweepctl report: wrote {report.html} ({', '.join(sorted(p.name for p in report.figures.values()))}, {DATA}) "
        f"and {report.interactive} (hover, zoom, log scale, pick a metric)"
    )
    return EXIT_OK
