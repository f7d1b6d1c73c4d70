"""Namespace GPU budgets in memory: what each namespace has admitted and its FIFO queue (R21).

One active operator (kopf peering) owns the ledger; it is loaded from the API once per namespace and then
kept by the operator's own admissions and releases, so two sweeps can never be admitted into the same
free GPUs by handlers running at once.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep_contracts.api import TERMINAL_PHASES, Phase, SweepSpec
from sweep_contracts.problems import SpecError
from sweep_contracts.spec_checks import parse_spec

from .policy import AdmissionDecision, Admit, Demand, Queue, decide_admission, demand_of
from .settings import OperatorLimits
from .status import read_status


@dataclass(frozen=True)
class QueuedSweep:
    name: str
    created: str
    demand: Demand


class AdmissionLedger:
    def __init__(
        self,
        load_namespace: Callable[[str], Sequence[Mapping[str, Any]]],
        load_runs: Callable[[str], list[tuple[str, Demand]]] | None = None,
    ):
        """`load_runs(namespace)`: (sweep, demand) of each unfinished RayJob of ours there. A crash between a
        RayJob's create and the sweep's status write leaves a run the sweeps' statuses do not show; it holds GPUs."""
        self._load_namespace = load_namespace
        self._load_runs = load_runs
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._guard = threading.Lock()
        self._loaded: set[str] = set()
        self.admitted: dict[str, dict[str, Demand]] = defaultdict(dict)  # changed through _admit/_drop only
        self.queued: dict[str, dict[str, QueuedSweep]] = defaultdict(dict)
        # Each namespace's admitted demand summed as it changes: summing `admitted` on every admission was O(N) per
        # sweep, O(N^2) for a burst (docs/benchmarks.md).
        self._in_use: dict[str, Demand] = defaultdict(Demand)

    def _admit(self, namespace: str, name: str, demand: Demand) -> None:
        self._drop(namespace, name)
        self.admitted[namespace][name] = demand
        self._in_use[namespace] += demand

    def _drop(self, namespace: str, name: str) -> None:
        old = self.admitted[namespace].pop(name, None)
        if old is not None:
            total = self._in_use[namespace]
            self._in_use[namespace] = Demand(total.workers - old.workers, total.gpus - old.gpus)

    def _lock(self, namespace: str) -> threading.Lock:
        with self._guard:
            return self._locks[namespace]

    def _ensure_loaded(self, namespace: str) -> None:
        if namespace in self._loaded:
            return
        for obj in self._load_namespace(namespace):
            meta, status = obj.get("metadata") or {}, read_status(obj.get("status"))
            name = meta.get("name", "")
            try:
                spec = parse_spec(obj.get("spec"))
            except SpecError:
                continue
            if meta.get("deletionTimestamp") or status.phase in TERMINAL_PHASES:
                continue
            if status.kueue is not None:  # Kueue mode: Kueue's quota holds it, not this budget (docs/kueue.md)
                continue
            if status.run_id:
                self._admit(namespace, name, demand_of(spec))
            elif status.phase == Phase.QUEUED:
                self.queued[namespace][name] = QueuedSweep(name, meta.get("creationTimestamp") or "", demand_of(spec))
        for name, demand in self._load_runs(namespace) if self._load_runs else ():
            if name not in self.admitted[namespace]:
                self._admit(namespace, name, demand)
                self.queued[namespace].pop(name, None)
        self._loaded.add(namespace)

    def decide(
        self, namespace: str, name: str, created: str, spec: SweepSpec, limits: OperatorLimits, *, record: bool = True
    ) -> AdmissionDecision:
        """Admit, Queue or Reject `name`, strictly FIFO by creationTimestamp within the namespace; `record`: the
        admission or queue place is recorded under the same lock (False: the answer only)."""
        with self._lock(namespace):
            self._ensure_loaded(namespace)
            admitted = self.admitted[namespace]
            if name in admitted:
                return Admit(admitted[name])
            in_use = self._in_use[namespace]  # `name` is not admitted (above)
            decision = decide_admission(spec, limits, in_use)
            if isinstance(decision, Admit) and decision.demand.gpus:
                ahead = sorted(
                    (
                        q
                        for q in self.queued[namespace].values()
                        if q.name != name and (q.created, q.name) < (created, name) and q.demand.gpus
                    ),
                    key=lambda q: (q.created, q.name),
                )
                if ahead:
                    decision = Queue(
                        decision.demand,
                        f"waiting behind {len(ahead)} older queued sweep(s) in this namespace "
                        f"({', '.join(q.name for q in ahead[:3])}{', ...' if len(ahead) > 3 else ''})",
                    )
            if not record:
                return decision
            if isinstance(decision, Admit):
                self._admit(namespace, name, decision.demand)
                self.queued[namespace].pop(name, None)
            elif isinstance(decision, Queue):
                self.queued[namespace][name] = QueuedSweep(name, created, decision.demand)
            return decision

    def release(self, namespace: str, name: str) -> list[str]:
        """Forget `name`'s admission or queue place; returns the namespace's queue in FIFO order."""
        with self._lock(namespace):
            self._drop(namespace, name)
            self.queued[namespace].pop(name, None)
        return self.queued_in(namespace)

    def queued_in(self, namespace: str) -> list[str]:
        """The namespace's queue in FIFO order."""
        with self._lock(namespace):
            return [q.name for q in sorted(self.queued[namespace].values(), key=lambda q: (q.created, q.name))]

    def in_use(self, namespace: str) -> Demand:
        with self._lock(namespace):
            return self._in_use[namespace]
