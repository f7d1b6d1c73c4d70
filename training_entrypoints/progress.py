"""Progress and result files of a run: `_sweep/status.json` while Tune runs, `_sweep/result.json` at the end.

The documents are built by pure functions from plain trial summaries; a Tune callback feeds them and writes
the status at most every few seconds. The operator copies both into the TrainingSweep status.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from ray.tune import Callback

from sweep_operator.s3_layout import RunLayout

from . import storage
from .trainable import CONTEXT_KEY

logger = logging.getLogger(__name__)

STATUS_INTERVAL_S = 5.0
CHECKPOINT_PATH_KEY = "checkpoint_path"  # what TuneReportCallback adds to rank 0's metrics (R18)
# Tune trial states -> the TrainingSweep's trial counts (a paused trial waits like a pending one).
_STATE_KEYS = {"PENDING": "pending", "PAUSED": "pending", "RUNNING": "running", "TERMINATED": "terminated", "ERROR": "errored"}


@dataclass(frozen=True)
class TrialSummary:
    """One trial as the progress files show it. `value` is the trial's best `metric` so far."""

    id: str
    status: str
    config: dict[str, Any] = field(default_factory=dict)
    value: float | None = None
    checkpoint_uri: str | None = None
    error: str | None = None


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def trial_counts(trials: Iterable[TrialSummary]) -> dict[str, int]:
    counts = {"total": 0, "pending": 0, "running": 0, "terminated": 0, "errored": 0}
    for trial in trials:
        counts["total"] += 1
        counts[_STATE_KEYS.get(trial.status, "pending")] += 1
    return counts


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def best_trial(trials: Iterable[TrialSummary], metric: str | None, mode: str | None) -> dict[str, Any] | None:
    """`{"id", "metric", "value", "config", "checkpointUri"}` of the best trial, None without metric or results."""
    if not metric or mode not in ("min", "max"):
        return None
    scored = [t for t in trials if t.value is not None]
    if not scored:
        return None
    best = (min if mode == "min" else max)(scored, key=lambda t: t.value)  # first wins a tie
    return {"id": best.id, "metric": metric, "value": best.value, "config": best.config, "checkpointUri": best.checkpoint_uri}


def status_document(
    trials: list[TrialSummary], metric: str | None, mode: str | None, *, phase: str = "Running"
) -> dict[str, Any]:
    return {
        "phase": phase,
        "trials": trial_counts(trials),
        "bestTrial": best_trial(trials, metric, mode),
        "updatedAt": utc_now(),
    }


def result_document(
    trials: list[TrialSummary],
    metric: str | None,
    mode: str | None,
    *,
    run: dict[str, str],
    deadline_reached: bool = False,
) -> dict[str, Any]:
    """The final file: best trial (its checkpoint a full URI), counts, every trial, errors, finishedAt."""
    return {
        **run,
        "bestTrial": best_trial(trials, metric, mode),
        "trials": trial_counts(trials),
        "trialResults": [
            {"id": t.id, "status": t.status, "config": t.config, "value": t.value, "checkpointUri": t.checkpoint_uri}
            for t in trials
        ],
        "errors": [{"trial": t.id, "error": t.error} for t in trials if t.error],
        "deadlineReached": deadline_reached,
        "finishedAt": utc_now(),
    }


def public_config(config: dict[str, Any]) -> dict[str, Any]:
    """A trial's hyper-parameters without the sweep context the trial driver adds."""
    return {k: v for k, v in config.items() if k != CONTEXT_KEY}


def summarize_trial(trial: Any, metric: str | None, mode: str | None, run_root: str) -> TrialSummary:
    """A live `ray.tune.experiment.Trial` as a TrialSummary (best value over all its results so far)."""
    value = None
    if metric and mode in ("min", "max"):
        value = _finite((trial.metric_analysis.get(metric) or {}).get(mode))
    checkpoint = (trial.last_result or {}).get(CHECKPOINT_PATH_KEY)
    return TrialSummary(
        id=trial.trial_id,
        status=trial.status,
        config=public_config(dict(trial.config)),
        value=value,
        checkpoint_uri=storage.to_uri(checkpoint, run_root) if checkpoint else None,
    )


class SweepProgressCallback(Callback):
    """Writes `_sweep/status.json` on trial events and steps, at most every `interval_s` seconds.

    The write happens on a background thread so a slow store never holds up Tune's event loop; a write still in
    flight when the next one is due is not queued (the one after it carries the newer state).
    """

    def __init__(
        self,
        layout: RunLayout,
        metric: str | None,
        mode: str | None,
        interval_s: float = STATUS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.layout = layout
        self.metric = metric
        self.mode = mode
        self.interval_s = interval_s
        self.trials: list[Any] = []
        self._clock = clock
        self._last_write = -math.inf
        self._writer: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks with the experiment; live trials and threads stay behind.
        return {**self.__dict__, "trials": [], "_writer": None}

    def summaries(self) -> list[TrialSummary]:
        return [summarize_trial(t, self.metric, self.mode, self.layout.root) for t in self.trials]

    def _write(self, document: dict[str, Any]) -> None:
        try:
            storage.write_json(self.layout.status_path, document)
        except OSError as exc:  # progress is best effort; the sweep itself must not fail on it
            logger.warning("could not write %s: %s", self.layout.status_path, exc)

    def flush(self) -> None:
        """Wait for a status write in flight."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None

    def _maybe_write(self, trials: list[Any]) -> None:
        self.trials = list(trials)
        if self._clock() - self._last_write < self.interval_s:
            return
        if self._writer is not None and self._writer.is_alive():
            return
        self._last_write = self._clock()
        document = status_document(self.summaries(), self.metric, self.mode)
        self._writer = threading.Thread(target=self._write, args=(document,), name="sweep-status", daemon=True)
        self._writer.start()

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self._maybe_write(trials)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._maybe_write(trials)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict, **info: Any) -> None:
        self._maybe_write(trials)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._maybe_write(trials)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._maybe_write(trials)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        # The driver writes the final status next; no earlier write may land after it.
        self.trials = list(trials)
        self.flush()
