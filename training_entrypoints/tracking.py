"""Trials tracked in MLflow (spec.tracking.mlflow): the sweep is a parent run, every trial a child run with its
hyper-parameters, its metrics per report and its committed checkpoint URIs as tags.

Ray's `MLflowLoggerCallback` (ray 2.58, ray/air/integrations/mlflow.py) is not used: it logs the config again on
every trial start (MLflow refuses a changed param, so a restored or retried trial fails its logging), calls the
server synchronously on Tune's event loop (a slow or down server holds up or fails the sweep), makes no parent run,
and keeps its trial -> run map in memory only (a restarted driver starts duplicate runs). Here the Tune callback
only appends to a bounded buffer; one thread of its own talks to the server, each call bounded by a timeout, retrying
with backoff while the server is down; runs are found again by their tags (sweeps.dev/run-id, /trial-id), never by
name. What the thread last saw goes into the run's progress documents, which the operator mirrors
(status.tracking, condition TrackingAvailable, Events).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.tune import Callback

from sweep_contracts import tracking as contract
from sweep_contracts.runspec import RunSpec

from . import storage
from .tracking_values import TrackingClient, TrackingTarget, metric_values, param_values

logger = logging.getLogger(__name__)

# Metric points kept while the server does not answer; past it the oldest are dropped (and counted): at 10 metrics a
# report, a thousand reports.
MAX_PENDING_POINTS = 10_000
CALL_TIMEOUT_S = 10.0  # one HTTP call to the server (MLflow's own default is 120 s, with 7 retries)
RETRY_MIN_S = 1.0
RETRY_MAX_S = 10.0
FLUSH_TIMEOUT_S = 30.0  # at the end of the run: how long the driver waits for what is still buffered
# Overrides for tests and operators of slow servers (seconds).
ENV_CALL_TIMEOUT = "SWEEP_TRACKING_CALL_TIMEOUT_S"
ENV_FLUSH_TIMEOUT = "SWEEP_TRACKING_FLUSH_TIMEOUT_S"
# MLflow's batch limits (mlflow/utils/validation.py) and its tag value bound.
_METRICS_PER_BATCH = 1000
_PARAMS_TAGS_PER_BATCH = 100
_TAG_VALUE_MAX = 8000
RUN_RUNNING, RUN_FINISHED, RUN_FAILED, RUN_KILLED = "RUNNING", "FINISHED", "FAILED", "KILLED"


@dataclass(frozen=True)
class MetricPoint:
    seq: int
    trial_id: str
    key: str
    value: float
    timestamp_ms: int
    step: int


@dataclass
class _TrialWork:
    """What one trial still has to log besides metric points (coalesced: the latest tags and end win)."""

    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    started: bool = False
    end_status: str | None = None


@dataclass
class TrackingFacts:
    """What the logging thread last saw, for the progress documents."""

    experiment_id: str | None = None
    parent_run_id: str | None = None
    available: bool | None = None  # None until the first call returned or failed
    error: str = ""
    dropped: int = 0


class MlflowTracker:
    """The buffer the Tune callback appends to and the thread that logs it to the server.

    Nothing here blocks its caller: `trial_started`, `trial_result`, `trial_ended` take a lock, append and return.
    `finish` (the end of the run) waits at most `flush_timeout_s` for the buffer to drain."""

    def __init__(
        self,
        target: TrackingTarget,
        client_factory: Callable[[], TrackingClient] | None = None,
        *,
        max_points: int = MAX_PENDING_POINTS,
        retry_min_s: float = RETRY_MIN_S,
        retry_max_s: float = RETRY_MAX_S,
        flush_timeout_s: float = FLUSH_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ):
        self.target = target
        self._client_factory = client_factory or (lambda: mlflow_client(target.tracking_uri))
        self._client: TrackingClient | None = None
        self.max_points = max_points
        self.retry_min_s, self.retry_max_s = retry_min_s, retry_max_s
        self.flush_timeout_s = flush_timeout_s
        self._clock = clock
        self._lock = threading.Condition()
        self._points: deque[MetricPoint] = deque()
        self._seq = 0
        self._trials: dict[str, _TrialWork] = {}
        self._reports: dict[str, int] = {}  # trial id -> reports seen by this tracker
        self._sweep_end: str | None = None
        self._sweep_tags: dict[str, str] = {}
        self._facts = TrackingFacts()
        # The logging thread's own caches (touched by it alone): runs found or made, params already on each run.
        self._trial_runs: dict[str, str] = {}
        self._logged_params: dict[str, set[str]] = {}
        self._step_base: dict[str, int] = {}  # run id -> the last step logged before this tracker
        self._parent_ready = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ---- the Tune side: append and return
    def start(self) -> MlflowTracker:
        self._thread = threading.Thread(target=self._run, name="sweep-tracking", daemon=True)
        self._thread.start()
        return self

    def trial_started(self, trial_id: str, config: Mapping[str, Any]) -> None:
        with self._lock:
            work = self._trials.setdefault(trial_id, _TrialWork())
            work.params.update(param_values(config))
            work.started, work.end_status = True, None
            self._lock.notify()

    def trial_result(self, trial_id: str, result: Mapping[str, Any], checkpoint_uri: str | None = None) -> None:
        # Steps count the trial's reports: this tracker's own count, after the last step its run already has (a
        # restored trial's training_iteration starts again at 1, so it cannot number them).
        step = self._reports[trial_id] = self._reports.get(trial_id, 0) + 1
        stamp = result.get("timestamp")
        timestamp_ms = int((stamp if isinstance(stamp, (int, float)) else self._clock()) * 1000)
        with self._lock:
            for key, value in metric_values(result).items():
                self._seq += 1
                self._points.append(MetricPoint(self._seq, trial_id, key, value, timestamp_ms, step))
            overflow = len(self._points) - self.max_points
            for _ in range(max(overflow, 0)):
                self._points.popleft()  # the oldest go first: the latest epochs say most about a trial
            if overflow > 0:
                self._facts.dropped += overflow
            if checkpoint_uri:
                self._trials.setdefault(trial_id, _TrialWork()).tags[contract.TAG_CHECKPOINT] = checkpoint_uri
            self._lock.notify()

    def trial_tags(self, trial_id: str, tags: Mapping[str, str]) -> None:
        with self._lock:
            self._trials.setdefault(trial_id, _TrialWork()).tags.update(tags)
            self._lock.notify()

    def trial_ended(self, trial_id: str, status: str) -> None:
        with self._lock:
            self._trials.setdefault(trial_id, _TrialWork()).end_status = status
            self._lock.notify()

    def pending(self) -> int:
        """Metric points, and trials with params, tags or an end, not yet logged."""
        with self._lock:
            return len(self._points) + sum(1 for w in self._trials.values() if _has_work(w))

    def fact(self) -> dict[str, Any] | None:
        """The `tracking` block of the progress documents (sweep_contracts.tracking reads it); None before the
        first call to the server returned or failed."""
        with self._lock:
            return self._fact_locked()

    def _fact_locked(self) -> dict[str, Any] | None:
        facts = self._facts
        if facts.available is None:
            return None
        pending = len(self._points) + sum(1 for w in self._trials.values() if _has_work(w))
        return {
            "backend": contract.BACKEND_MLFLOW,
            "experimentId": facts.experiment_id,
            "runId": facts.parent_run_id,
            "available": facts.available,
            "pending": pending,
            "dropped": facts.dropped,
            "error": facts.error or None,
        }

    def document_facts(self) -> dict[str, Any]:
        """{"tracking": block} for a progress document, {} before the first call."""
        block = self.fact()
        return {contract.DOCUMENT_KEY: block} if block is not None else {}

    def finish(self, status: str, timeout_s: float | None = None) -> dict[str, Any] | None:
        """End the parent run with `status`, wait at most `timeout_s` (default flush_timeout_s) for everything
        buffered to be logged, stop the thread; the final fact. What is still buffered then is not logged (the
        fact's `pending` says how much)."""
        deadline = time.monotonic() + (self.flush_timeout_s if timeout_s is None else timeout_s)
        with self._lock:
            if self._stopping:  # finished already: the first end stands
                return self._fact_locked()
            self._sweep_end = status
            self._lock.notify()
            while self._has_work() and time.monotonic() < deadline and self._thread_alive():
                self._lock.wait(min(0.2, max(deadline - time.monotonic(), 0.0)))
            self._stopping = True
            left = self._has_work()
            self._lock.notify()
        if left:
            logger.warning(
                "tracking: %d metric points and updates were not logged to %s before the run ended",
                self.pending(), self.target.tracking_uri,
            )  # fmt: skip
        return self.fact()

    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _has_work(self) -> bool:
        return (
            bool(self._points)
            or any(_has_work(w) for w in self._trials.values())
            or self._sweep_end is not None
            or bool(self._sweep_tags)
            or not self._parent_ready
        )

    # ---- the logging thread
    def _run(self) -> None:
        backoff = self.retry_min_s
        while True:
            with self._lock:
                while not self._stopping and not self._has_work():
                    self._lock.wait(1.0)
                if self._stopping:
                    return
            try:
                self._drain()
            except Exception as exc:  # the server's or the network's: training goes on, the fact says so
                with self._lock:
                    first = self._facts.available is not False
                    self._facts.available, self._facts.error = False, _one_line(exc)
                    self._lock.notify_all()
                if first:
                    logger.warning("tracking: %s does not answer: %s", self.target.tracking_uri, _one_line(exc))
                with self._lock:
                    self._lock.wait_for(lambda: self._stopping, timeout=backoff)
                backoff = min(backoff * 2, self.retry_max_s)
                continue
            backoff = self.retry_min_s
            with self._lock:
                if self._facts.available is False:
                    logger.info("tracking: %s answers again", self.target.tracking_uri)
                self._facts.available, self._facts.error = True, ""
                self._lock.notify_all()

    def _client_now(self) -> TrackingClient:
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    def _drain(self) -> None:
        """Log everything buffered now; raises at the first failed call, leaving the rest (and the failed part)
        buffered for the next try."""
        client = self._client_now()
        self._ensure_parent(client)
        with self._lock:
            trials = {tid: w for tid, w in self._trials.items() if _has_work(w)}
            snapshot = {tid: (dict(w.params), dict(w.tags), w.started, w.end_status) for tid, w in trials.items()}
        for trial_id, (params, tags, started, _) in snapshot.items():
            if not (params or tags or started):
                continue
            run_id = self._trial_run(client, trial_id, reopen=started)
            new = {k: v for k, v in params.items() if k not in self._logged_params[run_id]}
            self._log(client, run_id, params=new, tags=tags)
            self._logged_params[run_id].update(new)
            with self._lock:
                work = self._trials[trial_id]
                for key in params:
                    work.params.pop(key, None)
                for key, value in tags.items():
                    if work.tags.get(key) == value:
                        del work.tags[key]
                if started:
                    work.started = False
        self._drain_points(client)
        for trial_id, (_, _, _, end) in snapshot.items():
            if end is None:
                continue
            client.set_terminated(self._trial_run(client, trial_id), status=end)
            with self._lock:
                if self._trials[trial_id].end_status == end:
                    self._trials[trial_id].end_status = None
        with self._lock:
            sweep_end, sweep_tags = self._sweep_end, dict(self._sweep_tags)
        parent = self._facts.parent_run_id
        assert parent is not None
        if sweep_tags:
            self._log(client, parent, tags=sweep_tags)
            with self._lock:
                for key in sweep_tags:
                    self._sweep_tags.pop(key, None)
        if sweep_end is not None and not self._points_left():
            client.set_terminated(parent, status=sweep_end)
            with self._lock:
                if self._sweep_end == sweep_end:
                    self._sweep_end = None

    def _points_left(self) -> bool:
        with self._lock:
            return bool(self._points) or any(_has_work(w) for w in self._trials.values())

    def _drain_points(self, client: TrackingClient) -> None:
        from mlflow.entities import Metric, RunTag

        while True:
            with self._lock:
                batch = list(self._points)[:_METRICS_PER_BATCH]
            if not batch:
                return
            by_trial: dict[str, list[MetricPoint]] = {}
            for point in batch:
                by_trial.setdefault(point.trial_id, []).append(point)
            for trial_id, points in by_trial.items():
                run_id = self._trial_run(client, trial_id)
                base = self._step_base.get(run_id, 0)
                last = RunTag(contract.TAG_LAST_STEP, str(base + max(p.step for p in points)))
                client.log_batch(
                    run_id, metrics=[Metric(p.key, p.value, p.timestamp_ms, base + p.step) for p in points], tags=[last]
                )  # fmt: skip
                sent = {p.seq for p in points}
                with self._lock:
                    # Points dropped meanwhile (overflow) are already gone; only what was sent leaves the buffer.
                    self._points = deque(p for p in self._points if p.seq not in sent)

    def _ensure_parent(self, client: TrackingClient) -> None:
        if self._parent_ready:
            return
        target = self.target
        experiment = client.get_experiment_by_name(target.experiment_name)
        experiment_id = (
            experiment.experiment_id if experiment is not None else client.create_experiment(target.experiment_name)
        )
        found = _runs(client.search_runs([experiment_id], target.run_filter(contract.ROLE_SWEEP), max_results=1))
        if found:
            run_id = found[0].info.run_id
            client.update_run(run_id, status=RUN_RUNNING)  # a resumed attempt, a restarted driver: the same run
        else:
            name = f"{target.sweep}-{target.run_id}"
            run_id = client.create_run(experiment_id, tags=target.tags(contract.ROLE_SWEEP), run_name=name).info.run_id
        with self._lock:
            self._facts.experiment_id, self._facts.parent_run_id = str(experiment_id), run_id
        self._parent_ready = True

    def _trial_run(self, client: TrackingClient, trial_id: str, *, reopen: bool = False) -> str:
        run_id = self._trial_runs.get(trial_id)
        if run_id is not None and not reopen:
            return run_id
        parent = self._facts.parent_run_id
        assert parent is not None
        if run_id is None:
            target = self.target
            found = _runs(
                client.search_runs(
                    [self._facts.experiment_id or ""], target.run_filter(contract.ROLE_TRIAL, trial_id), max_results=1
                )
            )
            if found:
                run_id = found[0].info.run_id
                data = client.get_run(run_id).data
                self._logged_params[run_id] = set(data.params)
                last = str(data.tags.get(contract.TAG_LAST_STEP, "0"))
                self._step_base[run_id] = int(last) if last.isdigit() else 0
                reopen = True
            else:
                tags = {
                    **target.tags(contract.ROLE_TRIAL),
                    contract.TAG_TRIAL_ID: trial_id,
                    "mlflow.parentRunId": parent,
                }
                run = client.create_run(self._facts.experiment_id or "", tags=tags, run_name=trial_id)
                run_id = run.info.run_id
                self._logged_params[run_id] = set()
                reopen = False
            self._trial_runs[trial_id] = run_id
        if reopen:
            client.update_run(run_id, status=RUN_RUNNING)
        return run_id

    @staticmethod
    def _log(
        client: TrackingClient, run_id: str, *, params: Mapping[str, str] = {}, tags: Mapping[str, str] = {}
    ) -> None:
        from mlflow.entities import Param, RunTag

        param_items = [Param(k, v) for k, v in params.items()]
        tag_items = [RunTag(k, str(v)[:_TAG_VALUE_MAX]) for k, v in tags.items()]
        for i in range(0, max(len(param_items), len(tag_items)), _PARAMS_TAGS_PER_BATCH):
            client.log_batch(
                run_id,
                params=param_items[i : i + _PARAMS_TAGS_PER_BATCH],
                tags=tag_items[i : i + _PARAMS_TAGS_PER_BATCH],
            )

    def set_sweep_tags(self, tags: Mapping[str, str]) -> None:
        with self._lock:
            self._sweep_tags.update(tags)
            self._lock.notify()


def _has_work(work: _TrialWork) -> bool:
    return bool(work.params or work.tags or work.started or work.end_status)


def _runs(found: Any) -> list[Any]:
    return list(found or [])


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def mlflow_client(tracking_uri: str) -> TrackingClient:
    """MLflow's client for `tracking_uri`, each HTTP call bounded by CALL_TIMEOUT_S and not retried by MLflow (the
    tracker retries with its own backoff, so one call never waits through MLflow's seven). Credentials come from
    MLFLOW_TRACKING_TOKEN / _USERNAME / _PASSWORD (the Secret's keys on the head pod), read by MLflow itself."""
    # Read by MLflow at every request (mlflow/utils/rest_utils.py http_request): this driver process only.
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, round(_env_seconds(ENV_CALL_TIMEOUT, CALL_TIMEOUT_S))))
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    from mlflow import MlflowClient

    client: TrackingClient = MlflowClient(tracking_uri=tracking_uri)
    return client


