"""The worker-cap rule and its correction (R21): a run's worker groups never exceed its cap (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import SweepSpec
from sweep_contracts.runtime_env import run_spec_of

from ..policy import demand_of
from ..settings import OperatorLimits
from .facts import meta_of


def worker_cap(spec: SweepSpec, limits: OperatorLimits) -> int:
    """The most workers a run's worker group may have: what it asked for, at most the operator's per-sweep cap."""
    return min(demand_of(spec).workers, limits.max_workers_per_sweep)


def worker_groups(body: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    spec = body.get("spec") or {}
    if kind == constants.RAYJOB_KIND:
        return (spec.get("rayClusterSpec") or {}).get("workerGroupSpecs") or []
    return spec.get("workerGroupSpecs") or []


def capped(group: Mapping[str, Any], cap: int) -> tuple[dict[str, Any], list[str]]:
    """The worker group with its replica counts set back to `cap`, and a note per count that was above it."""
    out, notes = dict(group), []
    for key in ("maxReplicas", "minReplicas", "replicas"):
        if isinstance(out.get(key), int) and out[key] > cap:
            notes.append(f"{out.get('groupName')}.{key} {out[key]} -> {cap}")
            out[key] = cap
    return out, notes


def guarded_run_object(body: Mapping[str, Any]) -> bool:
    """Drift is corrected on our live RayJobs and RayClusters only (not on one being deleted)."""
    meta = meta_of(body)
    return not meta.get("deletionTimestamp") and constants.LABEL_SWEEP in (meta.get("labels") or {})


def over_cap(body: Mapping[str, Any], kind: str, cap: int) -> bool:
    return any(capped(group, cap)[1] for group in worker_groups(body, kind))


def may_exceed_cap(body: Mapping[str, Any], kind: str, cap: int | None, limits: OperatorLimits) -> bool:
    """Whether a worker group may be above the run's cap (`cap`: remembered for the run, else the run spec on a
    RayJob says it); True when unsure, and the correction reads what it needs."""
    if not guarded_run_object(body) or not worker_groups(body, kind):
        return False
    if cap is None:
        run_spec = run_spec_of(body) if kind == constants.RAYJOB_KIND else None
        if run_spec is None:
            return True
        cap = worker_cap(run_spec.spec, limits)
    return over_cap(body, kind, cap)


@dataclass(frozen=True)
class Correction:
    patch: dict[str, Any]
    message: str


def decide_drift(body: Mapping[str, Any], kind: str, cap: int) -> Correction | None:
    """The patch that sets every worker group back to `cap`, or None when none is above it."""
    fixed, notes = [], []
    for group in worker_groups(body, kind):
        group_fixed, group_notes = capped(group, cap)
        fixed.append(group_fixed)
        notes.extend(group_notes)
    if not notes:
        return None
    spec = (
        {"rayClusterSpec": {"workerGroupSpecs": fixed}}
        if kind == constants.RAYJOB_KIND
        else {"workerGroupSpecs": fixed}
    )
    return Correction(
        {"spec": spec}, f"worker group above the sweep's cap of {cap} workers set back: {', '.join(notes)}"
    )
