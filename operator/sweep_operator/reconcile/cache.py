"""The controller's memory between passes, as an informer's: the newest copy of each sweep and RayJob, our own writes'
resourceVersions, parsed specs, per-run caps.

None of it is needed for correctness: every status write carries the resourceVersion it was computed from, and the guard
reads fresh. Deduplicating reconcile requests is the work queue's job, not the cache's.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

from sweep_contracts import constants
from sweep_contracts.problems import SpecError
from sweep_contracts.status_models import SweepStatus

from ..settings import Settings
from ..validation import Sweep, parse_sweep
from .facts import ObjectRef, RunRef, meta_of, status_of
from .guard import backoff_seconds
from .progress_rhythm import next_poll_seconds

# What a reconcile reads from a RayJob's spec; the rest (the cluster spec with its pod templates) is most of
# its size, so the watch-fed copies keep only these (as an informer's transform would).
_RAYJOB_SPEC_READ = ("suspend", "runtimeEnvYAML", "shutdownAfterJobFinishes", "activeDeadlineSeconds", "backoffLimit")
_PARSE_METADATA = ("name", "namespace", "uid", "generation", "creationTimestamp", "labels", "annotations")
PARSE_CACHE_SIZE = 4096
# Parsed statuses kept: a sweep being worked on (its event, its pass, the write's echo, its ticks) is parsed once per
# resourceVersion; a parsed status is about 14 KiB against a stored one's 2, so the many idle sweeps of a large
# operator are parsed again at their rare ticks (tens of microseconds) rather than held.
STATUS_CACHE_SIZE = 512
ECHOES_KEPT = 4  # our writes per sweep whose events may still be on their way
CREATE_RETRY_BASE_SECONDS = 5.0
CREATE_RETRY_MAX_SECONDS = 300.0
_MISSING = object()


def older_version(candidate: Any, current: Any) -> bool:
    """Whether resourceVersion `candidate` is older than `current` of the same object. They are compared as
    numbers when both are (etcd revisions); otherwise never "older": the newest arrival wins, and a stale copy
    is caught by the resourceVersion precondition on every status write."""
    try:
        return int(candidate) < int(current)
    except (TypeError, ValueError):
        return False


def slim_rayjob(rayjob: Mapping[str, Any]) -> dict[str, Any]:
    """What reconciles read of a RayJob (metadata, status, the spec fields they use), sharing its values."""
    spec = rayjob.get("spec") or {}
    return {
        "apiVersion": rayjob.get("apiVersion"),
        "kind": rayjob.get("kind"),
        "metadata": {k: v for k, v in meta_of(rayjob).items() if k != "managedFields"},
        "spec": {k: spec[k] for k in _RAYJOB_SPEC_READ if k in spec},
        "status": dict(rayjob.get("status") or {}),
    }


def run_ref(body: Mapping[str, Any]) -> RunRef:
    """The run a RayJob or RayCluster belongs to, from its labels."""
    labels = meta_of(body).get("labels") or {}
    ref = ObjectRef.of(body)
    return RunRef(
        ObjectRef(ref.namespace, labels.get(constants.LABEL_SWEEP, "")), labels.get(constants.LABEL_RUN_ID, "")
    )


class Lru:
    """A small thread-safe least-recently-used map; callers key it by digests, not by the documents themselves."""

    def __init__(self, size: int) -> None:
        self._items: OrderedDict[bytes, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._size = size

    def get(self, key: bytes) -> Any:
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


def _dumps(obj: Any) -> bytes:
    """orjson (the cache's copies are written on every event and read on every pass); the standard encoder for what
    orjson refuses (an integer over 64 bits in a tenant's spec), marked by a leading space so that `_loads` decodes
    it with the standard decoder too (orjson would read such an integer back as a float)."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return b" " + json.dumps(obj).encode()


def _sorted_dumps(obj: Any) -> bytes:
    """Canonical bytes for a key (sorted keys): orjson (every pass keys its sweep's spec), the standard encoder
    for what orjson refuses. One body always takes the same path, so its key is stable."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return json.dumps(obj, sort_keys=True, default=str).encode()


def _loads(text: bytes) -> Any:
    return json.loads(text) if text[:1] == b" " else orjson.loads(text)


class Cache:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        # Copies are kept as JSON, a quarter of the memory of the dicts, and decoding is faster than deepcopy.
        self._sweeps: dict[ObjectRef, tuple[Any, bytes]] = {}  # -> (resourceVersion, copy)
        self._rayjobs: dict[ObjectRef, tuple[Any, bytes]] = {}
        self._echoes: dict[ObjectRef, tuple[str, ...]] = {}  # -> resourceVersions of our last writes, newest last
        self._rayjob_echoes: dict[ObjectRef, str] = {}  # -> resourceVersion our create answered
        self._rayjob_news: dict[str, tuple[Any, ...]] = {}  # RayJob uid -> the fields its sweep's status mirrors
        self._caps: dict[RunRef, int] = {}
        # -> (monotonic time of the last progress poll, the wait after it (0: status_poll_seconds), a time the next
        # poll is due by at the latest (a progress write waiting for its slot))
        self._polls: dict[ObjectRef, tuple[float, float, float]] = {}
        self._mirrored: dict[ObjectRef, float] = {}  # -> monotonic time progress was last written into the status
        self._pods_read: dict[ObjectRef, float] = {}  # -> monotonic time of the last GPU-pod read (GPU-hours)
        self._create_failures: dict[ObjectRef, tuple[int, float]] = {}  # -> (failed creates in a row, retry at)
        self._label_warned: set[str] = set()  # uids of guarded objects whose label loss was reported
        self.parsed = Lru(PARSE_CACHE_SIZE)  # spec digest -> Sweep, or the tuple of problems
        self.statuses = Lru(STATUS_CACHE_SIZE)  # uid/resourceVersion -> the status parsed (frozen, shared)

    # ---- sweeps
    def observe_sweep(self, body: Mapping[str, Any]) -> None:
        """Remember a full copy of a sweep (a watch event or a read), unless a newer one is already known."""
        ref, rv = ObjectRef.of(body), meta_of(body).get("resourceVersion")
        with self._lock:
            known = self._sweeps.get(ref)
        if rv is not None and known is not None and known[0] == rv:
            return  # this very version is known (the echo of our own write, remembered from its answer)
        meta = {k: v for k, v in meta_of(body).items() if k != "managedFields"}
        text = _dumps({**body, "metadata": meta})  # the watch's dict is kopf's: this is our copy
        with self._lock:
            current = self._sweeps.get(ref)
            if current is None or not older_version(rv, current[0]):
                self._sweeps[ref] = (rv, text)

    def remember_write(self, written: Mapping[str, Any]) -> None:
        """The sweep as our own write left it: the newest copy, and a resourceVersion whose event is an echo (the
        last few: a pass's finalizer patch and status write come back after both were made)."""
        self.observe_sweep(written)
        rv = meta_of(written).get("resourceVersion")
        if rv is not None:
            ref = ObjectRef.of(written)
            with self._lock:
                self._echoes[ref] = (*self._echoes.get(ref, ())[-(ECHOES_KEPT - 1) :], rv)

    def is_echo(self, body: Mapping[str, Any]) -> bool:
        rv = meta_of(body).get("resourceVersion")
        with self._lock:
            return rv is not None and rv in self._echoes.get(ObjectRef.of(body), ())

    def remember_created_rayjob(self, made: Mapping[str, Any]) -> None:
        """Our create's answer: its ADDED event is an echo (the answer was observed and seeded its news)."""
        rv = meta_of(made).get("resourceVersion")
        if rv is not None:
            with self._lock:
                self._rayjob_echoes[ObjectRef.of(made)] = rv

    def watch_echo(self, plural: str, obj: Mapping[str, Any]) -> bool:
        """Whether a watch event's object is a version our own write made and this cache already holds (a sweep's
        status or finalizer write, a RayJob's create): such an event tells the operator nothing. A deleting object
        is never one (its events enter the guard's pipeline, which reads fresh anyway)."""
        meta = meta_of(obj)
        rv = meta.get("resourceVersion")
        if rv is None or meta.get("deletionTimestamp"):
            return False
        ref = ObjectRef.of(obj)
        with self._lock:
            if plural == constants.PLURAL:
                return bool(rv in self._echoes.get(ref, ()))
            if plural == constants.RAYJOB_PLURAL:
                return bool(self._rayjob_echoes.get(ref) == rv)
        return False

    def sweep(self, ref: ObjectRef) -> dict[str, Any] | None:
        with self._lock:
            cached = self._sweeps.get(ref)
        return _loads(cached[1]) if cached is not None else None

    def sweeps(self) -> list[dict[str, Any]]:
        with self._lock:
            texts = [text for _, text in self._sweeps.values()]
        return [_loads(text) for text in texts]

    def forget_sweep(self, ref: ObjectRef) -> None:
        with self._lock:
            self._sweeps.pop(ref, None)
            self._echoes.pop(ref, None)
            # Per-sweep rhythms go with the sweep (a long-lived operator sees many sweeps come and go).
            self._polls.pop(ref, None)
            self._mirrored.pop(ref, None)
            self._pods_read.pop(ref, None)
            self._create_failures.pop(ref, None)

    def status(self, body: Mapping[str, Any]) -> SweepStatus:
        """The sweep's status as the contracts' model, parsed once per resourceVersion (a resourceVersion names one
        stored content; every pass over an unchanged sweep shares the frozen copy)."""
        meta = meta_of(body)
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if not uid or not version:
            return status_of(body)
        key = f"{uid}/{version}".encode()
        found = self.statuses.get(key)
        if found is _MISSING:
            found = status_of(body)
            self.statuses.put(key, found)
        return found  # type: ignore[no-any-return]  # Lru holds Any; only SweepStatus is put under these keys

    def parse(self, body: Mapping[str, Any], *, remember: bool = True) -> Sweep:
        """parse_sweep, remembered for the same spec and identity (every event and tick re-reads the sweep;
        pydantic validation of an unchanged spec is most of a steady reconcile's CPU). Raises SpecError.
        `remember=False` uses what is remembered but adds nothing (a spec that may never be stored)."""
        meta = meta_of(body)
        identity = [
            sorted(k for k in body if k != "status"),
            body.get("apiVersion"),
            body.get("kind"),
            {k: meta.get(k) for k in _PARSE_METADATA},
            body.get("spec"),
        ]
        key = hashlib.sha256(_sorted_dumps(identity)).digest()  # a digest: a thousand specs as keys were megabytes
        hit = self.parsed.get(key)
        if hit is _MISSING:
            try:
                hit = parse_sweep(dict(body), self.settings.limits, self.settings.tenancy)
            except SpecError as exc:
                hit = tuple(exc.problems)
            if remember:
                self.parsed.put(key, hit)
        if isinstance(hit, tuple):
            raise SpecError(list(hit))
        assert isinstance(hit, Sweep)
        return hit

    # ---- RayJobs
    def observe_rayjob(self, rayjob: Mapping[str, Any]) -> None:
        """Remember the newest copy of one of our RayJobs (the watch's, or our create's answer; they race)."""
        ref, rv = ObjectRef.of(rayjob), meta_of(rayjob).get("resourceVersion")
        text = _dumps(slim_rayjob(rayjob))
        with self._lock:
            current = self._rayjobs.get(ref)
            if current is None or not older_version(rv, current[0]):
                self._rayjobs[ref] = (rv, text)

    def rayjob(self, ref: ObjectRef) -> dict[str, Any] | None:
        with self._lock:
            cached = self._rayjobs.get(ref)
        return _loads(cached[1]) if cached is not None else None

    def rayjob_has_news(self, rayjob: Mapping[str, Any]) -> bool:
        """Whether a RayJob event changes what its sweep's status mirrors (status, deletion, suspension)."""
        meta, rayjob_status = meta_of(rayjob), rayjob.get("status") or {}
        news = (
            rayjob_status.get("jobDeploymentStatus"),
            rayjob_status.get("jobStatus"),
            rayjob_status.get("reason"),
            rayjob_status.get("rayClusterName"),
            rayjob_status.get("startTime"),
            bool(meta.get("deletionTimestamp")),
            bool((rayjob.get("spec") or {}).get("suspend")),
        )
        uid = meta.get("uid") or meta.get("name", "")
        with self._lock:
            if self._rayjob_news.get(uid) == news:
                return False
            self._rayjob_news[uid] = news
            # The run moved: its progress is read at the base rhythm again.
            sweep = run_ref(rayjob).sweep
            known = self._polls.get(sweep)
            if known is not None:
                self._polls[sweep] = (known[0], 0.0, known[2])
        return True

    def forget_rayjob(self, rayjob: Mapping[str, Any]) -> None:
        meta = meta_of(rayjob)
        with self._lock:
            self._rayjobs.pop(ObjectRef.of(rayjob), None)
            self._rayjob_echoes.pop(ObjectRef.of(rayjob), None)
            self._rayjob_news.pop(meta.get("uid") or meta.get("name", ""), None)
            self._caps.pop(run_ref(rayjob), None)

    # ---- per run and per sweep
    def cap(self, run: RunRef) -> int | None:
        with self._lock:
            return self._caps.get(run)

    def remember_cap(self, run: RunRef, cap: int) -> None:
        if run.run_id:
            with self._lock:
                self._caps[run] = cap

    def poll_due(self, ref: ObjectRef, now: float, *, take: bool) -> bool:
        """Whether the run's progress may be polled again; `take` records a poll (`polled` then says what it found)."""
        with self._lock:
            known = self._polls.get(ref)
            due = known is None or now >= self._next_poll(known)
            if due and take:
                self._polls[ref] = (now, known[1] if known else 0.0, math.inf)
            return due

    def _next_poll(self, known: tuple[float, float, float]) -> float:
        last, wait, by = known
        return min(last + (wait if wait > 0 else self.settings.status_poll_seconds), by)

    def polled(self, ref: ObjectRef, *, changed: bool) -> None:
        """A poll's outcome: the next one waits `progress_rhythm.next_poll_seconds` from the poll (longer while the
        document does not change; 0 stands for status_poll_seconds as it is then)."""
        settings = self.settings
        with self._lock:
            known = self._polls.get(ref)
            if known is None:
                return
            last, previous, by = known
            wait = 0.0
            if not changed:
                base, cap = settings.status_poll_seconds, settings.status_poll_max_seconds
                wait = next_poll_seconds(previous or base, changed, base=base, cap=cap)
            self._polls[ref] = (last, wait, by)

    def poll_by(self, ref: ObjectRef, at: float) -> None:
        """The next poll is due at `at` at the latest (a progress write waits for it: it carries the latest read)."""
        with self._lock:
            known = self._polls.get(ref)
            if known is not None:
                self._polls[ref] = (known[0], known[1], min(known[2], at))

    def last_mirrored(self, ref: ObjectRef) -> float | None:
        """When progress was last written into the sweep's status (monotonic); None: never by this process."""
        with self._lock:
            return self._mirrored.get(ref)

    def mirrored(self, ref: ObjectRef, now: float) -> None:
        with self._lock:
            self._mirrored[ref] = now

    def pods_due(self, ref: ObjectRef, now: float) -> bool:
        """Whether the run's GPU pods may be read again, and if so records the read: status_poll_seconds apart,
        as progress. Every event of a running sweep brings a pass; a pod LIST on each would be most of the
        operator's requests in a burst, and GPU-hours need no finer grain than the poll (intervals start and end
        at the pods' own timestamps where they carry them)."""
        with self._lock:
            last = self._pods_read.get(ref)
            due = last is None or now - last >= self.settings.status_poll_seconds
            if due:
                self._pods_read[ref] = now
            return due

    def create_retry_at(self, ref: ObjectRef) -> float | None:
        with self._lock:
            failed = self._create_failures.get(ref)
        return failed[1] if failed is not None else None

    def create_failed(self, ref: ObjectRef, now: float) -> tuple[int, float]:
        """Count one more failed create in a row; (the count, the backoff before the next try)."""
        with self._lock:
            failures = self._create_failures.get(ref, (0, 0.0))[0] + 1
            delay = backoff_seconds(failures - 1, CREATE_RETRY_BASE_SECONDS, CREATE_RETRY_MAX_SECONDS)
            self._create_failures[ref] = (failures, now + delay)
        return failures, delay

    def create_succeeded(self, ref: ObjectRef) -> None:
        with self._lock:
            self._create_failures.pop(ref, None)

    def first_label_warning(self, uid: str) -> bool:
        with self._lock:
            if uid in self._label_warned:
                return False
            self._label_warned.add(uid)
            return True
