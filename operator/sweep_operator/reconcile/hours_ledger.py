"""The namespace's GPU-hour ledger (pure): every GPU-second its sweeps used in the rolling window, deleted sweeps
included, and each admitted attempt's reservation.

Admission, release and usage records are decided over it. The GPUHourLedger object that stores it is written only by the
operator, one optimistic write per change; one that vanished after the operator created it (its record below) is
refused, never re-created.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import LEDGER_MAX_ENTRIES, LEDGER_MAX_RESERVATIONS, LEDGER_MAX_SWEEPS
from sweep_contracts.problems import Problem
from sweep_contracts.status_models import NamespaceUsageStatus

from ..gpu_time import (
    HOUR,
    NamespaceBudget,
    PodInterval,
    budget_frees_at,
    compact,
    epoch,
    format_duration,
    format_hours,
    sweep_usage_of,
)
from ..policy import AdmissionDecision, Admit, Queue, Reject
from ..status import rfc3339

ENTRY_INTERVALS = 16  # finished intervals an entry keeps before merging (open ones are never merged)
# A deleted sweep's pods still running are closed this long after the deletion was released: kubelet's default
# terminationGracePeriodSeconds, so the ledger errs high (the guard already verified; KubeRay deletes the pods).
TERMINATION_GRACE_SECONDS = 30.0
MERGED = "merged"  # the uid of the entry the oldest ones merge into past LEDGER_MAX_SWEEPS
EPSILON = 1e-9


@dataclass(frozen=True)
class Reservation:
    """GPU-hours promised to one admitted attempt; what it uses from `since` on spends it."""

    gpu_hours: float
    since: float
    attempt: str
    run_until_exhausted: bool = False

    def to_status(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "gpuHours": round(self.gpu_hours, 6),
            "since": rfc3339(self.since),
            "attempt": self.attempt,
        }
        if self.run_until_exhausted:
            doc["runUntilExhausted"] = True
        return doc

    @classmethod
    def from_status(cls, doc: Mapping[str, Any] | None) -> Reservation | None:
        doc = doc or {}
        hours, since = doc.get("gpuHours"), epoch(doc.get("since"))
        if since is None or isinstance(hours, bool) or not isinstance(hours, (int, float)):
            return None
        return cls(float(hours), since, str(doc.get("attempt") or ""), bool(doc.get("runUntilExhausted")))


@dataclass(frozen=True)
class LedgerEntry:
    """One sweep (by uid: a re-created sweep of the same name is another) in its namespace's ledger."""

    name: str
    uid: str
    intervals: tuple[PodInterval, ...] = ()
    reservation: Reservation | None = None
    deleted: bool = False

    def window_gpu_hours(self, now: float, window_seconds: float) -> float:
        return sum(i.overlap_gpu_seconds(now - window_seconds, now) for i in self.intervals) / HOUR

    def used_since(self, since: float, now: float) -> float:
        return sum(i.overlap_gpu_seconds(since, now) for i in self.intervals) / HOUR

    def reserved_left(self, now: float) -> float:
        """What its reservation still promises: granted less what the attempt used since its admission."""
        r = self.reservation
        return 0.0 if r is None else max(r.gpu_hours - self.used_since(r.since, now), 0.0)

    def last_end(self, now: float) -> float:
        return max((now if i.end is None else i.end for i in self.intervals), default=0.0)

    def to_status(self, now: float, window_seconds: float) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "uid": self.uid,
            "usedGpuHours": round(self.window_gpu_hours(now, window_seconds), 4),
            "reservedGpuHours": round(self.reserved_left(now), 4),
        }
        if self.deleted:
            doc["deleted"] = True
        if self.reservation is not None:
            doc["reservation"] = self.reservation.to_status()
        doc["intervals"] = [_interval_status(i) for i in sorted(self.intervals, key=lambda i: (i.start, i.pod))]
        return doc

    @classmethod
    def from_status(cls, doc: Mapping[str, Any]) -> LedgerEntry | None:
        if not doc.get("uid"):
            return None
        intervals = tuple(i for i in (PodInterval.from_status(d) for d in doc.get("intervals") or []) if i)
        return cls(
            str(doc.get("name") or ""),
            str(doc["uid"]),
            intervals,
            Reservation.from_status(doc.get("reservation")),
            bool(doc.get("deleted")),
        )


def _interval_status(interval: PodInterval) -> dict[str, Any]:
    doc = interval.to_status()
    return {k: doc[k] for k in ("pod", "gpus", "start", "end") if k in doc}


