"""The worker-cap rule and its correction (R21): a run's worker groups stay as rendered, within its cap (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants

from ..gpu_time import is_sidecar, pod_spec_gpus
from ..run_metadata import RunBounds as RunBounds
from ..run_metadata import active_deadline_of, container_gpus
from ..run_metadata import rendered_bounds as rendered_bounds
from ..run_metadata import worker_cap as worker_cap
from ..run_metadata import worker_groups as worker_groups
from .facts import meta_of


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


def bounds_of(obj: Mapping[str, Any] | None) -> RunBounds | None:
    """The bounds the operator wrote on a RayJob (KubeRay's copy on its RayCluster); None when absent."""
    annotations = (meta_of(obj or {}).get("annotations")) or {}
    return RunBounds.from_annotation(annotations.get(constants.ANNOTATION_BOUNDS))


def _with_gpus(group: Mapping[str, Any], gpus: int) -> tuple[dict[str, Any], list[str]]:
    """The group with its pod's GPUs set back to at most `gpus`, counted as Kubernetes sizes a pod (init containers
    and native sidecars included: gpu_time.pod_spec_gpus). The app containers keep theirs first, in order (the Ray
    container is the first), then the sidecars from what is left; an init container that runs to completion keeps
    at most what the sidecars started before it leave."""
    template = dict(group.get("template") or {})
    pod = dict(template.get("spec") or {})
    if pod_spec_gpus(pod, container_gpus) <= gpus:
        return dict(group), []
    where, notes = group.get("groupName", "head"), list[str]()

    def fit(container: Mapping[str, Any], allowed: int, kind: str) -> tuple[Mapping[str, Any], int]:
        own = container_gpus(container)
        if own <= allowed:
            return container, own
        resources = {k: dict(v or {}) for k, v in (container.get("resources") or {}).items()}
        for part in ("limits", "requests"):
            if constants.GPU_RESOURCE in resources.get(part, {}):
                resources[part][constants.GPU_RESOURCE] = allowed
        notes.append(f"{where}.{kind}{container.get('name')} {constants.GPU_RESOURCE} -> {allowed}")
        return {**container, "resources": resources}, allowed

    left, fixed_pod = gpus, dict(pod)
    apps = []
    for container in pod.get("containers") or []:
        container, used = fit(container, left, "")
        apps.append(container)
        left -= used
    fixed_pod["containers"] = apps
    if pod.get("initContainers"):
        inits, sidecars = [], 0
        for container in pod.get("initContainers") or []:
            if is_sidecar(container):
                container, used = fit(container, left, "initContainers.")
                left, sidecars = left - used, sidecars + used
            else:
                container, _ = fit(container, gpus - sidecars, "initContainers.")
            inits.append(container)
        fixed_pod["initContainers"] = inits
    return {**group, "template": {**template, "spec": fixed_pod}}, notes


def head_group(body: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    spec = body.get("spec") or {}
    cluster = spec.get("rayClusterSpec") or {} if kind == constants.RAYJOB_KIND else spec
    head = cluster.get("headGroupSpec")
    return head if isinstance(head, dict) else None


def may_exceed_cap(body: Mapping[str, Any], kind: str, bounds: RunBounds | None) -> bool:
    """Whether an object of ours may hold more than its run was rendered with (`bounds`: from its annotation or its
    RayJob's; None: unknown, the correction reads what it needs)."""
    if not guarded_run_object(body) or not (worker_groups(body, kind) or head_group(body, kind)):
        return False
    return bounds is None or decide_drift(body, kind, bounds) is not None


@dataclass(frozen=True)
class Correction:
    patch: dict[str, Any]
    message: str


def decide_drift(body: Mapping[str, Any], kind: str, bounds: RunBounds | int) -> Correction | None:
    """The patch that sets the object back to what was rendered (R21): worker groups added after rendering removed,
    replica counts above the cap and GPU requests above the rendered ones (the head has none) set back; None when
    nothing exceeds them. An int is a replica cap alone (objects rendered before the bounds annotation)."""
    bounds = bounds if isinstance(bounds, RunBounds) else RunBounds(bounds)
    fixed, notes = [], []
    for group in worker_groups(body, kind):
        name = str(group.get("groupName"))
        if bounds.groups and name not in bounds.groups:
            notes.append(f"worker group {name} was not rendered for this run: removed")
            continue
        group_fixed, group_notes = capped(group, bounds.cap)
        if bounds.groups:
            group_fixed, gpu_notes = _with_gpus(group_fixed, bounds.groups[name])
            group_notes += gpu_notes
        fixed.append(group_fixed)
        notes.extend(group_notes)
    head = head_group(body, kind)
    head_fixed, head_notes = _with_gpus(head, 0) if head is not None and bounds.groups else (head, [])
    notes.extend(head_notes)
    spec: dict[str, Any] = {}
    if notes:
        cluster: dict[str, Any] = {"workerGroupSpecs": fixed}
        if head_notes:
            cluster["headGroupSpec"] = head_fixed
        spec = {"rayClusterSpec": cluster} if kind == constants.RAYJOB_KIND else cluster
    deadline = _deadline_note(body, kind, bounds)
    if deadline:
        spec["activeDeadlineSeconds"] = bounds.active_deadline_s
        notes.append(deadline)
    if not notes:
        return None
    return Correction(
        {"spec": spec}, f"set back to what the operator rendered (cap {bounds.cap} workers): {', '.join(notes)}"
    )


def _deadline_note(body: Mapping[str, Any], kind: str, bounds: RunBounds) -> str:
    """KubeRay's backstop for a run the operator fails to stop: a RayJob's activeDeadlineSeconds raised or removed
    after rendering is set back (a lower one is the editor's to choose). "" when it holds."""
    if kind != constants.RAYJOB_KIND or not bounds.active_deadline_s:
        return ""
    if 0 < active_deadline_of(body) <= bounds.active_deadline_s:
        return ""
    found = (body.get("spec") or {}).get("activeDeadlineSeconds")
    return f"activeDeadlineSeconds {found} -> {bounds.active_deadline_s}"
