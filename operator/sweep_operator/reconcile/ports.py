"""The namespace's budgets as admission reads them, and what a pending resume reads: I/O beside reads, above the
decisions.

Reading only reads (the ledgers, the API, the caches), but for entering a ledger found in the operator's record of the
ledgers it created; what changes the ledgers is carried out by the controller's `_execute` (`Budgets.reserve` for a
ReserveBudget, `record_hours`, `release_hours`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from sweep_contracts import constants
from sweep_contracts.api import Phase
from sweep_contracts.status_models import NamespaceUsageStatus, UsageStatus

from ..admission_ledger import AdmissionLedger
from ..gpu_time import NamespaceBudget, UsageLedger
from ..kube import Conflict, KubeApi
from ..policy import AdmissionDecision, Admit
from ..rendering import RenderContext
from ..settings import Settings
from ..status import is_terminal, rfc3339
from . import attempts, kueue, resume, run_phase, verdicts, workloads
from .actions import ReserveBudget
from .attempts import RunRootCheck
from .facts import ObjectRef, SweepFacts, meta_of
from .hours_ledger import (
    HoursLedger,
    RecordedLedger,
    missing_message,
    record_usage,
    recorded,
    release,
    seeded,
    vanished,
    with_entry,
)
from .reads import Reads
from .run_pass import BudgetReads, ResumeRead, reservation
from .usage import GpuHourAsk, ReservationFacts, decide_gpu_hour_answer

log = logging.getLogger(__name__)
T = TypeVar("T")
WRITE_ATTEMPTS = 32  # a burst's writers each lose at most once per other writer


class GpuHourLedgers:
    """The namespaces' GPUHourLedger objects (hours_ledger). A change is decided on the copy last read or written and
    written with that copy's resourceVersion; a write refused because another came first (a worker, an operator
    restarted or newly elected) is read again and decided again: no lock, in this process or any other, is needed.

    Every ledger it creates or finds is entered in its record (a ConfigMap in the operator's namespace, `record_at`):
    a namespace whose ledger is missing although the record has it is answered with a ledger `missing`, which admits
    nothing and is never written, until a platform administrator removes the namespace's entry (docs/budgets.md)."""

    def __init__(
        self,
        kube: KubeApi,
        sweeps_of: Callable[[str], list[dict[str, Any]]],
        record_at: Callable[[], tuple[str, str]] = lambda: (
            constants.LEDGER_RECORD_FALLBACK_NAMESPACE,
            constants.LEDGER_RECORD_NAME,
        ),
    ) -> None:
        self.kube, self.sweeps_of, self.record_at = kube, sweeps_of, record_at
        self._known: dict[str, tuple[dict[str, Any] | None, str | None]] = {}  # namespace -> (object, missing)
        self._recorded: dict[str, str] = {}  # namespace -> the ledger uid known to be in the record
        self._lock = threading.Lock()  # guards `_known` and `_recorded` only

    def read(self, namespace: str, budget: NamespaceBudget, now: float, *, fresh: bool = False) -> HoursLedger:
        with self._lock:
            known = self._known.get(namespace)
        if fresh or known is None:
            obj = self.kube.get_ledger(namespace)
            if obj is not None:
                self._enter(namespace, obj, now)
            known = (obj, None if obj is not None else self._missing(namespace))
            with self._lock:
                self._known[namespace] = known
        return HoursLedger.from_object(known[0], budget, missing=known[1])

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
            if ledger.missing is not None:
                return result  # nothing re-creates a ledger that vanished (hours_ledger answers it writes nothing)
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
                self._known[namespace] = (written, None)
            self._enter(namespace, written, now)
            return result
        raise RuntimeError(f"GPUHourLedger {namespace}: {WRITE_ATTEMPTS} writes in a row were refused; retrying later")

    def for_admission(self, namespace: str, budget: NamespaceBudget, now: float) -> HoursLedger:
        """A fresh read to decide an admission on; where no ledger exists yet, the one the first write would create
        (`change` seeds it the same way), so the decision and its record agree."""
        ledger = self.read(namespace, budget, now, fresh=True)
        if ledger.resource_version is None and ledger.missing is None:
            return seeded(ledger, self.sweeps_of(namespace), now)
        return ledger

    # ---- the record of the ledgers created (hours_ledger.RecordedLedger)
    def _missing(self, namespace: str) -> str | None:
        """Why the namespace's absent ledger is not to be created (None: create it), from the record read now (an
        administrator's removal of the entry is seen at the next admission)."""
        record = self.record_at()
        stored = self.kube.get_config_map(*record)
        entry = recorded((stored or {}).get("data"), namespace)
        if entry is None or not vanished(entry, self.kube.namespace_uid(namespace)):
            return None
        log.warning("GPUHourLedger %s/%s is gone although the operator created it", namespace, constants.LEDGER_NAME)
        return missing_message(namespace, entry, record)

    def _enter(self, namespace: str, ledger: Mapping[str, Any], now: float) -> None:
        """The ledger entered in the record, once per ledger and process (a write only where the record lacks it)."""
        uid = str((ledger.get("metadata") or {}).get("uid") or "")
        with self._lock:
            if not uid or self._recorded.get(namespace) == uid:
                return
        record_namespace, record_name = self.record_at()
        for _ in range(WRITE_ATTEMPTS):
            stored = self.kube.get_config_map(record_namespace, record_name)
            entry = recorded((stored or {}).get("data"), namespace)
            if entry is None or entry.ledger_uid != uid:
                entry = RecordedLedger(uid, self.kube.namespace_uid(namespace) or "", rfc3339(now))
                metadata: dict[str, Any] = {"name": record_name, "namespace": record_namespace}
                if stored is not None:
                    metadata = {**metadata, "resourceVersion": stored["metadata"].get("resourceVersion")}
                body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}
                try:
                    self.kube.write_config_map(
                        {**body, "data": with_entry((stored or {}).get("data"), namespace, entry)}
                    )
                except Conflict:
                    continue
            with self._lock:
                self._recorded[namespace] = uid
            return
        raise RuntimeError(f"ConfigMap {record_namespace}/{record_name}: {WRITE_ATTEMPTS} writes in a row were refused")

    def all_cached(self, budget_of: Callable[[str], NamespaceBudget | None]) -> dict[str, HoursLedger]:
        """Every ledger last read or written, by namespace (the metrics' source)."""
        with self._lock:
            known = {ns: obj for ns, (obj, _) in self._known.items() if obj is not None}
        out = {}
        for namespace, obj in known.items():
            budget = budget_of(namespace)
            if budget is not None:
                out[namespace] = HoursLedger.from_object(obj, budget)
        return out

    def cached(self, namespace: str, budget: NamespaceBudget) -> HoursLedger | None:
        """The copy last read or written (None: not read yet): for views and metrics, never for a reservation."""
        with self._lock:
            obj = self._known.get(namespace, (None, None))[0]
        return HoursLedger.from_object(obj, budget) if obj is not None else None


