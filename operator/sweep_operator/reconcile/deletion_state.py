"""What the guard's deletion pipeline, the stop before a delete and the run pass share: one object, one lock."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from .facts import ObjectRef

MAX_REMEMBERED_STOPS = 4096  # stops whose GPU time is recorded, kept to record each once (oldest forgotten first)


@dataclass(frozen=True)
class GuardKey:
    """One object in the guard's deletion pipeline; the uid tells a re-created object of the same name apart."""

    kind: str
    namespace: str
    name: str
    uid: str


def namespace_of(key: Any) -> str:
    """A queue key's flow: its namespace (ObjectRef and GuardKey name it; a stop is (namespace, RayJob, sweep))."""
    namespace = getattr(key, "namespace", None)
    return str(namespace if namespace is not None else key[0])


@dataclass
class DeletionState:
    """This process's memory of deletions in progress. Every field is read and written under `lock` only: the guard's
    workers, the stop queue's workers and the reconcile workers all reach it. A restart forgets it; what must survive
    a restart is in the sweep's status (status.gracefulStop, status.idleGpuSeconds)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    # The guard: failed checks in a row per object, and each held object's next check (monotonic).
    guard_attempts: dict[GuardKey, int] = field(default_factory=dict)
    guard_due: dict[GuardKey, float] = field(default_factory=dict)
    # Graceful stops asked (RayJob uid -> when; "suspend/<uid>" and "unasked/<uid>" for the suspend's start and a stop
    # that reached no job), so a delete waits for the job at most its window.
    stops: dict[str, float] = field(default_factory=dict)
    stops_recorded: OrderedDict[tuple[str, int], None] = field(default_factory=OrderedDict)  # (RayJob, ask) recorded
    stop_failures: dict[tuple[str, str, str], int] = field(default_factory=dict)  # failed stop passes in a row
    finished_suspended: OrderedDict[str, None] = field(default_factory=OrderedDict)  # ended jobs' RayJobs suspended
    stop_calls: dict[str, Future[Any]] = field(default_factory=dict)  # RayJob -> its stop request (a StopOutcome)
    pod_looks: dict[ObjectRef, float] = field(default_factory=dict)  # each sweep's last look at its pods

    def remember(self, seen: OrderedDict[Any, None], key: Any) -> None:
        """Add `key` to a bounded memory (the oldest forgotten first). The caller holds the lock."""
        seen[key] = None
        while len(seen) > MAX_REMEMBERED_STOPS:
            seen.popitem(last=False)
