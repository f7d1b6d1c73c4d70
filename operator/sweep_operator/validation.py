"""Parse and validate a TrainingSweep (pure): every problem collected, each naming its field path.

`parse_sweep(obj)` returns a `Sweep` or raises `SpecError` with all problems: the schema's (types,
enums, minimums, unknown fields) and the spec's rules (`sweep_contracts.spec_checks`), the metadata's and the
operator's caps and tenancy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import RESUMABLE_PHASES, SweepSpec
from sweep_contracts.paramspace import grid_size
from sweep_contracts.problems import Problem, SpecError
from sweep_contracts.spec_checks import brief, parse_spec

from .policy import bundle_fit_problems, cap_problems, tenancy_problems
from .settings import OperatorLimits, TenancyPolicy

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_TOP_LEVEL = ("apiVersion", "kind", "metadata", "spec", "status")


@dataclass(frozen=True)
class Sweep:
    """A parsed TrainingSweep: the metadata the operator needs and the defaulted spec."""

    name: str
    namespace: str
    spec: SweepSpec
    uid: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


def _metadata_problems(obj: dict[str, Any]) -> list[Problem]:
    problems = []
    if obj.get("apiVersion") != constants.API_VERSION:
        problems.append(Problem("apiVersion", f"got {brief(obj.get('apiVersion'))}; must be {constants.API_VERSION}"))
    if obj.get("kind") != constants.KIND:
        problems.append(Problem("kind", f"got {brief(obj.get('kind'))}; must be {constants.KIND}"))
    for key in obj:
        if key not in _TOP_LEVEL:
            problems.append(Problem(str(key), f"unknown top-level field; allowed: {', '.join(_TOP_LEVEL)}"))
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        problems.append(Problem("metadata", f"got {brief(meta)}; must be an object with a name"))
        return problems
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        problems.append(Problem("metadata.name", "required field is missing"))
    elif len(name) > 63 or not _NAME_RE.match(name):
        problems.append(
            Problem(
                "metadata.name",
                f"got {brief(name)}; must be at most 63 lowercase letters, digits, '-' or '.', starting and "
                "ending with a letter or digit (it becomes a label value)",
            )
        )
    namespace = meta.get("namespace")
    if namespace is not None and (
        not isinstance(namespace, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace)
    ):
        problems.append(Problem("metadata.namespace", f"got {brief(namespace)}; must be a DNS-1123 label"))
    return problems


def parse_sweep(obj: Any, limits: OperatorLimits | None = None, tenancy: TenancyPolicy | None = None) -> Sweep:
    """Parse a whole TrainingSweep object; per-sweep caps (`limits`, else the defaults), bundle fit and, with
    `tenancy`, the operator's service-account and endpoint allowlists are checked too."""
    if not isinstance(obj, dict):
        raise SpecError([Problem("(document)", f"got {brief(obj)}; expected a TrainingSweep object")])
    problems = _metadata_problems(obj)
    spec: SweepSpec | None = None
    raw_spec = obj.get("spec")
    if raw_spec is None:
        problems.append(Problem("spec", "required field is missing"))
    else:
        try:
            spec = parse_spec(raw_spec)
        except SpecError as exc:
            problems += exc.problems
    if spec is not None:
        problems += bundle_fit_problems(spec)
        problems += cap_problems(spec, limits or OperatorLimits())
        problems += trial_count_problems(spec, limits or OperatorLimits())
        problems += transition_problems(obj) + resume_problems(spec, limits or OperatorLimits())
        if tenancy is not None and isinstance(obj.get("metadata"), dict):
            problems += tenancy_problems(spec, obj["metadata"].get("namespace") or "default", tenancy)
    if problems:
        raise SpecError(problems)
    assert spec is not None
    meta = obj["metadata"]
    return Sweep(
        name=meta["name"],
        namespace=meta.get("namespace") or "default",
        spec=spec,
        uid=meta.get("uid"),
        generation=meta.get("generation"),
        creation_timestamp=meta.get("creationTimestamp"),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
    )


def trial_count_problems(spec: SweepSpec, limits: OperatorLimits) -> list[Problem]:
    """The trials a sweep asks for (tune.numSamples, times the grid's points) against the operator's
    maxTrialsPerSweep: the CRD's maximum is the fixed ceiling, the setting the bound in force."""
    samples, points = spec.tune.num_samples, grid_size(dict(spec.param_space))
    trials = samples * points
    if trials <= limits.max_trials_per_sweep:
        return []
    asked = f"{samples} trials" if points == 1 else f"{trials} trials ({samples} samples x {points} grid points)"
    return [
        Problem(
            "spec.tune.numSamples",
            f"{asked} exceed maxTrialsPerSweep {limits.max_trials_per_sweep}, the most one sweep may ask for on "
            "this operator",
        )
    ]


