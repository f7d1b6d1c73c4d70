"""SIGTERM (Ray's Jobs API stop, KubeRay's StopJob) as a graceful Tune stop: no new trials, each running trial ends
after its next report, whose checkpoint Train commits before Tune sees the result, and once the checkpoint uploads in
flight are committed (within the window); then the driver records the stop, with what it could not wait for.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.tune import Callback
from ray.tune.stopper import Stopper

from sweep_contracts import constants

from . import storage
from .progress import CHECKPOINT_PATH_KEY, utc_now

logger = logging.getLogger(__name__)

STOPPED_BY_SIGNAL = "signal"
# What the driver keeps of the window for itself after the last report: Tune stops the trials (Train's abort, up to
# trial_stop.ABORT_TIMEOUT_S) and the status is written before Ray's supervisor sends SIGKILL.
MAX_MARGIN_S = 30.0
RAY_DEFAULT_STOP_WAIT_S = 3.0  # JobSupervisor.DEFAULT_RAY_JOB_STOP_WAIT_TIME_S
# What the driver keeps after the uploads in flight: Tune's end-of-experiment cleanup of the stopped trials (their
# aborts: ray_internals.TUNE_END_OF_EXPERIMENT_CLEANUP_S) and the status write; at most half the margin.
UPLOAD_RESERVE_S = 15.0
MAX_RECORDED_UPLOADS = 20  # uploads not waited for that the stop record names (the count says the rest)


def stop_window_s(env: Mapping[str, str], graceful_stop_s: float) -> float:
    """How long the driver has from SIGTERM to SIGKILL: `RAY_JOB_STOP_WAIT_TIME_S` as Ray's supervisor reads it (an
    int), else the spec's gracefulStopSeconds (what the operator renders it from)."""
    raw = env.get(constants.ENV_JOB_STOP_WAIT)
    if raw is not None:
        try:
            return float(int(raw))
        except ValueError:
            return RAY_DEFAULT_STOP_WAIT_S  # the supervisor would fail on it; nothing better is known
    return float(graceful_stop_s)


def report_wait_s(window_s: float) -> float:
    """How long the trials get to report once more: the window less a margin (a third of it, at most MAX_MARGIN_S)."""
    return max(0.0, window_s - min(MAX_MARGIN_S, window_s / 3.0))


def upload_wait_s(window_s: float) -> float:
    """How long from the request the uploads in flight may take: the window less what stopping the trials and
    writing the status need after them (UPLOAD_RESERVE_S, at most half the margin the report wait leaves)."""
    margin = window_s - report_wait_s(window_s)
    return max(report_wait_s(window_s), window_s - min(UPLOAD_RESERVE_S, margin / 2))


# (trial ids, deadline on the stop's clock, whether uploads newly in flight still join the wait) -> the wait, started
UploadWaiter = Callable[[list[str], float, Callable[[], bool]], Any]


def uploads_record(trials: Mapping[str, Any], wait_s: float) -> dict[str, Any]:
    """The stop record's `uploads` block (pure) from each trial's `stop_uploads.TrialUploads`: how many uploads in flight
    the stop waited for, how many of them Ray committed, and each it could not wait for (trial, checkpoint folder)."""
    waited = sum(len(t.waited) for t in trials.values())
    committed = sum(len(t.committed) for t in trials.values())
    missed = [{"trial": trial_id, "checkpoint": name} for trial_id in sorted(trials) for name in trials[trial_id].cut]
    errors = {trial_id: t.error for trial_id, t in sorted(trials.items()) if t.error}
    return {
        "waitSeconds": round(wait_s, 1),
        "waitedFor": waited,
        "committed": committed,
        "notWaitedFor": missed[:MAX_RECORDED_UPLOADS],
        "notWaitedForCount": len(missed),
        "message": uploads_message(waited, committed, missed, errors),
    }


