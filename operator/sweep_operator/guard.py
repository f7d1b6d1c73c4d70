"""The checkpoint guard's decision (pure, R22): release a finalizer, or hold it and re-check with backoff.

Only a verified run (or one that never started training) is released; the escape-hatch annotation and
`deletion.verifyCheckpoints: false` release too, always with an audited Warning Event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from . import constants


class VerificationOutcome(Protocol):
    """What the guard needs from a verification result (see verification.VerificationResult)."""

    verified: bool

    @property
    def reason(self) -> str: ...


@dataclass(frozen=True)
class Release:
    reason: str
    audit: bool = False  # emit a Warning Event: a deletion went through without a verified check


@dataclass(frozen=True)
class Hold:
    reason: str
    retry_after: float


@dataclass(frozen=True)
class Verify:
    """Verification is needed before a decision; the caller runs it and calls `decide_after_verification`."""


GuardDecision = Release | Hold | Verify


def skip_requested(*annotation_sets: Mapping[str, str] | None) -> bool:
    """The escape hatch: `sweeps.dev/skip-checkpoint-verification: "true"` on any of the objects."""
    return any(
        (annotations or {}).get(constants.ANNOTATION_SKIP_VERIFICATION, "").strip().lower() == "true"
        for annotations in annotation_sets
    )


def decide_before_verification(
    *, skip_annotation: bool, verify_enabled: bool, ever_ran: bool, run_root: str | None
) -> GuardDecision:
    if skip_annotation:
        return Release(
            f"annotation {constants.ANNOTATION_SKIP_VERIFICATION}=true: released without verifying checkpoints",
            audit=True,
        )
    if not verify_enabled:
        return Release("spec.deletion.verifyCheckpoints is false: released without verifying checkpoints", audit=True)
    if not ever_ran or not run_root:
        return Release("the sweep never started training: no checkpoints to protect")
    return Verify()


def backoff_seconds(attempt: int, base: float, maximum: float) -> float:
    """base, 2*base, 4*base, ... capped at maximum (attempt counts from 0)."""
    return float(min(base * (2 ** max(attempt, 0)), maximum))


def decide_after_verification(
    result: VerificationOutcome, *, attempt: int, base_backoff: float, max_backoff: float
) -> Release | Hold:
    if result.verified:
        return Release("checkpoints verified complete in S3")
    return Hold(
        f"checkpoints not verified: {result.reason}",
        retry_after=backoff_seconds(attempt, base_backoff, max_backoff),
    )


def problems_message(problems: Sequence[Any], limit: int = 5) -> str:
    """`kind key: detail; ...` for the first few verification problems (Event and condition text)."""
    parts = []
    for problem in list(problems)[:limit]:
        kind = getattr(problem, "kind", None) or (problem.get("kind") if isinstance(problem, Mapping) else "")
        key = getattr(problem, "key", None) or (problem.get("key") if isinstance(problem, Mapping) else "")
        detail = getattr(problem, "detail", None) or (problem.get("detail") if isinstance(problem, Mapping) else "")
        parts.append(f"{kind} {key}: {detail}".strip())
    more = len(problems) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
