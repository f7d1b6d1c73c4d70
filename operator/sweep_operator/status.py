"""Status (pure): KubeRay RayJob facts and the run's progress files -> phase, conditions, printer columns.

Conditions follow the Kubernetes API conventions: type, status, reason, message, lastTransitionTime
(changed only when status flips) and observedGeneration.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from sweep_contracts.api import TERMINAL_PHASES, WAITING_PHASES, Phase
from sweep_contracts.paramspace import grid_size
from sweep_contracts.status_models import (
    MAX_LINEAGE_CHANGES,
    MAX_LINEAGE_ENTRIES,
    MAX_LINEAGE_VALUE_CHARS,
    Condition,
    SweepStatus,
)
from sweep_contracts.timestamps import epoch_seconds as epoch_seconds  # re-exported: the operator reads times here
from sweep_contracts.timestamps import parse_time as parse_time  # re-exported, as epoch_seconds
from sweep_contracts.timestamps import rfc3339
from sweep_contracts.tracking import tracking_state, tracking_uri_of

from .phases import Fact, to

# KubeRay v1.7 JobDeploymentStatus values.
DEPLOYMENT_NEW = ""
DEPLOYMENT_STARTING = frozenset({"", "Initializing", "Waiting", "Scheduling", "Scheduled", "Retrying"})
DEPLOYMENT_RUNNING = "Running"
DEPLOYMENT_COMPLETE = "Complete"
DEPLOYMENT_FAILED = "Failed"
DEPLOYMENT_SUSPENDED = frozenset({"Suspending", "Suspended"})
REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"
JOB_SUCCEEDED = "SUCCEEDED"
JOB_RUNNING = "RUNNING"


@dataclass(frozen=True)
class RayJobFacts:
    """What the operator reads from a RayJob (None fields: not reported yet)."""

    name: str
    deployment_status: str = ""
    job_status: str = ""
    reason: str = ""
    message: str = ""
    cluster_name: str = ""
    start_time: str | None = None
    end_time: str | None = None
    failed: int = 0
    deleting: bool = False
    suspended: bool = False

    @classmethod
    def from_object(cls, rayjob: Mapping[str, Any]) -> RayJobFacts:
        status = rayjob.get("status") or {}
        meta = rayjob.get("metadata") or {}
        return cls(
            name=meta.get("name", ""),
            deployment_status=status.get("jobDeploymentStatus") or "",
            job_status=status.get("jobStatus") or "",
            reason=status.get("reason") or "",
            message=status.get("message") or "",
            cluster_name=status.get("rayClusterName") or "",
            start_time=status.get("startTime"),
            end_time=status.get("endTime"),
            failed=int(status.get("failed") or 0),
            deleting=bool(meta.get("deletionTimestamp")),
            suspended=bool((rayjob.get("spec") or {}).get("suspend")),
        )

    @property
    def running(self) -> bool:
        return self.deployment_status == DEPLOYMENT_RUNNING or self.job_status == JOB_RUNNING

    @property
    def finished(self) -> bool:
        return self.deployment_status in (DEPLOYMENT_COMPLETE, DEPLOYMENT_FAILED)


def kuberay_fact(facts: RayJobFacts) -> Fact:
    """What a RayJob's state says of the run (KubeRay's one switch on its deployment status)."""
    if facts.deployment_status == DEPLOYMENT_COMPLETE:
        return Fact.RAYJOB_SUCCEEDED if facts.job_status == JOB_SUCCEEDED else Fact.RAYJOB_FAILED
    if facts.deployment_status == DEPLOYMENT_FAILED:
        return Fact.RAYJOB_DEADLINE if facts.reason == REASON_DEADLINE_EXCEEDED else Fact.RAYJOB_FAILED
    if facts.deployment_status in DEPLOYMENT_SUSPENDED:
        return Fact.RAYJOB_SUSPENDED
    if facts.running:
        return Fact.RAYJOB_RUNNING
    return Fact.RAYJOB_STARTING


def phase_for(facts: RayJobFacts) -> Phase:
    """The sweep phase a RayJob's state implies (the phase table's answer to `kuberay_fact`)."""
    return to(kuberay_fact(facts))


def rayjob_summary(facts: RayJobFacts) -> str:
    parts = [f"RayJob {facts.name}: {facts.deployment_status or 'New'}"]
    if facts.job_status:
        parts.append(f"job {facts.job_status}")
    if facts.reason:
        parts.append(f"reason {facts.reason}")
    if facts.message:
        parts.append(facts.message)
    return ", ".join(parts)


def set_condition(
    conditions: Sequence[Condition] | None,
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    """`conditions` with `type_` set; lastTransitionTime moves only when the status value changes."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    previous = get_condition(conditions, type_)
    if (
        previous is not None
        and (previous.status, previous.reason, previous.message, previous.observed_generation)
        == (value, reason, message, generation)
        and previous.last_transition_time
    ):
        return sorted(conditions or [], key=lambda c: c.type)  # unchanged: the same models (every write settles them)
    transition = (
        previous.last_transition_time
        if previous is not None and previous.status == value and previous.last_transition_time
        else rfc3339(now)
    )
    condition = Condition.model_validate(
        {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": transition,
            "observedGeneration": generation,
        }
    )
    out = [c for c in conditions or [] if c.type != type_]
    out.append(condition)
    return sorted(out, key=lambda c: c.type)


