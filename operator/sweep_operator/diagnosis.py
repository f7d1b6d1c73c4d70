"""Why a sweep is not Running (pure): pending pods and their events, summarised for a condition message (R6, R20).

The layers are reported separately, as the review asks: KubeRay's worker-group limit, Kubernetes pod
placement (scheduling, image pulls, quota), and the node supply behind them.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import Phase

ROLE_LABEL = constants.RAY_LABEL_NODE_TYPE

# (pattern in an event/condition message or a waiting reason, short cause, what to check)
_CAUSES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"Insufficient nvidia\.com/gpu"),
        "Insufficient nvidia.com/gpu",
        "no node has a free GPU: check the GPU node group's max size, the autoscaler (Karpenter/Cluster Autoscaler) and EC2 capacity for the instance type",
    ),
    (re.compile(r"Insufficient (cpu|memory)"), "Insufficient {0}", "no node has enough {0} for the pod's requests"),
    (
        re.compile(r"ImagePullBackOff|ErrImagePull|InvalidImageName"),
        "ImagePullBackOff",
        "the image cannot be pulled: check its name, tag and the node's registry access",
    ),
    (
        re.compile(r"exceeded quota|forbidden: exceeded"),
        "ResourceQuota exceeded",
        "the namespace ResourceQuota does not allow the pods",
    ),
    (
        re.compile(r"didn't match Pod's node affinity/selector|node\(s\) didn't match|untolerated taint"),
        "Unschedulable (selector/taints)",
        "no node matches the worker group's nodeSelector and tolerations",
    ),
    (re.compile(r"Unschedulable|FailedScheduling"), "Unschedulable", "the scheduler cannot place the pod"),
)


@dataclass(frozen=True)
class PodProblem:
    pod: str
    role: str
    cause: str
    hint: str
    detail: str


def _classify(text: str) -> tuple[str, str] | None:
    for pattern, cause, hint in _CAUSES:
        match = pattern.search(text)
        if match:
            groups = match.groups()
            return cause.format(*groups), hint.format(*groups)
    return None


def _pod_texts(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> list[str]:
    texts = []
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            texts.append(f"{cond.get('reason', '')}: {cond.get('message', '')}")
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting:
            texts.append(f"{waiting.get('reason', '')}: {waiting.get('message', '')}")
    name = (pod.get("metadata") or {}).get("name")
    for event in events:
        involved = event.get("involvedObject") or event.get("regarding") or {}
        if involved.get("kind", "Pod") == "Pod" and involved.get("name") == name and event.get("type") == "Warning":
            texts.append(f"{event.get('reason', '')}: {event.get('message') or event.get('note', '')}")
    return texts


def pod_problems(pods: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]) -> list[PodProblem]:
    """One problem per pod that is not Running, with its most specific cause."""
    events = list(events)
    problems = []
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") in (Phase.RUNNING, Phase.SUCCEEDED):
            continue
        meta = pod.get("metadata") or {}
        role = (meta.get("labels") or {}).get(ROLE_LABEL, "pod")
        texts = _pod_texts(pod, events)
        found = [(c, t) for c, t in ((_classify(t), t) for t in texts) if c]
        if found:
            (cause, hint), detail = found[0]
        else:
            cause, hint, detail = (
                status.get("phase") or Phase.PENDING,
                "waiting for the pod to start",
                texts[0] if texts else "",
            )
        problems.append(PodProblem(meta.get("name", "?"), role, cause, hint, detail.strip(": ").strip()))
    return problems


def object_event_problems(
    events: Iterable[Mapping[str, Any]], kinds: tuple[str, ...] = ("RayCluster", "RayJob")
) -> list[str]:
    """Warnings on the RayCluster/RayJob themselves (e.g. KubeRay failing to create pods over quota)."""
    out = []
    for event in events:
        involved = event.get("involvedObject") or event.get("regarding") or {}
        if involved.get("kind") in kinds and event.get("type") == "Warning":
            text = f"{event.get('reason', '')}: {event.get('message') or event.get('note', '')}"
            classified = _classify(text)
            out.append(
                f"{involved['kind']} {classified[0] if classified else event.get('reason', '')}: {event.get('message') or event.get('note', '')}".strip()
            )
    return out


def diagnose_startup(
    pods: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    *,
    cluster_name: str = "",
    worker_cap: int | None = None,
    workers_wanted: int | None = None,
) -> str:
    """A readable summary of why the RayJob's cluster is not running, layer by layer (R6, R20)."""
    pods, events = list(pods), list(events)
    parts: list[str] = []
    if worker_cap is not None and workers_wanted is not None and workers_wanted > worker_cap:
        parts.append(f"KubeRay: worker group capped at maxReplicas {worker_cap} < {workers_wanted} wanted")
    problems = pod_problems(pods, events)
    if problems:
        by_cause: dict[tuple[str, str], list[PodProblem]] = defaultdict(list)
        for problem in problems:
            by_cause[(problem.cause, problem.hint)].append(problem)
        pod_parts = []
        for (cause, hint), group in by_cause.items():
            roles = Counter(p.role for p in group)
            who = ", ".join(f"{n} {role}{'s' if n > 1 else ''}" for role, n in sorted(roles.items()))
            detail = next((p.detail for p in group if p.detail), "")
            pod_parts.append(f"{who} Pending: {cause}" + (f" ({detail})" if detail else "") + f"; {hint}")
        parts.append("Pods: " + " | ".join(pod_parts))
    parts.extend(object_event_problems(events))
    if not parts:
        where = f"RayCluster {cluster_name}" if cluster_name else "the RayCluster"
        parts.append(
            f"no pods found for {where}: KubeRay may not have created it (check the KubeRay operator, "
            "its logs and the RayJob's events)"
            if not pods
            else f"{len(pods)} pods exist and none reports a scheduling or image problem; the Ray job did not "
            "reach RUNNING (check the submitter pod and the head's logs)"
        )
    return "; ".join(parts)
