"""The namespace's budgets as admission asks them, and the I/O a resume step is lent (resume.ResumePorts). Asking
only reads (the ledgers, the API, the caches); what changes the ledgers is carried out by the controller's `_act`
(`Budgets.reserve` for a ReserveBudget, `record_hours`, `release_hours`). They sit beside reads, above the decisions."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..gpu_time import NamespaceBudget, PodInterval
from ..kube import Conflict, KubeApi
from ..ledger import AdmissionLedger
from ..policy import AdmissionDecision, Admit
from ..rendering import RenderContext
from ..settings import Settings
from . import admission, attempts, kueue, resume, workloads
from .actions import Decision, ReserveBudget
from .facts import ObjectRef, SweepFacts, meta_of
from .hours_ledger import HoursLedger, decide_reservation, record_usage, release, seeded
from .reads import Reads
from .usage import GpuHourAsk, ReservationFacts, decide_gpu_hour_answer

log = logging.getLogger(__name__)
T = TypeVar("T")
INITIAL_ATTEMPT = "initial"
WRITE_ATTEMPTS = 32  # a burst's writers each lose at most once per other writer


class GpuHourLedgers:
    """The namespaces' GPUHourLedger objects (hours_ledger). A change is decided on the copy last read or written and
    written with that copy's resourceVersion; a write refused because another came first (a worker, an operator
    restarted or newly elected) is read again and decided again: no lock, in this process or any other, is needed."""

    def __init__(self, kube: KubeApi, sweeps_of: Callable[[str], list[dict[str, Any]]]) -> None:
        self.kube, self.sweeps_of = kube, sweeps_of
        self._known: dict[str, dict[str, Any] | None] = {}
        self._lock = threading.Lock()  # guards `_known` only

    def read(self, namespace: str, budget: NamespaceBudget, now: float, *, fresh: bool = False) -> HoursLedger:
        with self._lock:
            known, obj = namespace in self._known, self._known.get(namespace)
        if fresh or not known:
            obj = self.kube.get_ledger(namespace)
            with self._lock:
                self._known[namespace] = obj
        return HoursLedger.from_object(obj, budget)

    def change(
        self,
        namespace: str,
        budget: NamespaceBudget,
        now: float,
        decide: Callable[[HoursLedger], tuple[T, HoursLedger | None]],
        *,
        fresh: bool = False,
    ) -> T:
        """`decide` over the ledger; its new ledger (if any) written with the precondition, decided again on a
        refusal. `fresh`: decide on a read from the API even the first time (an admission)."""
        for attempt in range(WRITE_ATTEMPTS):
            ledger = self.read(namespace, budget, now, fresh=fresh or attempt > 0)
            result, new = decide(ledger)
            if new is not None and ledger.resource_version is None:
                # none yet: the first write creates it, with what the sweeps recorded themselves (decided again)
                result, new = decide(seeded(ledger, self.sweeps_of(namespace), now))
            if new is None:
                return result
            try:
                written = self.kube.write_ledger(new.to_object(namespace, now))
            except Conflict:
                log.debug("GPUHourLedger %s changed since it was read; deciding again", namespace)
                continue
            with self._lock:
                self._known[namespace] = written
            return result
        raise RuntimeError(f"GPUHourLedger {namespace}: {WRITE_ATTEMPTS} writes in a row were refused; retrying later")

    def peek(
        self,
        namespace: str,
        budget: NamespaceBudget,
        now: float,
        decide: Callable[[HoursLedger], tuple[T, HoursLedger | None]],
    ) -> T:
        """`decide`'s answer over a fresh read, as `change` would decide it first; nothing is written."""
        ledger = self.read(namespace, budget, now, fresh=True)
        result, new = decide(ledger)
        if new is not None and ledger.resource_version is None:
            result, _ = decide(seeded(ledger, self.sweeps_of(namespace), now))
        return result

    def all_cached(self, budget_of: Callable[[str], NamespaceBudget | None]) -> dict[str, HoursLedger]:
        """Every ledger last read or written, by namespace (the metrics' source)."""
        with self._lock:
            known = {ns: obj for ns, obj in self._known.items() if obj is not None}
        out = {}
        for namespace, obj in known.items():
            budget = budget_of(namespace)
            if budget is not None:
                out[namespace] = HoursLedger.from_object(obj, budget)
        return out

    def cached(self, namespace: str, budget: NamespaceBudget) -> HoursLedger | None:
        """The copy last read or written (None: not read yet): for views and metrics, never for a reservation."""
        with self._lock:
            obj = self._known.get(namespace)
        return HoursLedger.from_object(obj, budget) if obj is not None else None