def validate_sweep(
    obj: Any, limits: OperatorLimits | None = None, tenancy: TenancyPolicy | None = None
) -> list[Problem]:
    """Every problem with a TrainingSweep object (empty when valid)."""
    try:
        parse_sweep(obj, limits, tenancy)
    except SpecError as exc:
        return exc.problems
    return []


# ------------------------------------------------------------------------------------- resume
# A sweep that has run keeps its run root, and a resume continues the Tune experiment in it: what defines that
# experiment cannot change, and numSamples (the total over all attempts) only goes up. Each rule below is enforced
# twice with the same message: by the API server as a CEL rule on the object's root (crd.py puts RESUME_RULES there:
# a root rule sees status.runId and status.phase), and by `transition_problems` (the admission webhook, with the
# old object) for clusters that run the webhook and for tests.

_HAS_NOT_RUN = "!has(oldSelf.status) || !has(oldSelf.status.runId)"
_FIXED = (
    "once the sweep has run (status.runId is set): its run root holds that experiment, and a resume "
    "continues it; create a new TrainingSweep for another"
)


@dataclass(frozen=True)
class ResumeRule:
    """One rule: the field it names, its CEL text (at the object's root) and message, and the same check in Python
    (`holds(new, old)` over the objects; `old` None on a create)."""

    field: str
    rule: str
    message: str
    holds: Any  # Callable[[Mapping, Mapping | None], bool]
    message_expression: str | None = None

    def cel(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message, "fieldPath": "." + self.field}
        if self.message_expression:
            out["messageExpression"] = self.message_expression
        return out

    def detail(self, new: Any, old: Any) -> str:
        if self.field == "spec.resume.generation" and self.message_expression:
            return f"{self.message}; this sweep is {_phase(old) or 'Pending'}"
        return self.message


_MISSING = object()


def _at(obj: Any, path: str, default: Any = _MISSING) -> Any:
    node = obj
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _phase(obj: Any) -> str | None:
    phase = _at(obj, "status.phase", None)
    return phase if isinstance(phase, str) else None


def _has_run(old: Any) -> bool:
    return old is not None and bool(_at(old, "status.runId", None))


def _fixed(path: str, default: Any = _MISSING) -> Any:
    def holds(new: Any, old: Any) -> bool:
        return not _has_run(old) or _at(new, path, default) == _at(old, path, default)

    return holds


def _optional_fixed(path: str) -> str:
    new, old = f"self.{path}", f"oldSelf.{path}"
    return f"{_HAS_NOT_RUN} || (has({new}) ? {new} : '') == (has({old}) ? {old} : '')"


def _samples(obj: Any) -> int:
    value = _at(obj, "spec.tune.numSamples", 1)
    return value if isinstance(value, int) else 1


def _generation(obj: Any) -> int | None:
    value = _at(obj, "spec.resume.generation", None)
    return value if isinstance(value, int) else None


def _generation_kept(new: Any, old: Any) -> bool:
    before = _generation(old) if old is not None else None
    after = _generation(new)
    return before is None or (after is not None and after >= before)


def _raised_only_when_ended(new: Any, old: Any) -> bool:
    if old is None or _generation(new) is None:
        return True
    return _generation(new) == _generation(old) or _phase(old) in RESUMABLE_PHASES


def _active_above(field: str) -> Any:
    def holds(new: Any, old: Any) -> bool:
        active = _at(new, "spec.resume.activeSeconds", None)
        bound = _at(new, f"spec.deadlines.{field}", None)
        return not isinstance(active, int) or not isinstance(bound, int) or bound < active

    return holds