@dataclass(frozen=True)
class HoursLedger:
    """A namespace's ledger as read (`resource_version` None: not stored yet, the first write creates it)."""

    budget: NamespaceBudget
    entries: tuple[LedgerEntry, ...] = ()
    resource_version: str | None = None
    updated_at: float | None = None  # when the stored totals (what kubectl shows) were computed
    # Not stored, and the operator had created it (`vanished`): why, as the sweeps that need it say. Nothing is
    # admitted against it and nothing writes it: a ledger made anew would lack the hours of deleted sweeps.
    missing: str | None = None

    def entry(self, uid: str) -> LedgerEntry | None:
        return next((e for e in self.entries if e.uid == uid), None)

    def with_entry(self, entry: LedgerEntry) -> HoursLedger:
        others = tuple(e for e in self.entries if e.uid != entry.uid)
        return replace(self, entries=(*others, entry))

    def used(self, now: float) -> float:
        return sum(e.window_gpu_hours(now, self.budget.window_seconds) for e in self.entries)

    def reserved(self, now: float, *, exclude_uid: str | None = None) -> float:
        return sum(e.reserved_left(now) for e in self.entries if e.uid != exclude_uid)

    def left(self, now: float) -> float:
        return self.budget.gpu_hours - self.used(now) - self.reserved(now)

    def intervals(self) -> list[PodInterval]:
        return [i for e in self.entries for i in e.intervals]

    def frees_at(self, now: float, needed_gpu_hours: float = 1.0) -> float | None:
        return budget_frees_at(self.intervals(), self.budget, now, needed_gpu_hours, self.reserved(now))

    @classmethod
    def from_object(
        cls, obj: Mapping[str, Any] | None, budget: NamespaceBudget, *, missing: str | None = None
    ) -> HoursLedger:
        """The stored object (None: none yet, or `missing`: gone); entries it cannot read are dropped, never guessed
        at."""
        if obj is None:
            return cls(budget, missing=missing)
        docs = ((obj.get("status") or {}).get("sweeps")) or []
        entries = tuple(e for e in (LedgerEntry.from_status(d) for d in docs if isinstance(d, Mapping)) if e)
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "") or None
        return cls(budget, entries, version, epoch((obj.get("status") or {}).get("updatedAt")))

    def to_object(self, namespace: str, now: float) -> dict[str, Any]:
        """The whole object to write (with the resourceVersion it was computed from: the write's precondition)."""
        ledger = bounded(self, now)
        window = ledger.budget.window_seconds
        frees = ledger.frees_at(now) if ledger.left(now) < 1.0 else None
        metadata: dict[str, Any] = {"name": constants.LEDGER_NAME, "namespace": namespace}
        if ledger.resource_version:
            metadata["resourceVersion"] = ledger.resource_version
        ledger_status: dict[str, Any] = {
            "usedGpuHours": round(ledger.used(now), 4),
            "reservedGpuHours": round(ledger.reserved(now), 4),
            "leftGpuHours": round(max(ledger.left(now), 0.0), 4),
            "window": format_duration(window),
            "updatedAt": rfc3339(now),
            "sweeps": [e.to_status(now, window) for e in sorted(ledger.entries, key=lambda e: (e.name, e.uid))],
        }
        if frees is not None and frees > now:
            ledger_status["freesAt"] = rfc3339(math.ceil(frees))
        return {
            "apiVersion": constants.API_VERSION,
            "kind": constants.LEDGER_KIND,
            "metadata": metadata,
            "spec": {"gpuHours": ledger.budget.gpu_hours, "windowSeconds": int(window)},
            "status": ledger_status,
        }


