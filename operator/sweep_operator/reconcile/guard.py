"""The checkpoint guard (pure, R22): its facts from the objects read, and the decision to release a finalizer or hold it
and re-check with backoff.

docs/guard.md states the rules as one table; each rule names its test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants, s3_layout
from sweep_contracts.problems import SpecError
from sweep_contracts.spec_checks import parse_spec
from sweep_contracts.status_models import SweepStatus

from ..phases import Fact, to
from ..run_metadata import GuardTarget as GuardTarget
from ..status import StatusChanges, conditions_with, unreadable_fields, updated
from .actions import Action, ChangeStatus, PostEvent
from .facts import DeletionFacts, meta_of, status_of

# Hold, Release and backoff_seconds are re-exported: the controller's deletion pipeline and the cache name them here.
from .verdicts import Hold as Hold
from .verdicts import Release as Release
from .verdicts import backoff_seconds as backoff_seconds
from .verdicts import decide_after_verification, status_target, target_of, verdict


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


def decide_before_verification(
    facts: GuardFacts, *, attempt: int, base_backoff: float, max_backoff: float
) -> GuardDecision:
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
        return Hold(
            f"{why}{started}; fix the record or release by hand (sweepctl release)",
            backoff_seconds(attempt, base_backoff, max_backoff),
        )
    if not facts.target.verify:
        return Release(
            "spec.deletion.verifyCheckpoints was false at admission: released without verifying checkpoints", audit=True
        )
    return Verify(facts.target)


# ------------------------------------------------------------------------------------------- gathering the facts
# Pure functions over the objects the controller read for a deletion (DeletionFacts) -> GuardFacts.


@dataclass(frozen=True)
class StorageDefaults:
    """The operator's S3 endpoint and region, for targets whose record leaves them empty."""

    endpoint_url: str = ""
    region: str = ""


def run_records(rayjob: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The RayJob's records that a run exists: a job status, an attempt counter, a cluster, a start time
    (KubeRay resets jobStatus for a retry, so no single field decides)."""
    rayjob_status = (rayjob or {}).get("status") or {}
    records = []
    if rayjob_status.get("jobStatus"):
        records.append(f"jobStatus {rayjob_status['jobStatus']}")
    for counter in ("failed", "succeeded"):
        if int(rayjob_status.get(counter) or 0) > 0:
            records.append(f"status.{counter}={rayjob_status[counter]}")
    if rayjob_status.get("rayClusterName"):
        records.append(f"RayCluster {rayjob_status['rayClusterName']}")
    if rayjob_status.get("startTime"):
        records.append("status.startTime")
    return tuple(records)


def sweep_name_of(obj: Mapping[str, Any]) -> str:
    """The sweep a RayJob or RayCluster belongs to: its label, else its guard annotation (labels can be edited)."""
    target = target_of(obj)
    return (meta_of(obj).get("labels") or {}).get(constants.LABEL_SWEEP) or (target.sweep if target else "")


def spec_target(
    body: Mapping[str, Any], defaults: StorageDefaults, status: SweepStatus | None = None
) -> GuardTarget | None:
    """A run root derived from the spec's structure and status.runId (sweeps admitted before status.guard
    existed). Today's caps are not applied: a spec over a cap that was lowered later still names its run. `status`:
    the sweep's status already parsed; None: parsed here."""
    run_id = (status if status is not None else status_of(body)).run_id
    if not run_id:
        return None
    try:
        spec = parse_spec(body.get("spec"))
    except SpecError:
        return None
    meta = meta_of(body)
    root = s3_layout.run_root(spec.storage.uri, meta.get("namespace") or "default", meta["name"], run_id)
    return GuardTarget(
        root,
        spec.storage.endpoint_url or defaults.endpoint_url,
        spec.storage.region or defaults.region,
        spec.deletion.verify_checkpoints,
        spec.deletion.verification_timeout_seconds,
        meta["name"],
        run_id,
    )