_PHASES_CEL = "[" + ", ".join(f"'{p}'" for p in RESUMABLE_PHASES) + "]"
RESUME_RULES: tuple[ResumeRule, ...] = (
    ResumeRule(
        "spec.trainLoop",
        f"{_HAS_NOT_RUN} || self.spec.trainLoop == oldSelf.spec.trainLoop",
        f"cannot change {_FIXED}",
        _fixed("spec.trainLoop"),
    ),
    ResumeRule(
        "spec.paramSpace",
        f"{_HAS_NOT_RUN} || self.spec.paramSpace == oldSelf.spec.paramSpace",
        f"cannot change {_FIXED}",
        _fixed("spec.paramSpace", {}),
    ),
    ResumeRule(
        "spec.storage.uri",
        f"{_HAS_NOT_RUN} || self.spec.storage.uri == oldSelf.spec.storage.uri",
        f"cannot change {_FIXED}",
        _fixed("spec.storage.uri"),
    ),
    ResumeRule(
        "spec.storage.endpointUrl",
        f"{_HAS_NOT_RUN} || self.spec.storage.endpointUrl == oldSelf.spec.storage.endpointUrl",
        f"cannot change {_FIXED}",
        _fixed("spec.storage.endpointUrl", ""),
    ),
    ResumeRule(
        "spec.storage.region",
        f"{_HAS_NOT_RUN} || self.spec.storage.region == oldSelf.spec.storage.region",
        f"cannot change {_FIXED}",
        _fixed("spec.storage.region", ""),
    ),
    ResumeRule(
        "spec.tune.metric",
        _optional_fixed("spec.tune.metric"),
        f"cannot change {_FIXED}",
        _fixed("spec.tune.metric", ""),
    ),
    ResumeRule(
        "spec.tune.mode", _optional_fixed("spec.tune.mode"), f"cannot change {_FIXED}", _fixed("spec.tune.mode", "")
    ),
    ResumeRule(
        "spec.tune.searcher",
        f"{_HAS_NOT_RUN} || self.spec.tune.searcher == oldSelf.spec.tune.searcher",
        f"cannot change {_FIXED}",
        _fixed("spec.tune.searcher", {}),
    ),
    ResumeRule(
        "spec.tune.numSamples",
        f"{_HAS_NOT_RUN} || self.spec.tune.numSamples >= oldSelf.spec.tune.numSamples",
        "cannot go down once the sweep has run: it is the total over all attempts, and "
        "the trials that ran are kept; raise it, or leave it",
        lambda new, old: not _has_run(old) or _samples(new) >= _samples(old),
    ),
    ResumeRule(
        "spec.resume",
        "!has(oldSelf.spec.resume) || (has(self.spec.resume) && "
        "self.spec.resume.generation >= oldSelf.spec.resume.generation)",
        "spec.resume.generation may only go up, and spec.resume cannot be removed once set (each new "
        "generation asks for one resume; status.resumedGeneration is the last one acted on)",
        _generation_kept,
    ),
    ResumeRule(
        "spec.resume.generation",
        "!has(self.spec.resume) || (has(oldSelf.spec.resume) && "
        "self.spec.resume.generation == oldSelf.spec.resume.generation) || "
        f"(has(oldSelf.status) && has(oldSelf.status.phase) && oldSelf.status.phase in {_PHASES_CEL})",
        f"can be raised only on an ended sweep (phase {', '.join(RESUMABLE_PHASES[:-1])} or {RESUMABLE_PHASES[-1]})",
        _raised_only_when_ended,
        message_expression="'can be raised only on an ended sweep (phase "
        f"{', '.join(RESUMABLE_PHASES[:-1])} or {RESUMABLE_PHASES[-1]}); this sweep is ' + "
        "(has(oldSelf.status) && has(oldSelf.status.phase) ? oldSelf.status.phase : 'Pending')",
    ),
    ResumeRule(
        "spec.resume.activeSeconds",
        "!has(self.spec.resume) || !has(self.spec.resume.activeSeconds) || "
        "self.spec.deadlines.startupSeconds < self.spec.resume.activeSeconds",
        "must be more than spec.deadlines.startupSeconds",
        _active_above("startupSeconds"),
    ),
    ResumeRule(
        "spec.resume.activeSeconds",
        "!has(self.spec.resume) || !has(self.spec.resume.activeSeconds) || "
        "self.spec.deadlines.gracefulStopSeconds < self.spec.resume.activeSeconds",
        "must be more than spec.deadlines.gracefulStopSeconds",
        _active_above("gracefulStopSeconds"),
    ),
)


def transition_problems(new: Any, old: Any = None) -> list[Problem]:
    """The RESUME_RULES an object breaks (`old`: the stored object on an update, None on a create), each naming
    its field with the message the API server gives for the same rule."""
    if not isinstance(new, dict):
        return []
    return [
        Problem(rule.field, rule.detail(new, old))
        for rule in RESUME_RULES
        if (old is not None or "oldSelf" not in rule.rule) and not rule.holds(new, old)
    ]


def resume_problems(spec: SweepSpec, limits: OperatorLimits) -> list[Problem]:
    """spec.resume against the operator's limits (the CEL rules cannot know maxActiveSeconds)."""
    resume = spec.resume
    if resume is None or resume.active_seconds is None or resume.active_seconds <= limits.max_active_seconds:
        return []
    return [
        Problem(
            "spec.resume.activeSeconds",
            f"{resume.active_seconds}s exceeds maxActiveSeconds {limits.max_active_seconds}s",
        )
    ]
