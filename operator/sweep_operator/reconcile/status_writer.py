"""The only writer of a sweep's status: computed in memory, written once as a merge patch onto the version it was
computed from, then callbacks post Events and metrics.

As KubeRay's updateRayJobStatus(original, new) and Ray Train V2's ControllerCallback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from sweep_contracts.api import WARNING_PHASES, Phase
from sweep_contracts.status_models import SweepStatus

from ..kube import Conflict, KubeApi
from ..metrics import OperatorMetrics
from ..status import merge_patch, settled, status_document
from .actions import Event
from .cache import Cache
from .facts import ObjectRef, meta_of, status_of
from .progress_rhythm import mirror_wait, routine_fields

log = logging.getLogger(__name__)

# (object body, type "Normal"/"Warning", reason, message)
EventSink = Callable[[Mapping[str, Any], str, str, str], None]


class Stale(Exception):
    """A status write found the sweep changed since the copy it was computed from: decide again on a fresh read."""


class StatusCallback(Protocol):
    def after_write(self, body: Mapping[str, Any], old: SweepStatus, new: SweepStatus) -> None: ...


class PhaseCallback:
    """A phase change is an Event on the sweep and a metrics transition; a stop at the deadline is counted."""

    def __init__(self, emit: EventSink, metrics: OperatorMetrics) -> None:
        self.emit, self.metrics = emit, metrics

    def after_write(self, body: Mapping[str, Any], old: SweepStatus, new: SweepStatus) -> None:
        phase = new.phase
        if not phase or phase == old.phase:
            return
        meta = meta_of(body)
        self.metrics.observe_phase(meta.get("uid") or meta["name"], phase, meta.get("namespace"), meta["name"])
        if phase == Phase.DEADLINE_EXCEEDED:
            self.metrics.deadline_stopped(meta.get("namespace") or "default", meta["name"])
        if phase != Phase.DELETING:  # the guard announces a deletion with its own Events
            self.emit(body, "Warning" if phase in WARNING_PHASES else "Normal", phase, new.message or f"phase {phase}")


class StatusWriter:
    def __init__(
        self,
        kube: KubeApi,
        cache: Cache,
        emit: EventSink,
        callbacks: Iterable[StatusCallback],
        clock: Callable[[], float] = time.time,
        mirror_seconds: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.kube, self.cache, self.emit, self.clock = kube, cache, emit, clock
        self.callbacks = list(callbacks)
        self.mirror_seconds = mirror_seconds  # settings.progress_mirror_seconds (tests change settings in flight)

    def write(
        self,
        body: Mapping[str, Any],
        new: SweepStatus | None,
        events: Iterable[Event] = (),
        *,
        progress_may_wait: bool = False,
    ) -> Mapping[str, Any]:
        """Write `new` as the status of `body` (the copy it was computed from): only what changed, only onto that
        resourceVersion, else Stale. Returns the sweep as written (`body` when nothing changed, it is gone, or the
        change waits). Every write stores what follows from the phase (the lifecycle conditions, the DEADLINE
        column's field): `status.settled`, so no decision sets them and none can forget them.
        `progress_may_wait`: a change of progress alone waits for the sweep's mirror slot
        (`progress_rhythm.mirror_wait`); the progress poll is then due by that slot, so the write that follows
        carries the latest progress read."""
        old = self.cache.status(body)
        events = tuple(events)
        if new is not None:
            new = settled(new, meta_of(body).get("generation"), self.clock())
        # Both parsed and serialised alike: a stored field that does not parse is in neither, so never patched.
        document = status_document(new) if new is not None else {}
        patch = merge_patch(status_document(old), document) if new is not None else {}
        written: Mapping[str, Any] | None = None
        if patch and new is not None:
            ref, rv = ObjectRef.of(body), meta_of(body).get("resourceVersion")
            now = time.monotonic()
            if progress_may_wait:
                wait = mirror_wait(
                    old, new, last_mirrored=self.cache.last_mirrored(ref), now=now, every=self.mirror_seconds(),
                    events=len(events), changed=patch,
                )  # fmt: skip
                if wait > 0:
                    self.cache.poll_by(ref, now + wait)
                    return body
            try:
                written = self.kube.patch_sweep_status(ref.namespace, ref.name, patch, resource_version=rv)
            except Conflict as exc:
                raise Stale(str(exc)) from None
            if routine_fields(old, new, patch)[0]:
                self.cache.mirrored(ref, now)
            if written is not None:
                self.cache.remember_write(written)
            for callback in self.callbacks:
                callback.after_write(body, old, new)
        for event in events:
            self.emit(body, event.type, event.reason, event.message)
        return written if written is not None else ({**body, "status": document} if new is not None else body)

    def update(
        self, body: Mapping[str, Any], change: Callable[[SweepStatus], SweepStatus], attempts: int = 3
    ) -> Mapping[str, Any] | None:
        """Apply `change` (old status -> new status) and write it; on a conflict re-read the sweep and apply it to
        the newer status (client-go's RetryOnConflict). For the guard, which writes while others may."""
        current: Mapping[str, Any] | None = body
        for _ in range(attempts):
            if current is None:
                return None
            try:
                return self.write(current, change(status_of(current)))
            except Stale:
                ref = ObjectRef.of(body)
                current = self.kube.get_sweep(ref.namespace, ref.name)
        log.warning("sweep %s: status kept changing; not written", ObjectRef.of(body))
        return None


class BudgetThresholdCallback:
    """A status-writer callback: a threshold newly recorded in status.usage.thresholdsReported is counted once
    (`metrics.budget_threshold_crossed`), after the write that recorded it, so a retried pass never counts twice."""

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics

    def after_write(self, body: Mapping[str, Any], old: SweepStatus, new: SweepStatus) -> None:
        before = set(old.usage.thresholds_reported or []) if old.usage else set[int]()
        after = set(new.usage.thresholds_reported or []) if new.usage else set[int]()
        meta = body.get("metadata") or {}
        for threshold in sorted(after - before):
            self.metrics.budget_threshold_crossed(meta.get("namespace") or "default", meta.get("name") or "", threshold)
