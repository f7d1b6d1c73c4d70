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
from sweep_contracts.api import SweepSpec
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
    if namespace is not None and (not isinstance(namespace, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace)):
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


def validate_sweep(obj: Any, limits: OperatorLimits | None = None, tenancy: TenancyPolicy | None = None) -> list[Problem]:
    """Every problem with a TrainingSweep object (empty when valid)."""
    try:
        parse_sweep(obj, limits, tenancy)
    except SpecError as exc:
        return exc.problems
    return []
