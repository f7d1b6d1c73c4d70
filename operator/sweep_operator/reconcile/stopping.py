"""The stop before a delete (reads and the order of its steps): the graceful stop through the head, the worker groups
suspended, a held cluster's workers freed.

The worker groups are suspended while KubeRay still reconciles the cluster, and the GPU time held without training is
recorded. Every decision is in graceful_stop.py and idle_gpus.py; every write is an action the executor carries out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import DEFAULT_GRACEFUL_STOP_SECONDS
from sweep_contracts.problems import SpecError
from sweep_contracts.status_models import LastStopStatus, SweepStatus
from sweep_contracts.timestamps import epoch_seconds

from .. import ray_jobs
from ..kube import KubeApi
from ..settings import Settings
from ..status import updated
from ..workqueue import WorkQueue
from . import graceful_stop, guard, idle_gpus, verdicts
from .actions import (
    AskJobStop,
    ChangeStatus,
    DeletePods,
    DeleteRayJob,
    PostEvent,
    RecordIdleGpus,
    SuspendWorkerGroups,
)
from .cache import Cache
from .deletion_state import DeletionState, namespace_of
from .executor import Executor
from .facts import ObjectRef, meta_of, status_of
from .reads import Reads
from .workloads import kueue_managed

log = logging.getLogger(__name__)
STOP_RETRY_S, MAX_STOP_RETRY_S = 1.0, 60.0  # a failed stop pass is tried again after 1, 2, 4 ... 60 s
STOP_CALL_LOOK_S = 0.25  # when a pass looks again at a stop request still in flight


def _stop_key(rayjob: Mapping[str, Any], asked: float | None) -> tuple[str, int]:
    """One stop of one RayJob: whole seconds, as status.gracefulStop keeps the request's time."""
    return (meta_of(rayjob).get("uid") or meta_of(rayjob).get("name", ""), int(asked or 0))


