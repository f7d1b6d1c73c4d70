"""What decisions return: the new status and the actions to take, as data (Ray Train V2's ScalingDecision).

The controller executes the actions before the status write (ReserveBudget first, then CreateRayJob, DeleteRayJob,
SetSuspend, SetRuntimeEnv, RecordGpuHours, RecordIdleGpus, RecordDeadlineStop) or after it (ReleaseBudget, Finish);
Events are posted after the write. A new action is a dataclass here and one branch in
`controller.SweepController._apply_and_write_status`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
    name: str


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

    usage: Mapping[str, Any] | None
    terminal: bool


@dataclass(frozen=True)
class RecordIdleGpus:
    """Add GPU-seconds held without training to the idle-GPU metric, by cause (the status carries them already)."""

    cause: str
    gpu_seconds: float


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
)


@dataclass(frozen=True)
class Decision:
    """`status`: the sweep's whole new status (None: leave it); written once, then `events` are posted."""

    status: dict[str, Any] | None = None
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = field(default=())

    def wants(self, kind: type) -> Any:
        """The first action of `kind`, or None."""
        return next((a for a in self.actions if isinstance(a, kind)), None)