class Budgets:
    """Kueue's rules (Kueue mode) or the namespace's GPU ledger, then the namespace's GPU-hour window."""

    def __init__(self, reads: Reads, ledger: AdmissionLedger, context: RenderContext) -> None:
        self.reads, self.ledger, self.context = reads, ledger, context
        self.hours = GpuHourLedgers(reads.kube, reads.namespace_sweeps, self._ledger_record)

    @property
    def settings(self) -> Settings:
        return self.reads.settings  # the controller's (tests change them in flight)

    def _ledger_record(self) -> tuple[str, str]:
        """Where the record of the ledgers created is: the operator's own namespace, the platform team's."""
        namespace = self.settings.operator_namespace or constants.LEDGER_RECORD_FALLBACK_NAMESPACE
        return namespace, constants.LEDGER_RECORD_NAME

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

    def read(self, facts: SweepFacts, spec: Any) -> BudgetReads:
        """What the budgets answer for an attempt run with `spec`, read once for the pass's decision."""
        namespace = facts.ref.namespace
        caps = self.ask(facts, spec)
        budget = self.gpu_hour_budget(namespace)
        asks_hours = (
            isinstance(caps, Admit) and spec.trial.resources_per_worker.gpu > 0 and meta_of(facts.body).get("uid")
        )
        hours = self.hours.for_admission(namespace, budget, facts.now) if budget is not None and asks_hours else None
        return BudgetReads(caps, self.in_use(namespace), hours, self.settings.limits)

    def reserve(self, facts: SweepFacts, reservation: ReserveBudget) -> bool:
        """Carry out a ReserveBudget: the GPU caps and the GPU-hours decided again and recorded atomically, as the
        decision read them; False: the record no longer agrees with the decision (another admission came first)."""
        budget = self.ask(facts, reservation.spec, record=True)
        if not isinstance(budget, Admit):
            return not reservation.admitted
        refused = self._reserve_hours(facts, budget, reservation.spec, reservation.attempt)
        if refused:
            self.ledger.release(facts.ref.namespace, facts.ref.name)  # the GPU caps admitted it; the hours do not
        return refused == (not reservation.admitted)

    def _reserve_hours(self, facts: SweepFacts, budget: Admit, spec: Any, attempt: str) -> bool:
        """The attempt's hours reserved in the namespace's ledger (docs/budgets.md); True: the GPU-hours refuse it."""
        ref = facts.ref
        namespace = self.gpu_hour_budget(ref.namespace)
        uid = str(meta_of(facts.body).get("uid") or "")

        def reserve(ask: GpuHourAsk) -> AdmissionDecision:
            assert namespace is not None
            return self.hours.change(
                ref.namespace,
                namespace,
                facts.now,
                reservation(ask, uid=uid, name=ref.name, attempt=attempt, now=facts.now),
            )

        answer = decide_gpu_hour_answer(
            facts, budget, self.settings.limits, reserve if namespace is not None and uid else None, spec=spec
        )
        return answer is not None

    def namespace_hours(self, facts: SweepFacts) -> tuple[NamespaceUsageStatus | None, ReservationFacts | None]:
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

    def record_hours(self, body: Mapping[str, Any], usage: UsageStatus | None, ended: bool, now: float) -> None:
        """The sweep's own record (status.usage) into its namespace's ledger; `ended`: its reservation goes."""
        meta = meta_of(body)
        namespace = self.gpu_hour_budget(meta.get("namespace") or "default")
        if namespace is None or not meta.get("uid"):
            return
        intervals = UsageLedger.from_status(usage).intervals
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