def run_target(body: Mapping[str, Any], defaults: StorageDefaults) -> GuardTarget | None:
    """What a sweep's run writes to: recorded at admission (status.guard), else derived from the spec."""
    status = status_of(body)
    return status_target(body, status) or spec_target(body, defaults, status)


def trusted_target(target: GuardTarget | None, namespace: str) -> tuple[GuardTarget | None, str]:
    """The target a guard record names, if it may be read with the operator's rights: its run root must be the run's
    own prefix in the object's own namespace (`<storage>/<namespace>/<sweep>-<runId>`), so no record, however it got
    there, points the operator at another namespace's data. (None, why) otherwise."""
    if target is None:
        return None, ""
    own = f"/{namespace}/{target.sweep}-{target.run_id}"
    if not target.sweep or not target.run_id or not target.run_root.rstrip("/").endswith(own):
        return None, (
            f"the guard record's run root is not this run's prefix in namespace {namespace} "
            f"(expected it to end in {own}); it is never read"
        )
    return target, ""


# What a sweep's status records of a run having been admitted (by stored name).
RUN_RECORDS_IN_STATUS = (
    ("runId", "a run id in status"),
    ("trainingStartedAt", "status.trainingStartedAt"),
    ("rayClusterName", "a RayCluster in status"),
)
# Fields whose value, when it does not parse, is taken as a record of a run: the guard fails closed, and a record it
# cannot read is never taken for no record ("status": a status that is not an object at all).
UNREADABLE_RUN_RECORDS = frozenset({"status", "guard", *(key for key, _ in RUN_RECORDS_IN_STATUS)})


def status_run_records(body: Mapping[str, Any], status: SweepStatus) -> tuple[tuple[str, ...], str]:
    """The records in a sweep's status that say a run started (GuardFacts.started), and why its run root is unknown
    when nothing names it."""
    values = {"runId": status.run_id, "trainingStartedAt": status.training_started_at}
    values["rayClusterName"] = status.ray_cluster_name
    started = tuple(record for key, record in RUN_RECORDS_IN_STATUS if values[key])
    unreadable = sorted(unreadable_fields(body.get("status"), status) & UNREADABLE_RUN_RECORDS)
    named = ["status" if key == "status" else f"status.{key}" for key in unreadable]
    started += tuple(f"{name} (unreadable)" for name in named)
    if status.run_id:
        return started, f"run {status.run_id} has no recorded run root (status.guard)"
    if named:
        return started, f"the run root cannot be determined: {', '.join(named)} cannot be read"
    return started, "the run root cannot be determined"


UNGUARDED_HINT = (
    "it carries no guard record ({annotation}) the operator wrote: objects created by an earlier version, or by "
    "hand, are held until a guard admin runs `sweepctl release` with their own credentials"
)


def guard_facts(facts: DeletionFacts, defaults: StorageDefaults) -> GuardFacts:
    """The guard's facts for a TrainingSweep, RayJob or RayCluster being deleted (docs/guard.md, "what the guard
    verifies": first found wins)."""
    body, rayjob, sweep = facts.body, facts.rayjob, facts.sweep
    meta = meta_of(body)
    namespace = meta.get("namespace") or "default"
    hint = UNGUARDED_HINT.format(annotation=constants.ANNOTATION_GUARD)
    # Trust boundary: a target only from what the operator wrote and the policy protects (the guard annotation,
    # status.guard), never from a pod's env, runtimeEnvYAML, today's spec, a label or a name.
    if facts.kind == constants.KIND:
        status = status_of(body)
        in_status, why_unknown = status_run_records(body, status)
        started = (run_records(rayjob) if rayjob else ()) + in_status
        record = (target_of(rayjob) if rayjob else None) or status_target(body, status)
        target, untrusted = trusted_target(record, namespace)
        unknown = untrusted or ("" if target is not None else why_unknown)
        return GuardFacts(
            kind=facts.kind,
            name=meta["name"],
            skip=skip_requested(meta.get("annotations")),
            target=target,
            target_unknown=unknown,
            never_admitted=rayjob is None and not started,
            started=started,
        )
    if facts.kind == constants.RAYJOB_KIND:
        target, untrusted = trusted_target(target_of(body), namespace)
        return GuardFacts(
            kind=facts.kind,
            name=meta.get("name", ""),
            skip=skip_requested(meta.get("annotations"), meta_of(sweep or {}).get("annotations")),
            target=target,
            target_unknown=untrusted or f"the RayJob's run root is unknown: {hint}",
            started=run_records(body),
        )
    # A RayCluster: its own copy of the RayJob's annotation first (KubeRay copies it at creation): it outlives the
    # RayJob and names the sweep's own storage, not the operator's defaults.
    target, untrusted = trusted_target(target_of(body) or (target_of(rayjob) if rayjob else None), namespace)
    return GuardFacts(
        kind=facts.kind,
        name=meta.get("name", ""),
        skip=skip_requested(
            meta.get("annotations"), meta_of(rayjob or {}).get("annotations"), meta_of(sweep or {}).get("annotations")
        ),
        target=target,
        target_unknown=untrusted or f"no run root found for this cluster: {hint}",
        started=("a RayCluster exists",),
    )