def bounded(ledger: HoursLedger, now: float) -> HoursLedger:
    """The ledger kept small: entries whose hours all left the window and that reserve nothing go; past
    LEDGER_MAX_SWEEPS entries, the oldest that reserve nothing merge into one (their GPU-seconds kept, only which
    sweep used them lost). A merged sweep that records again counts twice: the ledger errs high, never low.

    Entries that reserve are bounded by admission (LEDGER_MAX_RESERVATIONS, `decide_reservation`). Where more are
    held all the same (a ledger seeded from more running sweeps than that), the newest reservations past what the
    object holds are charged: what each still promises counts as used now, in the merged entry, and the reservation
    goes. Again the ledger errs high, and every write stays one the API server accepts."""
    start = now - ledger.budget.window_seconds
    kept = [e for e in ledger.entries if e.reservation is not None or e.last_end(now) > start]
    if len(kept) > LEDGER_MAX_SWEEPS:
        idle = sorted((e for e in kept if e.reservation is None and e.uid != MERGED), key=lambda e: e.last_end(now))
        old = idle[: len(kept) - LEDGER_MAX_SWEEPS + 1]
        after = len(kept) - len(old) + (0 if any(e.uid == MERGED for e in kept) else 1)
        reserving = sorted((e for e in kept if e.reservation is not None), key=_admitted_order, reverse=True)
        charged = reserving[: max(after - LEDGER_MAX_ENTRIES, 0)]
        merged = next((e for e in kept if e.uid == MERGED), LedgerEntry(f"({MERGED} sweeps)", MERGED, deleted=True))
        intervals = [i for e in (merged, *old) for i in e.intervals if i.end is not None]
        intervals += [i if i.end is not None else replace(i, end=now) for e in charged for i in e.intervals]
        intervals += [_charge(e, now) for e in charged if e.reserved_left(now) > 0]
        merged = replace(merged, intervals=merged_intervals(intervals, ENTRY_INTERVALS))
        gone = {e.uid for e in (*old, *charged)} | {MERGED}
        kept = [e for e in kept if e.uid not in gone] + ([merged] if merged.intervals else [])
    return replace(ledger, entries=tuple(kept))


def _admitted_order(entry: LedgerEntry) -> tuple[float, str]:
    assert entry.reservation is not None
    return (entry.reservation.since, entry.uid)


def _charge(entry: LedgerEntry, now: float) -> PodInterval:
    """What a reservation still promises, as GPU-seconds used in the second before `now`."""
    return PodInterval(f"charged:{entry.uid}", "", entry.reserved_left(now) * HOUR, now - 1.0, now, MERGED)


def merged_intervals(intervals: list[PodInterval], limit: int) -> tuple[PodInterval, ...]:
    """Finished intervals of many sweeps as at most `limit`, by when they ended: each keeps its GPU-seconds exactly,
    spread evenly over its span (`compact` does the same pair by pair, too slowly for thousands)."""
    ordered = sorted(intervals, key=lambda i: (i.end or 0.0, i.start, i.pod))
    size = max(math.ceil(len(ordered) / limit), 1)
    out = []
    for n in range(0, len(ordered), size):
        group = ordered[n : n + size]
        start, end = min(i.start for i in group), max(i.end or 0.0 for i in group)
        seconds = sum(i.gpu_seconds(end) for i in group)
        gpus = seconds / (end - start) if end > start else 0.0
        out.append(PodInterval(f"{MERGED}:{group[0].pod}", group[0].cluster, gpus, start, end, MERGED))
    return tuple(out)


# ----------------------------------------------------------------------------------------------- decisions