def _env_seconds(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


class TrackingCallback(Callback):
    """Tune's side of the tracker: trial events into its buffer. Never calls the server itself.

    Tune pickles its callbacks with the experiment; a restored copy holds no tracker and does nothing (the driver
    installs this attempt's own, `install`)."""

    def __init__(self, tracker: MlflowTracker):
        self.tracker: MlflowTracker | None = tracker

    def __getstate__(self) -> dict[str, Any]:
        return {"tracker": None}

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        from .progress import public_config

        if self.tracker is not None:
            self.tracker.trial_started(str(trial.trial_id), public_config(dict(trial.config)))

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict, **info: Any) -> None:
        from .progress import CHECKPOINT_PATH_KEY

        if self.tracker is None:
            return
        path = result.get(CHECKPOINT_PATH_KEY)
        uri = storage.to_uri(path, self.tracker.target.run_root) if isinstance(path, str) and path else None
        self.tracker.trial_result(str(trial.trial_id), result, uri)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if self.tracker is not None:
            self.tracker.trial_ended(str(trial.trial_id), RUN_FINISHED)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if self.tracker is not None:
            self.tracker.trial_ended(str(trial.trial_id), RUN_FAILED)


def start_tracker(run_spec: RunSpec) -> MlflowTracker | None:
    """This attempt's tracker (its thread started), None when the sweep asks for no tracking."""
    target = TrackingTarget.of(run_spec)
    if target is None:
        return None
    return MlflowTracker(target, flush_timeout_s=_env_seconds(ENV_FLUSH_TIMEOUT, FLUSH_TIMEOUT_S)).start()


def install(callbacks: list[Any] | None, tracker: MlflowTracker | None) -> list[Any]:
    """`callbacks` without any restored TrackingCallback, with this attempt's (when tracking)."""
    kept = [c for c in (callbacks or []) if not isinstance(c, TrackingCallback)]
    return [*kept, TrackingCallback(tracker)] if tracker is not None else kept


def end_status(phase: str) -> str:
    """The MLflow run status of a driver's end phase."""
    return {"Succeeded": RUN_FINISHED, "DeadlineExceeded": RUN_FINISHED, "Stopped": RUN_KILLED}.get(phase, RUN_FAILED)


def record_best_checkpoints(tracker: MlflowTracker | None, best: Mapping[str, str]) -> None:
    """Each trial's best committed checkpoint ({trial id: URI}) as a tag of its run."""
    if tracker is None:
        return
    for trial_id, uri in best.items():
        tracker.trial_tags(trial_id, {contract.TAG_BEST_CHECKPOINT: uri})
