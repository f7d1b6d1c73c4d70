"""A namespace's Ray pods, one listing shared by every sweep the namespace holds (GPU-hours read them per pass)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants

ListPods = Callable[[str, str], list[dict[str, Any]]]  # (namespace, label selector) -> pods, as KubeApi.list_pods


@dataclass(frozen=True)
class _Snapshot:
    taken: float  # monotonic
    by_cluster: Mapping[str, tuple[Mapping[str, Any], ...]]


class PodSnapshots:
    """Every pod carrying `ray.io/cluster` in a namespace, listed at most once per `max_age` seconds and shared.

    Each running sweep's pass reads its clusters' pods every poll; a LIST per sweep made the operator's steady
    state one request per sweep per poll, all to answer "which pods does namespace N run". One listing answers it
    for every sweep in N. A snapshot younger than `max_age` is as good as the per-sweep read it replaces, which was
    itself a poll apart; a pod that ends in between is counted up to now until the next listing shows its end
    (usage is an upper bound, as it was). A failed listing raises and is not kept. Sweeps of one namespace wait
    for a listing in flight rather than sending their own."""

    def __init__(self, list_pods: ListPods, max_age: Callable[[], float], clock: Callable[[], float] = time.monotonic):
        self._list_pods, self._max_age, self._clock = list_pods, max_age, clock
        self._snapshots: dict[str, _Snapshot] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self.listings = 0  # LISTs answered (tests read it)

    def pods(self, namespace: str, clusters: Iterable[str]) -> list[Mapping[str, Any]]:
        """The pods of `clusters` (RayCluster names) in `namespace`, from a listing at most `max_age` old. The pods
        are shared between callers: read them, never change them."""
        with self._namespace_lock(namespace):
            snapshot = self._snapshots.get(namespace)
            if snapshot is None or self._clock() - snapshot.taken >= self._max_age():
                snapshot = self._list(namespace)
        return [p for c in sorted(set(clusters)) for p in snapshot.by_cluster.get(c, ())]

    def _list(self, namespace: str) -> _Snapshot:
        taken = self._clock()  # before the request: the snapshot is no younger than what the API answered
        pods = self._list_pods(namespace, constants.RAY_LABEL_CLUSTER)
        self.listings += 1
        by_cluster: dict[str, list[Mapping[str, Any]]] = {}
        for pod in pods:
            cluster = ((pod.get("metadata") or {}).get("labels") or {}).get(constants.RAY_LABEL_CLUSTER)
            if cluster:
                by_cluster.setdefault(str(cluster), []).append(pod)
        snapshot = _Snapshot(taken, {c: tuple(ps) for c, ps in by_cluster.items()})
        with self._lock:
            # Only fresh listings are kept: a namespace no sweep measures any more does not hold its pods.
            max_age = self._max_age()
            for stale in [ns for ns, s in self._snapshots.items() if taken - s.taken >= max_age]:
                del self._snapshots[stale]
            self._snapshots[namespace] = snapshot
        return snapshot

    def _namespace_lock(self, namespace: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(namespace, threading.Lock())
