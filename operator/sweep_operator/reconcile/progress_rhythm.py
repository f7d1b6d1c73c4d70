"""When a running sweep's progress is read and mirrored (pure): the poll of an unchanged status.json backs off, and
a status change that is only progress waits for the sweep's next mirror slot.

What may wait is the driver's progress (`status.PROGRESS_FIELDS`) and a refresh of `status.usage`'s totals (readers
recompute the hours from the intervals). Everything else (phase, conditions, messages, the guard's record, a stop, an
interval opened or closed) is written in the pass that decided it, together with whatever progress is pending.
"""

from __future__ import annotations

from collections.abc import Iterable

from sweep_contracts.status_models import SweepStatus, UsageStatus

from ..status import PROGRESS_FIELDS, merge_patch, status_document

# status.usage fields whose change is a fact (a pod's GPUs taken or freed, a threshold said, the budget): written at
# once.
USAGE_RECORD_FIELDS = ("pod_intervals", "thresholds_reported", "budget_gpu_hours")


def usage_totals_only(old: UsageStatus | None, new: UsageStatus | None) -> bool:
    """Whether status.usage changed only in its totals (hours so far, when measured, the namespace's window view)."""
    if old is None or new is None:
        return False
    return all(getattr(old, name) == getattr(new, name) for name in USAGE_RECORD_FIELDS)


def routine_fields(
    old: SweepStatus, new: SweepStatus, changed: Iterable[str] | None = None
) -> tuple[set[str], set[str]]:
    """The status fields (stored names) `new` changes against `old`, split into (those that may wait, those written
    at once). `changed`: those fields when the caller has the patch already (the writer), else computed here."""
    routine, urgent = set[str](), set[str]()
    if changed is None:
        changed = merge_patch(status_document(old), status_document(new))
    for key in changed:
        if key in PROGRESS_FIELDS or (key == "usage" and usage_totals_only(old.usage, new.usage)):
            routine.add(key)
        else:
            urgent.add(key)
    return routine, urgent


def mirror_wait(
    old: SweepStatus,
    new: SweepStatus,
    *,
    last_mirrored: float | None,
    now: float,
    every: float,
    events: int = 0,
    changed: Iterable[str] | None = None,
) -> float:
    """Seconds the write of `new` over `old` waits: 0 writes now. Only a change made of routine fields alone, with no
    Event to go with it, waits, until `every` seconds after the sweep's last write of such fields (the first one, and
    any after `every`, is written at once). The write then carries the latest progress read, so nothing is lost."""
    routine, urgent = routine_fields(old, new, changed)
    if not routine or urgent or events or last_mirrored is None or every <= 0:
        return 0.0
    return max(0.0, last_mirrored + every - now)


def next_poll_seconds(previous: float | None, changed: bool, *, base: float, cap: float) -> float:
    """The wait before the next read of a run's progress document: `base` after a change (or the first read), doubled
    after each read that found it unchanged, at most `cap` (never below `base`)."""
    if changed or previous is None or base <= 0:
        return max(base, 0.0)
    return min(max(previous * 2, base), max(cap, base))
