"""The operator's reconcile logic, without kopf: admission and queueing, the RayJob's lifecycle, status,
deadlines, drift correction and the checkpoint guard. Clients, clock and event sink are injected;
`handlers` wires these methods to kopf.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from . import audit, constants, s3_layout
from .api import DEFAULT_VERIFICATION_TIMEOUT_SECONDS
from .diagnosis import diagnose_startup
from .guard import (
    GuardFacts,
    GuardTarget,
    Hold,
    backoff_seconds,
    Release,
    Verify,
    decide_after_verification,
    decide_before_verification,
    problems_message,
    skip_requested,
    status_target,
    target_of,
)
from .kube import Conflict, KubeApi
from .ledger import AdmissionLedger
from .metrics import OperatorMetrics
from .policy import Admit, Queue, Reject, demand_of, effective_active_seconds
from .problems import SpecError
from .rendering import RenderContext, build_rayjob, guard_target, new_run_id, rayjob_name, run_id_for, worker_group_cap
from .runspec import RunSpec
from .runtime_env import deadline_of, run_spec_of
from .settings import Settings
from .status import (
    JOB_RUNNING,
    RayJobFacts,
    get_condition,
    is_terminal,
    parse_time,
    phase_for,
    progress_patch,
    rfc3339,
    set_condition,
)
from .validation import Sweep, parse_spec, parse_sweep
from .workqueue import ROUTINE, URGENT, WorkQueue

log = logging.getLogger(__name__)

# (object body, type "Normal"/"Warning", reason, message)
EventSink = Callable[[Mapping[str, Any], str, str, str], None]
S3ClientFactory = Callable[[str, str], Any]  # (endpoint_url, region) -> boto3-like S3 client
Verifier = Callable[..., Any]

WARNING_PHASES = frozenset({"Failed", "DeadlineExceeded", "Invalid"})
RAN_JOB_STATUSES = frozenset({JOB_RUNNING, "SUCCEEDED", "FAILED", "STOPPED"})


class RetryLater(Exception):
    """Keep the finalizer (or the handler) and come back after `delay` seconds."""

    def __init__(self, message: str, delay: float):
        super().__init__(message)
        self.delay = delay


class _Stale(Exception):
    """A status write found the sweep changed since the copy it was computed from."""


def _older_version(candidate: Any, current: Any) -> bool:
    """Whether resourceVersion `candidate` is older than `current` of the same object. They are compared as
    numbers when both are (etcd revisions); otherwise never "older": the newest arrival wins, and a stale copy
    is caught by the resourceVersion precondition on every status write."""
    try:
        return int(candidate) < int(current)
    except (TypeError, ValueError):
        return False


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def _status(body: Mapping[str, Any]) -> dict[str, Any]:
    return dict(body.get("status") or {})


_MISSING = object()


class _Lru:
    """A small thread-safe least-recently-used map; callers key it by digests, not by the documents themselves."""

    def __init__(self, size: int) -> None:
        self._items: OrderedDict[bytes, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._size = size

    def get(self, key: bytes) -> Any:
        """The value, or `_MISSING`."""
        with self._lock:
            if key not in self._items:
                return _MISSING
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key: bytes, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)


_PARSE_CACHE_SIZE = 4096


# What a reconcile reads from a RayJob's spec; the rest (the cluster spec with its pod templates) is most of
# its size, so the watch-fed copies keep only these (as an informer's transform would).
_RAYJOB_SPEC_READ = ("suspend", "runtimeEnvYAML", "shutdownAfterJobFinishes", "activeDeadlineSeconds", "backoffLimit")


def _slim_rayjob(rayjob: Mapping[str, Any]) -> dict[str, Any]:
    """What reconciles read of a RayJob (metadata, status, the spec fields they use), sharing its values."""
    spec = rayjob.get("spec") or {}
    return {
        "apiVersion": rayjob.get("apiVersion"),
        "kind": rayjob.get("kind"),
        "metadata": {k: v for k, v in _meta(rayjob).items() if k != "managedFields"},
        "spec": {k: spec[k] for k in _RAYJOB_SPEC_READ if k in spec},
        "status": dict(rayjob.get("status") or {}),
    }


def _worker_groups(body: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    spec = body.get("spec") or {}
    if kind == constants.RAYJOB_KIND:
        return (spec.get("rayClusterSpec") or {}).get("workerGroupSpecs") or []
    return spec.get("workerGroupSpecs") or []


def _capped(group: Mapping[str, Any], cap: int) -> tuple[dict[str, Any], list[str]]:
    """The worker group with its replica counts set back to `cap`, and a note per count that was above it."""
    capped, notes = dict(group), []
    for key in ("maxReplicas", "minReplicas", "replicas"):
        if isinstance(capped.get(key), int) and capped[key] > cap:
            notes.append(f"{capped.get('groupName')}.{key} {capped[key]} -> {cap}")
            capped[key] = cap
    return capped, notes


def _owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    owners = _meta(obj).get("ownerReferences") or []
    return not owners or any(o.get("uid") == uid for o in owners)


@dataclass
class _Memory:
    """Per-sweep facts the operator keeps between reconciles (none of them needed for correctness)."""

    last_progress_poll: dict[str, float] = field(default_factory=dict)


_PARSE_METADATA = ("name", "namespace", "uid", "generation", "creationTimestamp", "labels", "annotations")


@dataclass
class _InFlight:
    """A sweep whose reconcile is running; `again` when more requests for it arrived meanwhile."""

    again: bool = False


class SweepController:
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
    ):
        """`reconcile_workers`: threads serving reconcile requests from events and ticks (the operator's work
        queue); 0 runs each request at once in the caller's thread (tests drive the controller that way)."""
        from .verification import verify_sweep_checkpoints

        self.settings = settings
        self.kube = kube
        self.s3_client_for = s3_client_for
        self.emit = events
        self.verify = verifier or verify_sweep_checkpoints
        self.clock = clock
        self.metrics = metrics or OperatorMetrics()
        self.metrics.follow(lambda: [json.loads(t) for _, t in list(self._sweeps.values())], gpu_budget=settings.limits.max_gpus_per_namespace)
        self.render_context = RenderContext.from_settings(settings)
        self.ledger = AdmissionLedger(kube.list_sweeps, self._unfinished_runs)
        self._label_warned: set[str] = set()  # uids of guarded objects whose label loss was reported
        self._finishing: set[tuple[str, str]] = set()  # sweeps whose end-of-run verification is on the pool
        self._create_failures: dict[tuple[str, str], tuple[int, float]] = {}  # (ns, sweep) -> (failed creates in a row, retry at)
        self.memory = _Memory()
        self._memory_lock = threading.Lock()
        self._in_flight: dict[str, _InFlight] = {}
        # Copies are kept as JSON text, a quarter of the memory of the dicts, and json.loads is faster than deepcopy.
        self._rayjobs: dict[tuple[str, str], tuple[Any, str]] = {}  # (namespace, name) -> (resourceVersion, newest copy)
        self._sweeps: dict[tuple[str, str], tuple[Any, str]] = {}  # (namespace, name) -> (resourceVersion, copy)
        self._echoes: dict[tuple[str, str], str] = {}  # (namespace, name) -> resourceVersion of our last write
        self._parsed = _Lru(_PARSE_CACHE_SIZE)  # spec digest -> Sweep, or the tuple of problems
        self._caps: dict[tuple[str, str, str], int] = {}  # (namespace, sweep, runId) -> worker-group cap
        self._rayjob_facts: dict[str, tuple[Any, ...]] = {}
        # A concurrent.futures executor every verification runs on (bounded: handlers.build_controller); None: inline.
        self.verification_pool = verification_pool
        # End-of-run verifications get their own small pool beside the guard's: neither waits behind the other,
        # and neither holds a reconcile worker while a bucket is slow.
        self.finish_pool: ThreadPoolExecutor | None = (
            ThreadPoolExecutor(max_workers=FINISH_VERIFICATION_WORKERS, thread_name_prefix="finish-verify")
            if verification_pool is not None else None
        )
        self.queue: WorkQueue[tuple[str, str]] | None = (
            WorkQueue(self._reconcile_key, workers=reconcile_workers) if reconcile_workers else None
        )

    # ------------------------------------------------------------------------------ helpers
    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), tz=timezone.utc)

    def _patch_status(self, body: Mapping[str, Any], current: Mapping[str, Any], patch: dict[str, Any]) -> None:
        """Patch only what changed, only onto the version it was computed from (else `_Stale`: the reconcile
        starts over on a fresh read); emit an Event when the phase changes."""
        changed = {k: v for k, v in patch.items() if current.get(k) != v}
        if not changed:
            return
        meta = _meta(body)
        try:
            written = self.kube.patch_sweep_status(
                meta["namespace"], meta["name"], changed, resource_version=meta.get("resourceVersion")
            )
        except Conflict as exc:
            raise _Stale(str(exc)) from None
        if written is not None:
            self._remember_write(written)
            if isinstance(meta, dict) and _meta(written).get("resourceVersion"):
                meta["resourceVersion"] = _meta(written)["resourceVersion"]  # a later patch in this pass builds on it
        new_phase = changed.get("phase")
        if new_phase:
            self.metrics.observe_phase(meta.get("uid") or meta["name"], new_phase, meta.get("namespace"), meta["name"])
            kind = "Warning" if new_phase in WARNING_PHASES else "Normal"
            message = patch.get("message") or f"phase {new_phase}"
            self.emit(body, kind, new_phase, message)

    def _conditions(self, status: Mapping[str, Any], generation: int | None, *updates: tuple[str, bool | str, str, str]) -> list[dict[str, Any]]:
        conditions = list(status.get("conditions") or [])
        now = self._now()
        for type_, value, reason, message in updates:
            conditions = set_condition(conditions, type_, value, reason, message, now, generation)
        return conditions

    def _s3_client(self, storage: Any | None) -> Any:
        """An S3 client for a sweep's storage settings (operator defaults fill what it leaves empty)."""
        endpoint = (storage.endpoint_url if storage else "") or self.settings.s3_endpoint_url
        region = (storage.region if storage else "") or self.settings.s3_region
        return self.s3_client_for(endpoint, region)

    def _read_json(self, client: Any, location: str) -> dict[str, Any] | None:
        uri = s3_layout.S3Uri.parse(location)
        try:
            data = client.get_object(Bucket=uri.bucket, Key=uri.key)["Body"].read()
            doc = json.loads(data)
            return doc if isinstance(doc, dict) else None
        except Exception as exc:  # progress is best effort; the guard never relies on it
            log.debug("cannot read %s: %s", location, exc)
            return None

    def _parse(self, body: Mapping[str, Any]) -> Sweep:
        """parse_sweep, remembered for the same spec and identity (every event and tick re-reads the sweep;
        pydantic validation of an unchanged spec is most of a steady reconcile's CPU). Raises SpecError."""
        meta = _meta(body)
        key = hashlib.sha256(json.dumps(  # a digest: a thousand sweeps' specs as keys were megabytes
            [sorted(k for k in body if k != "status"), body.get("apiVersion"), body.get("kind"),
             {k: meta.get(k) for k in _PARSE_METADATA}, body.get("spec")],
            sort_keys=True, default=str,
        ).encode()).digest()
        hit = self._parsed.get(key)
        if hit is _MISSING:
            try:
                hit = parse_sweep(dict(body), self.settings.limits, self.settings.tenancy)
            except SpecError as exc:
                hit = tuple(exc.problems)
            self._parsed.put(key, hit)
        if isinstance(hit, tuple):
            raise SpecError(list(hit))
        return hit

    def run_root(self, sweep: Sweep, run_id: str) -> str:
        return s3_layout.run_root(sweep.spec.storage.uri, sweep.namespace, sweep.name, run_id)

    # ------------------------------------------------------------------------ sweep cache
    def sweep_event(self, body: Mapping[str, Any]) -> None:
        """A watch event for a sweep: remember the copy and reconcile, unless it is the echo of our own write.

        The echo needs no reconcile: every status write carries the resourceVersion it was computed from, so a
        write that landed was computed from the version just before it, and its result is what the reconcile
        wanted. Before, each status patch came back as an event whose reconcile re-read the sweep to find
        nothing to do (most of the operator's requests and CPU with many sweeps).
        """
        key = self._key(body)
        rv = _meta(body).get("resourceVersion")
        self.observe_sweep(body)
        with self._memory_lock:
            echo = rv is not None and self._echoes.get(key) == rv
        if not echo:
            waiting = not _status(body).get("runId") and not _meta(body).get("deletionTimestamp")
            self.request_reconcile(*key, priority=URGENT if waiting else ROUTINE)

    def request_reconcile(self, namespace: str, name: str, *, priority: int = ROUTINE) -> None:
        """Ask for a reconcile of one sweep: queued (deduplicated, admissions first) in the operator, at once
        without a queue."""
        if self.queue is not None:
            self.queue.add((namespace, name), priority)
        else:
            self._reconcile_key((namespace, name))

    def _reconcile_key(self, key: tuple[str, str]) -> None:
        self.reconcile_sweep({"metadata": {"namespace": key[0], "name": key[1]}})

    def close(self) -> None:
        """Stop the work queue's threads and the end-of-run verification pool (the operator is stopping)."""
        if self.queue is not None:
            self.queue.stop()
        if self.finish_pool is not None:
            self.finish_pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _key(body: Mapping[str, Any]) -> tuple[str, str]:
        meta = _meta(body)
        return meta.get("namespace") or "default", meta.get("name", "")

    def observe_sweep(self, body: Mapping[str, Any]) -> None:
        """Remember a full copy of a sweep (a watch event or a read), unless a newer one is already known."""
        meta = {k: v for k, v in _meta(body).items() if k != "managedFields"}
        text = json.dumps({**body, "metadata": meta})  # kopf bodies are live views: this is the copy
        key = self._key(body)
        rv = meta.get("resourceVersion")
        with self._memory_lock:
            current = self._sweeps.get(key)
            if current is None or not _older_version(rv, current[0]):
                self._sweeps[key] = (rv, text)

    def forget_sweep(self, body: Mapping[str, Any]) -> None:
        key = self._key(body)
        with self._memory_lock:
            self._sweeps.pop(key, None)
            self._echoes.pop(key, None)

    def _remember_write(self, written: Mapping[str, Any]) -> None:
        """The sweep as our own write left it: the newest copy, and the resourceVersion whose event is an echo."""
        self.observe_sweep(written)
        rv = _meta(written).get("resourceVersion")
        if rv is not None:
            with self._memory_lock:
                self._echoes[self._key(written)] = rv

    def _cached_sweep(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._memory_lock:
            cached = self._sweeps.get((namespace, name))
        return json.loads(cached[1]) if cached is not None else None

    def _known_sweep(self, namespace: str, name: str, *, reread: bool = False) -> dict[str, Any] | None:
        """The newest copy known, else (or with `reread`) a read from the API, remembered."""
        known = None if reread else self._cached_sweep(namespace, name)
        if known is None:
            known = self.kube.get_sweep(namespace, name)
            if known is not None:
                self.observe_sweep(known)
        return known

    # ---------------------------------------------------------------------------- reconcile
    def reconcile_sweep(self, body: Mapping[str, Any]) -> None:
        """Level-based: bring the sweep's RayJob and status in line with its spec and the world.

        One reconcile per sweep at a time, each on a fresh read (events for the sweep, its RayJob and the
        timer may arrive together, each with an older copy). Requests that arrive while one runs collapse
        into one more pass after it, as a controller work queue does: a burst of N events costs at most two
        reconciles, not N, and the callers that found one running return at once.
        """
        meta = _meta(body)
        namespace, name = meta.get("namespace") or "default", meta["name"]
        if "spec" in body:  # a full copy (an event's or a read's): newer than the cached one, or dropped
            self.observe_sweep(body)
        key = f"{namespace}/{name}"
        with self._memory_lock:
            state = self._in_flight.get(key)
            if state is not None:
                state.again = True
                return
            state = self._in_flight[key] = _InFlight()
        try:
            while True:
                self._reconcile_fresh(namespace, name)
                with self._memory_lock:
                    if not state.again:
                        break
                    state.again = False
        finally:
            with self._memory_lock:
                self._in_flight.pop(key, None)

    def _reconcile_fresh(self, namespace: str, name: str) -> None:
        """Reconcile from the newest copy known (watch events and our own writes keep it, as an informer
        cache does; a read when there is none). A status write computed from a copy that turns out stale is
        refused by its resourceVersion precondition; then the pass starts over on a fresh read."""
        started = time.monotonic()
        try:
            for attempt in range(3):
                fresh = self._known_sweep(namespace, name, reread=attempt > 0)
                if fresh is None or _meta(fresh).get("deletionTimestamp"):
                    return
                # Nothing is created for a sweep before the guard's finalizer is on it (R22). kopf puts it there
                # (it owns the finalizer: settings.persistence.finalizer), and the event of that write brings the
                # sweep back here. kopf's patch is conditional; if another write beat it, that write's event makes
                # kopf try again. Adding it here at once only raced kopf's patch (two writes and a re-read per
                # sweep), so the operator adds it only to a sweep still without one a reconcile interval after
                # its creation (a timer tick gets here then): the guard never depends on kopf's retry alone.
                if constants.FINALIZER not in (_meta(fresh).get("finalizers") or []):
                    if not self._finalizer_overdue(fresh):
                        log.debug("sweep %s/%s: waiting for the guard's finalizer", namespace, name)
                        return
                    log.info("sweep %s/%s: no finalizer %.0fs after creation; adding it", namespace, name,
                             self.settings.reconcile_seconds)
                    carried = self.kube.add_finalizer(fresh)
                    if carried is None:
                        return
                    self._remember_write(carried)
                    fresh = carried
                try:
                    self._reconcile(fresh)
                    return
                except _Stale as exc:
                    log.debug("%s; reconciling %s/%s again on a fresh read", exc, namespace, name)
            log.info("sweep %s/%s kept changing during three reconciles; the next event or tick retries", namespace, name)
        finally:
            self.metrics.reconcile_seconds.observe(time.monotonic() - started)

    def _finalizer_overdue(self, body: Mapping[str, Any]) -> bool:
        created = parse_time(_meta(body).get("creationTimestamp"))
        return created is None or self.clock() - created.timestamp() >= self.settings.reconcile_seconds

    def tick_due(self, body: Mapping[str, Any]) -> bool:
        """Whether a timer tick has work: a deadline that may have passed, progress to poll, a queue to retry.

        Ticks for sweeps in a steady state cost nothing (no API call); events drive everything else.
        """
        status = _status(body)
        phase = status.get("phase")
        if _meta(body).get("deletionTimestamp"):
            return False
        if is_terminal(phase):
            return not (status.get("checkpoints") or {}).get("verifiedAt")
        if phase in (None, "Pending", "Queued", "Starting", "Suspended"):
            return True
        now = self.clock()
        deadline = parse_time(status.get("deadlineAt"))
        if deadline is not None and now >= deadline.timestamp():
            return True
        key = f"{_meta(body).get('namespace') or 'default'}/{_meta(body).get('name')}"
        with self._memory_lock:
            last = self.memory.last_progress_poll.get(key)
        return last is None or time.monotonic() - last >= self.settings.status_poll_seconds

    def rayjob_changed(self, rayjob: Mapping[str, Any]) -> bool:
        """Whether a RayJob event carries news for its sweep (status, deletion, suspension), remembered per uid."""
        meta, status = _meta(rayjob), rayjob.get("status") or {}
        facts = (
            status.get("jobDeploymentStatus"), status.get("jobStatus"), status.get("reason"), status.get("rayClusterName"),
            status.get("startTime"), bool(meta.get("deletionTimestamp")), bool((rayjob.get("spec") or {}).get("suspend")),
        )
        uid = meta.get("uid") or meta.get("name", "")
        with self._memory_lock:
            if self._rayjob_facts.get(uid) == facts:
                return False
            self._rayjob_facts[uid] = facts
        return True

    def observe_rayjob(self, rayjob: Mapping[str, Any]) -> None:
        """Remember the newest copy of one of our RayJobs: one the watch delivered, or our create's answer
        (unless a newer one is already known; the watch and the create race).

        Reconciles read the RayJob from here, as a controller reads from its informer cache: the watch stream
        is the same source kopf's events come from, and a GET per reconcile was a fifth of all API requests.
        The guard never uses it: deletion decisions read fresh.
        """
        meta = _meta(rayjob)
        key = (meta.get("namespace") or "default", meta.get("name", ""))
        rv = meta.get("resourceVersion")
        text = json.dumps(_slim_rayjob(rayjob))
        with self._memory_lock:
            current = self._rayjobs.get(key)
            if current is None or not _older_version(rv, current[0]):
                self._rayjobs[key] = (rv, text)

    def _rayjob_for_reconcile(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The watched copy when there is one; a GET otherwise (just created, or before the watch caught up)."""
        with self._memory_lock:
            cached = self._rayjobs.get((namespace, name))
        if cached is not None:
            return json.loads(cached[1])
        return self.kube.get_rayjob(namespace, name)

    def forget_rayjob(self, rayjob: Mapping[str, Any]) -> None:
        meta = _meta(rayjob)
        labels = meta.get("labels") or {}
        with self._memory_lock:
            self._rayjobs.pop((meta.get("namespace") or "default", meta.get("name", "")), None)
            self._rayjob_facts.pop(meta.get("uid") or meta.get("name", ""), None)
            self._caps.pop((meta.get("namespace") or "default", labels.get(constants.LABEL_SWEEP, ""), labels.get(constants.LABEL_RUN_ID, "")), None)

    def _reconcile(self, body: Mapping[str, Any]) -> None:
        status = _status(body)
        if status.get("runId"):
            self._reconcile_run(body, status)
        else:
            self._reconcile_admission(body, status)

    def _reconcile_admission(self, body: Mapping[str, Any], status: dict[str, Any]) -> None:
        meta = _meta(body)
        namespace, name, generation = meta.get("namespace") or "default", meta["name"], meta.get("generation")
        if status.get("phase") == "Invalid" and status.get("observedGeneration") == generation:
            return  # nothing new since we said why
        try:
            sweep = self._parse(body)
        except SpecError as exc:
            self.ledger.release(namespace, name)
            message = "; ".join(str(p) for p in exc.problems)
            self._patch_status(
                body,
                status,
                {
                    "phase": "Invalid",
                    "message": message,
                    "observedGeneration": generation,
                    "conditions": self._conditions(status, generation, ("Admitted", False, "Invalid", message), ("Ready", False, "Invalid", "the spec is invalid")),
                },
            )
            return
        if sweep.spec.suspend:
            self.ledger.release(namespace, name)
            self._patch_status(
                body,
                status,
                {
                    "phase": "Suspended",
                    "message": "spec.suspend is true: the sweep waits and holds no budget",
                    "observedGeneration": generation,
                    "conditions": self._conditions(status, generation, ("Admitted", False, "Suspended", "spec.suspend is true")),
                },
            )
            return
        with self._memory_lock:
            failed = self._create_failures.get((namespace, name))
        if failed is not None and self.clock() < failed[1]:
            return  # the last create failed; its backoff has not passed (its timer, or a later tick, comes back)
        decision = self.ledger.decide(namespace, name, meta.get("creationTimestamp") or "", sweep.spec, self.settings.limits)
        if isinstance(decision, Reject):
            self._patch_status(
                body,
                status,
                {
                    "phase": "Invalid",
                    "message": decision.reason,
                    "observedGeneration": generation,
                    "conditions": self._conditions(status, generation, ("Admitted", False, "OverCap", decision.reason)),
                },
            )
            return
        if isinstance(decision, Queue):
            self._patch_status(
                body,
                status,
                {
                    "phase": "Queued",
                    "queuedAt": status.get("queuedAt") or rfc3339(self._now()),
                    "message": f"queued: {decision.reason}",
                    "observedGeneration": generation,
                    "replicas": {"workers": decision.demand.workers, "gpus": decision.demand.gpus,
                                 "namespaceBudget": self._namespace_budget(namespace)},
                    "conditions": self._conditions(status, generation, ("Admitted", False, "Queued", decision.reason)),
                },
            )
            return
        self._start_run(body, status, sweep, decision)

    def _start_run(self, body: Mapping[str, Any], status: dict[str, Any], sweep: Sweep, decision: Admit) -> None:
        """Create the run's RayJob, or adopt the one a previous attempt created, and record the run.

        The RayJob's name follows from the sweep's uid (`run_id_for`), so a create that finds it existing is the
        adoption check: an operator that crashed between creating it and writing the status (or a peer that
        got there first) left exactly that RayJob. One that is not this sweep's is never adopted.
        """
        meta = _meta(body)
        generation = meta.get("generation")
        now = self.clock()
        run_id = run_id_for(sweep.uid) if sweep.uid else new_run_id()
        deadline_at = int(now + effective_active_seconds(sweep.spec, self.settings.limits))
        try:
            rayjob, created = self.kube.create_rayjob(build_rayjob(sweep, run_id, self.render_context, deadline_at=deadline_at))
        except Exception as exc:  # the API refused or is unreachable: the budget must not leak, and the user must know
            self._create_failed(body, status, exc)
            return
        with self._memory_lock:
            self._create_failures.pop((sweep.namespace, sweep.name), None)
        if created:
            started_at = now
            how = "created"
        else:
            if not _owned_by(rayjob, sweep.uid) or (_meta(rayjob).get("labels") or {}).get(constants.LABEL_RUN_ID) != run_id:
                self._name_taken(body, status, _meta(rayjob).get("name", ""))
                return
            created_at = parse_time(_meta(rayjob).get("creationTimestamp"))
            started_at = created_at.timestamp() if created_at else now
            deadline_at = int(deadline_of(rayjob) or started_at + effective_active_seconds(sweep.spec, self.settings.limits))
            how = "adopted"
        self.observe_rayjob(rayjob)  # the next reconcile reads it from memory, not with a GET
        cap = worker_group_cap(sweep.spec, self.settings.limits)
        with self._memory_lock:
            self._caps[(sweep.namespace, sweep.name, run_id)] = cap
        name = _meta(rayjob)["name"]
        demand = decision.demand
        target = target_of(rayjob) or guard_target(sweep, self.run_root(sweep, run_id), run_id, self.render_context)
        message = f"admitted ({demand.workers} workers, {demand.gpus} GPUs); RayJob {name} {how}"
        self._patch_status(
            body,
            status,
            {
                "phase": "Starting",
                "runId": run_id,
                "rayJobName": name,
                "guard": {"runRoot": target.run_root, "endpointUrl": target.endpoint_url, "region": target.region,
                          "verify": target.verify, "timeoutSeconds": target.timeout_seconds},
                "startedAt": rfc3339(datetime.fromtimestamp(started_at, tz=timezone.utc)),
                "deadlineAt": rfc3339(datetime.fromtimestamp(deadline_at, tz=timezone.utc)),
                "replicas": {"workers": demand.workers, "gpus": demand.gpus, "cap": cap,
                             "namespaceBudget": self._namespace_budget(sweep.namespace)},
                "trials": {"total": 0, "pending": 0, "running": 0, "terminated": 0, "errored": 0},
                "trialsSummary": "0/0",
                "message": message,
                "observedGeneration": generation,
                "conditions": self._conditions(
                    status,
                    generation,
                    ("Admitted", True, "Admitted", message),
                    ("Running", False, "Starting", "waiting for the RayCluster and the Ray job"),
                    ("Ready", False, "Starting", "the sweep has not finished"),
                ),
            },
        )

    def _namespace_budget(self, namespace: str) -> str:
        """`<GPUs admitted>/<maxGpusPerNamespace>` in the namespace (the -o wide NS-BUDGET column)."""
        return f"{self.ledger.in_use(namespace).gpus}/{self.settings.limits.max_gpus_per_namespace}"

    def _create_failed(self, body: Mapping[str, Any], status: dict[str, Any], exc: Exception) -> None:
        """Free the budget, say why in status and an Event, and try again with backoff."""
        meta = _meta(body)
        namespace, name = meta.get("namespace") or "default", meta["name"]
        self.ledger.release(namespace, name)
        with self._memory_lock:
            failures = self._create_failures.get((namespace, name), (0, 0.0))[0] + 1
            delay = backoff_seconds(failures - 1, CREATE_RETRY_BASE_SECONDS, CREATE_RETRY_MAX_SECONDS)
            self._create_failures[(namespace, name)] = (failures, self.clock() + delay)
        detail = _api_error_text(exc)
        message = f"creating the RayJob failed ({failures} in a row): {detail}; retrying in {delay:g}s"
        log.warning("sweep %s/%s: %s", namespace, name, message)
        self.emit(body, "Warning", "RayJobCreateFailed", message)
        generation = meta.get("generation")
        try:
            self._patch_status(body, status, {
                "phase": "Pending",
                "message": message,
                "observedGeneration": generation,
                "conditions": self._conditions(status, generation, ("Admitted", False, "RayJobCreateFailed", message)),
            })
        except Exception as write_error:  # the API may be down for the status too; the retry below still comes
            log.warning("sweep %s/%s: cannot record the failed create: %s", namespace, name, write_error)
        if self.queue is not None:
            timer = threading.Timer(delay, self.request_reconcile, args=(namespace, name), kwargs={"priority": URGENT})
            timer.daemon = True
            timer.start()

    def _unfinished_runs(self, namespace: str) -> list[tuple[str, Any]]:
        """(sweep, demand) of each of our RayJobs in `namespace` that has not finished (the ledger's rebuild)."""
        runs = []
        for rayjob in self.kube.list_rayjobs(namespace, constants.LABEL_SWEEP):
            facts = RayJobFacts.from_object(rayjob)
            run_spec = run_spec_of(rayjob)
            if facts.finished or facts.deleting or run_spec is None:
                continue
            runs.append((run_spec.sweep, demand_of(run_spec.spec)))
        return runs

    def _name_taken(self, body: Mapping[str, Any], status: dict[str, Any], name: str) -> None:
        """The run's RayJob name is held by an object that is not this run's: hold no budget, wait (ticks retry,
        queued sweeps may go first), say why once."""
        meta = _meta(body)
        self.ledger.release(meta.get("namespace") or "default", meta["name"])
        message = (f"RayJob {name} exists and is not this sweep's run; the sweep starts once it is gone "
                   f"(or re-create the sweep: a new sweep gets a new run id)")
        if status.get("message") != message:
            self.emit(body, "Warning", "RayJobNameTaken", message)
        generation = meta.get("generation")
        self._patch_status(body, status, {
            "phase": "Pending",
            "message": message,
            "observedGeneration": generation,
            "conditions": self._conditions(status, generation, ("Admitted", False, "RayJobNameTaken", message)),
        })

    def _reconcile_run(self, body: Mapping[str, Any], status: dict[str, Any]) -> None:
        meta = _meta(body)
        namespace, name, generation = meta.get("namespace") or "default", meta["name"], meta.get("generation")
        phase = status.get("phase")
        try:
            sweep: Sweep | None = self._parse(body)
        except SpecError:
            sweep = None
        if is_terminal(phase):
            self._release_and_admit_next(namespace, name)
            if not (status.get("checkpoints") or {}).get("verifiedAt"):
                self._finish_soon(body, status)
            return
        rayjob = self._rayjob_for_reconcile(namespace, status.get("rayJobName") or "")
        run_spec = run_spec_of(rayjob) if rayjob else None
        patch: dict[str, Any] = {}
        conditions: list[tuple[str, bool | str, str, str]] = []
        if generation != status.get("observedGeneration"):
            self._handle_spec_change(body, status, sweep, rayjob, run_spec, patch)
        admitted = run_spec.spec if run_spec else (sweep.spec if sweep else None)
        if rayjob is None:
            message = f"RayJob {status.get('rayJobName')} no longer exists (deleted outside the operator)"
            self._patch_status(
                body,
                status,
                {**patch, "phase": "Failed", "message": message, "finishedAt": rfc3339(self._now()),
                 "conditions": self._conditions(status, generation, ("Running", False, "RayJobDeleted", message), ("Ready", False, "Failed", message))},
            )
            self._release_and_admit_next(namespace, name)
            return
        facts = RayJobFacts.from_object(rayjob)
        new_phase = phase_for(facts)
        message = patch.get("message") or status.get("message") or ""
        now = self.clock()
        deadline = parse_time(status.get("deadlineAt"))
        if facts.running and not status.get("trainingStartedAt"):
            patch["trainingStartedAt"] = rfc3339(self._now())
        graceful = admitted.deadlines.graceful_stop_seconds if admitted is not None else 0
        if facts.start_time and facts.deployment_status not in ("Retrying", "") and facts.start_time != status.get("attemptStartedAt"):
            patch["attemptStartedAt"] = facts.start_time
        if new_phase == "Succeeded" and self._stopped_at_deadline(body, status):
            # Tune's time budget stopped the trials before the deadline and the driver exited 0: a deadline stop,
            # not a finished sweep (the checkpoints so far are verified as for any end).
            new_phase = "DeadlineExceeded"
            message = f"the driver stopped the trials gracefully at the sweep deadline {status.get('deadlineAt')}"
            conditions.append(("DeadlineExceeded", True, "GracefulStop", message))
            self.metrics.deadline_stopped(namespace, name)
        elif deadline and not is_terminal(new_phase) and _deadline_passed(now, deadline.timestamp(), graceful):
            new_phase = "DeadlineExceeded"
            message = (
                f"sweep deadline {status.get('deadlineAt')} and its {graceful}s graceful window passed; stopping "
                f"RayJob {facts.name} through the checkpoint guard"
            )
            conditions.append(("DeadlineExceeded", True, "SweepDeadline", message))
            self.metrics.deadline_stopped(namespace, name)
            self.kube.delete_rayjob(namespace, facts.name)
        elif deadline and not is_terminal(new_phase) and _deadline_passed(now, deadline.timestamp(), 0):
            # The driver stops its trials gracefully at the deadline; deleting the RayJob now would stop the Ray
            # job at once (KubeRay's deletion path) and cut the last checkpoints short.
            conditions.append(("DeadlineExceeded", True, "GracefulStop",
                               f"sweep deadline {status.get('deadlineAt')} passed; the driver is stopping its trials; "
                               f"the operator stops RayJob {facts.name} if it still runs {graceful}s after it"))
        elif (new_phase in ("Starting", "Running") and admitted is not None
              and not _trials_started(self._running_progress(sweep, new_phase, status, patch))
              and _startup_overdue(facts, status, now, admitted.deadlines.startup_seconds)):
            # KubeRay reports Running once the head is up and the submitter exists (K8sJobMode), with the GPU
            # workers still Pending: the attempt has started only when a trial runs.
            diagnosis = self._diagnose(namespace, facts, admitted)
            new_phase = "Failed"
            message = (
                f"not Running within startupSeconds={admitted.deadlines.startup_seconds}: {diagnosis}"
            )
            conditions.append(("Running", False, "StartupDeadlineExceeded", message))
            self.kube.delete_rayjob(namespace, facts.name)
        if (
            new_phase == "Failed"
            and phase != "Failed"
            and not conditions
            and not (status.get("trainingStartedAt") or patch.get("trainingStartedAt"))
            and admitted is not None
        ):
            # KubeRay gave up before the job ever ran (e.g. its preRunningDeadlineSeconds): say why (R6, R20).
            message = f"{self._phase_message(new_phase, facts)}; never reached Running: {self._diagnose(namespace, facts, admitted)}"
            conditions.append(("Running", False, "StartupFailed", message))
        if new_phase == "DeadlineExceeded" and facts.reason == "DeadlineExceeded" and not any(c[0] == "DeadlineExceeded" for c in conditions):
            message = f"KubeRay stopped RayJob {facts.name}: activeDeadlineSeconds exceeded"
            conditions.append(("DeadlineExceeded", True, "ActiveDeadlineSeconds", message))
            self.metrics.deadline_stopped(namespace, name)
        if new_phase != phase and not conditions:
            message = self._phase_message(new_phase, facts)
        patch.update(
            {
                "phase": new_phase,
                "message": message,
                "rayClusterName": facts.cluster_name or status.get("rayClusterName"),
                "jobDeploymentStatus": facts.deployment_status or None,
                "jobStatus": facts.job_status or None,
                "reason": facts.reason or None,
            }
        )
        patch = {k: v for k, v in patch.items() if v is not None or k in status}
        if new_phase == "Running":
            conditions.append(("Running", True, "Running", f"Ray job {facts.job_status or 'RUNNING'} on {facts.cluster_name}"))
            self._running_progress(sweep, new_phase, status, patch)
        elif new_phase == "Starting":
            conditions.append(("Running", False, "Starting", self._phase_message(new_phase, facts)))
        elif new_phase == "Suspended":
            conditions.append(("Running", False, "Suspended", "spec.suspend is true"))
        if is_terminal(new_phase):
            patch["finishedAt"] = rfc3339(self._now())
            if not any(c[0] == "Running" for c in conditions):
                conditions.append(("Running", False, new_phase, message))
        if conditions:
            patch["conditions"] = self._conditions(status, generation, *conditions)
        self._patch_status(body, status, patch)
        if is_terminal(new_phase):
            self._release_and_admit_next(namespace, name)
            self._finish_soon(body, {**status, **patch})

    def _running_progress(self, sweep: Sweep | None, phase: str, status: Mapping[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        """Poll the run's progress into `patch` while Running (at most every status_poll_seconds); the trial
        counts known after it."""
        if phase == "Running" and sweep is not None and "trials" not in patch:
            patch.update(self._progress(sweep, status, force=False))
        return patch.get("trials") or status.get("trials") or {}

    def _stopped_at_deadline(self, body: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
        """Whether the run's `_sweep/result.json` says Tune's budget ended it (`deadlineReached`)."""
        target = self._run_target({**body, "status": status})
        if target is None:
            return False
        client = self.s3_client_for(target.endpoint_url, target.region)
        result = self._read_json(client, s3_layout.RunLayout(target.run_root).result_path)
        return bool(result and result.get("deadlineReached") is True)

    @staticmethod
    def _phase_message(phase: str, facts: RayJobFacts) -> str:
        detail = f"RayJob {facts.name} {facts.deployment_status or 'New'}"
        if facts.job_status:
            detail += f", job {facts.job_status}"
        if facts.reason:
            detail += f", reason {facts.reason}"
        if facts.message:
            detail += f": {facts.message}"
        return {
            "Starting": f"starting: {detail}",
            "Running": f"running: {detail}",
            "Succeeded": f"succeeded: {detail}",
            "Failed": f"failed: {detail}",
            "DeadlineExceeded": f"deadline exceeded: {detail}",
            "Suspended": f"suspended: {detail}",
        }.get(phase, detail)

    def _handle_spec_change(
        self,
        body: Mapping[str, Any],
        status: dict[str, Any],
        sweep: Sweep | None,
        rayjob: Mapping[str, Any] | None,
        run_spec: RunSpec | None,
        patch: dict[str, Any],
    ) -> None:
        """Only `suspend` may change while a run exists; other edits are refused (status message + Event)."""
        generation = _meta(body).get("generation")
        patch["observedGeneration"] = generation
        current = (body.get("spec") or {})
        admitted = run_spec.spec.model_dump(by_alias=True, mode="json") if run_spec else None
        if sweep is not None and rayjob is not None and bool((rayjob.get("spec") or {}).get("suspend")) != sweep.spec.suspend:
            self.kube.patch_rayjob(_meta(rayjob)["namespace"], _meta(rayjob)["name"], {"spec": {"suspend": sweep.spec.suspend}})
            self.emit(body, "Normal", "Suspend" if sweep.spec.suspend else "Resume", f"spec.suspend set to {sweep.spec.suspend} on RayJob {_meta(rayjob)['name']}")
        if admitted is None:
            return
        wanted = sweep.spec.model_dump(by_alias=True, mode="json") if sweep else current
        changed = sorted(k for k in set(admitted) | set(wanted) if k != "suspend" and admitted.get(k) != wanted.get(k))
        if sweep is None:
            changed = changed or ["spec"]
        if changed:
            message = (
                f"spec change refused: {', '.join('spec.' + k for k in changed)} changed after run "
                f"{status.get('runId')} was admitted; only spec.suspend may change while a run exists. "
                "The run continues with its admitted spec; delete and re-create the sweep to start a new run."
            )
            patch["message"] = message
            self.emit(body, "Warning", "SpecChangeRefused", message)

    def _diagnose(self, namespace: str, facts: RayJobFacts, spec: Any) -> str:
        try:
            pods = self.kube.list_pods(namespace, f"ray.io/cluster={facts.cluster_name}") if facts.cluster_name else []
            events = self.kube.list_events(namespace)
        except Exception as exc:  # diagnosis must never block the failure it explains
            return f"(diagnosis unavailable: {exc})"
        names = {(p.get("metadata") or {}).get("name") for p in pods} | {facts.cluster_name, facts.name}
        relevant = [e for e in events if ((e.get("involvedObject") or e.get("regarding") or {}).get("name")) in names]
        wanted = demand_of(spec).workers
        return diagnose_startup(
            pods,
            relevant,
            cluster_name=facts.cluster_name,
            worker_cap=min(wanted, self.settings.limits.max_workers_per_sweep),
            workers_wanted=wanted,
        )

    def _progress(self, sweep: Sweep, status: Mapping[str, Any], *, force: bool) -> dict[str, Any]:
        """Trial counts and best trial from the run's `_sweep/status.json`, at most every status_poll_seconds."""
        key = f"{sweep.namespace}/{sweep.name}"
        now = time.monotonic()
        with self._memory_lock:
            last = self.memory.last_progress_poll.get(key)
            if not force and last is not None and now - last < self.settings.status_poll_seconds:
                return {}
            self.memory.last_progress_poll[key] = now
        # The run's recorded storage (status.guard), as the guard reads it; today's spec only for older runs.
        target = status_target({"metadata": {"name": sweep.name}, "status": status})
        if target is None:
            layout = s3_layout.RunLayout(self.run_root(sweep, status["runId"]))
            client = self._s3_client(sweep.spec.storage)
        else:
            layout, client = s3_layout.RunLayout(target.run_root), self.s3_client_for(target.endpoint_url, target.region)
        doc = self._read_json(client, layout.status_path)
        return progress_patch(doc) if doc else {}

    def _run_target(self, body: Mapping[str, Any]) -> GuardTarget | None:
        """What this sweep's run writes to: recorded at admission, else derived from the spec's structure."""
        return status_target(body) or self._spec_target(body)

    def _finish_soon(self, body: Mapping[str, Any], status: dict[str, Any]) -> None:
        """The end-of-run verification, off the reconcile worker when there is a verification pool (a slow bucket
        would hold the worker, and every tenant's reconciles behind it, for up to the verification timeout)."""
        if self.finish_pool is None:
            self._finish(body, status)
            return
        key = self._key(body)
        with self._memory_lock:
            if key in self._finishing:
                return
            self._finishing.add(key)
        try:
            self.finish_pool.submit(self._finish_fresh, key)
        except RuntimeError:  # the pool is shut down: the operator is stopping; the next one verifies
            with self._memory_lock:
                self._finishing.discard(key)

    def _finish_fresh(self, key: tuple[str, str]) -> None:
        """`_finish` on the newest copy of the sweep, while it is still ended and unverified (pool thread)."""
        try:
            for attempt in range(3):
                fresh = self._known_sweep(*key, reread=attempt > 0)
                if fresh is None or _meta(fresh).get("deletionTimestamp"):
                    return
                status = _status(fresh)
                if not is_terminal(status.get("phase")) or (status.get("checkpoints") or {}).get("verifiedAt"):
                    return
                try:
                    self._finish(fresh, status)
                    return
                except _Stale:
                    continue
        except Exception:  # a tick comes back while verifiedAt is unset
            log.exception("sweep %s/%s: the end-of-run verification failed", *key)
        finally:
            with self._memory_lock:
                self._finishing.discard(key)

    def _finish(self, body: Mapping[str, Any], status: dict[str, Any]) -> None:
        """At a terminal phase: final result from `_sweep/result.json`, then verify checkpoints once, judged by the
        guard's own rules (so the status says what a deletion would do)."""
        meta = _meta(body)
        generation = meta.get("generation")
        target = self._run_target({**body, "status": status})
        if target is None:
            return
        client = self.s3_client_for(target.endpoint_url, target.region)
        layout = s3_layout.RunLayout(target.run_root)
        patch: dict[str, Any] = {}
        result = self._read_json(client, layout.result_path)
        progress = self._read_json(client, layout.status_path)
        if result:
            patch.update(progress_patch(result))
        elif progress:
            patch.update(progress_patch(progress))
        said = (progress or {}).get("message") if status.get("phase") == "Failed" else None
        if isinstance(said, str) and said and said not in (status.get("message") or ""):
            # The driver records why it stopped (a pre-flight refusal naming the S3 action, a trainLoop that does
            # not import): KubeRay only knows the exit code.
            patch["message"] = f"{status.get('message') or 'failed'}; the driver says: {said}"[:2000]
        # Inline: a reconcile worker queued behind the guards' verifications would stall deadlines (guard matrix).
        verification = self._verify_target(target, pooled=False)
        judged = decide_after_verification(verification, attempt=0, base_backoff=1, max_backoff=1,
                                           progress=progress, final=result)
        verified = verification.verified and verification.checked > 0 and isinstance(judged, Release) and not judged.audit
        if verified:
            reason, text = "Verified", f"{verification.checked} checkpoints, {verification.bytes} bytes verified"
        elif isinstance(judged, Release):
            reason, text = "NothingToProtect", judged.reason
        else:
            reason, text = "NotVerified", problems_message(verification.problems) or judged.reason
        patch["checkpoints"] = verification.to_status()
        ready = status.get("phase") == "Succeeded" and verified
        patch["conditions"] = self._conditions(
            status,
            generation,
            ("CheckpointsVerified", verified, reason, text),
            ("Ready", ready, "Succeeded" if ready else status.get("phase") or "NotReady",
             "sweep succeeded and its checkpoints are verified" if ready else status.get("message") or ""),
        )
        self._patch_status(body, status, patch)
        if not verified:
            self.emit(body, "Warning", "CheckpointsNotVerified" if reason == "NotVerified" else "NothingToProtect", text)

    def _verify_target(self, target: GuardTarget, *, pooled: bool = True) -> Any:
        """Verify a run root, always afresh: a result cached even for seconds could release a deletion after an
        object vanished (one listing pass is cheap next to the data it protects)."""
        started = time.monotonic()
        args = (self.s3_client_for(target.endpoint_url, target.region), target.run_root)
        options = {
            "concurrency": self.settings.verify_concurrency,
            # Targets recorded before a lower cap was set are held to it too.
            "timeout_seconds": min(target.timeout_seconds, self.settings.limits.max_verification_timeout_seconds),
            "min_retention_days": self.settings.min_retention_days,
        }
        if pooled and self.verification_pool is not None:
            result = self.verification_pool.submit(self.verify, *args, **options).result()
        else:
            result = self.verify(*args, **options)
        self.metrics.verification_finished(target.run_root, time.monotonic() - started, result.verified)
        return result

    def _release_and_admit_next(self, namespace: str, name: str) -> None:
        """A sweep ended or left: free its budget and give the queue, oldest first, a chance."""
        was_admitted = name in self.ledger.admitted.get(namespace, {})
        queue = self.ledger.release(namespace, name)
        if not was_admitted:
            return
        for queued in queue:
            body = self.kube.get_sweep(namespace, queued)
            if body is None:
                self.ledger.release(namespace, queued)
                continue
            self.reconcile_sweep(body)
            if _status(self.kube.get_sweep(namespace, queued) or {}).get("phase") == "Queued":
                break  # strict FIFO: the oldest still does not fit

    def check_guard_label(self, body: Mapping[str, Any], kind: str) -> None:
        """A guarded RayJob/RayCluster that lost its sweep label stays guarded (the finalizer goes only through
        the guard); say so once, on the object and on its sweep."""
        meta = _meta(body)
        labels = meta.get("labels") or {}
        if constants.LABEL_SWEEP in labels or constants.FINALIZER not in (meta.get("finalizers") or []):
            return
        uid = meta.get("uid") or meta.get("name", "")
        with self._memory_lock:
            if uid in self._label_warned:
                return
            self._label_warned.add(uid)
        target = target_of(body)
        message = (f"{kind} {meta.get('name')} lost its label {constants.LABEL_SWEEP}; it stays guarded by "
                   f"{constants.FINALIZER} (run root {target.run_root if target else 'unknown'}), which only the "
                   "checkpoint guard removes")
        self.emit(body, "Warning", "GuardLabelRemoved", message)
        sweep = self._sweep_of(body)
        if sweep is not None:
            self.emit(sweep, "Warning", "GuardLabelRemoved", message)

    # --------------------------------------------------------------------------------- drift
    def drifted(self, body: Mapping[str, Any], kind: str) -> bool:
        """Whether a RayJob's worker group may exceed its run's cap (no I/O: the run spec travels on the RayJob;
        True when unsure, and `correct_drift` decides)."""
        meta = _meta(body)
        if meta.get("deletionTimestamp") or constants.LABEL_SWEEP not in (meta.get("labels") or {}):
            return False
        groups = _worker_groups(body, kind)
        if not groups:
            return False
        cap = self._remembered_cap(body)
        if cap is None:
            run_spec = run_spec_of(body) if kind == constants.RAYJOB_KIND else None
            if run_spec is None:
                return True
            cap = worker_group_cap(run_spec.spec, self.settings.limits)
        return any(_capped(group, cap)[1] for group in groups)

    def correct_drift(self, body: Mapping[str, Any], kind: str) -> None:
        """Set a worker group edited above its cap back (RayJob or RayCluster), with an Event (R21)."""
        meta = _meta(body)
        namespace, labels = meta.get("namespace") or "default", meta.get("labels") or {}
        if meta.get("deletionTimestamp") or constants.LABEL_SWEEP not in labels:
            return
        cap = self._cap_for(body, kind)
        if cap is None:
            return
        groups = _worker_groups(body, kind)
        if not groups:
            return
        fixed, notes = [], []
        for group in groups:
            capped, group_notes = _capped(group, cap)
            fixed.append(capped)
            notes.extend(group_notes)
        if not notes:
            return
        if kind == constants.RAYJOB_KIND:
            self.kube.patch_rayjob(namespace, meta["name"], {"spec": {"rayClusterSpec": {"workerGroupSpecs": fixed}}})
        else:
            self.kube.patch_raycluster(namespace, meta["name"], {"spec": {"workerGroupSpecs": fixed}})
        message = f"worker group above the sweep's cap of {cap} workers set back: {', '.join(notes)}"
        self.emit(body, "Warning", "CapEnforced", message)
        sweep = self._known_sweep(namespace, labels[constants.LABEL_SWEEP])
        if sweep is not None:
            self.emit(sweep, "Warning", "CapEnforced", f"{kind} {meta['name']}: {message}")

    @staticmethod
    def _run_key(body: Mapping[str, Any]) -> tuple[str, str, str]:
        meta = _meta(body)
        labels = meta.get("labels") or {}
        return meta.get("namespace") or "default", labels.get(constants.LABEL_SWEEP, ""), labels.get(constants.LABEL_RUN_ID, "")

    def _remembered_cap(self, body: Mapping[str, Any]) -> int | None:
        with self._memory_lock:
            return self._caps.get(self._run_key(body))

    def _cap_for(self, body: Mapping[str, Any], kind: str) -> int | None:
        """The run's worker-group cap; fixed for a run, so remembered per run (no read or parse per event)."""
        cached = self._remembered_cap(body)
        if cached is not None:
            return cached
        cap = self._read_cap(body, kind)
        run = self._run_key(body)
        if cap is not None and run[2]:
            with self._memory_lock:
                self._caps[run] = cap
        return cap

    def _read_cap(self, body: Mapping[str, Any], kind: str) -> int | None:
        rayjob = body if kind == constants.RAYJOB_KIND else self._rayjob_of_cluster(body)
        run_spec = run_spec_of(rayjob) if rayjob else None
        if run_spec is not None:
            return worker_group_cap(run_spec.spec, self.settings.limits)
        meta = _meta(body)
        namespace, sweep_name = meta.get("namespace") or "default", (meta.get("labels") or {}).get(constants.LABEL_SWEEP, "")
        sweep_body = self._known_sweep(namespace, sweep_name)
        cap = ((sweep_body or {}).get("status") or {}).get("replicas", {}).get("cap")
        return cap if isinstance(cap, int) else None

    def _rayjob_of_cluster(self, cluster: Mapping[str, Any]) -> dict[str, Any] | None:
        meta = _meta(cluster)
        namespace = meta.get("namespace") or "default"
        for owner in meta.get("ownerReferences") or []:
            if owner.get("kind") == constants.RAYJOB_KIND:
                return self.kube.get_rayjob(namespace, owner.get("name", ""))
        labels = meta.get("labels") or {}
        name = labels.get(constants.RAY_LABEL_ORIGINATED_FROM_CR_NAME)
        return self.kube.get_rayjob(namespace, name) if name else None

    # --------------------------------------------------------------------------------- guard
    # Each deletion handler gathers GuardFacts (reads only), asks guard.decide_* and carries the decision out.
    # docs/guard.md has the rules as one table.

    def guard_sweep_deletion(self, body: Mapping[str, Any], attempt: int) -> str:
        """The sweep is being deleted: verify, then delete its RayJob and release; else RetryLater."""
        meta, status = _meta(body), _status(body)
        namespace, name = meta.get("namespace") or "default", meta["name"]
        if status.get("phase") != "Deleting":
            self.kube.patch_sweep_status(namespace, name, {"phase": "Deleting", "message": "verifying checkpoints before deletion"})
            self.metrics.observe_phase(meta.get("uid") or name, "Deleting", namespace, name)
        rayjob = self._rayjob_of_sweep(body)
        facts = self._sweep_guard_facts(body, rayjob)
        decision = self._guard(facts, body, body, attempt)
        if facts.skip:
            self._propagate_skip(namespace, name)
        if rayjob is not None:
            self.kube.delete_rayjob(namespace, _meta(rayjob)["name"])
        self._release_and_admit_next(namespace, name)
        self.metrics.observe_phase(meta.get("uid") or name, None, namespace, name)
        return decision.reason

    def guard_rayjob_deletion(self, body: Mapping[str, Any], attempt: int) -> str:
        meta = _meta(body)
        namespace = meta.get("namespace") or "default"
        sweep = self._sweep_of(body)
        target = target_of(body) or self._legacy_target(body)
        facts = GuardFacts(
            kind=constants.RAYJOB_KIND,
            name=meta.get("name", ""),
            skip=skip_requested(meta.get("annotations"), _meta(sweep or {}).get("annotations")),
            target=target,
            target_unknown="" if target else "the RayJob carries no guard annotation and its run spec is unreadable: the run root to verify is unknown",
            started=_started_records(body),
        )
        decision = self._guard(facts, body, sweep, attempt)
        if facts.skip:
            self._propagate_skip(namespace, _sweep_name_of(body, target), rayjobs=False)
        return decision.reason

    def guard_raycluster_deletion(self, body: Mapping[str, Any], attempt: int) -> str:
        meta = _meta(body)
        rayjob = self._rayjob_of_cluster(body)
        sweep = self._sweep_of(body)
        # The cluster's own copy of the RayJob's annotation first (KubeRay copies it at creation): it outlives
        # the RayJob and names the sweep's own storage, not the operator's defaults.
        target = target_of(body) or (target_of(rayjob) if rayjob else None) or (self._legacy_target(rayjob) if rayjob else None)
        how = ""
        if target is None:
            target = _head_env_target(body)
        if target is None and sweep is not None and _status(sweep).get("runId") == (meta.get("labels") or {}).get(constants.LABEL_RUN_ID):
            target = status_target(sweep)
        if target is None:
            how = "no run root found for this cluster (no guard annotation, RayJob, head SWEEP_RUN_ROOT or sweep record)"
        facts = GuardFacts(
            kind=constants.RAYCLUSTER_KIND,
            name=meta.get("name", ""),
            skip=skip_requested(meta.get("annotations"), _meta(rayjob or {}).get("annotations"), _meta(sweep or {}).get("annotations")),
            target=target,
            target_unknown=how,
            started=("a RayCluster exists",),
        )
        return self._guard(facts, body, sweep, attempt).reason

    # ---- facts

    def _rayjob_of_sweep(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The sweep's RayJob, read fresh: by status.rayJobName, else by the name its uid implies (an operator
        that crashed between the create and the status write left exactly that one). Never a foreign one."""
        meta, status = _meta(body), _status(body)
        name = status.get("rayJobName")
        if not name and meta.get("uid"):
            name = rayjob_name(meta["name"], run_id_for(meta["uid"]))
        if not name:
            return None
        rayjob = self.kube.get_rayjob(meta.get("namespace") or "default", name)
        if rayjob is None or not _owned_by(rayjob, meta.get("uid")):
            return None
        return rayjob

    def _sweep_guard_facts(self, body: Mapping[str, Any], rayjob: Mapping[str, Any] | None) -> GuardFacts:
        meta, status = _meta(body), _status(body)
        started = _started_records(rayjob) if rayjob else ()
        for key, record in (("runId", "a run id in status"), ("trainingStartedAt", "status.trainingStartedAt"),
                            ("rayClusterName", "a RayCluster in status")):
            if status.get(key):
                started += (record,)
        target = (target_of(rayjob) or self._legacy_target(rayjob)) if rayjob else None
        target = target or status_target(body) or self._spec_target(body)
        unknown = ""
        if target is None:
            unknown = (f"run {status.get('runId')} has no recorded run root, and the spec cannot name one"
                       if status.get("runId") else "the run root cannot be determined")
        return GuardFacts(
            kind=constants.KIND,
            name=meta["name"],
            skip=skip_requested(meta.get("annotations")),
            target=target,
            target_unknown=unknown,
            never_admitted=rayjob is None and not started,
            started=started,
        )

    def _spec_target(self, body: Mapping[str, Any]) -> GuardTarget | None:
        """A run root derived from the spec's structure and status.runId (sweeps admitted before status.guard
        existed). Today's caps are not applied: a spec over a cap that was lowered later still names its run."""
        status = _status(body)
        run_id = status.get("runId")
        if not run_id:
            return None
        try:
            spec = parse_spec(body.get("spec"))
        except SpecError:
            return None
        meta = _meta(body)
        root = s3_layout.run_root(spec.storage.uri, meta.get("namespace") or "default", meta["name"], run_id)
        return GuardTarget(root, spec.storage.endpoint_url or self.settings.s3_endpoint_url,
                           spec.storage.region or self.settings.s3_region, spec.deletion.verify_checkpoints,
                           spec.deletion.verification_timeout_seconds, meta["name"], run_id)

    def _legacy_target(self, rayjob: Mapping[str, Any] | None) -> GuardTarget | None:
        """RayJobs rendered before the guard annotation existed: the run spec in their runtime env."""
        run_spec = run_spec_of(rayjob) if rayjob else None
        if run_spec is None:
            return None
        storage = run_spec.spec.storage
        return GuardTarget(run_spec.run_root, storage.endpoint_url or self.settings.s3_endpoint_url,
                           storage.region or self.settings.s3_region, run_spec.spec.deletion.verify_checkpoints,
                           run_spec.spec.deletion.verification_timeout_seconds, run_spec.sweep, run_spec.run_id)

    def _sweep_of(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """The sweep a RayJob or RayCluster belongs to (label, else the guard annotation: labels can be edited)."""
        name = _sweep_name_of(obj, target_of(obj))
        return self.kube.get_sweep(_meta(obj).get("namespace") or "default", name) if name else None

    # ---- deciding and acting

    def _guard(self, facts: GuardFacts, body: Mapping[str, Any], sweep_body: Mapping[str, Any] | None, attempt: int) -> Release:
        """Decide for one object; a Hold becomes RetryLater (the finalizer stays), a Release is audited or noted."""
        deletion = self._deletion_settings(sweep_body)
        backoff = {"attempt": attempt, "base_backoff": deletion[0], "max_backoff": deletion[1]}
        decision = decide_before_verification(facts, **backoff)
        result = None
        if isinstance(decision, Verify):
            target = decision.target
            result = self._verify_target(target)
            progress, final, readable = self._run_records(target)
            decision = decide_after_verification(result, progress=progress, final=final, progress_readable=readable, **backoff)
            if sweep_body is not None:
                self._record_verification(sweep_body, result, decision)
        if isinstance(decision, Hold):
            raise self._hold(body, sweep_body, result, facts.kind, decision.reason, decision.retry_after)
        self.metrics.guard_released(facts.kind, body)
        name = _meta(body).get("name")
        if decision.audit:
            message = f"{facts.kind} {name} deletion released WITHOUT checkpoint verification: {decision.reason}"
            self.emit(body, "Warning", "CheckpointGuardBypassed", message)
            if sweep_body is not None and sweep_body is not body:
                self.emit(sweep_body, "Warning", "CheckpointGuardBypassed", message)
            if facts.skip:  # the escape hatch: a metric, a log line naming its setter, the sweep's condition
                audit.record_bypass(self, facts.kind, body, sweep_body)
        else:
            self.emit(body, "Normal", "CheckpointGuardReleased", f"{facts.kind} {name} deletion released: {decision.reason}")
        return decision

    def _deletion_settings(self, sweep_body: Mapping[str, Any] | None) -> tuple[float, float]:
        try:
            deletion = parse_spec((sweep_body or {}).get("spec")).deletion if sweep_body else None
        except SpecError:
            deletion = None
        return (deletion.retry_backoff_seconds, deletion.max_retry_backoff_seconds) if deletion else (30.0, 600.0)

    def _run_records(self, target: GuardTarget) -> tuple[dict[str, Any] | None, dict[str, Any] | None, bool]:
        """The run's `_sweep/status.json` and `result.json` (None when absent) and whether both could be read."""
        client = self.s3_client_for(target.endpoint_url, target.region)
        layout = s3_layout.RunLayout(target.run_root)
        docs, readable = [], True
        for location in (layout.status_path, layout.result_path):
            uri = s3_layout.S3Uri.parse(location)
            try:
                docs.append(json.loads(client.get_object(Bucket=uri.bucket, Key=uri.key)["Body"].read()))
            except Exception as exc:  # absent is an answer; anything else means "cannot tell"
                docs.append(None)
                if _error_code(exc) not in ("NoSuchKey", "404", "KeyError"):
                    readable = False
        return (docs[0] if isinstance(docs[0], dict) else None, docs[1] if isinstance(docs[1], dict) else None, readable)

    def _propagate_skip(self, namespace: str, sweep: str, *, rayjobs: bool = True) -> None:
        """The escape hatch on a sweep (or RayJob) covers the objects deleted after it, which outlive it."""
        if not sweep:
            return
        selector = f"{constants.LABEL_SWEEP}={sweep}"
        patch = {"metadata": {"annotations": {constants.ANNOTATION_SKIP_VERIFICATION: "true"}}}
        if rayjobs:
            for rayjob in self.kube.list_rayjobs(namespace, selector):
                self.kube.patch_rayjob(namespace, _meta(rayjob)["name"], patch)
        for cluster in self.kube.list_rayclusters(namespace, selector):
            self.kube.patch_raycluster(namespace, _meta(cluster)["name"], patch)

    def _record_verification(self, sweep_body: Mapping[str, Any], result: Any, decision: Release | Hold | None = None) -> None:
        meta, status = _meta(sweep_body), _status(sweep_body)
        verified = result.verified and result.checked > 0 and not isinstance(decision, Hold)
        if verified:
            message, reason = f"{result.checked} checkpoints, {result.bytes} bytes verified", "Verified"
        elif isinstance(decision, Release):  # audited: nothing to protect
            message, reason = decision.reason, "NothingToProtect"
        else:
            message, reason = problems_message(result.problems) or (decision.reason if decision else "not verified"), "NotVerified"
        updates: list[tuple[str, bool | str, str, str]] = [("CheckpointsVerified", verified, reason, message)]
        if status.get("phase") == "Succeeded" or get_condition(status.get("conditions"), "Ready"):
            ready = status.get("phase") == "Succeeded" and verified
            updates.append(("Ready", ready, "Succeeded" if ready else "CheckpointsNotVerified", message))
        self.kube.patch_sweep_status(
            meta.get("namespace") or "default",
            meta["name"],
            {"checkpoints": result.to_status(), "conditions": self._conditions(status, meta.get("generation"), *updates)},
        )

    def _hold(
        self,
        body: Mapping[str, Any],
        sweep_body: Mapping[str, Any] | None,
        result: Any,
        kind: str,
        reason: str,
        delay: float,
    ) -> RetryLater:
        message = f"{kind} {_meta(body).get('name')} deletion held by the checkpoint guard: {reason}; re-checking in {delay:g}s"
        self.metrics.guard_held(kind, body, _meta(sweep_body or {}).get("name"))
        self.emit(body, "Warning", "CheckpointsNotVerified", message)
        if sweep_body is not None and sweep_body is not body:
            self.emit(sweep_body, "Warning", "CheckpointsNotVerified", message)
        if sweep_body is not None and result is None:
            meta = _meta(sweep_body)
            self.kube.patch_sweep_status(
                meta.get("namespace") or "default",
                meta["name"],
                {"conditions": self._conditions(_status(sweep_body), meta.get("generation"), ("CheckpointsVerified", False, "NotVerified", message))},
            )
        return RetryLater(message, delay)

    # ------------------------------------------------------------------------------ webhook
    def admission_problems(self, body: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
        """Problems that make the API server refuse a CREATE/UPDATE (the validating webhook)."""
        if _meta(body).get("deletionTimestamp"):
            return []
        try:
            self._parse(body)
        except SpecError as exc:
            return [str(p) for p in exc.problems]
        if old is not None and _status(old).get("runId") and not is_terminal(_status(old).get("phase")):
            before = {k: v for k, v in (old.get("spec") or {}).items() if k != "suspend"}
            after = {k: v for k, v in (body.get("spec") or {}).items() if k != "suspend"}
            if before != after:
                changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
                return [
                    f"spec.{k}: cannot change while run {_status(old).get('runId')} is active; only spec.suspend may "
                    "change (delete and re-create the sweep for a new run)"
                    for k in changed
                ]
        return []


FINISH_VERIFICATION_WORKERS = 2
CREATE_RETRY_BASE_SECONDS = 5.0
CREATE_RETRY_MAX_SECONDS = 300.0


def _api_error_text(exc: Exception) -> str:
    """The API server's own message (a metav1.Status body) when there is one, else the exception."""
    body = getattr(exc, "body", None)
    if body:
        try:
            doc = json.loads(body)
            return f"HTTP {getattr(exc, 'status', '?')} {doc.get('reason', '')}: {doc.get('message', '')}".strip()
        except (TypeError, ValueError):
            pass
    return f"{type(exc).__name__}: {exc}"


def _deadline_passed(now: float, deadline: float, grace: float) -> bool:
    return now >= deadline + grace


def _trials_started(trials: Mapping[str, Any]) -> bool:
    return any(int(trials.get(state) or 0) > 0 for state in ("running", "terminated", "errored"))


def _startup_overdue(facts: RayJobFacts, status: Mapping[str, Any], now: float, startup_seconds: float) -> bool:
    """Per attempt: timed from the attempt's start (KubeRay's status.startTime, set at New -> Initializing). While
    KubeRay is Retrying, and in the New state after it, startTime still holds the failed attempt's value and the
    next attempt has not begun (rayjob_controller.go: the Retrying branch), so no startup clock runs then; the
    sweep-wide deadline still does."""
    if facts.deployment_status in ("Retrying", "") and facts.failed > 0:
        return False
    started = [t.timestamp() for t in (parse_time(status.get("startedAt")), parse_time(facts.start_time)) if t]
    return bool(started) and now - max(started) > startup_seconds


def _started_records(rayjob: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The RayJob's records that a run started: a job status, an attempt counter, a cluster, a start time
    (KubeRay resets jobStatus for a retry, so no single field decides)."""
    status = (rayjob or {}).get("status") or {}
    records = []
    if status.get("jobStatus"):
        records.append(f"jobStatus {status['jobStatus']}")
    for counter in ("failed", "succeeded"):
        if int(status.get(counter) or 0) > 0:
            records.append(f"status.{counter}={status[counter]}")
    if status.get("rayClusterName"):
        records.append(f"RayCluster {status['rayClusterName']}")
    if status.get("startTime"):
        records.append("status.startTime")
    return tuple(records)


def _sweep_name_of(obj: Mapping[str, Any], target: GuardTarget | None) -> str:
    labels = _meta(obj).get("labels") or {}
    return labels.get(constants.LABEL_SWEEP) or (target.sweep if target else "")


def _head_env_target(cluster: Mapping[str, Any]) -> GuardTarget | None:
    """Clusters whose RayJob predates the guard annotation: the head's env names root, endpoint and region."""
    env = _head_env(cluster)
    root = env.get(constants.ENV_RUN_ROOT)
    if not root:
        return None
    labels = _meta(cluster).get("labels") or {}
    return GuardTarget(root, env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "", env.get("AWS_REGION") or "",
                       True, DEFAULT_VERIFICATION_TIMEOUT_SECONDS, labels.get(constants.LABEL_SWEEP, ""),
                       labels.get(constants.LABEL_RUN_ID, ""))


def _error_code(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return "KeyError"
    response = getattr(exc, "response", None) or {}
    return str((response.get("Error") or {}).get("Code") or "")


def _head_env(cluster: Mapping[str, Any]) -> dict[str, str]:
    try:
        containers = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value", "") for c in containers for e in c.get("env") or []}
    except (KeyError, TypeError):
        return {}