def decide_reservation(
    ledger: HoursLedger,
    *,
    uid: str,
    name: str,
    attempt: str,
    worst_case: float,
    run_until_exhausted: bool,
    sweep_left: float | None,
    now: float,
    worst_case_text: str = "",
) -> tuple[AdmissionDecision, HoursLedger | None]:
    """Admit the attempt into the namespace's window, and the ledger to write (None: nothing to write).

    Everything the namespace used in the window counts, the sweep's own earlier attempts and deleted sweeps
    included, and so does every other admitted attempt's reservation. Without runUntilExhausted the attempt's
    whole worst case must fit and is reserved; with it, any room left admits and that room (at most the worst case
    and the sweep's own budget left) is reserved: the sweep is stopped when it is spent. The same attempt asked
    again (a retried pass, a restarted operator) finds its reservation: admitted, nothing written."""
    budget = ledger.budget
    if ledger.missing is not None:
        return Queue(reason=ledger.missing, cause=MISSING_REASON), None
    entry = ledger.entry(uid)
    if entry is not None and entry.reservation is not None and entry.reservation.attempt == attempt:
        return Admit(gpu_hours=entry.reservation.gpu_hours), None
    shown = worst_case_text or f"{format_hours(worst_case)} GPU-hours"
    opt_in = "or set spec.budget.runUntilExhausted: true to run until the budget stops the sweep"
    need = 0.0 if run_until_exhausted else worst_case
    if need > budget.gpu_hours + EPSILON:
        return Reject(
            (
                Problem(
                    "spec.budget.gpuHours",
                    f"worst case {shown} exceeds the namespace budget of {budget.describe()}: it could never start; "
                    f"lower trial.workers, tune.maxConcurrentTrials or deadlines.activeSeconds, {opt_in}",
                ),
            )
        ), None
    reserving = sum(1 for e in ledger.entries if e.reservation is not None and e.uid != uid)
    if reserving >= LEDGER_MAX_RESERVATIONS:
        return Queue(
            reason=f"the namespace has {reserving} admitted GPU sweeps holding GPU-hour reservations, the most its "
            "GPU-hour ledger tracks at once; admitted when one of them ends"
        ), None
    used, reserved = ledger.used(now), ledger.reserved(now, exclude_uid=uid)
    left = budget.gpu_hours - used - reserved
    fits = left >= need - EPSILON if need > 0 else left > EPSILON
    if fits:
        grant = worst_case
        if run_until_exhausted:
            grant = min(worst_case, left, sweep_left if sweep_left is not None else math.inf)
        reservation = Reservation(grant, now, attempt, run_until_exhausted)
        current = entry or LedgerEntry(name, uid)
        return Admit(gpu_hours=grant), ledger.with_entry(replace(current, name=name, reservation=reservation))
    frees = budget_frees_at(ledger.intervals(), budget, now, need if need > 0 else 1e-6, reserved)
    held = f"{format_hours(used)} used in the window and {format_hours(reserved)} reserved by admitted sweeps"
    wanted = f"needs {shown}" if need > 0 else "needs any GPU-hours left"
    when = (
        f"budget frees up at {rfc3339(math.ceil(frees))}"
        if frees is not None
        else "budget frees up as the admitted sweeps end"
    )
    return Queue(
        reason=f"{wanted}; namespace budget {budget.describe()} has {format_hours(max(left, 0.0))} left ({held}); {when}",
        frees_at=frees,
    ), None


def record_usage(
    ledger: HoursLedger,
    *,
    uid: str,
    name: str,
    intervals: Iterable[PodInterval],
    ended: bool,
    now: float,
    refresh_seconds: float | None = None,
) -> HoursLedger | None:
    """The sweep's own record (status.usage.podIntervals) copied into its entry, the finished intervals beyond
    ENTRY_INTERVALS merged; `ended`: its run is over, its reservation released. None: nothing to write. A copy,
    not a sum, so recording the same record twice changes nothing; but while a pod holds GPUs the stored totals
    (what `kubectl get gpuledger` shows) are rewritten every `refresh_seconds`."""
    if ledger.missing is not None:
        return None
    start = now - ledger.budget.window_seconds
    relevant = tuple(i for i in intervals if i.end is None or i.end > start)
    entry = ledger.entry(uid)
    current = entry or LedgerEntry(name, uid)
    updated = replace(
        current,
        intervals=compact(relevant, ENTRY_INTERVALS),
        reservation=None if ended else current.reservation,
    )
    if entry is None and not updated.intervals and updated.reservation is None:
        return None
    if entry is not None and _same(entry, updated):
        running = any(i.end is None for e in ledger.entries for i in e.intervals)
        stale = ledger.updated_at is None or (
            refresh_seconds is not None and now - ledger.updated_at >= refresh_seconds
        )
        return ledger if running and refresh_seconds is not None and stale else None
    return ledger.with_entry(updated)


def _same(a: LedgerEntry, b: LedgerEntry) -> bool:
    def key(e: LedgerEntry) -> tuple[list[str], Reservation | None, bool]:
        return (sorted(repr(sorted(_interval_status(i).items())) for i in e.intervals), e.reservation, e.deleted)

    return key(a) == key(b)


def release(ledger: HoursLedger, *, uid: str, deleted: bool, now: float) -> HoursLedger | None:
    """The attempt is over (or never started): its reservation goes, its hours stay. A deleted sweep's entry is kept
    until its hours leave the window; its pods still open are closed TERMINATION_GRACE_SECONDS from now (nobody
    measures them any more). None: nothing to change."""
    entry = ledger.entry(uid)
    if ledger.missing is not None or entry is None or (entry.reservation is None and (not deleted or entry.deleted)):
        return None
    intervals = entry.intervals
    if deleted:
        intervals = tuple(
            replace(i, end=max(now + TERMINATION_GRACE_SECONDS, i.start)) if i.end is None else i for i in intervals
        )
    return ledger.with_entry(replace(entry, reservation=None, deleted=entry.deleted or deleted, intervals=intervals))


