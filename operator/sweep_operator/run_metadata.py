"""What the operator writes on a run's objects and reads back (pure): the guard's target, the run's bounds (worker cap,
GPUs per worker) and the Kueue labels.

rendering.py writes them (the guard and bounds annotations, the labels); reconcile/ (guard, drift, kueue) reads them,
below the decisions that read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sweep_contracts import api, constants
from sweep_contracts.api import SweepSpec

from .gpu_time import pod_spec_gpus
from .policy import demand_of
from .settings import OperatorLimits

# Kueue's RayJob integration reads the queue and the WorkloadPriorityClass from these labels (jobframework
# QueueName / WorkloadPriorityClassName; pkg/controller/constants QueueLabel, WorkloadPriorityClassLabel).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"


def queue_name_for(spec_queue_name: str, configured: str) -> str:
    """The LocalQueue a sweep's RayJob is labelled with: spec.queueName, else the one the chart configures for the
    sweep's namespace (Settings.kueue_queue_for; empty: Kueue mode is off for the sweep)."""
    return spec_queue_name or configured


@dataclass(frozen=True)
class GuardTarget:
    """What the guard verifies, fixed when the run's RayJob is created and carried on it as an annotation
    (KubeRay copies a RayJob's annotations onto its RayCluster: `constructRayClusterForRayJob`). The spec and
    the runtime env can be edited; these facts must not depend on them."""

    run_root: str
    endpoint_url: str = ""
    region: str = ""
    verify: bool = True
    timeout_seconds: int = api.DEFAULT_VERIFICATION_TIMEOUT_SECONDS
    sweep: str = ""
    run_id: str = ""

    def to_annotation(self) -> str:
        return json.dumps(
            {
                "runRoot": self.run_root,
                "endpointUrl": self.endpoint_url,
                "region": self.region,
                "verify": self.verify,
                "timeoutSeconds": self.timeout_seconds,
                "sweep": self.sweep,
                "runId": self.run_id,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_annotation(cls, text: str | None) -> GuardTarget | None:
        """The target an annotation carries; None when absent or unreadable (the caller then holds)."""
        if not text:
            return None
        try:
            doc = json.loads(text)
            root = doc["runRoot"]
            if not isinstance(root, str) or not root.startswith("s3://"):
                return None
            return cls(
                run_root=root,
                endpoint_url=str(doc.get("endpointUrl") or ""),
                region=str(doc.get("region") or ""),
                verify=doc.get("verify") is not False,  # anything but an explicit false verifies
                timeout_seconds=int(doc.get("timeoutSeconds") or api.DEFAULT_VERIFICATION_TIMEOUT_SECONDS),
                sweep=str(doc.get("sweep") or ""),
                run_id=str(doc.get("runId") or ""),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def worker_cap(spec: SweepSpec, limits: OperatorLimits) -> int:
    """The most workers a run's worker group may have: what it asked for, at most the operator's per-sweep cap."""
    return min(demand_of(spec).workers, limits.max_workers_per_sweep)


def worker_groups(body: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    spec = body.get("spec") or {}
    if kind == constants.RAYJOB_KIND:
        return (spec.get("rayClusterSpec") or {}).get("workerGroupSpecs") or []
    return spec.get("workerGroupSpecs") or []


@dataclass(frozen=True)
class RunBounds:
    """What a run's objects may hold, as the operator rendered them: each worker group's replica cap and GPUs per
    worker. `groups` empty: only a replica cap is known (objects rendered before the bounds annotation)."""

    cap: int
    groups: Mapping[str, int] = field(default_factory=dict)  # group name -> GPUs per worker
    workers: int = 0  # the run's demand (the ledger's rebuild)
    gpus: int = 0
    active_deadline_s: int = 0  # the RayJob's spec.activeDeadlineSeconds as rendered (0: not recorded)

    def to_annotation(self) -> str:
        doc: dict[str, Any] = {"cap": self.cap, "groups": dict(self.groups), "workers": self.workers, "gpus": self.gpus}
        if self.active_deadline_s:
            doc["activeDeadlineSeconds"] = self.active_deadline_s
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, text: str | None) -> RunBounds | None:
        if not text:
            return None
        try:
            doc = json.loads(text)
            groups = {str(k): int(v) for k, v in (doc.get("groups") or {}).items()}
            deadline = int(doc.get("activeDeadlineSeconds") or 0)
            return cls(int(doc["cap"]), groups, int(doc.get("workers") or 0), int(doc.get("gpus") or 0), deadline)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def rendered_bounds(rayjob: Mapping[str, Any], demand_workers: int, demand_gpus: int) -> RunBounds:
    """The bounds of a RayJob as just rendered: its worker groups, their caps and GPUs per worker."""
    groups = worker_groups(rayjob, constants.RAYJOB_KIND)
    cap = max((int(g.get("maxReplicas") or 0) for g in groups), default=0)
    deadline = active_deadline_of(rayjob)
    gpus = {str(g.get("groupName")): group_gpus(g) for g in groups}
    return RunBounds(cap, gpus, demand_workers, demand_gpus, deadline)


def active_deadline_of(rayjob: Mapping[str, Any]) -> int:
    """A RayJob's spec.activeDeadlineSeconds, 0 where it has none that KubeRay would enforce (absent, not a
    positive integer)."""
    value = (rayjob.get("spec") or {}).get("activeDeadlineSeconds")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def container_gpus(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    most = 0
    for part in ("limits", "requests"):
        value = (resources.get(part) or {}).get(constants.GPU_RESOURCE)
        try:
            most = max(most, int(str(value))) if value is not None else most
        except ValueError:
            most = max(most, 1 << 30)  # unreadable: above any bound, so it is set back
    return most


def group_gpus(group: Mapping[str, Any]) -> int:
    """GPUs per pod of a worker group (or the head): every container counted as Kubernetes sizes the pod, init
    containers and native sidecars included (gpu_time.pod_spec_gpus)."""
    return pod_spec_gpus((group.get("template") or {}).get("spec") or {}, container_gpus)