ConditionUpdate = tuple[str, bool | str, str, str]  # (type, status, reason, message)


def conditions_with(
    status: SweepStatus, generation: int | None, now: float, *updates: ConditionUpdate
) -> list[Condition]:
    """`status.conditions` with each update applied at time `now` (Unix seconds)."""
    conditions: list[Condition] = list(status.conditions or [])
    moment = datetime.fromtimestamp(now, tz=UTC)
    for type_, value, reason, message in updates:
        conditions = set_condition(conditions, type_, value, reason, message, moment, generation)
    return conditions


# A part of a new status that a rule returns for its caller to combine with others before one `updated`: stored
# (camelCase) field names to values (a model, or its JSON), None removing the field; validated when applied.
StatusChanges = dict[str, Any]

# A status field by the name it is stored under (camelCase) or its attribute's name.
_FIELD_NAMES: dict[str, str] = {
    **{name: name for name in SweepStatus.model_fields},
    **{field.alias: name for name, field in SweepStatus.model_fields.items() if field.alias},
}


def read_status(raw: Mapping[str, Any] | None) -> SweepStatus:
    """A stored status as the contracts' model, the only form decisions read. A field that does not parse (written
    by an older operator, or edited by hand) is left out: no decision reads it, and no write touches it, since the
    writer patches only what differs between the two parsed statuses."""
    data = dict(raw or {}) if isinstance(raw, Mapping) else {}
    try:
        return SweepStatus.model_validate(data)
    except ValidationError as exc:
        unreadable = {error["loc"][0] for error in exc.errors() if error["loc"]}
    try:
        return SweepStatus.model_validate({k: v for k, v in data.items() if k not in unreadable})
    except ValidationError:
        return SweepStatus()


def unreadable_fields(raw: Any, status: SweepStatus) -> frozenset[str]:
    """The stored fields (by stored name) holding a value `read_status` left out of `status` because it does not
    parse; {"status"} when the status is not an object at all. A rule that must not take an unreadable record for no
    record (the guard, Kueue's clock) asks this."""
    if not isinstance(raw, Mapping):
        return frozenset({"status"}) if raw else frozenset()
    document = status_document(status)
    return frozenset(key for key, value in raw.items() if value and key not in document)


def status_document(status: SweepStatus) -> dict[str, Any]:
    """The status as the API stores it: camelCase, JSON values, unset fields left out."""
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


def updated(status: SweepStatus, changes: Mapping[str, Any] | None = None, /, **fields: Any) -> SweepStatus:
    """`status` with `changes` (by stored camelCase name) and `fields` (by attribute name) applied, as a new,
    validated model; None removes a field (as the merge patch will). A name outside the schema is a KeyError, a
    value outside it a ValidationError: the API server would refuse the write."""
    if not changes and not fields:
        return status
    data = dict(status)
    for key, value in {**(changes or {}), **fields}.items():
        data[_FIELD_NAMES[key]] = value
    return SweepStatus.model_validate(data)


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that takes status document `old` to `new`: a removed field is None, at any
    depth (the API server merges an object into the stored one, so a field left out of a nested object would stay),
    and a list is sent whole."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if before == value:
            continue
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = value
    patch.update({key: None for key in old if key not in new})
    return patch


