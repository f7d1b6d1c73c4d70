"""Workload arithmetic without a client: pod requests as Kueue counts them, the conditions it sets (apimeta's rules),
and the flavor assignment of one ClusterQueue without cohorts (flavorassigner.go)."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from ..kube_values import now_rfc3339
from .crds import Obj


def quantity(value: Any) -> Decimal:
    from kubernetes.utils import parse_quantity

    return Decimal(parse_quantity(value))


def _format(resource: str, amount: Decimal) -> str:
    """resource.Quantity's canonical form, as Kueue prints requests and capacity (cpu in millis when fractional)."""
    if amount == amount.to_integral_value():
        whole = int(amount)
        if resource == "memory" or resource.endswith("storage"):
            for suffix, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
                if whole and whole % size == 0:
                    return f"{whole // size}{suffix}"
        return str(whole)
    return f"{int(amount * 1000)}m"


def pod_requests(template: Mapping[str, Any]) -> dict[str, Decimal]:
    """A pod's requests as Kueue counts them (limits stand in for missing requests; init containers by max)."""
    spec = template.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in wanted.items():
            total[name] = total.get(name, Decimal(0)) + quantity(value)
    for container in spec.get("initContainers") or []:
        resources = container.get("resources") or {}
        for name, value in {**(resources.get("limits") or {}), **(resources.get("requests") or {})}.items():
            total[name] = max(total.get(name, Decimal(0)), quantity(value))
    for name, value in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, Decimal(0)) + quantity(value)
    return total


def workload_requests(workload: Mapping[str, Any]) -> list[tuple[str, int, dict[str, Decimal]]]:
    """(pod set, count, total requests) of each pod set."""
    out = []
    for ps in (workload.get("spec") or {}).get("podSets") or []:
        count = int(ps.get("count", 1))
        per_pod = pod_requests(ps.get("template") or {})
        out.append((ps.get("name", "main"), count, {k: v * count for k, v in per_pod.items()}))
    return out


def workload_condition(
    type_: str, status: bool, reason: str, message: str, generation: int | None = None, at: str | None = None
) -> Obj:
    condition: Obj = {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": at or now_rfc3339(),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def set_condition(conditions: list[Obj], new: Obj) -> list[Obj]:
    """apimeta.SetStatusCondition: replace by type; lastTransitionTime kept when the status did not change."""
    out, found = [], False
    for c in conditions:
        if c.get("type") == new["type"]:
            found = True
            merged = {**c, **new}
            if c.get("status") == new["status"]:
                merged["lastTransitionTime"] = c.get("lastTransitionTime", new["lastTransitionTime"])
            out.append(merged)
        else:
            out.append(c)
    if not found:
        out.append(new)
    return out


def condition_of(obj: Mapping[str, Any], type_: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def is_true(obj: Mapping[str, Any], type_: str) -> bool:
    c = condition_of(obj, type_)
    return c is not None and c.get("status") == "True"


def assign_flavors(
    cq: Mapping[str, Any], wl: Mapping[str, Any], usage: Mapping[tuple[str, str], Decimal]
) -> tuple[list[Obj] | None, str, str]:
    """flavorassigner.go for one ClusterQueue without cohorts: for each pod set, the first flavor of each resource's
    group whose nominalQuota holds what earlier pod sets and this one need. Returns (podSetAssignments, "", "") or
    (None, reason, Kueue's message: "couldn't assign flavors to pod set <ps>: ...")."""
    groups = (cq.get("spec") or {}).get("resourceGroups") or []
    assumed: dict[tuple[str, str], Decimal] = {}
    assignments: list[Obj] = []
    problems: list[str] = []
    reason = ""
    for ps_name, count, requests in workload_requests(wl):
        flavors: dict[str, str] = {}
        ps_problems: list[str] = []
        for resource, amount in sorted(requests.items()):
            if amount == 0:
                continue
            group = next((g for g in groups if resource in (g.get("coveredResources") or [])), None)
            if group is None:
                ps_problems.append(f"resource {resource} unavailable in ClusterQueue")
                reason = reason or "WaitingForQuota"
                continue
            chosen, why = None, []
            for flavor in group.get("flavors") or []:
                quota = next((r for r in flavor.get("resources") or [] if r.get("name") == resource), None)
                if quota is None:
                    continue
                nominal = quantity(quota["nominalQuota"])
                key = (flavor["name"], resource)
                before = assumed.get(key, Decimal(0))
                if before + amount > nominal:
                    why.append(
                        f"insufficient quota for {resource} in flavor {flavor['name']}, previously considered "
                        f"podsets requests ({_format(resource, before)}) + current podset request "
                        f"({_format(resource, amount)}) > maximum capacity ({_format(resource, nominal)})"
                    )
                    reason = reason or "ExceedsMaxQuota"
                    continue
                used = usage.get(key, Decimal(0))
                if used + before + amount > nominal:
                    more = used + before + amount - nominal
                    why.append(
                        f"insufficient unused quota for {resource} in flavor {flavor['name']}, "
                        f"{_format(resource, more)} more needed"
                    )
                    reason = "WaitingForQuota" if reason in ("", "ExceedsMaxQuota") else reason
                    continue
                chosen = flavor["name"]
                break
            if chosen is None:
                ps_problems.append(", ".join(why) or f"resource {resource} unavailable in ClusterQueue")
                continue
            flavors[resource] = chosen
        if ps_problems:
            problems.append(f"couldn't assign flavors to pod set {ps_name}: {'; '.join(ps_problems)}")
            continue
        for resource, flavor in flavors.items():
            key = (flavor, resource)
            assumed[key] = assumed.get(key, Decimal(0)) + requests[resource]
        assignments.append(
            {
                "name": ps_name,
                "count": count,
                "flavors": flavors,
                "resourceUsage": {r: _format(r, requests[r]) for r in flavors},
            }
        )
    if problems:
        return None, reason or "WaitingForQuota", "; ".join(problems)
    return assignments, "", ""
