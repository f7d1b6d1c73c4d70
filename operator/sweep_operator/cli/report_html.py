"""report.html of `sweepctl report`: the sweep's facts, each figure with a caption, the trials and checkpoints as headed
tables. Values are formatted for people, never a Python repr."""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..status import rfc3339
from .report_data import Curves, ParameterSeries, format_value
from .report_records import RunRecords, run_end, sweep_identity, trial_counts


@dataclass(frozen=True)
class Figure:
    name: str  # the PNG written beside report.html
    title: str
    caption: str
    png: bytes


def _table(rows: Iterable[Iterable[Any]], header: Sequence[str]) -> str:
    head = "".join(f'<th scope="col">{html.escape(h)}</th>' for h in header)
    cells = ["".join(f"<td>{html.escape('-' if c is None else str(c))}</td>" for c in row) for row in rows]
    body = "".join(f"<tr>{c}</tr>" for c in cells)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _facts(pairs: Iterable[tuple[str, str]]) -> str:
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in pairs)
    return f'<dl class="facts">{items}</dl>'


def title_of(records: RunRecords) -> str:
    namespace, name = sweep_identity(records)
    return f"{namespace}/{name}" if namespace else name


def _params(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={format_value(v)}" for k, v in sorted(config.items())) or "-"


def _best(curves: Curves) -> str:
    best = curves.best
    if not best or not best.values:
        return "-"
    value = min(best.values) if curves.mode == "min" else max(best.values)
    return f"{best.label} ({best.trial}): {curves.metric} {value:.6g}; config {_params(best.config)}"


def _verdict(records: RunRecords) -> str:
    verification, status = records.verification or {}, records.status
    if verification:
        verdict = "VERIFIED" if verification.get("verified") else "NOT VERIFIED"
        summary = f" ({verification['summary']})" if verification.get("summary") else ""
        return verdict + (f" at {verification['verifiedAt']}" if verification.get("verifiedAt") else "") + summary
    if status.get("checkpoints"):
        c = status["checkpoints"]
        said = c.get("summary") or ("verified" if c.get("verified") else "NOT verified")
        return (
            f"{said} (by the operator at {c.get('verifiedAt')}): {c.get('checked')} checkpoints, {c.get('bytes')} bytes"
        )
    return "not verified by this report (--no-verify, or not an S3 run root)"


def _trial_rows(curves: Curves) -> tuple[list[str], list[list[Any]]]:
    header = ["trial", *map(curves.parameter_label, curves.varying), "status", f"{curves.x_label}s reported"]
    header += [f"last {curves.metric}"]
    header += [f"best {curves.metric}", "outcome"]
    rows = []
    for t in curves.trials:
        best_value = (min(t.values) if curves.mode == "min" else max(t.values)) if t.values else None
        outcome = "best trial" if t.best else (curves.early_stop_note if t.early_stopped else "")
        rows.append(
            [
                t.trial,
                *(format_value(t.config.get(n)) if n in t.config else "-" for n in curves.varying),
                t.status or "-",
                len(t.values),
                f"{t.values[-1]:.6g}" if t.values else "-",
                f"{best_value:.6g}" if best_value is not None else "-",
                outcome or "-",
            ]
        )
    return header, rows


def parameters_caption(series: Sequence[ParameterSeries], constants: Mapping[str, Any], searched: bool) -> str:
    """Which hyper-parameters the figure shows, which did not vary, and which every trial shared."""
    shown = [s.name for s in series if s.varies]
    flat = [f"{s.name}={format_value(s.points[0][0])}" for s in series if not s.varies]
    parts = [f"Varied across trials: {', '.join(shown)}." if shown else "No hyper-parameter varied across trials."]
    if flat:
        parts.append(f"Searched but did not vary (every trial drew the same value): {', '.join(flat)}.")
    if constants:
        where = "fixed in paramSpace" if searched else "did not vary across trials"
        parts.append(f"Same in every trial ({where}): {_params(constants)}.")
    return " ".join(parts)


def _interactive_link(page: str | None) -> str:
    if not page:
        return ""
    return (
        f'<p>Interactive view: <a href="{html.escape(page)}">{html.escape(page)}</a>, beside this file (hover, zoom, '
        "log scale, pick a metric; it fetches nothing).</p>"
    )


def _tracking_link(records: RunRecords) -> str:
    """The sweep's parent run in MLflow (status.tracking.url, which the operator builds from the spec's server)."""
    url = (records.status.get("tracking") or {}).get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return ""
    link = html.escape(url)
    return (
        f'<p>Tracked in MLflow: <a href="{link}">{link}</a> (the sweep\'s parent run; each trial is a child run).</p>'
    )


def lineage_of(records: RunRecords) -> tuple[int, list[Mapping[str, Any]]]:
    """A PBT sweep's exploits: (how many, the newest entries) from the sweep's status or the run's status.json."""
    for source in (records.status, records.progress or {}):
        lineage = source.get("lineage")
        if isinstance(lineage, Mapping) and isinstance(lineage.get("entries"), list):
            entries = [e for e in lineage["entries"] if isinstance(e, Mapping)]
            total = lineage.get("exploits")
            return (total if isinstance(total, int) else len(entries)), entries
    return 0, []


def _change_text(changes: Any) -> str:
    if isinstance(changes, Mapping):
        pairs = [(k, v[0], v[1]) for k, v in changes.items() if isinstance(v, (list, tuple)) and len(v) == 2]
    elif isinstance(changes, list):  # the sweep's status: [{param, before, after}]
        pairs = [(c.get("param"), c.get("before"), c.get("after")) for c in changes if isinstance(c, Mapping)]
    else:
        pairs = []
    return ", ".join(f"{k}: {format_value(a)} \u2192 {format_value(b)}" for k, a, b in pairs) or "same config"


def _lineage_section(records: RunRecords) -> str:
    """Each trial's line: every point where it continued from another trial's checkpoint, as Tune's PBT log says."""
    total, entries = lineage_of(records)
    if not entries:
        return ""
    by_trial: dict[str, list[Mapping[str, Any]]] = {}
    for entry in entries:
        by_trial.setdefault(str(entry.get("trial")), []).append(entry)
    lines = []
    for trial, steps in sorted(by_trial.items()):
        path = "".join(
            f" \u2500 step {e.get('step')}: from {e.get('donor')} ({_change_text(e.get('changes'))}) \u2500\u25b6"
            for e in steps
        )
        lines.append(f"{trial}{path} {trial}")
    rows = [
        (e.get("trial"), e.get("donor"), e.get("step"), _change_text(e.get("changes")), e.get("at")) for e in entries
    ]
    shown = f" (the newest {len(entries)} of {total})" if total > len(entries) else ""
    return (
        f"<section><h2>Lineage</h2><p>{total} exploit(s){shown}: a trial continued from a donor's committed "
        "checkpoint at the donor's step, with the donor's config changed as shown.</p>"
        f"<pre>{html.escape(chr(10).join(lines))}</pre>"
        f"{_table(rows, ('trial', 'donor', 'step', 'config change', 'at'))}</section>"
    )


def render_html(
    records: RunRecords,
    curves: Curves,
    figures: Sequence[Figure],
    now: float,
    constants: Mapping[str, Any],
    interactive: str | None = None,
) -> str:
    title = title_of(records)
    end = run_end(records)
    facts = [
        ("sweep", title),
        ("run root", records.root),
        ("phase", f"{end.phase}: {end.detail}"),
        ("trials", trial_counts(records)),
        ("best trial", _best(curves)),
        ("same in every trial", _params(constants)),
        ("deadline", str(records.status.get("deadlineAt") or "-")),
        ("report written", rfc3339(now)),
    ]
    header, rows = _trial_rows(curves)
    verification = records.verification or {}
    checkpoints = [
        (c.get("trial"), c.get("checkpoint"), c.get("files"), c.get("bytes"), c.get("status"), c.get("level") or "-")
        for c in verification.get("checkpoints") or []
    ]
    problems = [(p.get("kind"), p.get("key"), p.get("detail")) for p in verification.get("problems") or []]
    sections = "".join(
        f'<section><h2>{html.escape(f.title)}</h2><figure><img alt="{html.escape(f.title)}" '
        f'src="data:image/png;base64,{base64.b64encode(f.png).decode()}"/>'
        f"<figcaption>{html.escape(f.caption)} ({html.escape(f.name)})</figcaption></figure></section>"
        for f in figures
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>TrainingSweep report: {html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:80em;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left;
font-size:.9em}}th{{background:#f3f3f3}}img{{max-width:100%}}figure{{margin:.5em 0 1.5em}}
figcaption{{color:#555;font-size:.9em;max-width:60em}}dl.facts{{display:grid;grid-template-columns:max-content auto;
gap:.2em 1.2em}}dl.facts dt{{font-weight:600}}dl.facts dd{{margin:0}}</style>
</head><body>
<h1>TrainingSweep {html.escape(title)}</h1>
{_facts(facts)}
{_interactive_link(interactive)}
{_tracking_link(records)}
{sections}
<section><h2>Trials</h2>
{_table(rows, header)}</section>
{_lineage_section(records)}
<section><h2>Checkpoints</h2>
<p>{html.escape(_verdict(records))}</p>
{_table(checkpoints, ("trial", "checkpoint", "files", "bytes", "status", "level")) if checkpoints else ""}
{_table(problems, ("problem", "key", "detail")) if problems else ""}</section>
</body></html>
"""
