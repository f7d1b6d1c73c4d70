"""The mutating webhook's decision (issue 25, defect 5): a RayCluster created with the guard annotation gets the
guard's finalizer at admission, so a cluster made and deleted while the operator is down is still verified."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sweep_contracts import constants

# The path kopf serves the handler under (its id); the chart's MutatingWebhookConfiguration names it.
MUTATING_WEBHOOK_PATH = "/guard-finalizer-raycluster"
MUTATING_WEBHOOK_ID = MUTATING_WEBHOOK_PATH.strip("/")


def finalizers_at_create(obj: Mapping[str, Any]) -> list[str] | None:
    """The object's finalizers with the guard's added, or None when nothing is to change.

    Only the guard annotation (which KubeRay copies from our RayJob, and the guard policy lets nobody else set)
    decides: labels are anyone's to edit and never make an object guarded.
    """
    metadata = obj.get("metadata") or {}
    if constants.ANNOTATION_GUARD not in (metadata.get("annotations") or {}):
        return None
    finalizers = list(metadata.get("finalizers") or [])
    if constants.FINALIZER in finalizers:
        return None
    return [*finalizers, constants.FINALIZER]
