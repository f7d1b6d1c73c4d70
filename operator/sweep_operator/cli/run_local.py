"""`sweepctl run-local -f FILE [--storage URI|DIR] [--cpu-only] [--code DIR]`: one sweep's entrypoint on a local Ray.

The RayJob is rendered exactly as the operator would; `training_entrypoints.local` runs its entrypoint with the
same environment on a local Ray sized so nested Tune + Train fits, the user's code on PYTHONPATH (code_path.py).
Exit 0 on success, 1 when the sweep failed, 2 when the manifest or the trainLoop's module cannot be used.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sweep_contracts.api import DEFAULT_WARN_AFTER_REPORTS
from sweep_contracts.checkpoint_coverage import checkpoint_coverage

from .code_path import code_dir, train_loop_dirs
from .common import EXIT_FAILED, EXIT_OK, UsageError, load_limits, load_sweep, run_id_from


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run-local",
        help="run a TrainingSweep's entrypoint on a local Ray (no cluster)",
        description="Run a TrainingSweep's entrypoint on a local Ray, as its RayJob would run in a cluster. Your "
        "train loop (spec.trainLoop, module:function) is imported from --code DIR; without --code, from the current "
        "directory, this Python's installed packages and PYTHONPATH, else the manifest's own directory.",
    )
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="TrainingSweep manifest ('-': stdin)")
    p.add_argument(
        "--storage",
        metavar="URI|DIR",
        help="base for the run root instead of spec.storage.uri: another s3://bucket/prefix or a local directory",
    )
    p.add_argument("--cpu-only", action="store_true", help="train on CPUs: render the sweep with 0 GPUs per worker")
    p.add_argument("--run-id", help="run id (default: a fresh one; a new run gets a new prefix)")
    p.add_argument("--limits", metavar="FILE", help="operator limits YAML (maxWorkersPerSweep, ...)")
    p.add_argument("--log-dir", metavar="DIR", help="where the driver and Ray logs go (default: a temp dir)")
    p.add_argument(
        "--code",
        metavar="DIR",
        help="the directory holding your train loop's package, put on PYTHONPATH for the driver (its working "
        "directory) and every Ray worker (default: the current directory; when spec.trainLoop is not found there "
        "or among the installed packages but beside the manifest, the manifest's directory)",
    )
    p.set_defaults(func=run)


def cpu_only(sweep: Any) -> Any:
    """The same sweep with no GPUs per worker (what `--cpu-only` renders)."""
    spec = sweep.spec
    res = spec.trial.resources_per_worker.model_copy(update={"gpu": 0})
    trial = spec.trial.model_copy(update={"resources_per_worker": res})
    return dataclasses.replace(sweep, spec=spec.model_copy(update={"trial": trial}))


def _storage_base(value: str | None) -> str | None:
    from sweep_contracts.s3_layout import S3Uri, is_s3_uri

    if value is None:
        return None
    if is_s3_uri(value):
        try:
            return str(S3Uri.parse(value))
        except ValueError as exc:
            raise UsageError(f"--storage: {exc}") from None
    return str(Path(value).expanduser().resolve())


class Stopped(BaseException):
    """run-local was sent SIGTERM or SIGINT. Raised in the main thread, so the run's own cleanup stops local Ray and
    the driver on the way out: both run in sessions of their own, and no signal sent to run-local reaches them."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stopping(signum: int, frame: Any) -> None:
    print("run-local: stopping local Ray and the driver ...", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGINT raise `Stopped` (SIGTERM would otherwise end Python with no cleanup at all); a second
    signal only says it is stopping, so it cannot cut the cleanup short (bounded: local.STOP_GRACE_S, then SIGKILL)."""

    def stop(signum: int, frame: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _stopping)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class ProgressLine:
    """One live line on a terminal (`\\r`), one line per change otherwise."""

    def __init__(self, planned: int | None = None, warn_after_reports: int = DEFAULT_WARN_AFTER_REPORTS) -> None:
        self.planned = planned  # the trials the sweep asks for (numSamples x grid points): the count's whole
        self.warn_after_reports = warn_after_reports
        self.started = time.monotonic()
        self.tty = sys.stderr.isatty()
        self._last = ""
        self._warned = ""

    def warn_if_uncheckpointed(self, document: dict[str, Any]) -> None:
        """What the operator's Warning Event says, printed as soon as the progress shows it, once per change."""
        coverage = checkpoint_coverage(document, self.warn_after_reports)
        if coverage is None or coverage.ok or coverage.message == self._warned:
            return
        self._warned = coverage.message
        print(f"{chr(10) if self.tty else ''}run-local: warning: {coverage.message}", file=sys.stderr, flush=True)

    def __call__(self, status: dict[str, Any]) -> None:
        self.warn_if_uncheckpointed(status)
        counts = status.get("trials") or {}
        best = status.get("bestTrial") or {}
        finished = counts.get("terminated", 0) + counts.get("errored", 0)
        whole = max(self.planned or 0, counts.get("total", 0))
        text = f"trials {finished}/{whole} done, {counts.get('running', 0)} running, {counts.get('errored', 0)} errored"
        if best:
            text += f"; best {best.get('metric')}={best.get('value'):.6g} ({best.get('id')})"
        if text == self._last and not self.tty:
            return
        self._last = text
        line = f"[{time.monotonic() - self.started:6.0f}s] {text}"
        print(f"\r{line:<100}" if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty:
            print(file=sys.stderr)


def result_table(result: dict[str, Any]) -> str:
    """trial, config, metric, checkpoint: one row per trial, the best one marked."""
    best = (result.get("bestTrial") or {}).get("id")
    metric = (result.get("bestTrial") or {}).get("metric") or "value"
    rows = [("", "trial", "status", "config", metric, "checkpoint")]
    for t in result.get("trialResults") or []:
        config = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in (t.get("config") or {}).items()
        )
        value = t.get("value")
        rows.append(
            (
                "*" if t.get("id") == best else "",
                str(t.get("id")),
                str(t.get("status")),
                config,
                "-" if value is None else f"{value:.6g}",
                t.get("checkpointUri") or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def run(args: argparse.Namespace) -> int:
    from ..policy import effective_active_seconds
    from ..rendering import RenderContext, build_rayjob

    limits = load_limits(args.limits)
    sweep = load_sweep(args.filename, limits)
    if args.cpu_only:
        sweep = cpu_only(sweep)
    run_id = run_id_from(args.run_id)
    code = code_dir(args.code)
    found = train_loop_dirs(
        sweep.spec.train_loop,
        first=code or Path.cwd(),
        first_label="--code" if code else "the current directory",
        manifest=args.filename,
    )
    if found.note:
        print(f"run-local: {found.note}", file=sys.stderr)
    deadline = int(time.time()) + effective_active_seconds(sweep.spec, limits)
    rayjob = build_rayjob(
        sweep, run_id, RenderContext(limits=limits), deadline_at=deadline, storage_uri=_storage_base(args.storage)
    )

    from training_entrypoints.local import LocalRunError, run_rayjob

    from ..status import planned_trials

    progress = ProgressLine(planned_trials(sweep.spec), sweep.spec.checkpoints.warn_after_reports)
    print(f"run-local: {sweep.namespace}/{sweep.name} run {run_id} ({rayjob['metadata']['name']})", file=sys.stderr)
    try:
        with stopped_by_signals():
            outcome = run_rayjob(rayjob, workdir=code, code_dirs=found.dirs, log_dir=args.log_dir, on_progress=progress)
    except LocalRunError as exc:
        progress.done()
        print(f"run-local: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Stopped as stopped:
        progress.done()
        name = signal.Signals(stopped.signum).name
        print(f"run-local: stopped by {name}; local Ray and the driver are stopped", file=sys.stderr)
        return 128 + stopped.signum
    progress.done()
    if outcome.result:
        print(result_table(outcome.result))
        progress.warn_if_uncheckpointed(outcome.result)
    print(f"run-local: run root {outcome.run_root}; driver log {outcome.log_path}", file=sys.stderr)
    if not outcome.ok:
        print(outcome.message or f"run-local: the entrypoint exited with {outcome.returncode}", file=sys.stderr)
        print(f"run-local: failed (exit {outcome.returncode}) after {outcome.duration_s:.0f} s", file=sys.stderr)
        return EXIT_FAILED
    print(f"run-local: succeeded in {outcome.duration_s:.0f} s", file=sys.stderr)
    return EXIT_OK