class Budgets:
    """Kueue's rules (Kueue mode) or the namespace's GPU ledger, then the namespace's GPU-hour window."""

    def __init__(self, reads: Reads, ledger: AdmissionLedger, context: RenderContext) -> None:
        self.reads, self.ledger, self.context = reads, ledger, context
        self.hours = GpuHourLedgers(reads.kube, reads.namespace_sweeps)

    @property
    def settings(self) -> Settings:
        return self.reads.settings  # the controller's (tests change them in flight)

    def gpu_hour_budget(self, namespace: str) -> NamespaceBudget | None:
        hours = self.settings.namespace_gpu_hour_budget(namespace)
        return NamespaceBudget(hours, self.settings.gpu_hours_window_seconds) if hours else None

    def in_use(self, namespace: str) -> str:
        """`<GPUs admitted>/<maxGpusPerNamespace>` in the namespace (the -o wide NS-BUDGET column)."""
        return f"{self.ledger.in_use(namespace).gpus}/{self.settings.limits.max_gpus_per_namespace}"

    def ask(self, facts: SweepFacts, spec: Any, *, record: bool = False) -> Any:
        """The GPU caps' answer for the sweep run with `spec`; `record` (`reserve` only): the ledger records it."""
        ref = facts.ref
        if workloads.our_queue_steps_aside(self.context.queue_name(spec, ref.namespace)):
            return kueue.decide_kueue_admission(spec, self.settings.limits)  # Kueue's quota, not our ledger
        created = meta_of(facts.body).get("creationTimestamp") or ""
        return self.ledger.decide(ref.namespace, ref.name, created, spec, self.settings.limits, record=record)

    def reserve(self, facts: SweepFacts, reservation: ReserveBudget) -> bool:
        """Carry out a ReserveBudget: the GPU caps and the GPU-hours decided again and recorded atomically, as the
        decision read them; False: the record no longer agrees with the decision (another admission came first)."""
        budget = self.ask(facts, reservation.spec, record=True)
        if not isinstance(budget, Admit):
            return not reservation.admitted
        hours = self.gpu_hours(facts, budget, spec=reservation.spec, attempt=reservation.attempt, record=True)
        return (hours is None) == reservation.admitted

    def gpu_hours(
        self, facts: SweepFacts, budget: Any, *, spec: Any = None, attempt: str = INITIAL_ATTEMPT, record: bool = False
    ) -> Decision | None:
        """The GPU-hour check beside the GPU caps: None admits; else the Invalid or Queued decision
        (docs/budgets.md). `spec`: the attempt's. `record` (`reserve` only): the attempt's hours are reserved in the
        namespace's ledger, and a refusal takes back the GPU caps' admission."""
        ref = facts.ref
        namespace = self.gpu_hour_budget(ref.namespace)
        uid = str(meta_of(facts.body).get("uid") or "")

        def reserve(ask: GpuHourAsk) -> AdmissionDecision:
            assert namespace is not None
            return (self.hours.change if record else self.hours.peek)(
                ref.namespace,
                namespace,
                facts.now,
                lambda ledger: decide_reservation(
                    ledger,
                    uid=uid,
                    name=ref.name,
                    attempt=attempt,
                    worst_case=ask.worst_case,
                    run_until_exhausted=ask.run_until_exhausted,
                    sweep_left=ask.sweep_left,
                    now=facts.now,
                    worst_case_text=ask.worst_case_text,
                ),
            )

        answer = decide_gpu_hour_answer(
            facts, budget, self.settings.limits, reserve if namespace is not None and uid else None, spec=spec
        )
        if answer is None:
            return None
        if record:
            self.ledger.release(ref.namespace, ref.name)  # the GPU caps admitted it; the hours do not
        return admission.decide_budget(facts, answer, self.in_use(ref.namespace), self.context)

    def namespace_hours(self, facts: SweepFacts) -> tuple[dict[str, Any] | None, ReservationFacts | None]:
        """The namespace's window as its ledger has it (status.usage.namespace) and this attempt's reservation."""
        namespace = self.gpu_hour_budget(facts.ref.namespace)
        if namespace is None:
            return None, None
        from .hours_ledger import view

        ledger = self.hours.cached(facts.ref.namespace, namespace) or self.hours.read(
            facts.ref.namespace, namespace, facts.now
        )
        entry = ledger.entry(str(meta_of(facts.body).get("uid") or ""))
        r = entry.reservation if entry is not None else None
        reservation = ReservationFacts(r.gpu_hours, r.since, r.run_until_exhausted) if r is not None else None
        return view(ledger, facts.now), reservation

    def record_hours(self, body: Mapping[str, Any], usage: Mapping[str, Any] | None, ended: bool, now: float) -> None:
        """The sweep's own record (status.usage) into its namespace's ledger; `ended`: its reservation goes."""
        meta = meta_of(body)
        namespace = self.gpu_hour_budget(meta.get("namespace") or "default")
        if namespace is None or not meta.get("uid"):
            return
        intervals = [i for i in (PodInterval.from_status(d) for d in (usage or {}).get("podIntervals") or []) if i]
        self.hours.change(
            meta.get("namespace") or "default",
            namespace,
            now,
            lambda ledger: (
                None,
                record_usage(
                    ledger,
                    uid=meta["uid"],
                    name=meta.get("name", ""),
                    intervals=intervals,
                    ended=ended,
                    now=now,
                    refresh_seconds=self.settings.usage_refresh_seconds,
                ),
            ),
        )

    def release_hours(self, body: Mapping[str, Any], *, deleted: bool, now: float) -> None:
        """The sweep's attempt is over, or the sweep is gone: its reservation goes, its hours stay in the window."""
        meta = meta_of(body)
        namespace = self.gpu_hour_budget(meta.get("namespace") or "default")
        if namespace is None or not meta.get("uid"):
            return
        self.hours.change(
            meta.get("namespace") or "default",
            namespace,
            now,
            lambda ledger: (None, release(ledger, uid=meta["uid"], deleted=deleted, now=now)),
        )


