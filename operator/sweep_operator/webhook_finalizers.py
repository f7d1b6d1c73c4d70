"""The mutating webhook's decisions: the guard's finalizer on every TrainingSweep and on a RayCluster created with the
guard annotation, so neither exists unguarded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sweep_contracts import constants

# The paths kopf serves the handlers under (their ids); the chart's MutatingWebhookConfiguration names them.
MUTATING_WEBHOOK_PATH = "/guard-finalizer-raycluster"
MUTATING_WEBHOOK_ID = MUTATING_WEBHOOK_PATH.strip("/")
SWEEP_MUTATING_WEBHOOK_PATH = "/guard-finalizer-trainingsweep"
SWEEP_MUTATING_WEBHOOK_ID = SWEEP_MUTATING_WEBHOOK_PATH.strip("/")


def finalizers_at_create(obj: Mapping[str, Any]) -> list[str] | None:
    """A RayCluster's finalizers with the guard's added, or None when nothing is to change.

    Only the guard annotation (which KubeRay copies from our RayJob, and the guard policy lets nobody else set)
    decides: labels are anyone's to edit and never make an object guarded.
    """
    metadata = obj.get("metadata") or {}
    if constants.ANNOTATION_GUARD not in (metadata.get("annotations") or {}):
        return None
    return _with_guard(metadata)


def sweep_finalizers_at_create(obj: Mapping[str, Any]) -> list[str] | None:
    """A TrainingSweep's finalizers with the guard's added, or None when it already carries it. Every sweep is ours:
    the operator would add the same finalizer on its first pass (`guard.missing_finalizer`), before anything exists
    for the sweep to guard; a sweep the webhook missed (failurePolicy Ignore, the chart's webhook off) still gets it
    there."""
    return _with_guard(obj.get("metadata") or {})


def _with_guard(metadata: Mapping[str, Any]) -> list[str] | None:
    finalizers = list(metadata.get("finalizers") or [])
    if constants.FINALIZER in finalizers:
        return None
    return [*finalizers, constants.FINALIZER]
