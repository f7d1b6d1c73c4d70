"""Which trials have reported, or ended, without a committed checkpoint, judged from the run's progress or result
document (`trialResults`).

For the operator's condition and Event and for run-local's closing lines alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

CONDITION: Final = "CheckpointsCommitted"
REASON_COMMITTED: Final = "Committed"
REASON_MISSING: Final = "NoCommittedCheckpoint"
# The document is written by the tenant's code: only this many trials are judged, and ids are cut in messages.
MAX_TRIALS: Final = 10_000
_ID_CHARS: Final = 64
_NAMED: Final = 3


@dataclass(frozen=True)
class TrialWithoutCheckpoint:
    id: str
    reports: int
    ended: bool


@dataclass(frozen=True)
class CheckpointCoverage:
    """`judged` trials (past the report threshold or ended); `without` those among them with no committed checkpoint."""

    judged: int
    without: tuple[TrialWithoutCheckpoint, ...]
    warn_after_reports: int

    @property
    def ok(self) -> bool:
        return not self.without

    @property
    def reason(self) -> str:
        return REASON_COMMITTED if self.ok else REASON_MISSING

    @property
    def message(self) -> str:
        if self.ok:
            return f"every trial that reported {self.warn_after_reports} times or ended has a committed checkpoint"
        # Stable while the trials train on (no running counts): the operator says it again only when it changes.
        named = "; ".join(
            f"trial {t.id} {'ended' if t.ended else f'reported {self.warn_after_reports}+ times'}"
            for t in self.without[:_NAMED]
        )
        more = f" (and {len(self.without) - _NAMED} more)" if len(self.without) > _NAMED else ""
        lead = (
            "no trial has committed a checkpoint: this sweep has nothing to resume from or protect"
            if len(self.without) == self.judged
            else f"{len(self.without)} of {self.judged} trials have no committed checkpoint"
        )
        return (
            f"{lead}: {named}{more}. Report one with ray.train.report(metrics, checkpoint=Checkpoint.from_directory"
            "(...)) from rank 0 (docs/your-training-loop.md), or raise spec.checkpoints.warnAfterReports "
            f"(now {self.warn_after_reports}) if the loop checkpoints less often"
        )


def _reports(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def checkpoint_coverage(doc: Mapping[str, Any] | None, warn_after_reports: int) -> CheckpointCoverage | None:
    """The coverage `doc`'s trials show, or None while no trial has reported `warn_after_reports` times or ended.

    A trial that errored before its first report is left out: its error is the story, it had nothing to save."""
    rows = (doc or {}).get("trialResults")
    if not isinstance(rows, list):
        return None
    judged = 0
    without: list[TrialWithoutCheckpoint] = []
    for row in rows[:MAX_TRIALS]:
        if not isinstance(row, Mapping):
            continue
        reports = _reports(row.get("reports"))
        status = row.get("status")
        ended = status == "TERMINATED" or (status == "ERROR" and reports > 0)
        if not ended and reports < warn_after_reports:
            continue
        judged += 1
        uri = row.get("checkpointUri")
        if not (isinstance(uri, str) and uri):
            without.append(TrialWithoutCheckpoint(str(row.get("id") or "?")[:_ID_CHARS], reports, ended))
    if not judged:
        return None
    return CheckpointCoverage(judged, tuple(without), warn_after_reports)