def get_condition(conditions: Sequence[Condition] | None, type_: str) -> Condition | None:
    return next((c for c in conditions or [] if c.type == type_), None)


def is_terminal(phase: str | None) -> bool:
    return phase in TERMINAL_PHASES


def awaiting_verification(status: SweepStatus) -> bool:
    """Ended, and its end-of-run verification has not been recorded. A verification from before the end (the guard
    verifying a retried or earlier attempt's RayCluster as KubeRay deletes it) is not the end-of-run one."""
    if not is_terminal(status.phase):
        return False
    recorded = status.checkpoints.verified_at if status.checkpoints else None
    if not recorded:
        return True
    try:
        verified_at, finished_at = parse_time(recorded), parse_time(status.finished_at)
    except ValueError:  # an unreadable time: the record stands
        return False
    return verified_at is not None and finished_at is not None and verified_at < finished_at


# The conditions a script waits on (`kubectl wait --for=condition=...`), as a Kubernetes Job has them: Complete and
# Failed turn True only when the run has ended, one or the other (never both); Ready is True only for a sweep that
# succeeded with its checkpoints verified. Every status write derives them here, from the phase and the facts
# beside it, and nowhere else.
NOT_FINISHED = "the sweep has not finished"
# A sweep that ended in one of these failed; a failure's reason is the phase, except Failed which says why.
FAILED_ENDS: frozenset[str] = TERMINAL_PHASES - {Phase.SUCCEEDED}
_CAMEL_CASE = re.compile(r"^[A-Z][A-Za-z0-9]{0,127}$")
# A Running condition still saying how the run went on, not why it ended.
NOT_ENDED_REASONS: frozenset[str] = WAITING_PHASES | {Phase.RUNNING}


def _failure_reason(status: SweepStatus) -> str:
    """Why a Failed sweep failed, as a CamelCase reason: the Running condition's when a rule set one at the end
    (StartupDeadlineExceeded, RayJobDeleted), else KubeRay's status.reason (AppFailed, SubmissionFailed), else
    Failed."""
    running = get_condition(status.conditions, "Running")
    for reason in (running.reason if running else None, status.reason):
        if isinstance(reason, str) and _CAMEL_CASE.match(reason) and reason not in NOT_ENDED_REASONS:
            return reason
    return str(Phase.FAILED)


def lifecycle_conditions(status: SweepStatus) -> tuple[ConditionUpdate, ...]:
    """Complete, Failed and Ready for `status` (pure: the phase, the message, the end-of-run verification and the
    CheckpointsVerified condition). None while the sweep has no phase or is being deleted: a deletion does not undo
    how the run ended."""
    phase = status.phase
    if not phase or phase == Phase.DELETING:
        return ()
    message = status.message or ""
    if not is_terminal(phase):
        return (
            ("Complete", False, phase, NOT_FINISHED),
            ("Failed", False, phase, NOT_FINISHED),
            ("Ready", False, phase, NOT_FINISHED),
        )
    if phase in FAILED_ENDS:
        reason = _failure_reason(status) if phase == Phase.FAILED else phase
        why = message or f"the sweep ended {phase}"
        return (
            ("Complete", False, phase, f"the sweep ended {phase}"),
            ("Failed", True, reason, why),
            ("Ready", False, phase, why),
        )
    verified = get_condition(status.conditions, "CheckpointsVerified")
    if awaiting_verification(status):
        ready: ConditionUpdate = ("Ready", False, phase, "the sweep succeeded; its checkpoints are being verified")
    elif verified is not None and verified.status == "True":
        ready = ("Ready", True, phase, "sweep succeeded and its checkpoints are verified")
    else:
        why = (verified.message if verified is not None else "") or "no verification recorded"
        ready = ("Ready", False, phase, f"the sweep succeeded, but its checkpoints are not verified: {why}")
    return (
        ("Complete", True, phase, message or "the sweep succeeded"),
        ("Failed", False, phase, "the sweep succeeded"),
        ready,
    )


