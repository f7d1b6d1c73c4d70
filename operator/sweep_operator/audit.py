"""Every use of the checkpoint guard's escape hatch, recorded: a metric, a log line naming who set it (as far as
the API says), and the sweep's CheckpointsVerified condition."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants

log = logging.getLogger(__name__)

BYPASS_REASON = "VerificationBypassed"


def annotation_setters(body: Mapping[str, Any], key: str = constants.ANNOTATION_SKIP_VERIFICATION) -> list[str]:
    """The field managers that own `metadata.annotations[key]` (server-side apply's managedFields: `kubectl
    annotate` shows as `kubectl-annotate`, an SSA user by the `--field-manager` it chose). Kubernetes records no
    user name on an object; the API server's audit log has it. Empty when no manager owns it."""
    owners = []
    for entry in (body.get("metadata") or {}).get("managedFields") or []:
        fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations") or {}
        if f"f:{key}" in fields:
            owners.append(str(entry.get("manager") or "unknown"))
    return sorted(set(owners))


def describe_setter(*bodies: Mapping[str, Any] | None) -> str:
    """Who set the escape hatch on any of the objects, for the log line and the condition."""
    parts = []
    for body in bodies:
        if not body:
            continue
        meta = body.get("metadata") or {}
        if constants.ANNOTATION_SKIP_VERIFICATION not in (meta.get("annotations") or {}):
            continue
        owners = annotation_setters(body)
        where = f"{body.get('kind') or 'object'} {meta.get('name')}"
        parts.append(f"{where} (field manager {', '.join(owners)})" if owners else f"{where} (field manager unknown)")
    return "; ".join(parts) or "unknown"


@dataclass(frozen=True)
class BypassAudit:
    """What a release through the escape hatch records (an action the controller carries out): the metric's
    labels, a log line naming who set it, and the sweep's CheckpointsVerified condition (when the sweep exists)."""

    kind: str
    namespace: str
    sweep: str
    log_line: str
    condition_message: str


def bypass_audit(kind: str, body: Mapping[str, Any], sweep_body: Mapping[str, Any] | None) -> BypassAudit:
    """The audit of a deletion released because the escape hatch is set (pure)."""
    meta = body.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    sweep = (
        ((sweep_body or {}).get("metadata") or {}).get("name")
        or (meta.get("labels") or {}).get(constants.LABEL_SWEEP)
        or ""
    )
    setter = describe_setter(body, sweep_body)
    line = (
        f"checkpoint guard BYPASSED: {kind} {namespace}/{meta.get('name')} released without verification through "
        f"{constants.ANNOTATION_SKIP_VERIFICATION}; set on {setter}"
    )
    message = (
        f"{kind} {meta.get('name')} released without checkpoint verification: "
        f"{constants.ANNOTATION_SKIP_VERIFICATION} set on {setter}"
    )
    return BypassAudit(kind, namespace, sweep, line, message[:1024])
