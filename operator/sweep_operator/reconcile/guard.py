"""The checkpoint guard's decision (pure, R22): release a finalizer, or hold it and re-check with backoff.

Facts in, a decision out. docs/guard.md states the rules as one table; each rule names its test.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Protocol, Sequence

from . import constants

# Verification problem kinds the guard reads (verification.py defines them).
EMPTY_RUN_ROOT = "empty-run-root"


class VerificationOutcome(Protocol):
    """What the guard needs from a verification result (see verification.VerificationResult)."""

    verified: bool
    checked: int
    problems: Sequence[Any]

    @property
    def reason(self) -> str: ...


@dataclass(frozen=True)
class GuardTarget:
    """What the guard verifies, fixed when the run's RayJob is created and carried on it as an annotation
    (KubeRay copies a RayJob's annotations onto its RayCluster: `constructRayClusterForRayJob`). The spec and
    the runtime env can be edited; these facts must not depend on them."""

    run_root: str
    endpoint_url: str = ""
    region: str = ""
    verify: bool = True
    timeout_seconds: int = 900
    sweep: str = ""
    run_id: str = ""

    def to_annotation(self) -> str:
        return json.dumps(
            {"runRoot": self.run_root, "endpointUrl": self.endpoint_url, "region": self.region,
             "verify": self.verify, "timeoutSeconds": self.timeout_seconds, "sweep": self.sweep, "runId": self.run_id},
            sort_keys=True, separators=(",", ":"),
        )

    @classmethod
    def from_annotation(cls, text: str | None) -> GuardTarget | None:
        """The target an annotation carries; None when absent or unreadable (the caller then holds)."""
        if not text:
            return None
        try:
            doc = json.loads(text)
            root = doc["runRoot"]
            if not isinstance(root, str) or not root.startswith("s3://"):
                return None
            return cls(
                run_root=root,
                endpoint_url=str(doc.get("endpointUrl") or ""),
                region=str(doc.get("region") or ""),
                verify=doc.get("verify") is not False,  # anything but an explicit false verifies
                timeout_seconds=int(doc.get("timeoutSeconds") or 900),
                sweep=str(doc.get("sweep") or ""),
                run_id=str(doc.get("runId") or ""),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def target_of(obj: Mapping[str, Any]) -> GuardTarget | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return GuardTarget.from_annotation(annotations.get(constants.ANNOTATION_GUARD))


def status_target(sweep: Mapping[str, Any]) -> GuardTarget | None:
    """The guard facts a sweep's status recorded at admission (status.guard)."""
    status = sweep.get("status") or {}
    guard = status.get("guard") or {}
    root = guard.get("runRoot")
    if not isinstance(root, str) or not root.startswith("s3://"):
        return None
    return GuardTarget(root, guard.get("endpointUrl") or "", guard.get("region") or "", guard.get("verify") is not False,
                       int(guard.get("timeoutSeconds") or 900), (sweep.get("metadata") or {}).get("name", ""),
                       status.get("runId") or "")


@dataclass(frozen=True)
class GuardFacts:
    """Everything a deletion decision depends on, gathered before deciding (no I/O after)."""

    kind: str
    name: str
    skip: bool = False  # the escape-hatch annotation on this object or one it belongs to
    target: GuardTarget | None = None
    target_unknown: str = ""  # why no target could be found (when one is needed)
    never_admitted: bool = False  # no run was ever created for this sweep: nothing can exist in S3
    started: tuple[str, ...] = ()  # the records that say a run started (for the messages)


@dataclass(frozen=True)
class Release:
    reason: str
    audit: bool = False  # a Warning Event: released without a verified, non-empty run


@dataclass(frozen=True)
class Hold:
    reason: str
    retry_after: float


@dataclass(frozen=True)
class Verify:
    """Verification is needed before a decision; the caller runs it and calls `decide_after_verification`."""

    target: GuardTarget


GuardDecision = Release | Hold | Verify


def skip_requested(*annotation_sets: Mapping[str, str] | None) -> bool:
    """The escape hatch: `sweeps.dev/skip-checkpoint-verification: "true"` on any of the objects."""
    return any(
        (annotations or {}).get(constants.ANNOTATION_SKIP_VERIFICATION, "").strip().lower() == "true"
        for annotations in annotation_sets
    )


def backoff_seconds(attempt: int, base: float, maximum: float) -> float:
    """base, 2*base, 4*base, ... capped at maximum (attempt counts from 0)."""
    return float(min(base * (2 ** max(attempt, 0)), maximum))


def decide_before_verification(facts: GuardFacts, *, attempt: int, base_backoff: float, max_backoff: float) -> GuardDecision:
    if facts.skip:
        return Release(
            f"annotation {constants.ANNOTATION_SKIP_VERIFICATION}=true: released without verifying checkpoints",
            audit=True,
        )
    if facts.never_admitted:
        return Release("the sweep was never admitted: no RayJob and no run root exist")
    if facts.target is None:
        why = facts.target_unknown or "the run root to verify is unknown"
        started = f" ({', '.join(facts.started)})" if facts.started else ""
        return Hold(f"{why}{started}; fix the record or release by hand (sweepctl release)",
                    backoff_seconds(attempt, base_backoff, max_backoff))
    if not facts.target.verify:
        return Release("spec.deletion.verifyCheckpoints was false at admission: released without verifying checkpoints", audit=True)
    return Verify(facts.target)


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
        return Release("nothing to protect: the run root holds no object (the driver never wrote its status)", audit=True)
    if result.verified and result.checked > 0:
        return Release("checkpoints verified complete in S3")
    if result.verified and result.checked == 0:
        reported = reported_checkpoints(progress, final)
        if not progress_readable:
            return Hold("no committed checkpoint found, and the run's status could not be read to confirm none was "
                        "reported", retry)
        if reported:
            return Hold(f"no committed checkpoint found, but the run reported {len(reported)} "
                        f"(e.g. {reported[0]}): checkpoints were lost or the run root is wrong", retry)
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
