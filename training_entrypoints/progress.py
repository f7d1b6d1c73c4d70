"""Progress and result files of a run: `_sweep/status.json` while Tune runs, `_sweep/result.json` at the end.

The documents are built by pure functions from plain trial summaries; a Tune callback feeds them and writes
the status at most every few seconds. The operator copies both into the TrainingSweep status.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.tune import Callback

from sweep_contracts.s3_layout import RunLayout
from sweep_contracts.timestamps import rfc3339

from . import storage
from .trainable import CONTEXT_KEY

logger = logging.getLogger(__name__)

STATUS_INTERVAL_S = 5.0
# What read_ray_demand returns: placement groups, node totals, task/actor demand, pending and failed launches.
DemandReader = Callable[[], tuple[dict, list, list, int, int]]
CHECKPOINT_PATH_KEY = "checkpoint_path"  # what TuneReportCallback adds to rank 0's metrics (R18)
# Tune trial states -> the TrainingSweep's trial counts (a paused trial waits like a pending one).
_STATE_KEYS = {
    "PENDING": "pending",
    "PAUSED": "pending",
    "RUNNING": "running",
    "TERMINATED": "terminated",
    "ERROR": "errored",
}


@dataclass(frozen=True)
class TrialSummary:
    """One trial as the progress files show it. `value` is the trial's best `metric` so far."""

    id: str
    status: str
    config: dict[str, Any] = field(default_factory=dict)
    value: float | None = None
    checkpoint_uri: str | None = None
    error: str | None = None
    reports: int = 0  # how many times the trial reported (Tune's training_iteration)


def utc_now() -> str:
    return rfc3339()


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
    return {
        "id": best.id,
        "metric": metric,
        "value": best.value,
        "config": best.config,
        "checkpointUri": best.checkpoint_uri,
    }


