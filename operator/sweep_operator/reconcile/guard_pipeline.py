"""The checkpoint guard's pipeline: the deletion pipeline and the finalizer on our RayJobs and RayClusters.

It reads and orders the steps; every decision is in guard.py, every write an action the executor carries out.

The pipeline keeps our own finalizer and our own retries; the escape hatch's audit and its propagation, and the
lost-label warning, are here too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import Phase
from sweep_contracts.status_models import SweepStatus

from .. import audit
from ..kube import KubeApi
from ..metrics import OperatorMetrics
from ..status import conditions_with, updated
from ..workqueue import WorkQueue
from . import guard
from .actions import AddFinalizer, ChangeStatus, DeleteRayJob, PostEvent, RemoveFinalizer, SkipVerification
from .cache import Cache
from .deletion_state import DeletionState, GuardKey, namespace_of
from .executor import Executor
from .facts import DeletionFacts, ObjectRef, meta_of, status_of
from .reads import Reads, run_id_of, sweep_run_id
from .stopping import StopBeforeDelete

log = logging.getLogger(__name__)


Documents = tuple[Mapping[str, Any] | None, Mapping[str, Any] | None, bool]  # status.json, result.json, readable


def verify_and_decide(
    facts: guard.GuardFacts,
    backoff: guard.Backoff,
    verify: Callable[[guard.GuardTarget], Any],
    documents: Callable[[guard.GuardTarget], Documents],
) -> tuple[guard.Release | guard.Hold, Any]:
    """The one decision every deletion path takes (the operator's kinds and `sweepctl release`, each with its own
    reads): decide, read the verification and the run's records when the decision asks for them, decide on what was
    read. Returns the decision and the verification it took (None: it needed none)."""
    decision = guard.before_verification(facts, backoff)
    if not isinstance(decision, guard.Verify):
        return decision, None
    result = verify(decision.target)
    progress, final, readable = documents(decision.target)
    return guard.after_verification(guard.RunRecords(result, progress, final, readable), backoff), result


class RetryLater(Exception):
    """Keep the finalizer (or the handler) and come back after `delay` seconds."""

    def __init__(self, message: str, delay: float, *, counted: bool = True):
        super().__init__(message)
        self.delay = delay
        self.counted = counted  # False: a wait that is no failed check (a graceful stop): the backoff does not grow


class GuardPipeline:
    """Guards deletions: an object of ours being deleted keeps the guard's finalizer until a verification in this
    process releases it. `guards` is its queue; a sweep's deletion stops its run first through `stopper`."""

    def __init__(
        self,
        *,
        kube: KubeApi,
        cache: Cache,
        reads: Reads,
        executor: Executor,
        metrics: OperatorMetrics,
        shared: DeletionState,
        stopper: StopBeforeDelete,
        clock: Callable[[], float],
        release_and_admit_next: Callable[[ObjectRef], None],
        workers: int,
    ) -> None:
        """`clock` is read at each use (tests swap the controller's in flight); `release_and_admit_next` is the
        controller's: a deleted sweep frees its share of the budget. Its writes are the executor's."""
        self.kube, self.cache, self.reads, self.executor, self.metrics = kube, cache, reads, executor, metrics
        self.shared, self.stopper, self.clock = shared, stopper, clock
        self._release_and_admit_next = release_and_admit_next
        # Our own finalizer, our own retries. kopf's on.delete kept its progress ("handler done", retry counts) in
        # annotations a tenant can write; nothing stored stands in for a verification here: a release is decided by
        # verifying, in this process, every time.
        self.guards: WorkQueue[GuardKey] = WorkQueue(self._guard_pass, workers=workers, name="guard", flow=namespace_of)

    def deletion_seen(self, kind: str, body: Mapping[str, Any]) -> None:
        """An object of ours is being deleted and carries the guard's finalizer: the pipeline takes it. Events that
        arrive while a hold waits out its backoff do not hurry the next check (our own status writes on a held
        sweep would otherwise re-verify it in a loop)."""
        meta = meta_of(body)
        if not meta.get("deletionTimestamp") or constants.FINALIZER not in (meta.get("finalizers") or []):
            return
        key = GuardKey(kind, meta.get("namespace") or "default", meta.get("name", ""), meta.get("uid") or "")
        with self.shared.lock:
            if key in self.shared.guard_due:
                return
        self.guards.add(key)

    def _guard_pass(self, key: GuardKey) -> None:
        """Read the object afresh, decide (verifying), and take the finalizer off only on a release."""
        with self.shared.lock:
            due = self.shared.guard_due.get(key)
            early = due - time.monotonic() if due is not None else 0.0
            if early <= 0:
                self.shared.guard_due.pop(key, None)
        if early > 0:  # a timer may fire a hair early; the check stays armed for its time
            self.guards.add_after(key, early)
            return
        attempt = self.shared.guard_attempts.get(key, 0)
        try:  # a failed read or release is tried again after a backoff, not left to a watch event that may not come
            fresh = self.kube.get_object(key.kind, key.namespace, key.name)
        except Exception as exc:
            self._guard_io_failed(key, attempt, "read", exc)
            return
        meta = meta_of(fresh or {})
        if (
            fresh is None
            or (key.uid and meta.get("uid") != key.uid)
            or not meta.get("deletionTimestamp")
            or constants.FINALIZER not in (meta.get("finalizers") or [])
        ):
            self._guard_done(key)
            return
        try:
            reason = self._deletion_kinds[key.kind](fresh, attempt)
        except RetryLater as hold:
            self._guard_retry(key, attempt if hold.counted else attempt - 1, hold.delay)
            return
        except Exception:  # fail closed: an unexpected error holds like any other, with backoff
            delay = guard.backoff_seconds(attempt, 1.0, 60.0)
            log.exception(
                "checkpoint guard of %s %s/%s failed; holding, next check in %gs",
                key.kind,
                key.namespace,
                key.name,
                delay,
            )
            self._guard_retry(key, attempt, delay)
            return
        try:
            removed = self.executor.carry_out(RemoveFinalizer(fresh))
        except Exception as exc:
            self._guard_io_failed(key, attempt, "release", exc)
            return
        if not removed:
            self._guard_retry(key, attempt, 1.0)
            return
        self._guard_done(key)
        log.info("checkpoint guard released %s %s/%s: %s", key.kind, key.namespace, key.name, reason)

    def _guard_io_failed(self, key: GuardKey, attempt: int, what: str, exc: Exception) -> None:
        delay = guard.backoff_seconds(attempt, 1.0, 60.0)
        log.warning(
            "checkpoint guard of %s %s/%s: cannot %s it (%s); holding, next check in %gs",
            key.kind, key.namespace, key.name, what, exc, delay,
        )  # fmt: skip
        self._guard_retry(key, attempt, delay)

    def _guard_retry(self, key: GuardKey, attempt: int, delay: float) -> None:
        with self.shared.lock:
            self.shared.guard_attempts[key] = attempt + 1
            self.shared.guard_due[key] = time.monotonic() + delay
        self.guards.add_after(key, delay)

    def _guard_done(self, key: GuardKey) -> None:
        with self.shared.lock:
            self.shared.guard_attempts.pop(key, None)
            self.shared.guard_due.pop(key, None)

    @property
    def _deletion_kinds(self) -> dict[str, Callable[[Mapping[str, Any], int], str]]:
        """The deletion pipeline's table: one row per kind the guard holds."""
        return {
            constants.KIND: self.guard_sweep_deletion,
            constants.RAYJOB_KIND: self.guard_rayjob_deletion,
            constants.RAYCLUSTER_KIND: self.guard_raycluster_deletion,
        }

    def guard_object(self, kind: str, body: Mapping[str, Any]) -> None:
        """A RayJob or RayCluster of ours carries the guard's finalizer from the moment we see it (the RayJob from
        its rendering; KubeRay's RayCluster from here)."""
        meta = meta_of(body)
        if meta.get("deletionTimestamp") or constants.FINALIZER in (meta.get("finalizers") or []):
            return
        self.executor.carry_out(AddFinalizer(body))

    def guard_sweep_deletion(self, body: Mapping[str, Any], attempt: int) -> str:
        """The sweep is being deleted: verify, then delete its RayJob and release; else RetryLater."""
        ref, meta, newest = ObjectRef.of(body), meta_of(body), None
        if status_of(body).phase != Phase.DELETING:
            newest = self.executor.carry_out(ChangeStatus(body, lambda s: updated(s, guard.DELETING)))
        rayjob = self.reads.rayjob_of_sweep(body)
        if rayjob is not None:  # its job stops gracefully first, so the last reports' checkpoints are verified too;
            wait = self.stopper.before_delete(rayjob, body)  # then its GPU workers go, whatever the verification finds
            if wait is not None:
                message = f"RayJob {meta_of(rayjob)['name']}: waiting for its Ray job to stop and its workers to go"
                raise RetryLater(message, wait, counted=False)
        facts, decision = self._guard(DeletionFacts(constants.KIND, body, attempt, sweep=body, rayjob=rayjob), newest)
        if facts.skip:
            self._propagate_skip(ref.namespace, ref.name, sweep_run_id(body))
        if rayjob is not None:  # its job stopped and its workers were suspended above
            self.executor.carry_out(DeleteRayJob(meta_of(rayjob)["name"], ref.namespace, after_stop=False))
        self._release_and_admit_next(ref)
        self.metrics.observe_phase(meta.get("uid") or ref.name, None, ref.namespace, ref.name)
        self.metrics.sweep_gone(ref.namespace, ref.name)  # its series go later; its pods' last look now
        with self.shared.lock:
            self.shared.pod_looks.pop(ref, None)
        return decision.reason

    def guard_rayjob_deletion(self, body: Mapping[str, Any], attempt: int) -> str:
        sweep = self.reads.sweep_of(body)
        # Whoever deleted it (a user's `kubectl delete rayjob`, a tool), KubeRay stops its job, but the RayCluster
        # stays while the guard holds its owner, at full size: its worker groups are suspended first, as where the
        # operator deletes a RayJob (a no-op there: they are suspended already), so the GPUs do not wait for the
        # verification.
        wait = self.stopper.suspend_before_delete(body, sweep)
        if wait is not None:
            message = f"RayJob {meta_of(body).get('name')}: waiting for its cluster's worker groups to go"
            raise RetryLater(message, wait, counted=False)
        deletion = DeletionFacts(constants.RAYJOB_KIND, body, attempt, sweep=sweep)
        facts, decision = self._guard(deletion)
        with self.shared.lock:  # released: the suspend's start is no longer needed
            self.shared.stops.pop(f"suspend/{meta_of(body).get('uid') or meta_of(body).get('name')}", None)
        if facts.skip:
            self._propagate_skip(
                ObjectRef.of(body).namespace, guard.sweep_name_of(body), run_id_of(body), rayjobs=False
            )
        return decision.reason

    def guard_raycluster_deletion(self, body: Mapping[str, Any], attempt: int) -> str:
        rayjob, sweep = self.reads.rayjob_of_cluster(body), self.reads.sweep_of(body)
        if rayjob is not None and self.stopper.evicted_by_kueue(
            rayjob
        ):  # a preemption: KubeRay deletes the cluster of the
            # suspended RayJob without stopping its job, which stops gracefully first; then the guard verifies
            wait = self.stopper.stop_before_delete(rayjob, sweep)
            if wait is not None:
                message = f"RayCluster {meta_of(body).get('name')}: waiting for its Ray job to stop gracefully"
                raise RetryLater(message, wait, counted=False)
            self.stopper.stop_done(rayjob, sweep)
        self.stopper.record_stop_outran_suspend(
            body, rayjob, sweep
        )  # before a release lets the cluster and its pods go
        # The data stays held; the GPUs need not, nor wait for the verification, which may take minutes.
        self.stopper.free_held_workers(body, rayjob, sweep)
        try:
            _, decision = self._guard(
                DeletionFacts(constants.RAYCLUSTER_KIND, body, attempt, rayjob=rayjob, sweep=sweep)
            )
        except RetryLater as hold:
            hold.delay = min(hold.delay, self.stopper.until_workers_free(body, rayjob, sweep))
            raise
        return decision.reason

    def _guard(
        self, deletion: DeletionFacts, newest: Mapping[str, Any] | None = None
    ) -> tuple[guard.GuardFacts, guard.Release]:
        """Decide for one object; a Hold becomes RetryLater (the finalizer stays), a Release is audited or noted.
        Status changes are computed from the sweep as the deletion found it and written onto `newest` (our own
        write just before) or the freshest copy."""
        facts, body, sweep = guard.guard_facts(deletion, self.reads.defaults), deletion.body, deletion.sweep
        # The verification runs in the deleted object's namespace's share of the verification pool.
        verify = partial(self.reads.verify, flow=meta_of(body).get("namespace") or "default")
        decision, result = verify_and_decide(facts, guard.Backoff.of(deletion), verify, self.reads.run_documents)
        self.executor.carry_out_all(guard.recorded(deletion, facts, decision, result, self.clock(), newest))
        if isinstance(decision, guard.Hold):
            self.metrics.guard_held(facts.kind, body, meta_of(sweep or {}).get("name"))
        else:
            self.metrics.guard_released(facts.kind, body)
        if isinstance(decision, guard.Hold):
            raise RetryLater(guard.deletion_notice(deletion, facts, decision).message, decision.retry_after)
        if decision.audit and facts.skip:  # the escape hatch: a metric, a log naming its setter, a condition
            self._record_bypass(audit.bypass_audit(facts.kind, body, sweep), sweep)
        return facts, decision

    def _record_bypass(self, record: audit.BypassAudit, sweep: Mapping[str, Any] | None) -> None:
        """Carry out a bypass audit: the metric, the log line, the sweep's CheckpointsVerified condition."""
        self.metrics.guard_bypassed(record.kind, record.namespace, record.sweep)
        log.warning("%s", record.log_line)
        if sweep is None:
            return
        condition = ("CheckpointsVerified", False, audit.BYPASS_REASON, record.condition_message)
        generation, now = meta_of(sweep).get("generation"), self.clock()

        def change(status: SweepStatus) -> SweepStatus:
            return updated(status, {"conditions": conditions_with(status, generation, now, condition)})

        # The release goes ahead either way; the Event and the metric already say it.
        self.executor.carry_out(ChangeStatus(sweep, change, failure="record the bypass"))

    def _propagate_skip(self, namespace: str, sweep: str, run: str, *, rayjobs: bool = True) -> None:
        """The escape hatch on a sweep (or RayJob) covers the objects of its run deleted after it, which outlive
        it; not an older run's under the same sweep name (`run_id_of`: what only the operator writes)."""
        if not sweep:
            return
        selector = f"{constants.LABEL_SWEEP}={sweep}"
        found = [(constants.RAYJOB_KIND, o) for o in (self.kube.list_rayjobs(namespace, selector) if rayjobs else [])]
        found += [(constants.RAYCLUSTER_KIND, o) for o in self.kube.list_rayclusters(namespace, selector)]
        self.executor.carry_out_all(
            SkipVerification(kind, namespace, meta_of(obj)["name"]) for kind, obj in found if run_id_of(obj) == run
        )

    def check_guard_label(self, body: Mapping[str, Any], kind: str) -> None:
        """A guarded RayJob/RayCluster that lost its sweep label stays guarded (the finalizer goes only through
        the guard); say so once, on the object and on its sweep."""
        meta = meta_of(body)
        if not guard.label_lost(body) or not self.cache.first_label_warning(meta.get("uid") or meta.get("name", "")):
            return
        message = guard.label_removed_message(kind, body)
        self.executor.carry_out(PostEvent((body,), "Warning", "GuardLabelRemoved", message))
        sweep = self.reads.sweep_of(body)
        if sweep is not None:
            self.executor.carry_out(PostEvent((sweep,), "Warning", "GuardLabelRemoved", message))
