"""Prometheus metrics of the operator (own registry, so several operators can live in one test process)."""

from __future__ import annotations

from collections import Counter as _Tally
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .api import Phase

PHASES: tuple[str, ...] = Phase.__args__  # type: ignore[attr-defined]


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.sweeps = Gauge("trainingsweep_sweeps", "TrainingSweeps by phase", ["phase"], registry=self.registry)
        self.queued = Gauge("trainingsweep_queued_sweeps", "Sweeps waiting for namespace GPU budget", registry=self.registry)
        self.reconcile_seconds = Histogram(
            "trainingsweep_reconcile_seconds", "Time to reconcile one sweep", registry=self.registry
        )
        self.verification_seconds = Histogram(
            "trainingsweep_verification_seconds",
            "Time to verify a run's checkpoints in S3",
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900),
            registry=self.registry,
        )
        self.verification_failures = Counter(
            "trainingsweep_verification_failures", "Verifications that did not verify", registry=self.registry
        )
        self.deadline_stops = Counter(
            "trainingsweep_deadline_stops", "RayJobs stopped by the sweep deadline", registry=self.registry
        )
        self.guard_holds = Counter(
            "trainingsweep_guard_holds", "Deletions held by the checkpoint guard", ["kind"], registry=self.registry
        )
        self._phases: dict[str, str] = {}
        for phase in PHASES:
            self.sweeps.labels(phase=phase).set(0)

    def observe_phase(self, uid: str, phase: str | None) -> None:
        if phase is None:
            self._phases.pop(uid, None)
        else:
            self._phases[uid] = phase
        tally = _Tally(self._phases.values())
        for name in PHASES:
            self.sweeps.labels(phase=name).set(tally.get(name, 0))
        self.queued.set(tally.get("Queued", 0))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve /metrics on `port` in a background thread; returns the server (call .shutdown())."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