def backoff_settings(sweep: Mapping[str, Any] | None) -> tuple[float, float]:
    """The sweep's (retryBackoffSeconds, maxRetryBackoffSeconds); the defaults when there is no readable spec."""
    try:
        deletion = parse_spec(sweep.get("spec")).deletion if sweep else None
    except SpecError:
        deletion = None
    return (deletion.retry_backoff_seconds, deletion.max_retry_backoff_seconds) if deletion else (30.0, 600.0)


def error_code(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return "KeyError"
    response = getattr(exc, "response", None) or {}
    return str((response.get("Error") or {}).get("Code") or "")


# --------------------------------------------------------------------------------- the guard's finalizer and label
def missing_finalizer(body: Mapping[str, Any]) -> bool:
    """Nothing is created for a sweep before the guard's finalizer is on it (R22): the operator adds it itself (the
    guard's pipeline owns the finalizer; kopf manages none of ours)."""
    return constants.FINALIZER not in (meta_of(body).get("finalizers") or [])


def label_lost(body: Mapping[str, Any]) -> bool:
    """A guarded RayJob/RayCluster without its sweep label: it stays guarded (only the guard removes the
    finalizer), and people are told so."""
    meta = meta_of(body)
    return constants.LABEL_SWEEP not in (meta.get("labels") or {}) and constants.FINALIZER in (
        meta.get("finalizers") or []
    )


# --------------------------------------------------------------------------------- one deletion, before and after
# A deletion is decided twice around what the edge reads: `before_verification` says whether a verification (and
# the run's records) must be read; `after_verification` decides on what was read (guard_pipeline.verify_and_decide).


@dataclass(frozen=True)
class RunRecords:
    """What a verification read for a deletion's second decision: the verifier's result, the run's status.json and
    result.json, and whether status.json could be read at all."""

    result: Any
    progress: Mapping[str, Any] | None = None
    final: Mapping[str, Any] | None = None
    readable: bool = True


@dataclass(frozen=True)
class Backoff:
    """How a deletion's holds are spaced: its attempt and the sweep's backoff settings."""

    attempt: int
    base: float
    most: float

    @classmethod
    def of(cls, deletion: DeletionFacts) -> Backoff:
        base, most = backoff_settings(deletion.sweep)
        return cls(deletion.attempt, base, most)


def before_verification(facts: GuardFacts, backoff: Backoff) -> Release | Hold | Verify:
    """The decision before anything is read from S3: release, hold, or verify `Verify.target` first."""
    return decide_before_verification(
        facts, attempt=backoff.attempt, base_backoff=backoff.base, max_backoff=backoff.most
    )


def after_verification(records: RunRecords, backoff: Backoff) -> Release | Hold:
    """The decision on what the verification read."""
    return decide_after_verification(
        records.result,
        progress=records.progress,
        final=records.final,
        progress_readable=records.readable,
        attempt=backoff.attempt,
        base_backoff=backoff.base,
        max_backoff=backoff.most,
    )


@dataclass(frozen=True)
class Notice:
    """The Event a deletion decision posts on each of `objects`."""

    type: str
    reason: str
    message: str
    objects: tuple[Mapping[str, Any], ...]


def deletion_notice(deletion: DeletionFacts, facts: GuardFacts, decision: Release | Hold) -> Notice:
    """A hold, or a release without verification, is told on the object and on its sweep (where people look); a
    verified release on the object only."""
    body, sweep, kind = deletion.body, deletion.sweep, facts.kind
    name = meta_of(body).get("name", "")
    both = (body, sweep) if sweep is not None and sweep is not body else (body,)
    if isinstance(decision, Hold):
        message = hold_message(kind, name, decision.reason, decision.retry_after)
        return Notice("Warning", "CheckpointsNotVerified", message, both)
    if decision.audit:
        message = f"{kind} {name} deletion released WITHOUT checkpoint verification: {decision.reason}"
        return Notice("Warning", "CheckpointGuardBypassed", message, both)
    return Notice("Normal", "CheckpointGuardReleased", f"{kind} {name} deletion released: {decision.reason}", (body,))


# --------------------------------------------------------------------------------- what the sweep's status says


DELETING = {"phase": to(Fact.DELETION_STARTED), "message": "verifying checkpoints before deletion"}


def verification_status(
    status: SweepStatus, generation: int | None, now: float, result: Any, decision: Release | Hold | None
) -> StatusChanges:
    """Status changes recording a deletion's verification: checkpoints and CheckpointsVerified (Ready follows from
    them when the status is written: status.lifecycle_conditions)."""
    said = verdict(result, decision)
    condition = ("CheckpointsVerified", said.verified, said.reason, said.message)
    return {"checkpoints": result.to_status(), "conditions": conditions_with(status, generation, now, condition)}


def held_status(sweep: Mapping[str, Any], now: float, message: str) -> StatusChanges:
    """A hold without a verification (nothing to record but why): CheckpointsVerified false with the hold's message."""
    condition = ("CheckpointsVerified", False, "NotVerified", message)
    return {"conditions": conditions_with(status_of(sweep), meta_of(sweep).get("generation"), now, condition)}


def recorded(
    deletion: DeletionFacts,
    facts: GuardFacts,
    decision: Release | Hold,
    result: Any,
    now: float,
    onto: Mapping[str, Any] | None = None,
) -> tuple[Action, ...]:
    """What a guard decision records, in this order: the verification on the sweep (`result`; None: none was taken),
    the notice's Events, and a hold without a verification's reason on the sweep. The status changes are computed
    from the sweep as the deletion found it and written onto `onto` (a newer copy: our own write just before), and
    all come before the finalizer comes off, so the sweep says why it went."""
    sweep, actions = deletion.sweep, list[Action]()
    if sweep is not None and result is not None:
        changes = verification_status(status_of(sweep), meta_of(sweep).get("generation"), now, result, decision)
        actions.append(ChangeStatus(onto or sweep, lambda s: updated(s, changes)))
    notice = deletion_notice(deletion, facts, decision)
    actions.append(PostEvent(notice.objects, notice.type, notice.reason, notice.message))
    if isinstance(decision, Hold) and sweep is not None and result is None:
        held = held_status(sweep, now, notice.message)
        actions.append(ChangeStatus(onto or sweep, lambda s: updated(s, held)))
    return tuple(actions)


def hold_message(kind: str, name: str, reason: str, delay: float) -> str:
    return f"{kind} {name} deletion held by the checkpoint guard: {reason}; re-checking in {delay:g}s"


def label_removed_message(kind: str, body: Mapping[str, Any]) -> str:
    target = target_of(body)
    return (
        f"{kind} {meta_of(body).get('name')} lost its label {constants.LABEL_SWEEP}; it stays guarded by "
        f"{constants.FINALIZER} (run root {target.run_root if target else 'unknown'}), which only the "
        "checkpoint guard removes"
    )
