"""What Ray is waiting for, as one status line (R20): the `pending` block the driver writes into `_sweep/status.json` ->
`status.waitingFor`. Pure.

The block names pending trials, unmet placement groups, task and actor demand, and node launches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _count(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


WAITING_FOR_MAX_CHARS = 1024


def _resource_text(bundle: Any) -> str:
    if not isinstance(bundle, Mapping):
        return "{}"
    parts = [
        f"{k}: {v:g}" for k, v in sorted(bundle.items()) if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    return "{" + ", ".join(parts) + "}"


def _bundles_text(bundles: Any) -> str:
    """`4 x {CPU: 2}` for equal bundles, else each one."""
    texts = [_resource_text(b) for b in bundles] if isinstance(bundles, list) else []
    if not texts:
        return "no bundles"
    if len(set(texts)) == 1:
        return f"{len(texts)} x {texts[0]}"
    return " + ".join(texts)


def waiting_for(doc: Mapping[str, Any]) -> str | None:
    """One line from status.json's `pending` block saying what Ray is waiting for (R20); None when nothing waits."""
    pending = doc.get("pending")
    if not isinstance(pending, Mapping):
        return None
    trials = _count(pending.get("trials"))
    demands = [d for d in pending.get("waitingFor") or [] if isinstance(d, Mapping)]
    failed = _count(pending.get("failedLaunches"))
    if not trials and not demands and not failed:
        return None
    parts: list[str] = []
    if trials:
        oldest = _seconds(pending.get("oldestPendingSeconds"))
        age = f" (oldest for {oldest:.0f}s)" if oldest is not None else ""
        parts.append(f"{trials} trial(s) pending{age}")
    waits: list[str] = []
    for demand in demands:
        hopeless = "; no node can hold it: the autoscaler must add one" if demand.get("infeasible") is True else ""
        if demand.get("kind") == "placementGroup":
            waited = _seconds(demand.get("pendingSeconds"))
            since = f" pending {waited:.0f}s" if waited is not None else ""
            strategy = f" {demand.get('strategy')}" if demand.get("strategy") else ""
            waits.append(f"placement group{strategy} of {_bundles_text(demand.get('bundles'))}{since}{hopeless}")
        else:
            waits.append(
                f"{_count(demand.get('count'))} task(s)/actor(s) of {_resource_text(demand.get('bundle'))}{hopeless}"
            )
    if waits:
        parts.append("Ray is waiting for " + ", ".join(waits))
    if failed:
        parts.append(f"{failed} node launch(es) failed")
    launching = _count(pending.get("pendingLaunches"))
    if launching:
        parts.append(f"{launching} node launch(es) pending")
    if isinstance(pending.get("clusterResources"), Mapping):
        parts.append(f"the cluster has {_resource_text(pending['clusterResources'])}")
    text = "; ".join(parts)
    return text if len(text) <= WAITING_FOR_MAX_CHARS else text[: WAITING_FOR_MAX_CHARS - 3] + "..."
