"""The one executor: every action the run pass, the guard and the stop decide is carried out here.

It is the only reconcile module that writes to the cluster; the status writer writes the sweep's status for it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants

from .. import ray_jobs
from ..admission_ledger import AdmissionLedger
from ..kube import KubeApi
from ..metrics import OperatorMetrics
from ..workqueue import FairPool
from .actions import (
    Action,
    AddFinalizer,
    AskJobStop,
    CapWorkers,
    ChangeStatus,
    CreateRayJob,
    Decision,
    DeletePods,
    DeleteRayJob,
    Diagnose,
    Finish,
    PostEvent,
    RecordDeadlineStop,
    RecordGpuHours,
    RecordIdleGpus,
    ReleaseBudget,
    RemoveFinalizer,
    ReserveBudget,
    SetRuntimeEnv,
    SetSuspend,
    SkipVerification,
    SuspendWorkerGroups,
    SuspendWorkers,
)
from .deletion_state import DeletionState
from .facts import ObjectRef, meta_of
from .ports import Budgets
from .status_writer import EventSink, StatusWriter

log = logging.getLogger(__name__)
STOP_CALL_WAIT_S = 0.05  # how long a stop waits for a head's answer before it looks again later
# Carried out by the pass before it decides on their outcome (`SweepController._execute`), or read (Diagnose).
_DECIDED_ON_OUTCOME = (CreateRayJob, ReserveBudget, Diagnose)


def _after_write(action: Action) -> bool:
    """What must follow a pass's status write: a freed budget's next admission, the end-of-run verification."""
    return isinstance(action, Finish) or (isinstance(action, ReleaseBudget) and action.admit_next)


@dataclass(frozen=True)
class Followers:
    """What an action hands on to the controller's queues: a RayJob stopped then deleted ((namespace, RayJob,
    sweep)), an ended job's workers suspended (namespace, RayJob, cluster), a freed budget's next admission, the
    end-of-run verification."""

    stop_then_delete: Callable[[tuple[str, str, str]], None]
    suspend_finished: Callable[[str, str, str], None]
    release_and_admit_next: Callable[[ObjectRef], None]
    finish: Callable[[ObjectRef], None]


class Executor:
    """Carries out actions, one branch per kind (`_branches`). `within` names what an action is relative to: the
    sweep whose pass decided it (the run pass's actions name objects in its namespace), its facts for a
    ReserveBudget; the guard's and the stop's actions name their objects themselves."""

    def __init__(
        self,
        *,
        kube: KubeApi,
        status: StatusWriter,
        metrics: OperatorMetrics,
        shared: DeletionState,
        budgets: Budgets,
        ledger: AdmissionLedger,
        emit: EventSink,
        clock: Callable[[], float],
        stop_job: Callable[[str, str], ray_jobs.StopOutcome],
        head_calls: FairPool | None,
        followers: Followers,
    ) -> None:
        """`emit`, `clock` and `stop_job` are read at each use (tests swap the controller's in flight). `head_calls`:
        None asks heads in the caller's thread (tests without workers)."""
        self.kube, self.status, self.metrics, self.shared = kube, status, metrics, shared
        self.budgets, self.ledger, self.emit, self.clock = budgets, ledger, emit, clock
        self.stop_job, self.head_calls, self.followers = stop_job, head_calls, followers
        self._branches: dict[type, Callable[[Any, Any], Any]] = {
            CreateRayJob: self._create_rayjob,
            ReserveBudget: self._reserve_budget,
            DeleteRayJob: self._delete_rayjob,
            SuspendWorkers: self._suspend_finished,
            SetSuspend: self._set_suspend,
            SetRuntimeEnv: self._set_runtime_env,
            RecordGpuHours: self._record_gpu_hours,
            RecordIdleGpus: self._record_idle_gpus,
            RecordDeadlineStop: self._record_deadline_stop,
            ReleaseBudget: self._release_budget,
            Finish: self._finish,
            AddFinalizer: self._add_finalizer,
            RemoveFinalizer: self._remove_finalizer,
            AskJobStop: self._ask_job_stop,
            SuspendWorkerGroups: self._suspend_worker_groups,
            DeletePods: self._delete_pods,
            CapWorkers: self._cap_workers,
            SkipVerification: self._skip_verification,
            ChangeStatus: self._change_status,
            PostEvent: self._post_event,
        }

    def carry_out(self, action: Action, within: Any = None) -> Any:
        """One action; returns its outcome (what the create made, whether a finalizer is off, the head's answer)."""
        return self._branches[type(action)](action, within)

    def carry_out_all(self, actions: Iterable[Action], within: Any = None) -> None:
        """Actions in their order (a status record before what must follow it)."""
        for action in actions:
            self.carry_out(action, within)

    def apply(self, body: Mapping[str, Any], decision: Decision, *, progress_may_wait: bool = True) -> None:
        """A pass's decision on the sweep `body`: its actions, its status written once (then its Events), then what
        must follow the write (a freed budget's next admission reads this sweep's new status; the end-of-run
        verification). A create and a budget record were carried out by the pass already, their outcome decided."""
        actions = [a for a in decision.actions if not isinstance(a, _DECIDED_ON_OUTCOME)]
        self.carry_out_all((a for a in actions if not _after_write(a)), body)
        self.status.write(body, decision.status, decision.events, progress_may_wait=progress_may_wait)
        self.carry_out_all((a for a in actions if _after_write(a)), body)

    # ------------------------------------------------------------------------------ the run pass's actions
    def _create_rayjob(self, create: CreateRayJob, _: Any) -> tuple[dict[str, Any], bool]:
        return self.kube.create_rayjob(dict(create.rayjob))

    def _reserve_budget(self, reserve: ReserveBudget, facts: Any) -> bool:
        return self.budgets.reserve(facts, reserve)

    def _delete_rayjob(self, delete: DeleteRayJob, sweep: Mapping[str, Any] | None) -> Any:
        ref = ObjectRef.of(sweep) if sweep is not None else None
        namespace = delete.namespace or (ref.namespace if ref is not None else "default")
        if delete.after_stop:  # the job stopped gracefully and its workers suspended first, then deleted
            self.followers.stop_then_delete((namespace, delete.name, ref.name if ref is not None else ""))
            return None
        return self.kube.delete_rayjob(namespace, delete.name)

    def _suspend_finished(self, suspend: SuspendWorkers, sweep: Mapping[str, Any]) -> None:
        self.followers.suspend_finished(ObjectRef.of(sweep).namespace, suspend.rayjob, suspend.cluster)

    def _set_suspend(self, action: SetSuspend, sweep: Mapping[str, Any]) -> Any:
        return self.kube.patch_rayjob(
            ObjectRef.of(sweep).namespace, action.rayjob, {"spec": {"suspend": action.suspend}}
        )

    def _set_runtime_env(self, action: SetRuntimeEnv, sweep: Mapping[str, Any]) -> Any:
        patch = {"spec": {"runtimeEnvYAML": action.runtime_env}}
        return self.kube.patch_rayjob(ObjectRef.of(sweep).namespace, action.rayjob, patch)

    def _record_gpu_hours(self, record: RecordGpuHours, sweep: Mapping[str, Any]) -> None:
        try:
            self.budgets.record_hours(sweep, record.usage, record.terminal, self.clock())
        except Exception as exc:  # the next measurement records it (the ledger copies the sweep's record)
            log.warning("sweep %s: cannot record its GPU-hours in the namespace ledger: %s", ObjectRef.of(sweep), exc)

    def _record_idle_gpus(self, record: RecordIdleGpus, sweep: Mapping[str, Any] | None) -> None:
        ref = ObjectRef.of(sweep) if sweep is not None else None
        namespace = record.namespace or (ref.namespace if ref is not None else "default")
        name = record.sweep or (ref.name if ref is not None else "")
        self.metrics.idle_gpus(namespace, name, record.cause, record.gpu_seconds)

    def _record_deadline_stop(self, _: RecordDeadlineStop, sweep: Mapping[str, Any]) -> None:
        ref = ObjectRef.of(sweep)
        self.metrics.deadline_stopped(ref.namespace, ref.name)

    def _release_budget(self, release: ReleaseBudget, sweep: Mapping[str, Any]) -> None:
        ref = ObjectRef.of(sweep)
        if release.admit_next:
            self.followers.release_and_admit_next(ref)
            return
        self.ledger.release(ref.namespace, ref.name)
        self.budgets.release_hours(sweep, deleted=False, now=self.clock())

    def _finish(self, _: Finish, sweep: Mapping[str, Any]) -> None:
        self.followers.finish(ObjectRef.of(sweep))

    # ------------------------------------------------------------------------ the guard's and the stop's actions
    def _add_finalizer(self, action: AddFinalizer, _: Any) -> dict[str, Any] | None:
        return self.kube.add_finalizer(dict(action.body))

    def _remove_finalizer(self, action: RemoveFinalizer, _: Any) -> bool:
        return self.kube.remove_finalizer(dict(action.body))

    def _ask_job_stop(self, ask: AskJobStop, _: Any) -> ray_jobs.StopOutcome | None:
        """The head's answer, asked once per stop: None while the request is in flight on the head calls' pool (a
        fast head's answer is waited for briefly, so a stop costs no extra look)."""
        if self.head_calls is None:
            return self.stop_job(ask.url, ask.job)
        with self.shared.lock:
            call = self.shared.stop_calls.get(ask.key)
            if call is None:
                call = self.head_calls.submit_to(ask.namespace, self.stop_job, ask.url, ask.job)
                self.shared.stop_calls[ask.key] = call
        try:
            outcome: ray_jobs.StopOutcome = call.result(timeout=STOP_CALL_WAIT_S)
        except FutureTimeout:
            return None
        except Exception as exc:  # stop_job answers every failure as an outcome; anything else is the same to us
            outcome = ray_jobs.StopOutcome(asked=False, error=f"the request failed ({type(exc).__name__})")
        with self.shared.lock:
            self.shared.stop_calls.pop(ask.key, None)
        return outcome

    def _suspend_worker_groups(self, action: SuspendWorkerGroups, _: Any) -> dict[str, Any] | None:
        return self.kube.patch_raycluster(action.namespace, action.cluster, dict(action.patch), retry_conflict=False)

    def _delete_pods(self, action: DeletePods, _: Any) -> None:
        for pod in action.pods:
            self.kube.delete_pod(action.namespace, pod)

    def _cap_workers(self, action: CapWorkers, _: Any) -> Any:
        patch = self.kube.patch_rayjob if action.kind == constants.RAYJOB_KIND else self.kube.patch_raycluster
        return patch(action.namespace, action.name, dict(action.patch))

    def _skip_verification(self, action: SkipVerification, _: Any) -> Any:
        patch = {"metadata": {"annotations": {constants.ANNOTATION_SKIP_VERIFICATION: "true"}}}
        if action.kind == constants.RAYJOB_KIND:
            return self.kube.patch_rayjob(action.namespace, action.name, patch)
        return self.kube.patch_raycluster(action.namespace, action.name, patch)

    def _change_status(self, action: ChangeStatus, _: Any) -> Mapping[str, Any] | None:
        if not action.failure:
            return self.status.update(action.sweep, action.change)
        try:
            return self.status.update(action.sweep, action.change)
        except Exception as exc:  # a best-effort record: what it records is said elsewhere too (a metric, a log)
            log.warning("sweep %s: cannot %s: %s", meta_of(action.sweep).get("name"), action.failure, exc)
            return None

    def _post_event(self, event: PostEvent, _: Any) -> None:
        for target in event.targets:
            self.emit(target, event.type, event.reason, event.message)