def resume_ports(facts: SweepFacts, budgets: Budgets) -> tuple[resume.ResumePorts, list[ReserveBudget]]:
    """What a resume step may ask for this sweep: verify afresh, read the run's records, ask the namespace's budgets
    as an admission does (the RayJob's create, the Events and the budgets' record of the answer, the ReserveBudget
    listed here, are carried out by `_act`)."""
    reads, ref = budgets.reads, facts.ref
    asked: list[ReserveBudget] = []

    def admit(sweep: Any, decision: Any = None) -> str | None:
        """The attempt's own deadline makes its worst case; its reservation is its own (resume-<n>)."""
        spec = attempts.attempt_sweep(sweep, decision).spec if decision is not None else sweep.spec
        attempt = f"resume-{decision.attempt}" if decision is not None else INITIAL_ATTEMPT
        budget = budgets.ask(facts, spec)
        hours = budgets.gpu_hours(facts, budget, spec=spec, attempt=attempt) if isinstance(budget, Admit) else None
        refusal = resume.budget_refusal(budget, hours)
        asked.append(ReserveBudget(spec, attempt, admitted=refusal is None))
        return refusal

    ports = resume.ResumePorts(
        verify=lambda target: reads.verify(target, pooled=False),
        documents=reads.run_documents,
        rayjob=lambda name: reads.rayjob(ObjectRef(ref.namespace, name)),
        admit=admit,
    )
    return ports, asked
