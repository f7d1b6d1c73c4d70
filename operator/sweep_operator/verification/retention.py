"""Whether the bucket keeps checkpoints long enough: versioning and lifecycle rules against the minimum retention
(warnings only, never a reason to hold a deletion)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

from sweep_contracts.s3_layout import S3Uri

from ..status import parse_time
from .findings import (
    LIFECYCLE_EXPIRATION,
    LIFECYCLE_NONCURRENT_EXPIRATION,
    LIFECYCLE_TRANSITION,
    VERSIONING_DISABLED,
    Finding,
)


def _days_until(when: Any, today: date) -> int | None:
    if isinstance(when, datetime):
        return (when.date() - today).days
    if isinstance(when, date):
        return (when - today).days
    if isinstance(when, str):
        try:
            parsed = parse_time(when)
        except ValueError:
            return None
        return (parsed.date() - today).days if parsed is not None else None
    return None


def _rule_scope(rule: Mapping[str, Any]) -> tuple[str, str]:
    """(prefix, extra conditions) a lifecycle rule applies to."""
    filt = rule.get("Filter")
    if filt is None:
        return str(rule.get("Prefix", "")), ""
    conditions = filt.get("And", filt)
    prefix = str(conditions.get("Prefix", ""))
    extras = []
    tags = conditions.get("Tags") or ([conditions["Tag"]] if "Tag" in conditions else [])
    if tags:
        extras.append("tagged " + ", ".join(f"{t.get('Key')}={t.get('Value')}" for t in tags))
    if "ObjectSizeGreaterThan" in conditions:
        extras.append(f"larger than {conditions['ObjectSizeGreaterThan']} bytes")
    if "ObjectSizeLessThan" in conditions:
        extras.append(f"smaller than {conditions['ObjectSizeLessThan']} bytes")
    return prefix, " and ".join(extras)


def retention_findings(
    versioning: Mapping[str, Any],
    rules: Sequence[Mapping[str, Any]],
    root: S3Uri,
    min_retention_days: int,
    today: date,
) -> list[Finding]:
    """Warnings for a bucket that would not keep the run's objects for `min_retention_days` (R11)."""
    findings: list[Finding] = []
    if versioning.get("Status") != "Enabled":
        state = "suspended" if versioning.get("Status") == "Suspended" else "not enabled"
        findings.append(
            Finding(
                VERSIONING_DISABLED,
                "",
                f"versioning of bucket {root.bucket} is {state}: a deleted or overwritten checkpoint cannot be recovered",
            )
        )
    run_prefix = root.prefix
    for rule in rules:
        if rule.get("Status") != "Enabled":
            continue
        prefix, extras = _rule_scope(rule)
        if not (run_prefix.startswith(prefix) or prefix.startswith(run_prefix)):
            continue
        scope = f"lifecycle rule {rule.get('ID', '?')!r} (prefix {prefix!r}{', ' + extras if extras else ''})"
        expiration = rule.get("Expiration") or {}
        days = expiration.get("Days")
        if days is None and "Date" in expiration:
            days = _days_until(expiration["Date"], today)
        if isinstance(days, int) and days < min_retention_days:
            findings.append(
                Finding(
                    LIFECYCLE_EXPIRATION,
                    root.prefix,
                    f"{scope} deletes objects after {days} day(s), under the {min_retention_days}-day minimum",
                )
            )
        for transition in rule.get("Transitions") or []:
            days = transition.get("Days")
            if days is None and "Date" in transition:
                days = _days_until(transition["Date"], today)
            if isinstance(days, int) and days < min_retention_days:
                findings.append(
                    Finding(
                        LIFECYCLE_TRANSITION,
                        root.prefix,
                        f"{scope} moves objects to {transition.get('StorageClass', '?')} after {days} day(s), "
                        f"under the {min_retention_days}-day minimum",
                    )
                )
        noncurrent = (rule.get("NoncurrentVersionExpiration") or {}).get("NoncurrentDays")
        if isinstance(noncurrent, int) and noncurrent < min_retention_days:
            findings.append(
                Finding(
                    LIFECYCLE_NONCURRENT_EXPIRATION,
                    root.prefix,
                    f"{scope} deletes overwritten/deleted versions after {noncurrent} day(s), under the {min_retention_days}-day minimum",
                )
            )
    return findings