def status_document(
    trials: list[TrialSummary],
    metric: str | None,
    mode: str | None,
    *,
    phase: str = "Running",
    pending: dict[str, Any] | None = None,
    attempt_facts: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`_sweep/status.json`. `trialResults` names every trial's latest checkpoint: the verifier reads it to know
    which trials must have checkpoints even when their train/ directory is gone; `pending` says what Ray waits for;
    `attempt_facts` (`attempt`, `attempts[]`: training_entrypoints.resume) which attempt of the run wrote it."""
    document: dict[str, Any] = {
        **(attempt_facts or {}),
        "phase": phase,
        "trials": trial_counts(trials),
        "bestTrial": best_trial(trials, metric, mode),
        "trialResults": [
            {"id": t.id, "status": t.status, "checkpointUri": t.checkpoint_uri, "reports": t.reports} for t in trials
        ],
        "updatedAt": utc_now(),
    }
    if pending is not None:
        document["pending"] = pending
    return document


# ------------------------------------------------------------------------------ what Ray waits for (R20)

PENDING_PG_STATES = ("PENDING", "RESCHEDULING")
_MAX_DEMANDS = 10


def _resources(bundle: Any) -> dict[str, float]:
    """A bundle without Ray's implicit per-node and bookkeeping resources."""
    if not isinstance(bundle, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in bundle.items()
        if isinstance(v, (int, float))
        and v
        and not str(k).startswith(("node:", "bundle_group", "CPU_group", "GPU_group"))
        and "_group_" not in str(k)
    }


def _fits(bundle: dict[str, float], node: dict[str, float]) -> bool:
    return all(node.get(k, 0.0) >= v for k, v in bundle.items())


def summarize_pending(
    pending_trials: dict[str, float],
    placement_groups: dict[str, Any],
    node_totals: list[dict[str, float]],
    task_demand: list[tuple[dict[str, float], int]],
    first_seen: dict[str, float],
    now: float,
    *,
    pending_launches: int = 0,
    failed_launches: int = 0,
) -> dict[str, Any]:
    """The `pending` block of status.json from what Ray reports (pure, R20).

    `pending_trials`: {trial id: seconds pending}; `placement_groups`: `ray.util.placement_group_table()`;
    `node_totals`: each alive node's total resources; `task_demand`: unmet task/actor demand from the autoscaler's
    cluster status (bundle, count). `first_seen` ({placement group id: when first seen pending}) is updated in place,
    so a group's age is measured across status writes. A bundle that fits no alive node is `infeasible`: only a new
    node (the autoscaler, KubeRay's worker group) can satisfy it."""
    waiting: list[dict[str, Any]] = []
    seen_now: set[str] = set()
    for pg_id, info in sorted(placement_groups.items()):
        if not isinstance(info, dict) or info.get("state") not in PENDING_PG_STATES:
            continue
        seen_now.add(pg_id)
        since = first_seen.setdefault(pg_id, now)
        raw = info.get("bundles") or {}
        bundles = (
            [_resources(b) for _, b in sorted(raw.items())] if isinstance(raw, dict) else [_resources(b) for b in raw]
        )
        strategy = str(info.get("strategy") or "")
        if strategy == "STRICT_PACK":
            total: dict[str, float] = {}
            for bundle in bundles:
                for k, v in bundle.items():
                    total[k] = total.get(k, 0.0) + v
            infeasible = not any(_fits(total, node) for node in node_totals)
        else:
            infeasible = any(not any(_fits(b, node) for node in node_totals) for b in bundles)
        waiting.append(
            {
                "kind": "placementGroup",
                "name": str(info.get("name") or ""),
                "bundles": bundles,
                "strategy": strategy,
                "pendingSeconds": round(now - since, 1),
                "infeasible": infeasible,
            }
        )
    for pg_id in list(first_seen):
        if pg_id not in seen_now:
            del first_seen[pg_id]
    for bundle, count in task_demand[:_MAX_DEMANDS]:
        clean = _resources(bundle)
        if clean and count > 0:
            waiting.append(
                {
                    "kind": "tasksAndActors",
                    "bundle": clean,
                    "count": int(count),
                    "infeasible": not any(_fits(clean, n) for n in node_totals),
                }
            )
    waiting.sort(key=lambda w: -w.get("pendingSeconds", 0.0))
    cluster: dict[str, float] = {}
    for node in node_totals:
        for k, v in _resources(node).items():
            if not k.startswith(("memory", "object_store_memory")):
                cluster[k] = cluster.get(k, 0.0) + v
    return {
        "trials": len(pending_trials),
        "oldestPendingSeconds": round(max(pending_trials.values()), 1) if pending_trials else 0.0,
        "waitingFor": waiting[:_MAX_DEMANDS],
        "clusterResources": dict(sorted(cluster.items())),
        "pendingLaunches": pending_launches,
        "failedLaunches": failed_launches,
    }


def read_ray_demand() -> tuple[dict[str, Any], list[dict[str, float]], list[tuple[dict[str, float], int]], int, int]:
    """(placement groups, alive nodes' totals, task/actor demand, pending launches, failed launches) from the connected
    Ray: the GCS's placement-group table (no dashboard needed) and the autoscaler's cluster status, which a local Ray
    serves too. Every part is best effort: what cannot be read is left empty."""
    import ray

    groups: dict[str, Any] = {}
    nodes: list[dict[str, float]] = []
    demand: list[tuple[dict[str, float], int]] = []
    pending_launches = failed_launches = 0
    if not ray.is_initialized():
        return groups, nodes, demand, pending_launches, failed_launches
    try:
        groups = dict(ray.util.placement_group_table())
    except Exception as exc:  # progress is best effort; never fail the sweep on it
        logger.debug("placement group table unavailable: %s", exc)
    try:
        nodes = [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]
    except Exception as exc:
        logger.debug("node table unavailable: %s", exc)
    try:
        from ray.autoscaler.v2.sdk import get_cluster_status

        status = get_cluster_status(ray.get_runtime_context().gcs_address, timeout=5)
        for item in status.resource_demands.ray_task_actor_demand:
            demand += [(dict(b.bundle), int(b.count)) for b in item.bundles_by_count]
        pending_launches = sum(int(getattr(launch, "count", 1) or 1) for launch in status.pending_launches)
        failed_launches = sum(int(getattr(launch, "count", 1) or 1) for launch in status.failed_launches)
    except Exception as exc:
        logger.debug("autoscaler cluster status unavailable: %s", exc)
    return groups, nodes, demand, pending_launches, failed_launches


def result_document(
    trials: list[TrialSummary],
    metric: str | None,
    mode: str | None,
    *,
    run: dict[str, str],
    deadline_reached: bool = False,
    attempt_facts: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The final file: best trial (its checkpoint a full URI), counts, every trial, errors, finishedAt; over every
    trial of every attempt (a resumed run's Tune experiment holds them all), with `attempt_facts` as in the status."""
    return {
        **run,
        **(attempt_facts or {}),
        "bestTrial": best_trial(trials, metric, mode),
        "trials": trial_counts(trials),
        "trialResults": [
            {
                "id": t.id,
                "status": t.status,
                "config": t.config,
                "value": t.value,
                "checkpointUri": t.checkpoint_uri,
                "reports": t.reports,
            }
            for t in trials
        ],
        "errors": [{"trial": t.id, "error": t.error} for t in trials if t.error],
        "deadlineReached": deadline_reached,
        "finishedAt": utc_now(),
    }


def public_config(config: dict[str, Any]) -> dict[str, Any]:
    """A trial's hyper-parameters without the sweep context the trial driver adds."""
    return {k: v for k, v in config.items() if k != CONTEXT_KEY}


def summarize_trial(
    trial: Any, metric: str | None, mode: str | None, run_root: str, last_checkpoint: str | None = None
) -> TrialSummary:
    """A live `ray.tune.experiment.Trial` as a TrialSummary (best value over all its results so far). Its checkpoint
    is the last one any of its results named (`last_checkpoint`): a loop that checkpoints every other report has one
    between them too."""
    value = None
    if metric and mode in ("min", "max"):
        value = _finite((trial.metric_analysis.get(metric) or {}).get(mode))
    last = trial.last_result or {}
    checkpoint = last.get(CHECKPOINT_PATH_KEY) or last_checkpoint
    iteration = last.get("training_iteration")
    return TrialSummary(
        id=trial.trial_id,
        status=trial.status,
        config=public_config(dict(trial.config)),
        value=value,
        checkpoint_uri=storage.to_uri(checkpoint, run_root) if checkpoint else None,
        reports=iteration if isinstance(iteration, int) and not isinstance(iteration, bool) else 0,
    )


def mark_completed(trial: Any) -> None:
    """Make Tune's saved state say this trial ended on its own terms (`done` in its last result).

    Tune 2.58 sets `done` on a returning trial by updating its last result in place
    (TuneController._process_trial_result, the RESULT_DUPLICATE branch), which leaves the run metadata's cached JSON
    (`_TrainingRunMetadata._cached_json`) as it was when last serialised: the experiment state can then record a
    finished trial without `done`, and a resume would take it for one the deadline stopped. Tune calls
    on_trial_complete (TuneController.stop_trial) before it marks the trial for the next experiment checkpoint, so
    dropping the cache here makes that checkpoint carry `done`; training_entrypoints.resume relies on it."""
    metadata = getattr(trial, "run_metadata", None)
    if metadata is not None:
        metadata.invalidate_cache()


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
        demand_reader: DemandReader | None = read_ray_demand,
        attempt_facts: Mapping[str, Any] | None = None,
    ):
        self.layout = layout
        self.attempt_facts = dict(attempt_facts or {})
        self.metric = metric
        self.mode = mode
        self.interval_s = interval_s
        self.trials: list[Any] = []
        self._clock = clock
        self._last_write = -math.inf
        self._writer: threading.Thread | None = None
        self._demand_reader = demand_reader
        self._trial_pending_since: dict[str, float] = {}
        self._group_pending_since: dict[str, float] = {}  # touched by the one writer thread only
        self._checkpoints: dict[str, str] = {}  # trial id -> the last checkpoint path its results named
        self._last_written: str | None = None  # the last document written, its time aside (the writer's own)
        # More facts for each status document (the tracker's `tracking` block); set by the driver, never pickled.
        self.extra_facts: Callable[[], Mapping[str, Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks with the experiment; live trials, threads and clocks stay behind.
        return {
            **self.__dict__,
            "trials": [],
            "_writer": None,
            "_trial_pending_since": {},
            "_group_pending_since": {},
            "_checkpoints": {},
            "extra_facts": None,
            "_last_written": None,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_checkpoints": {}, "extra_facts": None, "_last_written": None, **state})

    def summaries(self) -> list[TrialSummary]:
        return [
            summarize_trial(t, self.metric, self.mode, self.layout.root, self._checkpoints.get(str(t.trial_id)))
            for t in self.trials
        ]

    def pending_trials(self, trials: list[Any], now: float) -> dict[str, float]:
        """{trial id: seconds it has been PENDING}, measured from when this callback first saw it pending."""
        pending = {str(t.trial_id) for t in trials if t.status == "PENDING"}
        self._trial_pending_since = {tid: self._trial_pending_since.get(tid, now) for tid in pending}
        return {tid: now - since for tid, since in self._trial_pending_since.items()}

    def _write(
        self, document: dict[str, Any], pending_trials: dict[str, float] | None = None, now: float = 0.0
    ) -> None:
        if self._demand_reader is not None and pending_trials is not None:
            try:
                groups, nodes, demand, launching, failed = self._demand_reader()
                document["pending"] = summarize_pending(
                    pending_trials, groups, nodes, demand, self._group_pending_since, now,
                    pending_launches=launching, failed_launches=failed,
                )  # fmt: skip
            except Exception as exc:  # what Ray waits for is a diagnosis: never worth failing a status write
                logger.warning("could not read Ray's resource demand: %s", exc)
        # A document that says nothing new (its time aside) is not written again: the operator asks for it with the
        # ETag of the copy it read and downloads it again only when it changed, and a running sweep's trials may
        # report every few minutes while this writes every few seconds.
        content = json.dumps({k: v for k, v in document.items() if k != "updatedAt"}, sort_keys=True, default=str)
        if content == self._last_written:
            return
        try:
            storage.write_json(self.layout.status_path, document)
        except OSError as exc:  # progress is best effort; the sweep itself must not fail on it
            logger.warning("could not write %s: %s", self.layout.status_path, exc)
            return
        self._last_written = content

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
        now = self._last_write = self._clock()
        document = status_document(self.summaries(), self.metric, self.mode, attempt_facts=self.attempt_facts)
        if self.extra_facts is not None:
            document.update(self.extra_facts())
        pending = self.pending_trials(self.trials, now)
        self._writer = threading.Thread(
            target=self._write, args=(document, pending, now), name="sweep-status", daemon=True
        )
        self._writer.start()

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self._maybe_write(trials)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._maybe_write(trials)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict, **info: Any) -> None:
        checkpoint = result.get(CHECKPOINT_PATH_KEY)
        if isinstance(checkpoint, str) and checkpoint:
            self._checkpoints[str(trial.trial_id)] = checkpoint
        self._maybe_write(trials)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        mark_completed(trial)
        self._maybe_write(trials)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._maybe_write(trials)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        # The driver writes the final status next; no earlier write may land after it.
        self.trials = list(trials)
        self.flush()