def uploads_message(
    waited: int, committed: int, missed: list[dict[str, Any]], errors: Mapping[str, str] | None = None
) -> str | None:
    """What the stop says of the uploads in flight (None when there were none)."""
    if not waited and not missed:
        return None
    if not missed:
        return f"waited for {waited} checkpoint upload(s) in flight; {committed} committed"
    named = ", ".join(
        f"trial {m['trial']} checkpoint {m['checkpoint']}" if m["checkpoint"] else f"trial {m['trial']} (unnamed)"
        for m in missed[:5]
    )
    more = f" and {len(missed) - 5} more" if len(missed) > 5 else ""
    why = "; ".join(f"trial {t}: {e}" for t, e in (errors or {}).items())
    return (
        f"could not wait for {len(missed)} checkpoint upload(s) in flight ({named}{more}): the stop's time for uploads "
        f"ran out or they started after it; they are not committed and nothing uses them"
        + (f" ({why})" if why else "")
        + (f"; waited for {waited}, {committed} committed" if waited else "")
    )


@dataclass
class StoppedTrial:
    """A trial the stop ended: whether it reported after the signal, and the checkpoint of its last report."""

    id: str
    reported: bool = False
    checkpoint_path: str | None = None


@dataclass
class GracefulStop:
    """The stop's state, shared by the signal handler, the Stopper and the Callback (all in the driver process).

    Decisions are pure (`should_stop_all`); the clock is injected."""

    report_wait_s: float
    clock: Callable[[], float] = time.monotonic
    upload_wait_s: float | None = None  # from the request; None: as report_wait_s
    start_upload_wait: UploadWaiter | None = None
    uploads: Any = None  # the started wait (stop_uploads.UploadWait), once the stop knows its trials
    reports_over: bool = False  # every trial reported once more, or the report wait ran out
    requested_at: float | None = None  # monotonic
    requested_utc: str | None = None
    signal_name: str | None = None
    awaiting: set[str] | None = None  # running at the request, not reported since; None until the next step
    trials: dict[str, StoppedTrial] = field(default_factory=dict)
    timed_out: bool = False
    triggered: bool = False  # the experiment was stopped for it (a request after the sweep ended changes nothing)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its stopper and callbacks with the experiment; a stop belongs to the attempt that got it.
        return {"report_wait_s": self.report_wait_s, "upload_wait_s": self.upload_wait_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        fresh = GracefulStop(report_wait_s=state["report_wait_s"], upload_wait_s=state.get("upload_wait_s"))
        self.__dict__.update(fresh.__dict__)

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def request(self, signal_name: str) -> None:
        """Called from the signal handler: only notes the request (Tune acts on it in its own loop)."""
        if self.requested_at is None:
            self.requested_at = self.clock()
            self.requested_utc = utc_now()
            self.signal_name = signal_name

    def note_trials(self, running: list[str]) -> None:
        """At the first Tune step after the request: the trials to wait for are the ones running then."""
        with self._lock:
            if self.requested and self.awaiting is None:
                self.awaiting = set(running)
                for trial_id in running:
                    self.trials.setdefault(trial_id, StoppedTrial(trial_id))
                if self.start_upload_wait is not None and running:
                    deadline = self.requested_at_or_now() + self.uploads_wait_s
                    try:
                        self.uploads = self.start_upload_wait(list(running), deadline, lambda: not self.reports_over)
                    except Exception:  # the stop goes on as without uploads to wait for; the log says why
                        logger.warning("cannot wait for the uploads in flight of %s", running, exc_info=True)

    def note_result(self, trial_id: str, result: Mapping[str, Any]) -> None:
        with self._lock:
            if not self.requested or self.awaiting is None or trial_id not in self.trials:
                return
            trial = self.trials[trial_id]
            trial.reported = True
            trial.checkpoint_path = result.get(CHECKPOINT_PATH_KEY) or trial.checkpoint_path
            self.awaiting.discard(trial_id)

    def note_ended(self, trial_id: str) -> None:
        """A trial that ended on its own (finished, failed) is not waited for."""
        with self._lock:
            if self.awaiting is not None:
                self.awaiting.discard(trial_id)

    @property
    def uploads_wait_s(self) -> float:
        return max(self.report_wait_s, self.upload_wait_s if self.upload_wait_s is not None else self.report_wait_s)

    def should_stop_all(self) -> bool:
        """Stop the experiment once every trial running at the request reported once more (or the report wait is
        over), and the uploads in flight are committed (or their share of the window is over)."""
        if not self.requested or self.awaiting is None:
            return False
        elapsed = self.clock() - self.requested_at_or_now()
        if self.awaiting and elapsed < self.report_wait_s:
            return False
        if not self.reports_over:
            self.reports_over = True
            self.timed_out = bool(self.awaiting)
        if self.uploads is not None and not self.uploads.done() and elapsed < self.uploads_wait_s:
            return False
        self.triggered = True
        return True

    def requested_at_or_now(self) -> float:
        return self.clock() if self.requested_at is None else self.requested_at

    def record(self, run_root: str) -> dict[str, Any]:
        """The `stop` block of `_sweep/status.json`: what the stop ended, each trial's last reported checkpoint."""
        waited = None if self.requested_at is None else round(self.clock() - self.requested_at, 1)
        uploads = dict(self.uploads.trials) if self.uploads is not None else {}
        record = {
            "signal": self.signal_name,
            "requestedAt": self.requested_utc,
            "stoppedAt": utc_now(),
            "waitedSeconds": waited,
            "reportWaitSeconds": self.report_wait_s,
            "timedOut": self.timed_out,
            "trials": [
                {
                    "id": t.id,
                    "reportedAfterStop": t.reported,
                    "checkpointUri": storage.to_uri(t.checkpoint_path, run_root) if t.checkpoint_path else None,
                    **_trial_uploads(uploads.get(t.id)),
                }
                for t in sorted(self.trials.values(), key=lambda t: t.id)
            ],
        }
        if self.start_upload_wait is not None:
            record["uploads"] = uploads_record(uploads, self.uploads_wait_s)
        return record


def _trial_uploads(uploads: Any) -> dict[str, Any]:
    if uploads is None:
        return {}
    return {
        "uploadsWaitedFor": len(uploads.waited),
        "uploadsCommitted": len(uploads.committed),
        "uploadsNotWaitedFor": uploads.cut[:MAX_RECORDED_UPLOADS],
    }


class GracefulStopper(Stopper):
    """Tune's stopper: never stops one trial (a trial the stopper ends is marked `done`, and a resumed attempt would
    not continue it); stops the whole experiment as `_stop_experiment_if_needed` does for a time budget, so the trials
    end TERMINATED without `done` and the next attempt resumes them (training_entrypoints.resume)."""

    def __init__(self, stop: GracefulStop):
        self.stop = stop

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        self.stop.note_result(trial_id, result)
        return False

    def stop_all(self) -> bool:
        return self.stop.should_stop_all()


class GracefulStopCallback(Callback):
    """Tells the stop which trials run when it is asked (`on_step_begin` comes before the step's results)."""

    def __init__(self, stop: GracefulStop):
        self.stop = stop

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if self.stop.requested and self.stop.awaiting is None:
            running = [str(t.trial_id) for t in trials if t.status == "RUNNING"]
            self.stop.note_trials(running)
            logger.warning(
                "%s: stopping the sweep gracefully: no new trials; waiting up to %.0f s for the next report of %s",
                self.stop.signal_name, self.stop.report_wait_s, ", ".join(running) or "no running trial",
            )  # fmt: skip

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.stop.note_ended(str(trial.trial_id))

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.stop.note_ended(str(trial.trial_id))


def install(stop: GracefulStop, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> Callable[[], None]:
    """Turn `signals` into `stop.request` (main thread only); returns what puts the old handlers back."""
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handler(signum: int, frame: Any) -> None:
        stop.request(signal.Signals(signum).name)

    for sig in signals:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def wait_for_uploads(trial_ids: list[str], deadline: float, collecting: Callable[[], bool]) -> Any:
    """The driver's wait for the trials' uploads in flight (stop_uploads.UploadWait), started."""
    from .stop_uploads import UploadWait

    return UploadWait(trial_ids, deadline, collecting).start()


def from_env(
    graceful_stop_s: float, env: Mapping[str, str] | None = None, *, uploads: UploadWaiter | None = wait_for_uploads
) -> GracefulStop:
    window = stop_window_s(os.environ if env is None else env, graceful_stop_s)
    return GracefulStop(
        report_wait_s=report_wait_s(window), upload_wait_s=upload_wait_s(window), start_upload_wait=uploads
    )
