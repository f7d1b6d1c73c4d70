"""What a verification reports: the kinds of problems and warnings, one finding, one checkpoint's row and the
verdict on a run root (VerificationResult, with its `status.checkpoints` form)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

# Problems: any one makes the run not verified.
EMPTY_RUN_ROOT: Final = "empty-run-root"
MISSING_SNAPSHOT: Final = "missing-snapshot"
INVALID_SNAPSHOT: Final = "invalid-snapshot"
MISSING_CHECKPOINT: Final = "missing-checkpoint"
MISSING_MANIFEST: Final = "missing-manifest"
INVALID_MANIFEST: Final = "invalid-manifest"
MISSING_FILE: Final = "missing-file"
SIZE_MISMATCH: Final = "size-mismatch"
CHECKSUM_MISMATCH: Final = "checksum-mismatch"
INVALID_RESULT: Final = "invalid-result"
BEST_CHECKPOINT_UNVERIFIED: Final = "best-checkpoint-unverified"
S3_ERROR: Final = "s3-error"
TIMEOUT: Final = "timeout"
VERIFIER_ERROR: Final = "verifier-error"
# More objects under the run's train/ than the verifier lists (listing.MAX_LISTED_OBJECTS), or keys
# taking more than a verification's share of the operator's memory.
TOO_MANY_OBJECTS: Final = "too-many-objects"
# A run's status or result document, or its Tune experiment states, over what the operator reads of them (bytes,
# nesting, elements, files: memory_budget.py); which trials checkpointed is then unknown.
OVER_BUDGET: Final = "over-budget"
# A trial the run's surviving records (status.json, result.json, Tune's experiment state) say checkpointed, with no
# object left under train/<trial>/.
MISSING_TRIAL: Final = "missing-trial"
# _sweep/status.json or one of Tune's experiment_state-*.json cannot be read: which trials checkpointed is unknown.
INVALID_RECORD: Final = "invalid-record"
# A checkpoint result.json names for a trial is not among the verified ones.
RECORDED_CHECKPOINT_UNVERIFIED: Final = "recorded-checkpoint-unverified"
# A file's ETag differs from the one its commit record took when Ray committed it: rewritten since.
FINGERPRINT_MISMATCH: Final = "fingerprint-mismatch"
# A checkpoint's _commit_record.json cannot be read as one.
INVALID_COMMIT_RECORD: Final = "invalid-commit-record"

# Warnings: reported, never a reason to hold a deletion.
UNCOMMITTED_CHECKPOINT: Final = "uncommitted-checkpoint"
NO_CHECKPOINTS: Final = "no-checkpoints"
SNAPSHOT_RAY_VERSION: Final = "snapshot-ray-version"
VERSIONING_DISABLED: Final = "versioning-disabled"
LIFECYCLE_EXPIRATION: Final = "lifecycle-expiration"
LIFECYCLE_TRANSITION: Final = "lifecycle-transition"
LIFECYCLE_NONCURRENT_EXPIRATION: Final = "lifecycle-noncurrent-expiration"
RETENTION_UNKNOWN: Final = "retention-unknown"

# Row statuses besides a problem kind.
VERIFIED: Final = "verified"
UNCOMMITTED: Final = "uncommitted"

# What a verified checkpoint is proven to hold. Committed: every file Ray committed is there unchanged (its commit
# record; any loop). Full state: our helpers' manifests on top (model, optimizer, RNG, data position, each rank).
LEVEL_COMMITTED: Final = "committed"
LEVEL_FULL_STATE: Final = "full-state"

STATUS_MAX_PROBLEMS: Final = 20  # CheckpointsStatus.problems keeps the first 20


@dataclass(frozen=True)
class Finding:
    """One problem or warning: `kind` (constants above), the S3 key or key prefix concerned ("" for the bucket), and why."""

    kind: str
    key: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "key": self.key, "detail": self.detail}


@dataclass(frozen=True)
class CheckpointReport:
    """One checkpoint directory: committed by Ray's snapshot or not, and what we found in it."""

    trial: str
    name: str
    key: str  # the directory's key prefix, `.../train/<trial>/<name>/`
    committed: bool
    files: int  # files its manifests list
    bytes: int  # bytes its manifests list
    status: str  # "verified", "uncommitted", or the first problem kind found
    level: str = ""  # LEVEL_COMMITTED or LEVEL_FULL_STATE once verified, "" otherwise

    @property
    def verified(self) -> bool:
        return self.status == VERIFIED

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "checkpoint": self.name,
            "key": self.key,
            "committed": self.committed,
            "files": self.files,
            "bytes": self.bytes,
            "status": self.status,
            "level": self.level,
        }


@dataclass(frozen=True)
class VerificationResult:
    """The verdict on one run root; `verified` is True only when no problem was found."""

    root: str
    verified: bool
    deep: bool
    checked: int  # committed checkpoints examined
    bytes: int  # bytes held by the verified checkpoints
    files: int  # files of the verified checkpoints
    problems: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    checkpoints: tuple[CheckpointReport, ...]
    best_checkpoint_uri: str | None
    objects_listed: int
    duration_seconds: float
    verified_at: str  # RFC 3339, UTC

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; `verified` is a top-level boolean."""
        return {
            "verified": self.verified,
            "root": self.root,
            "deep": self.deep,
            "checked": self.checked,
            "bytes": self.bytes,
            "files": self.files,
            "problems": [p.to_dict() for p in self.problems],
            "warnings": [w.to_dict() for w in self.warnings],
            "checkpoints": [c.to_dict() for c in self.checkpoints],
            "summary": self.summary,
            "bestCheckpointUri": self.best_checkpoint_uri,
            "objectsListed": self.objects_listed,
            "durationSeconds": round(self.duration_seconds, 3),
            "verifiedAt": self.verified_at,
        }

    def to_status(self, max_problems: int = STATUS_MAX_PROBLEMS) -> dict[str, Any]:
        """`status.checkpoints` of a TrainingSweep (api.CheckpointsStatus, camelCase keys)."""
        return {
            "summary": self.summary,
            "verified": self.verified,
            "checked": self.checked,
            "fullState": sum(1 for c in self.checkpoints if c.verified and c.level == LEVEL_FULL_STATE),
            "bytes": self.bytes,
            "problems": [p.to_dict() for p in self.problems[:max_problems]],
            "verifiedAt": self.verified_at,
        }

    @property
    def summary(self) -> str:
        """What the VERIFIED column, `sweepctl verify` and the report say: `4 full-state`, `4 committed`,
        `4 committed (2 full-state)`, `none`, or `failed: <first problem kind>`."""
        return checkpoints_summary(self.verified, self.problems, self.checkpoints)

    @property
    def reason(self) -> str:
        """One line saying why the run is not verified ("" when it is)."""
        if self.verified:
            return ""
        first = self.problems[0]
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        return f"{first.kind}: {first.key}: {first.detail}{more}"


def checkpoints_summary(verified: bool, problems: Sequence[Finding], checkpoints: Sequence[CheckpointReport]) -> str:
    if not verified:
        return f"failed: {problems[0].kind}" if problems else "failed"
    proven = [c for c in checkpoints if c.verified]
    if not proven:
        return "none"
    full = sum(1 for c in proven if c.level == LEVEL_FULL_STATE)
    if full == len(proven):
        return f"{full} {LEVEL_FULL_STATE}"
    return f"{len(proven)} {LEVEL_COMMITTED}" + (f" ({full} {LEVEL_FULL_STATE})" if full else "")
