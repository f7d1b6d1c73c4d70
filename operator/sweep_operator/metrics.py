"""Prometheus metrics of the operator (own registry, so several operators can live in one test process).

Names follow Prometheus' conventions (`_total` counters, `_seconds` units, `_timestamp_seconds` for points in
time) under `trainingsweep_`, labelled `namespace` and `sweep` as KubeRay labels its `kuberay_job_*` series.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as _Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sweep_contracts import constants
from sweep_contracts.api import TERMINAL_PHASES, Phase

from .gpu_time import NamespaceBudget, UsageLedger
from .status import epoch_seconds, read_status

PHASES: tuple[str, ...] = tuple(Phase)
PREFIX = "trainingsweep_"

RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A gone sweep's counter series stay this long (many scrape intervals), then go with the next sweep that goes.
SERIES_RETENTION_S = 900.0
VERIFICATION_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)

# Series the state collector produces at each scrape (name -> help), listed so tests and the chart's dashboard
# check can name every exported metric without scraping.
STATE_GAUGES: dict[str, str] = {
    "trainingsweep_sweeps": "TrainingSweeps the operator knows, by namespace and phase",
    "trainingsweep_sweep_phase": "1 for each sweep's current phase (as kuberay_job_deployment_status does for RayJobs)",
    "trainingsweep_queued_sweeps": "Sweeps waiting Queued for namespace GPU budget",
    "trainingsweep_sweep_queued_timestamp_seconds": "When a Queued sweep was queued (status.queuedAt), Unix time",
    "trainingsweep_admitted_gpus": "GPUs admitted to the namespace's running sweeps (status.replicas.gpus)",
    "trainingsweep_namespace_gpu_budget": "The namespace GPU budget (maxGpusPerNamespace)",
    "trainingsweep_guard_holding_objects": "Objects whose deletion the checkpoint guard holds, by namespace and kind",
    "trainingsweep_guard_holding_since_timestamp_seconds": "When the deletion the guard holds was asked for (deletionTimestamp), Unix time",
}
# GPU-hour budget series, also built at scrape; present only where a sweep or namespace has a record or a
# budget (a budget of "none" is no series, not 0).
BUDGET_GAUGES: dict[str, str] = {
    "trainingsweep_sweep_gpu_hours": "GPU-hours the sweep's GPU pods have held, scheduled to gone (status.usage)",
    "trainingsweep_sweep_gpu_hours_budget": "The sweep's GPU-hour budget (spec.budget.gpuHours)",
    "trainingsweep_namespace_gpu_hours": "GPU-hours the namespace's sweeps held inside its rolling budget window",
    "trainingsweep_namespace_gpu_hours_budget": "The namespace's GPU-hour budget per window (budgets.namespaceGpuHours)",
}


def run_root_identity(root: str) -> tuple[str, str]:
    """(namespace, sweep) of a run root `<storage.uri>/<namespace>/<sweep>-<runId>` (s3_layout.run_root);
    run ids hold no '-' (rendering.check_run_id)."""
    parts = root.rstrip("/").split("/")
    if len(parts) < 2:
        return "", ""
    return parts[-2], parts[-1].rsplit("-", 1)[0]


@dataclass(frozen=True)
class GaugedSweep:
    """What the state gauges need of one sweep."""

    namespace: str
    name: str
    phase: str
    queued_at: float | None = None
    deleting_since: float | None = None
    gpus: int = 0
    admitted: bool = False
    usage: UsageLedger | None = None  # status.usage, when the sweep has one
    gpu_hours_budget: float | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> GaugedSweep:
        meta, status = body.get("metadata") or {}, read_status(body.get("status"))
        phase = status.phase or Phase.PENDING
        deleting = epoch_seconds(meta.get("deletionTimestamp"))
        # The ledger's own rule for what holds budget (admission_ledger.AdmissionLedger._ensure_loaded).
        admitted = bool(status.run_id) and deleting is None and phase not in TERMINAL_PHASES
        gpus = status.replicas.gpus if status.replicas is not None else None
        budget = ((body.get("spec") or {}).get("budget") or {}).get("gpuHours")
        return cls(
            namespace=meta.get("namespace") or "default",
            name=meta.get("name") or "",
            phase=phase,
            queued_at=epoch_seconds(status.queued_at) if phase == Phase.QUEUED else None,
            deleting_since=deleting,
            gpus=gpus if isinstance(gpus, int) and admitted else 0,
            admitted=admitted,
            usage=UsageLedger.from_status(status.usage) if status.usage is not None else None,
            gpu_hours_budget=float(budget)
            if isinstance(budget, (int, float)) and not isinstance(budget, bool)
            else None,
        )


@dataclass(frozen=True)
class _Hold:
    namespace: str
    sweep: str
    since: float


class OperatorMetrics:
    """The operator's metrics. Counters and histograms are observed where things happen; the gauges of state
    (phases, queue, budget, guard holds) are computed at each scrape from the sweeps the controller knows
    (`follow`), so they are right after a restart, not only after the next transition."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry()
        self._clock = clock
        self._lock = threading.Lock()
        self._sweeps: dict[str, GaugedSweep] = {}  # uid (or name) -> facts
        self._holds: dict[tuple[str, str, str], _Hold] = {}  # (kind, namespace, name) -> hold
        self._source: Callable[[], Iterable[Mapping[str, Any]]] | None = None
        self._gpu_budget: int | None = None
        self._gpu_hour_budget: Callable[[str], NamespaceBudget | None] | None = None
        self._gpu_hour_ledgers: Callable[[], Mapping[str, Any]] | None = None
        self._namespaces: set[str] = set()  # every namespace seen keeps its zero series (0, not absent)
        self._gone: dict[tuple[str, str], float] = {}  # (namespace, sweep) -> when it went (its series go later)
        self.reconcile_seconds = Histogram(
            "trainingsweep_reconcile_duration_seconds",
            "Time to reconcile one sweep",
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        self.verification_seconds = Histogram(
            "trainingsweep_verification_duration_seconds",
            "Time to verify a run's checkpoints in S3",
            ["namespace"],
            buckets=VERIFICATION_BUCKETS,
            registry=self.registry,
        )
        self.verifications = Counter(
            "trainingsweep_verifications",
            "Checkpoint verifications, by result (verified, not_verified)",
            ["namespace", "sweep", "result"],
            registry=self.registry,
        )
        self.verification_failures = Counter(
            "trainingsweep_verification_failures",
            "Verifications that did not verify",
            ["namespace", "sweep"],
            registry=self.registry,
        )
        self.deadline_stops = Counter(
            "trainingsweep_deadline_stops",
            "RayJobs the operator stopped at the sweep deadline",
            ["namespace", "sweep"],
            registry=self.registry,
        )
        self.guard_holds = Counter(
            "trainingsweep_guard_holds",
            "Deletions held by the checkpoint guard (one per hold, retries included)",
            ["namespace", "sweep", "kind"],
            registry=self.registry,
        )
        self.budget_thresholds = Counter(
            "trainingsweep_budget_thresholds",
            "GPU-hour budget thresholds a sweep crossed (80, 100 percent), once each",
            ["namespace", "sweep", "threshold"],
            registry=self.registry,
        )
        self.guard_bypasses = Counter(
            "trainingsweep_guard_bypasses",
            "Deletions released through the escape hatch, unverified",
            ["namespace", "sweep", "kind"],
            registry=self.registry,
        )
        self.idle_gpu_seconds = Counter(
            "trainingsweep_idle_gpu_seconds",
            "GPU-seconds held without training, by cause (held-deletion: GPU workers of a cluster whose deletion "
            "the guard holds, counted when the operator frees them)",
            ["namespace", "sweep", "cause"],
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self))

    # ------------------------------------------------------------------ events of the controller
    def reconcile_finished(self, seconds: float) -> None:
        self.reconcile_seconds.observe(seconds)

    def verification_finished(self, root: str, seconds: float, verified: bool) -> None:
        namespace, sweep = run_root_identity(root)
        self.verification_seconds.labels(namespace=namespace).observe(seconds)
        self.verifications.labels(
            namespace=namespace, sweep=sweep, result="verified" if verified else "not_verified"
        ).inc()
        if not verified:
            self.verification_failures.labels(namespace=namespace, sweep=sweep).inc()

    def deadline_stopped(self, namespace: str, sweep: str) -> None:
        self.deadline_stops.labels(namespace=namespace, sweep=sweep).inc()

    def guard_held(self, kind: str, body: Mapping[str, Any], sweep: str | None = None) -> None:
        """The guard holds `body`'s deletion; its age counts from the deletionTimestamp (restart-proof)."""
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
        sweep = (
            sweep or (meta.get("labels") or {}).get(constants.LABEL_SWEEP) or (name if kind == "TrainingSweep" else "")
        )
        since = epoch_seconds(meta.get("deletionTimestamp")) or self._clock()
        self.guard_holds.labels(namespace=namespace, sweep=sweep, kind=kind).inc()
        with self._lock:
            held = self._holds.get((kind, namespace, name))
            self._holds[(kind, namespace, name)] = _Hold(namespace, sweep, min(since, held.since) if held else since)

    def budget_threshold_crossed(self, namespace: str, sweep: str, threshold: int) -> None:
        """Once per sweep and threshold: the controller records the crossing in status.usage.thresholdsReported."""
        self.budget_thresholds.labels(namespace=namespace, sweep=sweep, threshold=str(threshold)).inc()

    def guard_bypassed(self, kind: str, namespace: str, sweep: str) -> None:
        self.guard_bypasses.labels(namespace=namespace, sweep=sweep, kind=kind).inc()

    def idle_gpus(self, namespace: str, sweep: str, cause: str, gpu_seconds: float) -> None:
        self.idle_gpu_seconds.labels(namespace=namespace, sweep=sweep, cause=cause).inc(gpu_seconds)

    def _per_sweep(self) -> tuple[Counter, ...]:
        return (
            self.verifications,
            self.verification_failures,
            self.deadline_stops,
            self.guard_holds,
            self.budget_thresholds,
            self.guard_bypasses,
            self.idle_gpu_seconds,
        )

    def sweep_gone(self, namespace: str, sweep: str) -> None:
        """The sweep left the cluster: its per-sweep counter series go SERIES_RETENTION_S later, so a long-running
        operator's /metrics does not grow with every sweep it ever ran. Not at once: a counter bumped as the sweep
        goes (a bypass, a hold's last verification) must be scraped first, or its alert never sees the increase.
        The series of sweeps gone longer ago are removed now; a sweep of that name created again keeps its own."""
        now = self._clock()
        with self._lock:
            self._gone[(namespace, sweep)] = now
            due = [k for k, at in self._gone.items() if now - at >= SERIES_RETENTION_S]
            for key in due:
                del self._gone[key]
            live = {(f.namespace, f.name) for f in self._sweeps.values()}  # as of the last scrape
        for ns, name in due:
            if (ns, name) in live:
                continue
            for counter in self._per_sweep():
                counter.remove_by_labels({"namespace": ns, "sweep": name})

    def guard_released(self, kind: str, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        with self._lock:
            self._holds.pop((kind, meta.get("namespace") or "default", meta.get("name") or ""), None)

    # ------------------------------------------------------------------ state
    def follow(
        self,
        source: Callable[[], Iterable[Mapping[str, Any]]],
        *,
        gpu_budget: int | None = None,
        gpu_hour_budget: Callable[[str], NamespaceBudget | None] | None = None,
        gpu_hour_ledgers: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        """Compute the state gauges at each scrape from `source()` (the controller's cached sweeps);
        `gpu_hour_budget(namespace)` is the namespace's GPU-hour budget, if any; `gpu_hour_ledgers()` the namespaces'
        GPU-hour ledgers the operator last read or wrote (hours_ledger.HoursLedger, by namespace)."""
        self._source = source
        self._gpu_budget = gpu_budget
        self._gpu_hour_budget = gpu_hour_budget
        self._gpu_hour_ledgers = gpu_hour_ledgers

    def recompute(self, sweeps: Iterable[Mapping[str, Any]]) -> None:
        """Replace what the state gauges know with these sweep objects (a list or the controller's cache)."""
        facts = {}
        for body in sweeps:
            meta = body.get("metadata") or {}
            facts[meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"] = GaugedSweep.of(body)
        with self._lock:
            self._sweeps = facts
            known = {(f.namespace, f.name) for f in facts.values()}
            # A hold on a sweep that is gone was released (its deletion completed).
            for key in [k for k in self._holds if k[0] == "TrainingSweep" and (k[1], k[2]) not in known]:
                del self._holds[key]

    def observe_phase(
        self, uid: str, phase: str | None, namespace: str | None = None, sweep: str | None = None
    ) -> None:
        """A phase transition (None: the sweep is gone); thread-safe, the reconcile workers call it at once."""
        with self._lock:
            if phase is None:
                self._sweeps.pop(uid, None)
                return
            known = self._sweeps.get(uid)
            if known is not None:
                self._sweeps[uid] = replace(known, phase=phase)
            else:
                self._sweeps[uid] = GaugedSweep(namespace or "default", sweep or uid, phase)

    def _state(self) -> tuple[list[GaugedSweep], dict[tuple[str, str, str], _Hold], list[str]]:
        source = self._source
        if source is not None:
            self.recompute(list(source()))
        with self._lock:
            self._namespaces |= {s.namespace for s in self._sweeps.values()} | {
                h.namespace for h in self._holds.values()
            }
            return list(self._sweeps.values()), dict(self._holds), sorted(self._namespaces)

    # ------------------------------------------------------------------ exposition
    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def metric_names(self) -> set[str]:
        """Every series name this registry exports (counters with `_total`, histograms with their parts)."""
        names = set(STATE_GAUGES) | set(BUDGET_GAUGES)
        for collector in (
            self.reconcile_seconds,
            self.verification_seconds,
            self.verifications,
            self.verification_failures,
            self.deadline_stops,
            self.guard_holds,
            self.budget_thresholds,
            self.idle_gpu_seconds,
        ):
            for family in collector.describe():
                if family.type == "counter":
                    names |= {f"{family.name}_total", f"{family.name}_created"}
                elif family.type == "histogram":
                    names |= {f"{family.name}_{part}" for part in ("bucket", "count", "sum", "created")}
                else:
                    names.add(family.name)
        return names

    def total(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels` (e.g. total("trainingsweep_deadline_stops_total"))."""
        return sum(
            sample.value
            for family in self.registry.collect()
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve /metrics on `port` in a background thread; returns the server (call .shutdown())."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server


class _StateCollector(Collector):
    """The state gauges, built at scrape time (a restarted operator reports its steady sweeps at once)."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterator[Metric]:
        for name, help_ in {**STATE_GAUGES, **BUDGET_GAUGES}.items():
            yield GaugeMetricFamily(name, help_)

    def collect(self) -> Iterator[Metric]:
        sweeps, holds, namespaces = self.metrics._state()
        yield from self._phases(sweeps, namespaces)
        yield from self._admitted(sweeps, namespaces)
        yield from self._gpu_hours(sweeps, namespaces)
        yield from self._holds(sweeps, holds, namespaces)

    def _phases(self, sweeps: list[GaugedSweep], namespaces: list[str]) -> Iterator[Metric]:
        """Sweeps per phase, each sweep's phase, the queued ones and since when."""
        by_phase = GaugeMetricFamily(
            "trainingsweep_sweeps", STATE_GAUGES["trainingsweep_sweeps"], labels=["namespace", "phase"]
        )
        tally = _Tally((s.namespace, s.phase) for s in sweeps)
        for namespace in namespaces:
            for phase in PHASES:
                by_phase.add_metric([namespace, phase], tally.get((namespace, phase), 0))
        yield by_phase

        phase_of = GaugeMetricFamily(
            "trainingsweep_sweep_phase",
            STATE_GAUGES["trainingsweep_sweep_phase"],
            labels=["namespace", "sweep", "phase"],
        )
        for s in sorted(sweeps, key=lambda s: (s.namespace, s.name)):
            phase_of.add_metric([s.namespace, s.name, s.phase], 1)
        yield phase_of

        queued = GaugeMetricFamily(
            "trainingsweep_queued_sweeps", STATE_GAUGES["trainingsweep_queued_sweeps"], labels=["namespace"]
        )
        for namespace in namespaces:
            queued.add_metric([namespace], tally.get((namespace, Phase.QUEUED), 0))
        yield queued

        queued_at = GaugeMetricFamily(
            "trainingsweep_sweep_queued_timestamp_seconds",
            STATE_GAUGES["trainingsweep_sweep_queued_timestamp_seconds"],
            labels=["namespace", "sweep"],
        )
        for s in sweeps:
            if s.phase == Phase.QUEUED and s.queued_at is not None:
                queued_at.add_metric([s.namespace, s.name], s.queued_at)
        yield queued_at

    def _admitted(self, sweeps: list[GaugedSweep], namespaces: list[str]) -> Iterator[Metric]:
        """GPUs admitted per namespace, and the namespace GPU budget."""
        gpus = GaugeMetricFamily(
            "trainingsweep_admitted_gpus", STATE_GAUGES["trainingsweep_admitted_gpus"], labels=["namespace"]
        )
        budget = GaugeMetricFamily(
            "trainingsweep_namespace_gpu_budget",
            STATE_GAUGES["trainingsweep_namespace_gpu_budget"],
            labels=["namespace"],
        )
        admitted: _Tally[str] = _Tally()
        for s in sweeps:
            admitted[s.namespace] += s.gpus
        for namespace in namespaces:
            gpus.add_metric([namespace], admitted.get(namespace, 0))
            if self.metrics._gpu_budget is not None:
                budget.add_metric([namespace], self.metrics._gpu_budget)
        yield gpus
        yield budget

    def _holds(
        self, sweeps: list[GaugedSweep], holds: dict[tuple[str, str, str], _Hold], namespaces: list[str]
    ) -> Iterator[Metric]:
        """What the guard holds, per kind, and since when."""
        # The sweep's own guard holds while its deletion is pending (the finalizer is the guard's); RayJob and
        # RayCluster holds are the ones the guard reported.
        all_holds = dict(holds)
        for s in sweeps:
            if s.deleting_since is not None:
                all_holds.setdefault(
                    ("TrainingSweep", s.namespace, s.name), _Hold(s.namespace, s.name, s.deleting_since)
                )
        counts = GaugeMetricFamily(
            "trainingsweep_guard_holding_objects",
            STATE_GAUGES["trainingsweep_guard_holding_objects"],
            labels=["namespace", "kind"],
        )
        per_kind = _Tally((h.namespace, kind) for (kind, _, _), h in all_holds.items())
        for namespace in namespaces:
            for kind in ("TrainingSweep", "RayJob", "RayCluster"):
                counts.add_metric([namespace, kind], per_kind.get((namespace, kind), 0))
        yield counts
        since = GaugeMetricFamily(
            "trainingsweep_guard_holding_since_timestamp_seconds",
            STATE_GAUGES["trainingsweep_guard_holding_since_timestamp_seconds"],
            labels=["namespace", "sweep", "kind", "name"],
        )
        for (kind, namespace, name), hold in sorted(all_holds.items()):
            since.add_metric([namespace, hold.sweep, kind, name], hold.since)
        yield since

    def _gpu_hours(self, sweeps: list[GaugedSweep], namespaces: list[str]) -> Iterator[Metric]:
        """GPU-hours recomputed from each sweep's recorded pod intervals up to the scrape (a running pod's hours grow
        between the operator's status writes)."""
        now = self.metrics._clock()
        used = GaugeMetricFamily(
            "trainingsweep_sweep_gpu_hours",
            BUDGET_GAUGES["trainingsweep_sweep_gpu_hours"],
            labels=["namespace", "sweep"],
        )
        budget = GaugeMetricFamily(
            "trainingsweep_sweep_gpu_hours_budget",
            BUDGET_GAUGES["trainingsweep_sweep_gpu_hours_budget"],
            labels=["namespace", "sweep"],
        )
        for s in sorted(sweeps, key=lambda s: (s.namespace, s.name)):
            if s.usage is not None:
                used.add_metric([s.namespace, s.name], s.usage.gpu_hours(now))
            if s.gpu_hours_budget is not None:
                budget.add_metric([s.namespace, s.name], s.gpu_hours_budget)
        yield used
        yield budget
        window_used = GaugeMetricFamily(
            "trainingsweep_namespace_gpu_hours",
            BUDGET_GAUGES["trainingsweep_namespace_gpu_hours"],
            labels=["namespace"],
        )
        window_budget = GaugeMetricFamily(
            "trainingsweep_namespace_gpu_hours_budget",
            BUDGET_GAUGES["trainingsweep_namespace_gpu_hours_budget"],
            labels=["namespace"],
        )
        budget_of = self.metrics._gpu_hour_budget
        # The namespace's ledger, deleted sweeps included; the sweeps' own records only before it was read here.
        ledgers = dict(self.metrics._gpu_hour_ledgers() if self.metrics._gpu_hour_ledgers is not None else {})
        for namespace in sorted(set(namespaces) | set(ledgers)):
            policy = budget_of(namespace) if budget_of is not None else None
            if policy is None:
                continue
            if namespace in ledgers:
                hours = float(ledgers[namespace].used(now))
            else:
                hours = (
                    sum(
                        s.usage.window_gpu_seconds(now, policy.window_seconds)
                        for s in sweeps
                        if s.namespace == namespace and s.usage is not None
                    )
                    / 3600.0
                )
            window_used.add_metric([namespace], hours)
            window_budget.add_metric([namespace], policy.gpu_hours)
        yield window_used
        yield window_budget
