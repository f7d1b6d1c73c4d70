"""What decisions return: the new status and the actions to take, as data (Ray Train V2's ScalingDecision).

`executor.Executor` carries out every action, the run pass's, the guard's and the stop's alike. A new action is a
dataclass here and one branch in the executor's table (`Executor._branches`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sweep_contracts.status_models import SweepStatus, UsageStatus

from ..policy import Demand


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event on the sweep (type "Normal" or "Warning")."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class CreateRayJob:
    """Create the run's RayJob (or find the one an earlier attempt created). A first admission's create is carried
    out by the controller before `admission.after_create` decides on its outcome; a resumed attempt's (`attempt` > 1)
    is carried out by `_execute`: its decision's status is written when the RayJob was created or is this run's
    (`attempts.adoptable`), else `taken`, decided beside it."""

    rayjob: Mapping[str, Any]
    run_id: str
    deadline_at: int
    attempt: int = 1
    demand: Demand | None = None  # a first admission's: what the namespace's GPU budget admitted
    owner_uid: str = ""  # the sweep's uid: an existing RayJob it does not own is not adopted
    taken: Decision | None = None


@dataclass(frozen=True)
class DeleteRayJob:
    """Delete a RayJob. `after_stop` (the run pass's): its job is stopped gracefully and its workers suspended first,
    on the stop queue; False (the stop's own, once that is done, and the guard's): delete it now."""

    name: str
    namespace: str = ""  # "": the namespace of the sweep whose pass decided it
    after_stop: bool = True


@dataclass(frozen=True)
class SuspendWorkers:
    """The ended job's cluster keeps its worker groups until KubeRay deletes it (ttlSecondsAfterFinished): suspend
    them now (KubeRay deletes their pods; the head stays)."""

    rayjob: str
    cluster: str


@dataclass(frozen=True)
class SetSuspend:
    rayjob: str
    suspend: bool


@dataclass(frozen=True)
class SetRuntimeEnv:
    """Rewrite a RayJob's runtimeEnvYAML (Kueue mode: the driver's deadline while the RayJob waits suspended)."""

    rayjob: str
    runtime_env: str


@dataclass(frozen=True)
class Diagnose:
    """The decision needs to know why the cluster does not start: read pods and Events, then decide again."""

    cluster_name: str
    rayjob_name: str
    workers_wanted: int
    worker_cap: int


@dataclass(frozen=True)
class ReleaseBudget:
    """Free the sweep's GPUs in the namespace ledger (before the write); `admit_next`: then give the queue, oldest
    first, a chance (after the write: the next sweep's pass reads this one's new status)."""

    admit_next: bool = True


@dataclass(frozen=True)
class Finish:
    """The run ended: read its result and verify its checkpoints once (`run_phase.decide_finish`)."""


@dataclass(frozen=True)
class RecordGpuHours:
    """Copy the sweep's usage record into its namespace's GPU-hour ledger (before the write): the ledger outlives the
    sweep. `terminal`: the run has ended (its reservation no longer counts)."""

    usage: UsageStatus | None
    terminal: bool


@dataclass(frozen=True)
class RecordIdleGpus:
    """Add GPU-seconds held without training to the idle-GPU metric, by cause (the status carries them already, or a
    ChangeStatus beside it adds them)."""

    cause: str
    gpu_seconds: float
    namespace: str = ""  # "": the sweep whose pass decided it
    sweep: str = ""


@dataclass(frozen=True)
class RecordDeadlineStop:
    """Count a RayJob stopped at the sweep's deadline while the guard holds the sweep (its phase does not change, so
    the phase callback that counts the others does not see it)."""


@dataclass(frozen=True)
class ReserveBudget:
    """Record what the namespace's budgets answered on a read (the ports only read): the GPU caps' admission or queue
    place, and the attempt's GPU-hour reservation. Carried out first, each decided again where it is recorded (under
    the GPU ledger's lock; onto the GPUHourLedger's resourceVersion), so a burst never over-admits: a record that no
    longer agrees with `admitted` (another admission came first) voids the decision and the pass runs again."""

    spec: Any  # the attempt's (a resume's deadlines are its own)
    attempt: str  # the GPU-hour reservation's attempt: "initial" or "resume-<n>"
    admitted: bool  # the decision admits (its RayJob is created); False: it waits or is refused


@dataclass(frozen=True)
class AddFinalizer:
    """Put the guard's finalizer on an object (the executor answers with the object as it carries it, or None)."""

    body: Mapping[str, Any]


@dataclass(frozen=True)
class RemoveFinalizer:
    """Take the guard's finalizer off a released object (the executor answers True once it is off)."""

    body: Mapping[str, Any]


@dataclass(frozen=True)
class AskJobStop:
    """Ask a Ray head to stop its job (the Jobs API), once per stop `key`: the executor answers with the head's
    StopOutcome, or None while the request is still in flight."""

    namespace: str
    key: str
    url: str
    job: str


@dataclass(frozen=True)
class SuspendWorkerGroups:
    """Patch a RayCluster's worker groups to suspended; the patch carries the cluster's resourceVersion as a
    precondition (the executor answers with the patched cluster, None when it is gone; a conflict raises)."""

    namespace: str
    cluster: str
    patch: Mapping[str, Any]


@dataclass(frozen=True)
class DeletePods:
    """Delete a held cluster's worker pods (KubeRay no longer reconciles a cluster being deleted)."""

    namespace: str
    pods: tuple[str, ...]


@dataclass(frozen=True)
class CapWorkers:
    """Set a worker group edited above its run's cap back (a RayJob's or a RayCluster's patch)."""

    kind: str
    namespace: str
    name: str
    patch: Mapping[str, Any]


@dataclass(frozen=True)
class SkipVerification:
    """The escape hatch's annotation, spread to an object of the same run (a RayJob or a RayCluster)."""

    kind: str
    namespace: str
    name: str


@dataclass(frozen=True)
class ChangeStatus:
    """Change a sweep's status outside a pass (the guard, the stop), retried on a conflict onto the newer status:
    `change` maps the status read to the new one. `failure`: what is logged when it cannot be written, and the
    write is then given up (the record is best effort); empty: the failure is raised to the caller."""

    sweep: Mapping[str, Any]
    change: Callable[[SweepStatus], SweepStatus]
    failure: str = ""


@dataclass(frozen=True)
class PostEvent:
    """A Kubernetes Event on each of `targets` (objects as read)."""

    targets: tuple[Mapping[str, Any], ...]
    type: str
    reason: str
    message: str


Action = (
    CreateRayJob
    | DeleteRayJob
    | SuspendWorkers
    | SetSuspend
    | SetRuntimeEnv
    | Diagnose
    | ReleaseBudget
    | Finish
    | RecordGpuHours
    | RecordIdleGpus
    | RecordDeadlineStop
    | ReserveBudget
    | AddFinalizer
    | RemoveFinalizer
    | AskJobStop
    | SuspendWorkerGroups
    | DeletePods
    | CapWorkers
    | SkipVerification
    | ChangeStatus
    | PostEvent
)


@dataclass(frozen=True)
class Decision:
    """`status`: the sweep's whole new status (None: leave it); written once, then `events` are posted."""

    status: SweepStatus | None = None
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = field(default=())

    def wants(self, kind: type) -> Any:
        """The first action of `kind`, or None."""
        return next((a for a in self.actions if isinstance(a, kind)), None)