def resume_read(facts: SweepFacts, budgets: Budgets, max_active_seconds: int | None) -> ResumeRead | None:
    """What an ended sweep's pending resume decides on (None: no resume pending, nothing read): the run's RayJob and
    the driver's phase; the run root's fresh verification and records when the decision asks for them
    (resume.planned); the namespace's budgets for the attempt it would start."""
    status, sweep, reads = facts.status, facts.sweep, budgets.reads
    if sweep is None or not is_terminal(status.phase) or run_phase.awaiting_verification(status):
        return None
    if not resume.may_resume(status, sweep.spec):
        return None
    name, target = status.ray_job_name, verdicts.status_target(facts.body, status)
    rayjob = reads.rayjob(ObjectRef(facts.ref.namespace, name)) if name else None
    driver = None
    if target is not None and status.phase == Phase.FAILED:
        progress, _, _ = reads.run_documents(target)
        driver = (progress or {}).get("phase") if isinstance((progress or {}).get("phase"), str) else None
    records = resume.ResumeReads(rayjob, driver)

    def plan() -> Any:
        return resume.planned(
            facts.body, sweep, records, now=facts.now, max_active_seconds=max_active_seconds, status=facts.status
        )

    planned = plan()
    if isinstance(planned, resume.VerifyFirst) and target is not None:
        result = reads.verify(target, pooled=False)
        progress, final, readable = reads.run_documents(target)
        check = RunRootCheck.from_result(
            result, progress=progress, final=final, records_readable=readable, root=target.run_root
        )
        records = replace(records, verification=check)
        planned = plan()
    if not isinstance(planned, resume.StartAttempt):
        return ResumeRead(records)
    return ResumeRead(records, budgets.read(facts, attempts.attempt_sweep(sweep, planned).spec))