def settled(status: SweepStatus, generation: int | None, now: float) -> SweepStatus:
    """`status` with what follows from its phase, as every status write stores it: the lifecycle conditions, and
    `activeDeadlineAt` (the DEADLINE column: the deadline while the run has not ended; deadlineAt keeps it)."""
    changes: dict[str, Any] = {}
    updates = lifecycle_conditions(status)
    if updates:
        conditions = conditions_with(status, generation, now, *updates)
        if conditions != list(status.conditions or []):
            changes["conditions"] = conditions
    phase = status.phase
    if phase != Phase.DELETING:
        deadline = status.deadline_at
        active = deadline if deadline and not is_terminal(phase) else None
        if active != status.active_deadline_at:
            changes["activeDeadlineAt"] = active
    return updated(status, changes)


TRIAL_STATES = ("pending", "running", "terminated", "errored")


def _count(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0


def trial_counts(doc: Mapping[str, Any]) -> dict[str, int]:
    """Trial counts from `_sweep/status.json` or `result.json` (`trials: {total, pending, ...}`)."""
    raw = doc.get("trials") or {}
    counts = {state: _count(raw.get(state)) for state in TRIAL_STATES}
    counts["total"] = max(_count(raw.get("total")), sum(counts.values()))
    return counts


def planned_trials(spec: Any) -> int | None:
    """How many trials the sweep asks for in all (over every attempt): `tune.numSamples`, times the grid's points
    when paramSpace has grid values (Tune repeats the whole grid numSamples times); None without a spec."""
    if spec is None:
        return None
    return int(spec.tune.num_samples) * grid_size(dict(spec.param_space))


def trials_summary(counts: Mapping[str, int], planned: int | None = None) -> str:
    """The TRIALS printer column: finished out of the trials the sweep asks for, and how many run now, e.g.
    `3/8 (2 running)`. Ray's count of trials started so far is no denominator: it reads `0/1` while the first trial
    trains and `2/2` when a 100-sample sweep has only begun."""
    finished = counts.get("terminated", 0) + counts.get("errored", 0)
    total = max(planned or 0, counts.get("total", 0))
    running = counts.get("running", 0)
    return f"{finished}/{total} ({running} running)" if running else f"{finished}/{total}"


# The best trial is copied from documents the tenant's code writes (`_sweep/status.json`, `result.json`) into the
# sweep's status, which is rewritten on every change: each part is bounded. A config over its bound is replaced by a
# note of its size (the whole config stays in the run's documents).
MAX_BEST_CONFIG_BYTES = 4 * 1024  # the config as compact JSON
MAX_BEST_ID_CHARS = 256  # Tune's trial ids are a dozen characters
MAX_BEST_METRIC_CHARS = 128  # spec.tune.metric's own bound
MAX_BEST_URI_CHARS = 2048  # s3://, a bucket name (63) and a key (at most 1024 bytes)


def _bounded_text(value: Any, limit: int) -> str | None:
    """A string of at most `limit` characters (a longer one cut, saying its length); None for anything else."""
    if not isinstance(value, str):
        return None
    if len(value) <= limit:
        return value
    note = f"... ({len(value)} characters)"
    return value[: limit - len(note)] + note


def _bounded_config(value: Any) -> dict[str, Any] | None:
    """The config when it is a JSON object of at most MAX_BEST_CONFIG_BYTES, else a short note saying why not."""
    if not isinstance(value, Mapping):
        return None
    try:
        size = len(json.dumps(value, separators=(",", ":"), allow_nan=False).encode())
    except (ValueError, TypeError, RecursionError):  # NaN or infinity (the API server refuses them), too deep
        return {"omitted": "the best trial's config is not plain JSON; see the run's _sweep/status.json"}
    if size > MAX_BEST_CONFIG_BYTES:
        return {
            "omitted": f"the best trial's config is {size} bytes of JSON, over the {MAX_BEST_CONFIG_BYTES} the status "
            "keeps; see the run's _sweep/status.json",
            "bytes": size,
        }
    return dict(value)


def _finite_number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return value if math.isfinite(value) else None
    except OverflowError:  # an integer past a float's range: no number the API server stores
        return None


def best_trial(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """`bestTrial` for the status from a progress/result file, or None when there is none yet. Every part is
    bounded and of its schema type (a wrong type is left out: the API server would refuse the whole status)."""
    best = doc.get("bestTrial") or doc.get("best")
    if not isinstance(best, Mapping):
        return None
    out = {
        "id": _bounded_text(best.get("id"), MAX_BEST_ID_CHARS),
        "metric": _bounded_text(best.get("metric"), MAX_BEST_METRIC_CHARS),
        "value": _finite_number(best.get("value")),
        "config": _bounded_config(best.get("config")),
        "checkpointUri": _bounded_text(best.get("checkpointUri"), MAX_BEST_URI_CHARS),
    }
    return {k: v for k, v in out.items() if v is not None}


# The status fields progress_patch writes: the driver's progress, mirrored on the sweep's own rhythm
# (reconcile.progress_rhythm), never ahead of a phase or condition change.
PROGRESS_FIELDS = frozenset(
    {"trials", "trialsSummary", "waitingFor", "bestTrial", "bestSummary", "tracking", "lineage"}
)


def lineage_status(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """`lineage` for the status from a PBT run's `_sweep/status.json` (its newest exploits and their count): bounded
    like bestTrial, every value in its schema type; None when the document has none."""
    lineage = doc.get("lineage")
    if not isinstance(lineage, Mapping) or not isinstance(lineage.get("entries"), list):
        return None
    entries = []
    for raw in [e for e in lineage["entries"] if isinstance(e, Mapping)][-MAX_LINEAGE_ENTRIES:]:
        step = raw.get("step")
        found = raw.get("changes")
        changes: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        entry = {
            "trial": _bounded_text(raw.get("trial"), MAX_BEST_ID_CHARS),
            "donor": _bounded_text(raw.get("donor"), MAX_BEST_ID_CHARS),
            "step": step if isinstance(step, int) and not isinstance(step, bool) else None,
            "changes": [
                {
                    "param": _bounded_text(str(name), MAX_BEST_METRIC_CHARS),
                    "before": _bounded_text(json.dumps(pair[0], default=str), MAX_LINEAGE_VALUE_CHARS),
                    "after": _bounded_text(json.dumps(pair[1], default=str), MAX_LINEAGE_VALUE_CHARS),
                }
                for name, pair in list(changes.items())[:MAX_LINEAGE_CHANGES]
                if isinstance(pair, (list, tuple)) and len(pair) == 2
            ],
            "at": _bounded_text(raw.get("at"), 64),
        }
        entries.append({k: v for k, v in entry.items() if v is not None})
    total = lineage.get("exploits")
    count = total if isinstance(total, int) and not isinstance(total, bool) and total >= len(entries) else len(entries)
    return {"exploits": count, "entries": entries}


def progress_patch(doc: Mapping[str, Any], spec: Any = None) -> StatusChanges:
    """Status fields from a run's `_sweep/status.json` or `_sweep/result.json`; `waitingFor` is cleared (None: the
    merge patch removes it) as soon as nothing is pending, and by result.json, which has no `pending` block. `spec`
    (the run's SweepSpec) gives trialsSummary its denominator, the trials asked for (`planned_trials`)."""
    from .ray_demand import waiting_for

    counts = trial_counts(doc)
    patch: dict[str, Any] = {
        "trials": counts,
        "trialsSummary": trials_summary(counts, planned_trials(spec)),
        "waitingFor": waiting_for(doc),
    }
    best = best_trial(doc)
    if best:
        patch["bestTrial"] = best
        if "value" in best:
            patch["bestSummary"] = best_summary(best)
    lineage = lineage_status(doc)
    if lineage is not None:
        patch["lineage"] = lineage
    tracked = tracking_state(doc, tracking_uri_of(spec))
    if tracked is not None:
        patch["tracking"] = tracked.status()
    return patch


MAX_SUMMARY_METRIC_CHARS = 40  # the BEST column's metric name; bestTrial.metric keeps it whole


def best_summary(best: Mapping[str, Any]) -> str:
    """The BEST column: `val_loss=0.1235`, the metric's name and its value to 4 significant digits (the value alone
    when the metric is not named)."""
    value = f"{best['value']:.4g}"
    metric = best.get("metric")
    if not isinstance(metric, str) or not metric:
        return value
    if len(metric) > MAX_SUMMARY_METRIC_CHARS:
        metric = metric[: MAX_SUMMARY_METRIC_CHARS - 3] + "..."
    return f"{metric}={value}"