def seeded(ledger: HoursLedger, sweeps: Iterable[Mapping[str, Any]], now: float) -> HoursLedger:
    """A ledger created where none was: the hours the namespace's sweeps recorded in their own status (an operator
    upgraded from one without a ledger), each admitted and unfinished one reserving its worst case left."""
    entries = []
    for body in sweeps:
        meta = body.get("metadata") or {}
        if not meta.get("uid"):
            continue
        usage = sweep_usage_of(body, now)  # its record (status.usage) and its reservation
        reservation = Reservation(usage.reserved_gpu_hours, now, "seeded") if usage.reserved_gpu_hours > 0 else None
        entry = LedgerEntry(
            str(meta.get("name") or ""), str(meta["uid"]), compact(usage.ledger.intervals, ENTRY_INTERVALS)
        )
        if entry.intervals or reservation is not None:
            entries.append(replace(entry, reservation=reservation))
    return replace(ledger, entries=tuple(entries))


def view(ledger: HoursLedger, now: float) -> NamespaceUsageStatus:
    """status.usage.namespace of a sweep: the namespace's window as the ledger has it."""
    return NamespaceUsageStatus(
        gpu_hours=round(ledger.used(now), 4),
        budget_gpu_hours=ledger.budget.gpu_hours,
        left_gpu_hours=round(max(ledger.left(now), 0.0), 4),
        window_seconds=int(ledger.budget.window_seconds),
    )


# ------------------------------------------------------------------------------- the record of ledgers created
# Which namespaces' ledgers the operator created, so that a ledger that vanished is refused rather than re-created
# from the sweeps that still exist (which would give a namespace back the hours of its deleted sweeps).
#
# Why a record in the operator's own namespace: nothing a tenant may write (their namespace, their sweeps, the
# ledger's absence itself) can say whether a ledger existed; the operator's namespace is the platform team's, so a
# tenant can neither forge nor erase an entry. One ConfigMap, one key per namespace (a namespace name is a valid key),
# each value the ledger's and the namespace's uids: a namespace deleted and created again (another uid) starts afresh.

MISSING_REASON = "GpuHourLedgerMissing"  # the condition's reason and the Warning Event's


@dataclass(frozen=True)
class RecordedLedger:
    """A ledger the operator created: its uid, its namespace's uid then ("" where the operator may not read
    namespaces) and when it was first seen."""

    ledger_uid: str
    namespace_uid: str = ""
    since: str = ""

    def to_value(self) -> str:
        return json.dumps({"ledgerUid": self.ledger_uid, "namespaceUid": self.namespace_uid, "since": self.since})

    @classmethod
    def from_value(cls, value: str | None) -> RecordedLedger | None:
        """An entry as stored; one that does not parse still says a ledger existed (fail closed)."""
        if value is None:
            return None
        try:
            doc = json.loads(value)
        except ValueError:
            doc = None
        if not isinstance(doc, Mapping):
            return cls(ledger_uid="")
        return cls(str(doc.get("ledgerUid") or ""), str(doc.get("namespaceUid") or ""), str(doc.get("since") or ""))


def recorded(data: Mapping[str, str] | None, namespace: str) -> RecordedLedger | None:
    return RecordedLedger.from_value((data or {}).get(namespace))


def vanished(recorded_ledger: RecordedLedger | None, namespace_uid: str | None) -> bool:
    """With no ledger in the namespace: True when the operator had created one there (refuse what needs it); False
    when it never did, or did in an earlier namespace of the same name (a namespace uid that differs): create it."""
    if recorded_ledger is None:
        return False
    earlier = recorded_ledger.namespace_uid
    return not (earlier and namespace_uid and earlier != namespace_uid)


def missing_message(namespace: str, recorded_ledger: RecordedLedger, record: tuple[str, str]) -> str:
    """What the sweeps waiting on a vanished ledger say: what is gone, why it matters, what an admin does."""
    since = f" on {recorded_ledger.since}" if recorded_ledger.since else ""
    record_namespace, record_name = record
    return (
        f"the namespace's GPU-hour ledger {namespace}/{constants.LEDGER_NAME} is gone (the operator created it{since}); "
        "it keeps the GPU-hours of the namespace's deleted sweeps, so GPU sweeps here wait instead of starting on a "
        "new one: a platform administrator re-creates it on purpose by removing the key "
        f"{namespace} from ConfigMap {record_namespace}/{record_name} (docs/budgets.md)"
    )


def with_entry(data: Mapping[str, str] | None, namespace: str, entry: RecordedLedger) -> dict[str, str]:
    return {**(data or {}), namespace: entry.to_value()}
