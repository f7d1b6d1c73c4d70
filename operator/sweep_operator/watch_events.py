"""What the operator does with a watch event of a sweep, a RayJob or a RayCluster, and its Events: each notes, checks
and enqueues (no kopf here).

kopf's handlers and the watch router in handlers.py both call these; a deleting object of ours goes to the guard's
pipeline.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from sweep_contracts import constants

from .kube import KubeApi
from .reconcile.controller import SweepController
from .reconcile.guard import sweep_name_of

log = logging.getLogger(__name__)
KOPF_FINALIZER = f"{constants.GROUP}/kopf-timer"  # earlier versions' kopf.timer needed it; kopf now removes it


def ours(labels: Mapping[str, str], annotations: Mapping[str, str], meta: Mapping[str, Any], **_: Any) -> bool:
    """A RayJob or RayCluster is ours while it carries our label, our guard annotation or our finalizer. kopf
    removes a finalizer no matching deletion handler requires any more, so a label filter alone let anyone with
    patch rights unguard an object by removing the label."""
    return (
        constants.LABEL_SWEEP in labels
        or constants.ANNOTATION_GUARD in annotations
        or constants.FINALIZER in (meta.get("finalizers") or [])
    )


EVENT_COMPONENT = "trainingsweep-operator"  # Events name their writer (kopf's default: "kopf")
MAX_QUEUED_EVENTS = 1000  # client-go's tools/record maxQueuedEvents


class EventPoster:
    """The controller's event sink: a Kubernetes Event on `body`, posted by the calling thread (a reconcile pass or
    the guard's pipeline: they make API calls anyway), or from the event loop by a thread of its own, so the loop
    never waits on the API. It replaced kopf's poster (`kopf.event`: an aiohttp request per Event from kopf's loop,
    twice the CPU of a request of ours, and a queue that exists only in kopf's handler context). A failed post is
    logged and dropped, as kopf's was: an Event never fails what it reports. The loop's backlog is bounded as
    client-go's broadcaster bounds its queue (1,000, `watch.DropIfChannelFull`): past it an Event is dropped and
    counted, so an unreachable API server cannot grow the operator's memory."""

    def __init__(self, kube: KubeApi, instance: str | None = None, backlog: int = MAX_QUEUED_EVENTS) -> None:
        self.kube, self.instance = kube, instance or os.uname().nodename
        self._backlog: queue.Queue[tuple[Mapping[str, Any], str, str, str]] = queue.Queue(maxsize=backlog)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0  # Events dropped from a full backlog

    def __call__(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        event = (body, type_, reason, message[:1024])
        if not _in_event_loop():
            self._post(*event)
            return
        try:
            self._backlog.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:  # the first of a run of drops, then now and then
                log.warning("%d Events dropped: the API server takes them slower than they come", self.dropped)
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="event-poster", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._post(*self._backlog.get())

    def _post(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        try:
            self.kube.post_event(body, type_, reason, message, component=EVENT_COMPONENT, instance=self.instance)
        except Exception as exc:
            meta = body.get("metadata") or {}
            if _namespace_terminating(exc):  # NamespaceLifecycle refuses every create there: expected, not a fault
                log.info("%s Event %s on %s %s/%s not posted: its namespace is being deleted", type_, reason,
                         body.get("kind"), meta.get("namespace"), meta.get("name"))  # fmt: skip
                return
            log.warning(
                "cannot post the %s Event %s on %s %s/%s: %s",
                type_,
                reason,
                body.get("kind"),
                meta.get("namespace"),
                meta.get("name"),
                exc,
            )


def _namespace_terminating(exc: Exception) -> bool:
    """A create refused because its namespace is being deleted (403, cause NamespaceTerminating: k8s.io/apiserver
    plugin/namespace/lifecycle `Admit`)."""
    return isinstance(exc, ApiException) and exc.status == 403 and "NamespaceTerminating" in str(exc.body or "")


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def rayjob_event(controller: SweepController, type: str | None, body: Mapping[str, Any]) -> None:
    """One of our RayJobs changed: the guard's checks, the watch's copy for reconciles, drift, and its sweep's
    reconcile when the change is news for the sweep's status."""
    if type != "DELETED":
        if deleting(body):
            await _guard_deletion(controller, constants.RAYJOB_KIND, body)
        else:
            await _guard_object(controller, constants.RAYJOB_KIND, body)
        controller.check_guard_label(body, constants.RAYJOB_KIND)
        controller.observe_rayjob(body)
        if controller.drifted(body, constants.RAYJOB_KIND):  # rare: someone raised a worker group
            await asyncio.to_thread(controller.correct_drift, body, constants.RAYJOB_KIND)
    if type == "DELETED":
        controller.forget_rayjob(body)
        await _off_loop_unless_queued(controller, _reconcile_owner, controller, body)
    elif controller.rayjob_changed(body):
        await _off_loop_unless_queued(controller, _reconcile_owner, controller, body)


async def raycluster_event(controller: SweepController, type: str | None, body: Mapping[str, Any]) -> None:
    """One of our RayClusters changed: the guard's finalizer, its deletion pipeline, drift."""
    if type != "DELETED" and deleting(body):
        controller.check_guard_label(body, constants.RAYCLUSTER_KIND)
        await _guard_deletion(controller, constants.RAYCLUSTER_KIND, body)
        return
    if type != "DELETED":
        await _guard_object(controller, constants.RAYCLUSTER_KIND, body)
        controller.check_guard_label(body, constants.RAYCLUSTER_KIND)
    if type != "DELETED" and controller.drifted(body, constants.RAYCLUSTER_KIND):
        await asyncio.to_thread(controller.correct_drift, body, constants.RAYCLUSTER_KIND)


async def sweep_event(
    controller: SweepController, follow: Callable[[Mapping[str, Any]], None], type: str | None, body: Mapping[str, Any]
) -> None:
    """A sweep changed: note it and queue its reconcile (no I/O here) and its next tick (`follow`), or forget a
    deleted one."""
    if type == "DELETED":
        meta = body.get("metadata") or {}
        controller.metrics.observe_phase(meta.get("uid") or meta.get("name") or "", None)
        controller.forget_sweep(body)
        return
    if deleting(body):  # ticks stop for a deleting sweep: the held pass schedules itself
        await _guard_deletion(controller, constants.KIND, body)
    await _off_loop_unless_queued(controller, controller.sweep_event, body)
    follow(body)


def ours_body(body: Mapping[str, Any]) -> bool:
    meta = body.get("metadata") or {}
    return ours(meta.get("labels") or {}, meta.get("annotations") or {}, meta)


def has_kopf_finalizer(body: Mapping[str, Any]) -> bool:
    return KOPF_FINALIZER in ((body.get("metadata") or {}).get("finalizers") or ())


def routed(
    handle: Callable[[str | None, Mapping[str, Any]], Coroutine[Any, Any, None]],
    *,
    accept: Callable[[Mapping[str, Any]], bool] = lambda body: True,
    kopf_keeps: Callable[[Mapping[str, Any]], bool] = lambda body: False,
) -> Callable[[Mapping[str, Any]], bool]:
    """A raw watch event from kopf's stream (in its event loop), for the router: one `kopf_keeps` goes on to kopf;
    an accepted one is handled in a task of its own (started in order, so one object's events are handled in the
    order they came; a task that waits on I/O lets the stream go on); any other is dropped, as kopf's `when=`
    filter would have."""
    running: set[asyncio.Task[None]] = set()

    def done(task: asyncio.Task[None]) -> None:
        running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("handling a watch event failed", exc_info=task.exception())

    def route(raw_event: Mapping[str, Any]) -> bool:
        body = raw_event["object"]
        if kopf_keeps(body):
            return False
        if accept(body):
            task: asyncio.Task[None] = asyncio.get_running_loop().create_task(handle(raw_event.get("type"), body))
            running.add(task)
            task.add_done_callback(done)
        return True

    return route


async def _off_loop_unless_queued(controller: SweepController, fn: Callable[..., None], *args: Any) -> None:
    """Call `fn` right here when the controller queues reconciles (it only enqueues); in a thread otherwise
    (a controller without a queue reconciles in the caller, which must not be the event loop)."""
    if controller.queue.threaded:
        fn(*args)
    else:
        await asyncio.to_thread(fn, *args)


async def _guard_deletion(controller: SweepController, kind: str, body: Mapping[str, Any]) -> None:
    """A deleting object of ours enters the guard's pipeline (its queue runs the verification off the loop)."""
    if controller.guards.threaded:
        controller.deletion_seen(kind, body)
    else:
        await asyncio.to_thread(controller.deletion_seen, kind, body)


def deleting(body: Mapping[str, Any]) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


async def _guard_object(controller: SweepController, kind: str, body: Mapping[str, Any]) -> None:
    if constants.FINALIZER not in ((body.get("metadata") or {}).get("finalizers") or []):
        await asyncio.to_thread(controller.guard_object, kind, body)


def _reconcile_owner(controller: SweepController, body: Mapping[str, Any]) -> None:
    meta = body.get("metadata") or {}
    name = sweep_name_of(body)
    if name:  # the reconcile reads the sweep itself (and skips a missing one): no GET of our own first
        controller.request_reconcile(meta.get("namespace") or "default", name)
