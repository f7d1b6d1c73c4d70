"""The operator's entry points (kopf-free; `handlers` wires them): each reads the facts, asks a decide_* function
and carries the decision out. Clients, clock and event sink are injected."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from sweep_contracts.problems import SpecError

from .. import gpu_time, ray_jobs
from ..admission_ledger import AdmissionLedger
from ..kube import KubeApi
from ..metrics import OperatorMetrics
from ..policy import Admit
from ..rendering import RenderContext
from ..settings import Settings
from ..validation import transition_problems
from ..workqueue import ROUTINE, URGENT, FairPool, WorkQueue
from . import admission, attempts, guard, kueue, run_pass, run_phase, usage
from .actions import AddFinalizer, CapWorkers, CreateRayJob, Decision, Diagnose, PostEvent, ReserveBudget
from .cache import Cache, run_ref
from .deletion_state import DeletionState, namespace_of
from .deletion_state import GuardKey as GuardKey  # re-exported: tests name the guard's queue keys here
from .drift import RunBounds, bounds_of, decide_drift, guarded_run_object, may_exceed_cap, worker_cap
from .executor import Executor, Followers
from .facts import ObjectRef, RunRef, SweepFacts, meta_of, status_of
from .guard_pipeline import GuardPipeline
from .guard_pipeline import RetryLater as RetryLater  # re-exported: the guard's callers catch it here
from .ports import Budgets, resume_read
from .reads import Reads, S3ClientFactory, Verifier, delegated
from .run_pass import PodsRead, RunReads
from .status_writer import BudgetThresholdCallback, EventSink, PhaseCallback, Stale, StatusWriter
from .stopping import StopBeforeDelete

log = logging.getLogger(__name__)

FINISH_VERIFICATION_WORKERS = 2
# Graceful stops (a call to the run's Ray head each, up to its deadline; threads that mostly wait): more than the
# namespaces likely to stop sweeps at once, so that namespaces whose heads answer slowly each hold one and a
# worker is still free for the next.
STOP_WORKERS = 16
# Requests to Ray heads in flight at once (threads that wait on a head, each at most its deadline): more than the
# stops many namespaces' deletions ask for at once.
HEAD_CALL_WORKERS = 64


class SweepController:
    """The operator's controller: the run pass (admit, run, finish) here; the deletion guard (`guarding`) and the stop
    before a delete (`stopper`) are its collaborators."""

    s3_client_for = delegated("reads", "s3_client_for")  # (endpoint, region) -> S3 client
    verify = delegated("reads", "verifier")
    # The guard's entry points, as handlers.py wires them (kopf's deletion and resume events).
    deletion_seen = delegated("guarding", "deletion_seen")
    guard_object = delegated("guarding", "guard_object")
    check_guard_label = delegated("guarding", "check_guard_label")
    guard_sweep_deletion = delegated("guarding", "guard_sweep_deletion")
    guard_rayjob_deletion = delegated("guarding", "guard_rayjob_deletion")
    guard_raycluster_deletion = delegated("guarding", "guard_raycluster_deletion")

    def __init__(
        self,
        settings: Settings,
        kube: KubeApi,
        s3_client_for: S3ClientFactory,
        events: EventSink,
        *,
        verifier: Verifier | None = None,
        clock: Callable[[], float] = time.time,
        metrics: OperatorMetrics | None = None,
        reconcile_workers: int = 0,
        verification_pool: Any = None,
        guard_workers: int = 0,
        stop_job: Callable[[str, str], ray_jobs.StopOutcome] = ray_jobs.stop_job,
        job_status: Callable[[str, str], str | None] = ray_jobs.job_status,
    ):
        """`reconcile_workers`: threads serving reconcile requests from events and ticks (the operator's work
        queue); 0 runs each request at once in the caller's thread (tests drive the controller that way)."""
        from ..verification import verify_sweep_checkpoints

        self.kube, self.emit, self.clock = kube, events, clock
        self.metrics = metrics or OperatorMetrics()
        self.cache = Cache(settings)
        verifier = verifier or verify_sweep_checkpoints
        self.reads = Reads(
            settings, kube, self.cache, s3_client_for, verifier, self.metrics, verification_pool, emit=events
        )
        self.settings = settings
        self.status = StatusWriter(
            kube,
            self.cache,
            events,
            [PhaseCallback(events, self.metrics), BudgetThresholdCallback(self.metrics)],
            clock=lambda: self.clock(),  # a test may move the controller's clock after it is built
            mirror_seconds=lambda: self.settings.progress_mirror_seconds,
        )
        self.render_context = RenderContext.from_settings(settings)
        self.ledger = AdmissionLedger(kube.list_sweeps, self.reads.unfinished_runs)
        self.budgets = Budgets(self.reads, self.ledger, self.render_context)
        self.metrics.follow(
            self.cache.sweeps,
            gpu_budget=settings.limits.max_gpus_per_namespace,
            gpu_hour_budget=self.budgets.gpu_hour_budget,
            gpu_hour_ledgers=lambda: self.budgets.hours.all_cached(self.budgets.gpu_hour_budget),
        )
        self.verification_pool = verification_pool
        self._build_queues(reconcile_workers, verification_pool is not None)
        # The memory budget is shared by what may run at once: the guard's and the finishing sweeps' verifications,
        # and every worker that may read a run's status or result document (reconcile, guard, finishing).
        finishing = FINISH_VERIFICATION_WORKERS if verification_pool is not None else 0
        self.reads.concurrency = (
            (settings.verification_workers if verification_pool is not None else 0) + finishing,
            reconcile_workers + guard_workers + finishing,
        )
        log.info("%s", self.reads.budget.describe())
        # Each graceful stop's request to a head runs here, not on the guard's or the stop queue's worker, which
        # looks again shortly: a head at its deadline then holds a thread that only waits (fair between
        # namespaces), and no worker another namespace's deletion needs.
        threaded = bool(reconcile_workers or guard_workers)
        self.head_calls: FairPool | None = FairPool(HEAD_CALL_WORKERS, name="head-call") if threaded else None
        self.stop_job, self.job_status = stop_job, job_status
        self._build_collaborators(guard_workers, threaded)

    def _build_collaborators(self, guard_workers: int, threaded: bool) -> None:
        """The executor of every action, and the guard's pipeline and the stop before a delete: collaborators
        sharing one explicit state object with the run pass (its pod looks); what they read of the controller
        (clock, settings, Events, the head calls tests swap) is read at each use."""
        self.shared = DeletionState()
        emit, clock = (lambda *event: self.emit(*event)), (lambda: self.clock())
        followers = Followers(
            stop_then_delete=lambda key: self.stopping.add(key),
            suspend_finished=lambda *names: self.stopper.suspend_finished(*names),
            release_and_admit_next=lambda ref: self._release_and_admit_next(ref),
            finish=lambda ref: self.finishing.add(ref),
        )
        # The one executor of every action: the run pass's, the guard's and the stop's.
        self.executor = Executor(
            kube=self.kube, status=self.status, metrics=self.metrics, shared=self.shared, budgets=self.budgets,
            ledger=self.ledger, emit=emit, clock=clock, stop_job=lambda url, job: self.stop_job(url, job),
            head_calls=self.head_calls, followers=followers,
        )  # fmt: skip
        self.stopper = StopBeforeDelete(
            kube=self.kube, cache=self.cache, reads=self.reads, executor=self.executor,
            shared=self.shared, clock=clock, settings=lambda: self.settings,
            job_status=lambda url, job: self.job_status(url, job), workers=STOP_WORKERS if threaded else 0,
        )  # fmt: skip
        self.guarding = GuardPipeline(
            kube=self.kube, cache=self.cache, reads=self.reads, executor=self.executor, metrics=self.metrics,
            shared=self.shared, clock=clock, stopper=self.stopper,
            release_and_admit_next=lambda ref: self._release_and_admit_next(ref), workers=guard_workers,
        )  # fmt: skip
        # RayJobs to delete once their job stopped gracefully, and the guard's deletion pipeline: their queues.
        self.stopping, self.guards = self.stopper.stopping, self.guarding.guards

    def _build_queues(self, reconcile_workers: int, pooled: bool) -> None:
        """The reconcile and end-of-run verification queues (`pooled`: verifications run on their own threads); the
        guard's and the stop's are their own."""
        # Every queue is fair between namespaces (workqueue.fair_share): what one namespace's objects cause (its
        # polls, stops, guard checks, verifications) holds at most its share of a queue's workers.
        self.queue: WorkQueue[ObjectRef] = WorkQueue(
            lambda ref: self._pass(ref), workers=reconcile_workers, flow=namespace_of
        )
        # End-of-run verifications get their own small pool beside the guard's: neither waits behind the other,
        # and neither holds a reconcile worker while a bucket is slow.
        self.finishing: WorkQueue[ObjectRef] = WorkQueue(
            self._finish,
            workers=FINISH_VERIFICATION_WORKERS if pooled else 0,
            name="finish-verify",
            flow=namespace_of,
        )

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:  # one Settings for every part (tests change them in flight)
        self._settings = self.cache.settings = self.reads.settings = settings

    def close(self) -> None:
        """Stop the work queues' threads (the operator is stopping)."""
        self.queue.close()
        self.guards.close(timeout=0)
        self.stopping.close(timeout=0)
        self.finishing.close(timeout=0)  # a verification waiting on a slow bucket does not hold the shutdown
        if self.head_calls is not None:
            self.head_calls.shutdown(wait=False)

    # ------------------------------------------------------------------------------ watch events and ticks
    def sweep_event(self, body: Mapping[str, Any]) -> None:
        """A watch event for a sweep: remember the copy and reconcile, unless it is the echo of our own write (every
        status write carries the resourceVersion it was computed from, so its result is what the pass wanted)."""
        self.cache.observe_sweep(body)
        if not self.cache.is_echo(body):
            waiting = not self.cache.status(body).run_id and not meta_of(body).get("deletionTimestamp")
            self.queue.add(ObjectRef.of(body), URGENT if waiting else ROUTINE)

    def request_reconcile(self, namespace: str, name: str, *, priority: int = ROUTINE) -> None:
        """Queued (deduplicated, admissions first) in the operator; at once without reconcile workers."""
        self.queue.add(ObjectRef(namespace, name), priority)

    def reconcile_sweep(self, body: Mapping[str, Any]) -> None:
        """One pass in the caller's thread, on the newest copy known (a full `body` is remembered first)."""
        if "spec" in body:
            self.cache.observe_sweep(body)
        self.queue.run_now(ObjectRef.of(body))

    def observe_sweep(self, body: Mapping[str, Any]) -> None:
        self.cache.observe_sweep(body)

    def forget_sweep(self, body: Mapping[str, Any]) -> None:
        ref = ObjectRef.of(body)
        self.cache.forget_sweep(ref)
        with self.shared.lock:
            self.shared.pod_looks.pop(ref, None)

    def observe_rayjob(self, rayjob: Mapping[str, Any]) -> None:
        """Reconciles read RayJobs from the watch's copies, as a controller reads its informer cache (a GET per
        reconcile was a fifth of all API requests). The guard never does: deletion decisions read fresh."""
        self.cache.observe_rayjob(rayjob)

    def forget_rayjob(self, rayjob: Mapping[str, Any]) -> None:
        self.cache.forget_rayjob(rayjob)

    def rayjob_changed(self, rayjob: Mapping[str, Any]) -> bool:
        """Whether a RayJob event carries news for its sweep's status."""
        return self.cache.rayjob_has_news(rayjob)

    def tick_due(self, body: Mapping[str, Any]) -> bool:
        """Whether a timer tick has work (run_phase.tick_due); ticks for steady sweeps cost no API call."""
        status = self.cache.status(body)  # parsed once per resourceVersion: a steady sweep's ticks parse nothing
        if usage.usage_open(status):
            return True  # an ended run's GPU pods are measured until they are gone (docs/budgets.md)
        poll_due = self.cache.poll_due(ObjectRef.of(body), time.monotonic(), take=False)
        return run_phase.tick_due(body, self.clock(), poll_due, status)

    # ------------------------------------------------------------------------------ the reconcile pass
    def _pass(self, ref: ObjectRef) -> None:
        """Level-based: bring the sweep's RayJob and status in line with its spec and the world. A status write
        computed from a copy that turns out stale is refused by its precondition; the pass starts over on a read."""
        started = time.monotonic()
        try:
            for attempt in range(3):
                fresh = self.reads.sweep(ref, reread=attempt > 0)
                if fresh is None:
                    return
                if meta_of(fresh).get("deletionTimestamp"):
                    self._held_pass(fresh)  # the guard's pipeline decides the deletion itself
                    return
                if guard.missing_finalizer(fresh):
                    fresh = self.executor.carry_out(AddFinalizer(fresh))
                    if fresh is None:
                        return
                    self.cache.remember_write(fresh)
                try:
                    self._reconcile(fresh)
                    return
                except Stale as exc:
                    log.debug("%s; reconciling %s again on a fresh read", exc, ref)
            log.info("sweep %s kept changing during three reconciles; the next event or tick retries", ref)
        finally:
            self.metrics.reconcile_seconds.observe(time.monotonic() - started)

    def _held_pass(self, body: Mapping[str, Any]) -> None:
        """A sweep being deleted keeps its deadline, its GPU-hour budget and its measuring while the guard holds it
        (its RayJob runs until the guard releases the sweep): a deadline or a spent budget still stops the RayJob,
        and status.usage keeps counting. Nothing else of the run phase applies (no admission, no resume)."""
        if not self.cache.status(body).run_id:
            return
        facts = self.reads.run_facts(self.reads.sweep_facts(body, self.clock()))
        if facts.rayjob is None or facts.rayjob.deleting:
            return
        # kopf runs no timer for an object being deleted: this pass asks for its own next one.
        next_in = run_phase.held_pass_due_in(facts, self.settings.reconcile_seconds, usage.usage_open(facts.status))
        if next_in is not None:
            self.queue.add_after(facts.ref, next_in)
        refresh = self.settings.usage_refresh_seconds
        decision = run_pass.decide_held_pass(facts, self._pods_read(facts), refresh_seconds=refresh)
        self._execute(body, decision)  # the stops go gracefully, then deleted (DeleteRayJob)

    def _reconcile(self, body: Mapping[str, Any]) -> None:
        facts = self.reads.sweep_facts(body, self.clock())
        if facts.status.run_id:
            self._run(facts)
        else:
            self._admit(facts)

    def _admit(self, facts: SweepFacts) -> None:
        """A sweep without a run: read (the budgets only where the admission asks them), decide once, act (a status,
        or its RayJob to create, which `_execute` carries out)."""
        asks = facts.sweep is not None and admission.asks_budgets(facts)  # a sweep that did not parse asks none
        budgets = self.budgets.read(facts, facts.sweep.spec) if asks and facts.sweep is not None else None
        self._execute(facts.body, run_pass.decide_admit_pass(facts, budgets, self.render_context), facts)

    def _create_first_attempt(self, facts: SweepFacts, create: CreateRayJob) -> tuple[Decision, bool]:
        """A first admission's create carried out, and the decision on its outcome (`admission.after_create`; in
        Kueue mode the created run waits Queued); True: the create failed."""
        assert facts.sweep is not None and create.demand is not None
        decision, failed = self._create_rayjob(facts, create, Admit(create.demand))
        queue = self.render_context.queue_name(facts.sweep.spec, facts.ref.namespace)
        if queue and not failed and decision.status and decision.status.run_id:
            decision = replace(decision, status=kueue.kueue_created_status(decision.status, queue))
        return decision, failed

    def _create_rayjob(self, facts: SweepFacts, create: CreateRayJob, budget: Admit) -> tuple[Decision, bool]:
        ref, render = facts.ref, self.render_context
        try:
            rayjob, created = self.executor.carry_out(create)
        except Exception as exc:
            failures, delay = self.cache.create_failed(ref, self.clock())
            outcome = admission.CreateOutcome(error=admission.api_error_text(exc), failures=failures, retry_in=delay)
            log.warning("sweep %s: creating the RayJob failed (%d in a row): %s", ref, failures, outcome.error)
            if self.queue.threaded:
                timer = threading.Timer(delay, self.request_reconcile, (ref.namespace, ref.name), {"priority": URGENT})
                timer.daemon = True
                timer.start()
            return admission.after_create(facts, create, budget, outcome, "", render), True
        self.cache.create_succeeded(ref)
        outcome = admission.CreateOutcome(rayjob, created)
        decision = admission.after_create(facts, create, budget, outcome, self.budgets.in_use(ref.namespace), render)
        if facts.sweep is not None and decision.status and decision.status.run_id:
            self.cache.observe_rayjob(rayjob)  # the next pass reads it from memory, not with a GET
            self.cache.rayjob_has_news(rayjob)  # its ADDED event mirrors nothing this pass's status lacks
            if created:
                self.cache.remember_created_rayjob(rayjob)  # and that event need not reach the operator at all
            self.cache.remember_cap(RunRef(ref, create.run_id), worker_cap(facts.sweep.spec, self.settings.limits))
        return decision, False

    def _run(self, facts: SweepFacts) -> None:
        """An admitted sweep: read (a pending resume's reads, the run's, Kueue's, the pods when due), decide once
        (Diagnose alone asks for one more read), act."""
        settings = self.settings
        resumed = resume_read(facts, self.budgets, settings.limits.max_active_seconds)
        facts = self.reads.run_facts(facts)
        namespace = kueue.workloads_wanted(facts)
        run = kueue.kueue_run_of(facts, self.kube.list_workloads(namespace)) if namespace else None
        if run is not None:  # Kueue mode: the deadline counts admitted time only, startup from the admission
            facts = replace(facts, clock=kueue.run_clock(run, facts.now))
        queue = self.render_context.queue_name(facts.sweep.spec, facts.ref.namespace) if facts.sweep else None
        reads = RunReads(run, self._pods_read(facts), resumed, queue)
        decide = partial(
            run_pass.decide_run_pass,
            reads=reads,
            reconcile_seconds=settings.reconcile_seconds,
            refresh_seconds=settings.usage_refresh_seconds,
            context=self.render_context,
            max_active_seconds=settings.limits.max_active_seconds,
        )
        decision = decide(facts)
        wanted = decision.wants(Diagnose)
        if wanted is not None:  # the decision needs the startup diagnosis: read it, decide again
            decision = decide(replace(facts, diagnosis=self.reads.diagnosis(facts.ref.namespace, wanted)))
        self._execute(facts.body, decision, facts)

    def _execute(self, body: Mapping[str, Any], decision: Decision, facts: SweepFacts | None = None) -> None:
        """The decision carried out by the executor: a `CreateRayJob` first (the status to write follows from its
        outcome); before it, a `ReserveBudget`, which voids the decision when the budgets no longer answer as read
        (the pass runs again); then the other actions, the status (written once) and what follows the write."""
        reserve = decision.wants(ReserveBudget)
        if reserve is not None and facts is not None and not self.executor.carry_out(reserve, facts):
            ref = ObjectRef.of(body)
            log.debug("sweep %s: the namespace's budgets changed since this pass read them; deciding again", ref)
            self.request_reconcile(ref.namespace, ref.name, priority=URGENT)
            return
        create, failed = decision.wants(CreateRayJob), False
        if create is not None and create.taken is not None:  # a resumed attempt's RayJob
            made, fresh = self.executor.carry_out(create)
            self.cache.observe_rayjob(made)
            if not fresh and not attempts.adoptable(made, create.run_id, create.owner_uid):
                decision = create.taken
        elif create is not None and facts is not None:  # a first admission's
            decision, failed = self._create_first_attempt(facts, create)
        try:
            self.executor.apply(body, decision)
        except Exception as exc:
            if not failed:
                raise
            # the API may be down for the status too; the create's retry still comes
            log.warning("sweep %s: cannot record the failed create: %s", ObjectRef.of(body), exc)
        if create is not None and create.taken is None and not failed and decision.status and decision.status.run_id:
            ref = ObjectRef.of(body)  # admitted: the next queued sweep may fit as well (strict FIFO, oldest first)
            self._admit_next(ref.namespace, self.ledger.queued_in(ref.namespace))

    def _finish(self, ref: ObjectRef) -> None:
        """The end-of-run verification on the newest copy, while the sweep is still ended and unverified."""
        for attempt in range(3):
            fresh = self.reads.sweep(ref, reread=attempt > 0)
            if fresh is None or meta_of(fresh).get("deletionTimestamp"):
                return
            ended = self.reads.end_of_run(fresh) if run_phase.awaiting_verification(status_of(fresh)) else None
            if ended is None:
                return
            decision = run_phase.decide_finish(self.reads.sweep_facts(fresh, self.clock()), *ended)
            try:
                self.executor.apply(fresh, decision, progress_may_wait=False)
                return
            except Stale:
                continue

    # ------------------------------------------------------------ budgets: GPU-hours, the FIFO, Kueue
    def _pods_read(self, facts: SweepFacts) -> PodsRead | None:
        """The run's GPU pods, when a pass measures them (docs/budgets.md), and the namespace's window."""
        budget = self.budgets.gpu_hour_budget(facts.ref.namespace)
        clusters = usage.clusters_to_measure(facts, budget)
        if clusters is None or not self.cache.pods_due(facts.ref, time.monotonic()):
            return None
        pods = self.reads.cluster_pods(facts.ref, clusters)
        unlisted = gpu_time.unlisted_open_pods(facts.judged_status, pods or (), clusters)
        if pods is not None and unlisted:  # relabelled, or gone: only an observed end closes a pod's interval
            still = self.reads.pods_still_holding(facts.ref.namespace, unlisted)
            pods = None if still is None else [*pods, *still]
        if pods is None:
            return None
        window, reservation = self.budgets.namespace_hours(facts)
        with self.shared.lock:  # this look's time, for the next pass's unscheduled-trials count
            previous, self.shared.pod_looks[facts.ref] = self.shared.pod_looks.get(facts.ref), facts.now
        return PodsRead(tuple(pods), frozenset(clusters), window, reservation, budget is not None, previous)

    def _release_and_admit_next(self, ref: ObjectRef) -> None:
        """A sweep ended or left: free its budget and give the queue, oldest first, a chance. Its GPU-hour
        reservation goes; its hours stay in the namespace's ledger, deleted or not."""
        body = self.cache.sweep(ref) or self.kube.get_sweep(ref.namespace, ref.name)
        if body is not None:
            deleted = bool(meta_of(body).get("deletionTimestamp"))
            self.budgets.release_hours(body, deleted=deleted, now=self.clock())
        was_admitted = ref.name in self.ledger.admitted.get(ref.namespace, {})
        queue = self.ledger.release(ref.namespace, ref.name)
        if not was_admitted:
            return
        self._admit_next(ref.namespace, queue)

    def _admit_next(self, namespace: str, queue: list[str]) -> None:
        """Hand the oldest queued sweep still there to the work queue, before routine work: its pass decides, and
        an admission hands on the next one (`_execute`). The queue is tried oldest first and stops at the first sweep
        that does not fit, one pass at a time, never a pass nested in another's actions."""
        for queued in queue:
            if self.kube.get_sweep(namespace, queued) is None:
                self.ledger.release(namespace, queued)
                continue
            self.request_reconcile(namespace, queued, priority=URGENT)
            return

    def workload_changed(self, workload: Mapping[str, Any]) -> None:
        """A Kueue Workload changed: reconcile the sweep whose RayJob it belongs to (Kueue mode)."""
        for sweep in self.reads.sweeps_of_workload(workload):
            self.request_reconcile(sweep.namespace, sweep.name)

    # --------------------------------------------------------------------------------- drift (R21)
    def drifted(self, body: Mapping[str, Any], kind: str) -> bool:
        """Whether a worker group may exceed its run's cap (no I/O; `correct_drift` decides)."""
        bounds = bounds_of(body)
        if bounds is None:
            cap = self.cache.cap(run_ref(body))
            bounds = RunBounds(cap) if cap is not None else None
        return may_exceed_cap(body, kind, bounds)

    def correct_drift(self, body: Mapping[str, Any], kind: str) -> None:
        """Set a worker group edited above its cap back (RayJob or RayCluster), with an Event."""
        if not guarded_run_object(body):
            return
        bounds = self.reads.run_bounds(body, kind)
        correction = decide_drift(body, kind, bounds) if bounds is not None else None
        if correction is None:
            return
        ref = ObjectRef.of(body)
        self.executor.carry_out_all(
            (
                CapWorkers(kind, ref.namespace, ref.name, correction.patch),
                PostEvent((body,), "Warning", "CapEnforced", correction.message),
            )
        )
        sweep = self.reads.sweep(run_ref(body).sweep)
        if sweep is not None:
            message = f"{kind} {ref.name}: {correction.message}"
            self.executor.carry_out(PostEvent((sweep,), "Warning", "CapEnforced", message))

    # --------------------------------------------------------------------------------- the webhook
    def admission_problems(self, body: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
        """Problems that make the API server refuse a CREATE/UPDATE (the validating webhook; no I/O). What it parses
        is not remembered: anyone who reaches the webhook chooses these specs (dry runs and forged reviews too), and
        hundreds of KiB each would fill the parse cache the reconciles share."""
        if meta_of(body).get("deletionTimestamp"):
            return []
        try:
            self.cache.parse(body, remember=False)
        except SpecError as exc:
            return [str(p) for p in exc.problems]
        return admission.spec_change_problems(body, old) + [str(p) for p in transition_problems(body, old)]