class StopBeforeDelete:
    """Stops a run before the operator deletes its RayJob, and frees the GPUs of a cluster the guard holds. The
    controller builds it; the guard's pipeline and the run pass call it. `stopping` is its queue of RayJobs to delete
    once their job stopped: (namespace, RayJob, sweep), looked at again until then."""

    def __init__(
        self,
        *,
        kube: KubeApi,
        cache: Cache,
        reads: Reads,
        executor: Executor,
        shared: DeletionState,
        clock: Callable[[], float],
        settings: Callable[[], Settings],
        job_status: Callable[[str, str], str | None],
        workers: int,
    ) -> None:
        """`clock`, `settings` and `job_status` are read at each use (tests swap the controller's in flight). Its
        writes (the deletes, the suspends, the stop requests, the status records, the Events) are the executor's."""
        self.kube, self.cache, self.reads, self.executor = kube, cache, reads, executor
        self.shared, self.clock, self._settings, self.job_status = shared, clock, settings, job_status
        self.stopping: WorkQueue[tuple[str, str, str]] = WorkQueue(
            self.stopping_pass, workers=workers, name="graceful-stop", flow=namespace_of
        )

    @property
    def settings(self) -> Settings:
        return self._settings()

    def graceful_seconds(self, sweep: Mapping[str, Any] | None) -> float:
        """The sweep's gracefulStopSeconds, at most the operator's cap: the webhook refuses no edit of a sweep being
        deleted, so a raised value must not keep a held cluster's GPUs longer than the platform allows."""
        try:
            spec = self.cache.parse(sweep).spec if sweep is not None else None
        except SpecError:
            spec = None
        asked = float(spec.deadlines.graceful_stop_seconds if spec is not None else DEFAULT_GRACEFUL_STOP_SECONDS)
        return min(asked, self.settings.max_graceful_stop_seconds)

    def evicted_by_kueue(self, rayjob: Mapping[str, Any]) -> bool:
        if not kueue_managed(rayjob):
            return False
        try:
            workloads = self.kube.list_workloads(meta_of(rayjob).get("namespace") or "default")
        except Exception as exc:  # the guard verifies as before; only the graceful stop is missed
            log.warning("cannot read Kueue's Workloads for RayJob %s: %s", meta_of(rayjob).get("name"), exc)
            return False
        return graceful_stop.evicted_by_kueue(rayjob, workloads)

    def stopping_pass(self, key: tuple[str, str, str]) -> None:
        """Delete a RayJob once its job stopped gracefully or its window passed; until then look again. A pass that
        fails (the API server, the head) is tried again after a backoff: the stop exists nowhere else once the
        sweep's phase has ended, and a live job keeps its GPUs."""
        try:
            self._stop_step(key)
        except Exception as exc:
            with self.shared.lock:
                failures = self.shared.stop_failures[key] = self.shared.stop_failures.get(key, 0) + 1
            delay = min(STOP_RETRY_S * 2 ** (failures - 1), MAX_STOP_RETRY_S)
            log.warning("RayJob %s/%s: its stop failed (%s); trying again in %.0f s", key[0], key[1], exc, delay)
            self.stopping.add_after(key, delay)
            return
        with self.shared.lock:
            self.shared.stop_failures.pop(key, None)

    def _stop_step(self, key: tuple[str, str, str]) -> None:
        namespace, name, sweep_name = key
        rayjob = self.kube.get_rayjob(namespace, name)
        if rayjob is None:
            return
        wait = self.before_delete(rayjob, self.kube.get_sweep(namespace, sweep_name))
        if wait is not None:
            self.stopping.add_after(key, wait)
            return
        self.executor.carry_out(DeleteRayJob(name, namespace, after_stop=False))  # stopped, its workers suspended

    def before_delete(self, rayjob: Mapping[str, Any], sweep: Mapping[str, Any] | None) -> float | None:
        """Where the operator deletes a RayJob: its job stops gracefully, then its worker groups are suspended while
        KubeRay still reconciles the cluster. Seconds to wait, or None: delete now."""
        wait = self.stop_before_delete(rayjob, sweep)
        wait = wait if wait is not None else self.suspend_before_delete(rayjob, sweep)
        if wait is None:
            self.stop_done(rayjob, sweep)
        return wait

    def suspend_before_delete(self, rayjob: Mapping[str, Any], sweep: Mapping[str, Any] | None) -> float | None:
        """Suspend the RayJob's cluster's worker groups and wait (bounded) until KubeRay deleted their pods: once the
        RayJob goes, its cluster is deleted and, held by the guard, no longer reconciled."""
        meta = meta_of(rayjob)
        namespace, key = meta.get("namespace") or "default", f"suspend/{meta.get('uid') or meta.get('name')}"
        name = str((rayjob.get("status") or {}).get("rayClusterName") or "")
        try:
            cluster = self.kube.get_raycluster(namespace, name) if name else None
            pods = self.kube.list_pods(namespace, f"{constants.RAY_LABEL_CLUSTER}={name}") if cluster else []
        except Exception as exc:  # the delete goes ahead; a held cluster's workers are freed by the guard
            log.warning("RayJob %s: cannot read its cluster to suspend its workers: %s", meta.get("name"), exc)
            return None
        with self.shared.lock:
            since = self.shared.stops.get(key)
        step = idle_gpus.decide_suspend_workers(cluster, rayjob, pods, self.clock(), since)
        if step.wait_s is None:
            if cluster is not None:  # KubeRay may have deleted the stopped job's cluster before any suspend
                self.record_stop_outran_suspend(cluster, rayjob, sweep, pods)
            return None
        with self.shared.lock:
            self.shared.stops.setdefault(key, self.clock())
        if step.patch is not None and cluster is not None:
            try:  # the patch's resourceVersion is a precondition: a conflict is decided again on a fresh read
                patched = self.executor.carry_out(SuspendWorkerGroups(namespace, name, step.patch))
            except Exception as exc:
                log.info(
                    "RayCluster %s/%s: suspending its worker groups failed (%s); trying again", namespace, name, exc
                )
                return step.wait_s
            if patched is None:  # gone meanwhile: its deletion passed the guard, which recorded the stop
                return None
            asked = self._asked(rayjob, sweep)
            if asked is not None:
                self._record_stopping(rayjob, sweep, cluster, pods, asked)
            else:  # deleted by someone else: no stop of ours, the guard holds it (once: the next pass patches nothing)
                held = idle_gpus.deleted_rayjob_gpu_seconds(cluster, rayjob, pods, self.clock())
                sweep_name = guard.sweep_name_of(rayjob)
                self._record_idle(namespace, sweep_name, sweep, idle_gpus.HELD_DELETION, held)
            text = f"RayCluster {name}: worker groups suspended before its RayJob is deleted (KubeRay deletes them)"
            log.info("%s", text)
            targets = (rayjob, sweep) if sweep is not None else (rayjob,)
            self.executor.carry_out(PostEvent(targets, "Normal", "WorkerGroupsSuspended", text))
        return step.wait_s

    def suspend_finished(self, namespace: str, rayjob_name: str, cluster_name: str) -> None:
        """An ended job's cluster keeps its worker groups until KubeRay deletes it (ttlSecondsAfterFinished): suspend
        them, once per RayJob, on the cluster KubeRay made for it (its controller ownerReference), while KubeRay
        still reconciles it (not deleting). A failed patch is tried again by the next pass."""
        try:  # the pass's status write comes after its actions: a read that fails must not hold it up
            rayjob = self.cache.rayjob(ObjectRef(namespace, rayjob_name)) or self.kube.get_rayjob(
                namespace, rayjob_name
            )
            uid = meta_of(rayjob or {}).get("uid") or ""
            with self.shared.lock:
                if not uid or uid in self.shared.finished_suspended:
                    return
            cluster = self.kube.get_raycluster(namespace, cluster_name)
        except Exception as exc:
            log.info("RayCluster %s/%s: cannot read the ended job's cluster: %s", namespace, cluster_name, exc)
            return
        patch = None
        if (
            cluster is not None
            and not meta_of(cluster).get("deletionTimestamp")
            and idle_gpus.controlled_by_rayjob(cluster, rayjob or {})
        ):
            patch = idle_gpus.suspend_patch(cluster)
        if patch is not None:
            try:  # the cluster's resourceVersion is a precondition: a conflict is decided again by the next pass
                if self.executor.carry_out(SuspendWorkerGroups(namespace, cluster_name, patch)) is None:
                    return
            except Exception as exc:
                log.info(
                    "RayCluster %s/%s: suspending the ended job's workers failed: %s", namespace, cluster_name, exc
                )
                return
            text = (
                f"RayCluster {cluster_name}: its job ended; worker groups suspended (KubeRay deletes the cluster later)"
            )
            log.info("%s", text)
            self.executor.carry_out(PostEvent((rayjob or {},), "Normal", "WorkerGroupsSuspended", text))
        with self.shared.lock:
            self.shared.remember(self.shared.finished_suspended, uid)

    def _asked(self, rayjob: Mapping[str, Any], sweep: Mapping[str, Any] | None) -> float | None:
        """When the operator asked the RayJob's head to stop (this process's memory, else status.gracefulStop)."""
        uid = meta_of(rayjob).get("uid") or ""
        with self.shared.lock:
            asked = self.shared.stops.get(uid or meta_of(rayjob).get("name", ""))
        return asked if asked is not None else graceful_stop.recorded_request(status_of(sweep or {}), uid)

    def record_stop_outran_suspend(
        self,
        cluster: Mapping[str, Any],
        rayjob: Mapping[str, Any] | None,
        sweep: Mapping[str, Any] | None,
        pods: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """KubeRay deleted the cluster of a job the operator was stopping before the operator suspended its worker
        groups (the stopped job's shutdownAfterJobFinishes, or suspends refused): the stop held the workers until
        the deletion began. Called from the stop's pass and from the guard, which every such deletion passes."""
        if rayjob is None or not idle_gpus.controlled_by_rayjob(cluster, rayjob):
            return
        asked = self._asked(rayjob, sweep)
        if not idle_gpus.stop_outran_suspend(cluster, asked) or self._stopping_recorded(rayjob, asked):
            return
        if pods is None:
            ref = ObjectRef.of(cluster)
            try:
                pods = self.kube.list_pods(ref.namespace, f"{constants.RAY_LABEL_CLUSTER}={ref.name}")
            except Exception as exc:  # the metric and status miss this stop's seconds; the guard goes on
                log.warning("RayCluster %s: cannot read its pods to record the stop's GPU time: %s", ref, exc)
                return
        self._record_stopping(rayjob, sweep, cluster, pods, asked)

    def _stopping_recorded(self, rayjob: Mapping[str, Any], asked: float | None) -> bool:
        with self.shared.lock:
            return _stop_key(rayjob, asked) in self.shared.stops_recorded

    def _record_stopping(
        self,
        rayjob: Mapping[str, Any],
        sweep: Mapping[str, Any] | None,
        cluster: Mapping[str, Any],
        pods: Sequence[Mapping[str, Any]],
        asked: float | None,
    ) -> None:
        """GPU time from the graceful stop's request (`asked`) to the suspend, or to the cluster's deletion: once per
        stop, whichever of the stop's pass and the guard sees it first, and once across a restart (the status write
        that adds it marks status.gracefulStop, which a restarted operator reads before it adds anything)."""
        if asked is None:
            return
        stop, uid = _stop_key(rayjob, asked), meta_of(rayjob).get("uid") or ""
        with self.shared.lock:
            if stop in self.shared.stops_recorded:
                return
            self.shared.remember(self.shared.stops_recorded, stop)
        if sweep is not None and graceful_stop.idle_recorded(status_of(sweep), uid):
            return
        held = idle_gpus.stopping_gpu_seconds(cluster, pods, asked, self.clock())
        namespace, name = meta_of(rayjob).get("namespace") or "default", guard.sweep_name_of(rayjob)
        if held <= 0:
            return
        counted = True

        def change(status: SweepStatus) -> SweepStatus:
            nonlocal counted
            counted = not graceful_stop.idle_recorded(status, uid)  # a fresh read after a conflict decides again
            if not counted:
                return status
            idle = idle_gpus.idle_status(status, idle_gpus.STOPPING, held)
            return updated(status, {**idle, **graceful_stop.with_idle_recorded(status, uid)})

        if sweep is not None:  # the metric says it when the status cannot: the status then misses this stop
            failure = f"record idle GPU-seconds ({idle_gpus.STOPPING})"
            self.executor.carry_out(ChangeStatus(sweep, change, failure=failure))
        if counted:
            self.executor.carry_out(RecordIdleGpus(idle_gpus.STOPPING, held, namespace, name))

    def stop_before_delete(self, rayjob: Mapping[str, Any], sweep: Mapping[str, Any] | None) -> float | None:
        """Before deleting `rayjob`: ask its head to stop a running job (Ray's Jobs API: the driver gets
        SIGTERM and RAY_JOB_STOP_WAIT_TIME_S), then hold the delete until the job ended or the window passed.
        Seconds to wait, or None: delete now. KubeRay's own deletion path would stop the job at once."""
        meta = meta_of(rayjob)
        key = meta.get("uid") or meta.get("name", "")
        window = graceful_stop.window_s(self.graceful_seconds(sweep), self.settings.max_graceful_stop_seconds)
        with self.shared.lock:
            asked, unasked = self.shared.stops.get(key), f"unasked/{key}" in self.shared.stops
        if unasked:  # the head could not be told (or its job had ended): no window to wait out, KubeRay stops it
            return None
        job, refused = self._head_job(rayjob) if graceful_stop.job_live(rayjob) else (None, "")
        if refused:  # the head's address is not KubeRay's: nothing is sent, the delete (KubeRay's StopJob) goes ahead
            with self.shared.lock:
                self.shared.stops[f"unasked/{key}"] = self.clock()
            text = f"RayJob {meta.get('name')}: the operator sends nothing to its head: {refused}"
            log.warning("%s", text)
            targets = (rayjob, sweep) if sweep is not None else (rayjob,)
            message = f"{text}; it is deleted without a graceful stop"
            self.executor.carry_out(PostEvent(targets, "Warning", "GracefulStopRefused", message))
            return None
        if asked is None and sweep is not None:  # asked before a restart: the window goes on from then
            asked = graceful_stop.recorded_request(status_of(sweep), meta.get("uid") or "")
        # Once asked, the head says when the job ended (KubeRay stops polling it while it suspends the RayJob).
        ended = asked is not None and job is not None and self.job_status(*job) in ray_jobs.TERMINAL_JOB_STATUSES
        step = graceful_stop.decide_graceful_stop(
            rayjob,
            addressable=job is not None,
            requested_at=asked,
            now=self.clock(),
            window=window,
            driver_stopped=ended,
        )
        if step.request and job is not None:
            outcome = self.executor.carry_out(AskJobStop(meta.get("namespace") or "default", key, *job))
            if outcome is None:  # in flight: the worker goes on with other work and looks again shortly
                return STOP_CALL_LOOK_S
            asked_at = self.clock()
            delivered = outcome.asked and not outcome.already_ended
            # A request that reached no running job starts no window: a later look (after the suspend) must not wait.
            with self.shared.lock:
                self.shared.stops[key if delivered else f"unasked/{key}"] = asked_at
            if sweep is not None and delivered:
                self._record_stop_request(sweep, meta.get("uid") or "", asked_at)
            text = (
                f"RayJob {meta.get('name')}: asked its head to stop Ray job {job[1]} gracefully (up to {window:.0f} s)"
            )
            if outcome.asked:
                log.info("%s", text)
                if sweep is not None:
                    self.executor.carry_out(
                        PostEvent((sweep,), "Normal", "GracefulStopRequested", f"{text} before deleting it")
                    )
            else:  # nothing was told to stop: waiting saves nothing, the delete (KubeRay's StopJob) goes ahead
                log.warning("%s, which failed: %s", text, outcome.error)
                if sweep is not None:
                    failed = f"{text}, which failed: {outcome.error}"
                    self.executor.carry_out(PostEvent((sweep,), "Warning", "GracefulStopFailed", failed))
            if not outcome.asked or outcome.already_ended:
                step = replace(step, wait_s=None)
        return step.wait_s

    def stop_done(self, rayjob: Mapping[str, Any], sweep: Mapping[str, Any] | None) -> None:
        """The stop (and the suspend) before a delete ended: forget its request, here and in status.gracefulStop,
        so a later stop of the same RayJob (readmitted by Kueue, then deleted) is asked afresh."""
        meta = meta_of(rayjob)
        key, uid = meta.get("uid") or meta.get("name", ""), meta.get("uid") or ""
        with self.shared.lock:
            asked = self.shared.stops.pop(key, None)
            self.shared.stops.pop(f"suspend/{key}", None)
            self.shared.stops.pop(f"unasked/{key}", None)
            self.shared.stop_calls.pop(key, None)  # a request still in flight ends on its own, at most its deadline
        if asked is None and sweep is not None:
            asked = graceful_stop.recorded_request(status_of(sweep), uid)
        if sweep is None or asked is None:
            return
        last_stop = self._driver_stop_record(sweep, uid, asked)
        change: dict[str, Any] = {"gracefulStop": None, **({"lastStop": last_stop} if last_stop else {})}
        # Not cleared, a later stop of this RayJob would wait out the old window's rest.
        self.executor.carry_out(
            ChangeStatus(sweep, lambda s: updated(s, change), failure="clear its graceful stop's record")
        )
        if last_stop is not None and last_stop.uploads_not_waited_for_count:
            text = f"RayJob {meta.get('name')}: {last_stop.message}"
            self.executor.carry_out(PostEvent((sweep,), "Warning", "StopUploadsNotWaitedFor", text))

    def _driver_stop_record(self, sweep: Mapping[str, Any], rayjob_uid: str, asked: float) -> LastStopStatus | None:
        """status.lastStop from the run's _sweep/status.json, when the driver recorded this stop there (asked no
        earlier than this request, clocks allowing); None when it did not or the document cannot be read."""
        target = verdicts.status_target(sweep)
        if target is None:
            return None
        try:
            progress, _, _ = self.reads.run_documents(target)
        except Exception as exc:  # the stop is over either way; only its record is missing from the status
            log.warning("sweep %s: cannot read its driver's stop record: %s", meta_of(sweep).get("name"), exc)
            return None
        stop = (progress or {}).get("stop")
        requested = epoch_seconds(stop.get("requestedAt")) if isinstance(stop, Mapping) else None
        if requested is None or requested < asked - graceful_stop.CLOCK_SKEW_S:
            return None
        return graceful_stop.last_stop_status(progress, rayjob_uid)

    def until_workers_free(
        self, body: Mapping[str, Any], rayjob: Mapping[str, Any] | None, sweep: Mapping[str, Any] | None
    ) -> float:
        """Seconds until a held cluster's graceful window ends (its next check frees the workers then)."""
        deleting = epoch_seconds(meta_of(body).get("deletionTimestamp"))
        if deleting is None or idle_gpus.driver_stopped(rayjob, self._head_job_status(rayjob)):
            return float("inf")
        return max(1.0, deleting + self.graceful_seconds(sweep) - self.clock())

    def free_held_workers(
        self, body: Mapping[str, Any], rayjob: Mapping[str, Any] | None, sweep: Mapping[str, Any] | None
    ) -> None:
        """Delete the worker pods of a cluster the guard holds once its driver stopped or its graceful window
        passed; the object, its head and the finalizer stay until the checkpoints verify."""
        ref = ObjectRef.of(body)
        try:
            pods = self.kube.list_pods(ref.namespace, f"{constants.RAY_LABEL_CLUSTER}={ref.name}")
        except Exception as exc:  # the hold stands; the next check tries again
            log.warning("RayCluster %s: cannot read its pods to free held GPUs: %s", ref, exc)
            return
        head = self._head_job_status(rayjob)
        free = idle_gpus.decide_free_workers(body, rayjob, pods, self.clock(), self.graceful_seconds(sweep), head)
        if free is None:
            return
        self.executor.carry_out(DeletePods(ref.namespace, tuple(free.pods)))
        cause = idle_gpus.cause_of(free, status_of(sweep or {}))
        self._record_idle(ref.namespace, guard.sweep_name_of(body), sweep, cause, free.gpu_seconds)
        message = (
            f"RayCluster {ref.name} is held until its checkpoints verify; {free.why}, so its {len(free.pods)} "
            f"worker pod(s) were deleted (they had held {free.gpu_seconds / 3600:.3g} GPU-hours since the deletion "
            "began); the cluster, its head and the finalizer stay"
        )
        targets = (body, sweep) if sweep is not None else (body,)
        self.executor.carry_out(PostEvent(targets, "Normal", "HeldClusterWorkersReleased", message))

    def _head_job_status(self, rayjob: Mapping[str, Any] | None) -> str | None:
        """The Ray job's status from its head (the Jobs API), None when the RayJob names none, its address is not
        the head Service KubeRay made, or the head is silent."""
        job, refused = self._head_job(rayjob) if rayjob is not None else (None, "")
        if refused:
            log.info(
                "RayJob %s: its head is not asked for the job's status: %s", meta_of(rayjob or {}).get("name"), refused
            )
        return self.job_status(*job) if job is not None else None

    def _head_job(self, rayjob: Mapping[str, Any]) -> tuple[tuple[str, str] | None, str]:
        """(dashboard URL, job id) of the RayJob's Ray job, once the URL is checked to be the dashboard port of the
        head Service KubeRay made for the RayJob's own cluster (graceful_stop.head_address_refusal, on fresh reads);
        else None and why ("" when the RayJob names no job to ask about)."""
        job = ray_jobs.job_of(rayjob)
        if job is None:
            return None, ""
        namespace = meta_of(rayjob).get("namespace") or "default"
        name = str((rayjob.get("status") or {}).get("rayClusterName") or "")
        try:
            cluster = self.kube.get_raycluster(namespace, name) if name else None
            service = (
                self.kube.get_service(namespace, graceful_stop.head_service_name(cluster))
                if cluster is not None
                else None
            )
        except Exception as exc:  # nothing is sent to an address the operator could not check
            return None, f"its cluster's head Service could not be read ({type(exc).__name__})"
        refused = graceful_stop.head_address_refusal(rayjob, cluster, service, job[0])
        return (None, refused) if refused else (job, "")

    def _record_stop_request(self, sweep: Mapping[str, Any], rayjob_uid: str, asked_at: float) -> None:
        """status.gracefulStop: the window survives an operator restart (read back by graceful_stop.recorded_request).
        Not written, this process still remembers it; only a restart would ask again."""
        change = graceful_stop.request_status(rayjob_uid, asked_at)
        failure = "record the graceful stop's request"
        self.executor.carry_out(ChangeStatus(sweep, lambda s: updated(s, change), failure=failure))

    def _record_idle(
        self, namespace: str, sweep_name: str, sweep: Mapping[str, Any] | None, cause: str, gpu_seconds: float
    ) -> None:
        """GPU-seconds held without training: the metric, and status.idleGpuSeconds by cause."""
        if gpu_seconds <= 0:
            return
        actions: list[Any] = [RecordIdleGpus(cause, gpu_seconds, namespace, sweep_name)]
        if sweep is not None:  # the metric says it; the next record adds to the status

            def change(status: SweepStatus) -> SweepStatus:
                return updated(status, idle_gpus.idle_status(status, cause, gpu_seconds))

            actions.append(ChangeStatus(sweep, change, failure=f"record idle GPU-seconds ({cause})"))
        self.executor.carry_out_all(actions)
