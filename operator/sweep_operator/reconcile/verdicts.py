"""What a verification of a run root says (pure), shared by the guard, the end of a run and resume: the guard's target,
the rule that releases or holds, the verdict.

The verdict is Verified, NothingToProtect or NotVerified, as the sweep's status records it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sweep_contracts import api, constants
from sweep_contracts.status_models import SweepStatus

from ..run_metadata import GuardTarget
from ..status import read_status

# Verification problem kinds the guard reads (the verifier's findings define them).
EMPTY_RUN_ROOT = "empty-run-root"


class VerificationOutcome(Protocol):
    """What the guard needs from a verification result (see verification.VerificationResult)."""

    # Read-only members: the verifier's result is a frozen dataclass.
    @property
    def verified(self) -> bool: ...

    @property
    def checked(self) -> int: ...

    @property
    def problems(self) -> Sequence[Any]: ...

    @property
    def reason(self) -> str: ...


def target_of(obj: Mapping[str, Any]) -> GuardTarget | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return GuardTarget.from_annotation(annotations.get(constants.ANNOTATION_GUARD))


def status_target(sweep: Mapping[str, Any], status: SweepStatus | None = None) -> GuardTarget | None:
    """The guard facts a sweep's status recorded at admission (status.guard). `status`: the sweep's status already
    parsed (`SweepFacts.status`); None: parsed from the body here."""
    if status is None:
        status = read_status(sweep.get("status"))
    guard = status.guard
    root = guard.run_root if guard is not None else None
    if guard is None or not root or not root.startswith("s3://"):
        return None
    return GuardTarget(
        root,
        guard.endpoint_url or "",
        guard.region or "",
        guard.verify is not False,
        guard.timeout_seconds or api.DEFAULT_VERIFICATION_TIMEOUT_SECONDS,
        (sweep.get("metadata") or {}).get("name", ""),
        status.run_id or "",
    )


@dataclass(frozen=True)
class Release:
    reason: str
    audit: bool = False  # a Warning Event: released without a verified, non-empty run


@dataclass(frozen=True)
class Hold:
    reason: str
    retry_after: float


def reported_checkpoints(*documents: Mapping[str, Any] | None) -> list[str]:
    """Checkpoint URIs the driver reported in `_sweep/status.json` / `_sweep/result.json` (best and per trial)."""
    uris: list[str] = []
    for doc in documents:
        if not isinstance(doc, Mapping):
            continue
        best = doc.get("bestTrial")
        if isinstance(best, Mapping) and best.get("checkpointUri"):
            uris.append(str(best["checkpointUri"]))
        for trial in doc.get("trialResults") or []:
            if isinstance(trial, Mapping) and trial.get("checkpointUri"):
                uris.append(str(trial["checkpointUri"]))
    return sorted(set(uris))


def decide_after_verification(
    result: VerificationOutcome,
    *,
    attempt: int,
    base_backoff: float,
    max_backoff: float,
    progress: Mapping[str, Any] | None = None,
    final: Mapping[str, Any] | None = None,
    progress_readable: bool = True,
) -> Release | Hold:
    """`progress`/`final`: the run's `_sweep/status.json` and `_sweep/result.json` (None when absent);
    `progress_readable`: False when reading them failed (then "nothing was reported" cannot be concluded)."""
    kinds = {getattr(p, "kind", None) or (p.get("kind") if isinstance(p, Mapping) else "") for p in result.problems}
    retry = backoff_seconds(attempt, base_backoff, max_backoff)
    if kinds == {EMPTY_RUN_ROOT}:
        # Nothing at all under the root: the driver (which writes its status before any user code runs) never
        # wrote, so no trial could have. Releasing is safe, and holding would keep the cluster's pods forever.
        return Release(
            "nothing to protect: the run root holds no object (the driver never wrote its status)", audit=True
        )
    if result.verified and result.checked > 0:
        # Said with the level it proved (`4 committed`, `4 full-state`): what the guard saw, not only that it passed.
        summary = getattr(result, "summary", "")
        return Release("checkpoints verified complete in S3" + (f": {summary}" if summary else ""))
    if result.verified and result.checked == 0:
        reported = reported_checkpoints(progress, final)
        if not progress_readable:
            return Hold(
                "no committed checkpoint found, and the run's status could not be read to confirm none was reported",
                retry,
            )
        if reported:
            return Hold(
                f"no committed checkpoint found, but the run reported {len(reported)} "
                f"(e.g. {reported[0]}): checkpoints were lost or the run root is wrong",
                retry,
            )
        return Release("nothing to protect: no committed checkpoint, and the run's status reports none", audit=True)
    return Hold(f"checkpoints not verified: {result.reason}", retry)


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


@dataclass(frozen=True)
class Verdict:
    """What a verification and the guard's decision over it say of the checkpoints (the CheckpointsVerified
    condition): `reason` Verified, NothingToProtect (an audited release) or NotVerified."""

    verified: bool
    reason: str
    message: str


def verdict(result: Any, decision: Release | Hold | None) -> Verdict:
    """The one rule, for a deletion's verification and for the end of a run: verified when the verification found a
    non-empty, complete run and the guard released it without an audit."""
    audited = isinstance(decision, Release) and decision.audit
    if result.verified and result.checked > 0 and not isinstance(decision, Hold) and not audited:
        return Verdict(True, "Verified", f"{result.checked} checkpoints, {result.bytes} bytes verified")
    if isinstance(decision, Release):  # audited: nothing to protect
        return Verdict(False, "NothingToProtect", decision.reason)
    why = problems_message(result.problems) or (decision.reason if decision else "not verified")
    return Verdict(False, "NotVerified", why)


def backoff_seconds(attempt: int, base: float, maximum: float) -> float:
    """base, 2*base, 4*base, ... capped at maximum (attempt counts from 0)."""
    return float(min(base * (2 ** max(attempt, 0)), maximum))
