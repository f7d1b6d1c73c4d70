"""A namespace's Ray pods listed once and shared by its sweeps (reconcile/pod_snapshots.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator.reconcile.pod_snapshots import PodSnapshots


def pod(name: str, cluster: str, namespace: str = "team-a") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": {constants.RAY_LABEL_CLUSTER: cluster}}}


class Lister:
    """KubeApi.list_pods over a list of pods, recording each LIST (namespace, selector)."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods, self.calls = pods, list[tuple[str, str]]()
        self.fail: Exception | None = None

    def __call__(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.calls.append((namespace, selector))
        if self.fail is not None:
            raise self.fail
        return [p for p in self.pods if p["metadata"]["namespace"] == namespace and selector in p["metadata"]["labels"]]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def names(pods: list[Any]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def test_one_listing_answers_every_sweep_of_the_namespace_until_it_is_max_age_old() -> None:
    lister = Lister([pod("a-head", "a"), pod("a-w1", "a"), pod("b-w1", "b"), pod("x-w1", "a", namespace="team-b")])
    clock = Clock()
    snapshots = PodSnapshots(lister, lambda: 5.0, clock)

    assert names(snapshots.pods("team-a", {"a"})) == ["a-head", "a-w1"]  # its own clusters, this namespace only
    clock.now += 4.9
    assert names(snapshots.pods("team-a", {"b", "a"})) == ["a-head", "a-w1", "b-w1"]
    assert names(snapshots.pods("team-a", {"gone"})) == []
    assert lister.calls == [("team-a", constants.RAY_LABEL_CLUSTER)]  # every pod with the label: one LIST

    lister.pods.append(pod("b-w2", "b"))
    clock.now += 0.1  # max_age old: listed again, and the new pod is seen
    assert names(snapshots.pods("team-a", {"b"})) == ["b-w1", "b-w2"]
    assert len(lister.calls) == 2 and snapshots.listings == 2


def test_a_poll_of_zero_lists_on_every_read() -> None:
    lister = Lister([pod("a-w1", "a")])
    snapshots = PodSnapshots(lister, lambda: 0.0, Clock())
    for _ in range(3):
        assert names(snapshots.pods("team-a", {"a"})) == ["a-w1"]
    assert len(lister.calls) == 3


def test_a_failed_listing_raises_and_is_not_kept() -> None:
    lister, clock = Lister([pod("a-w1", "a")]), Clock()
    snapshots = PodSnapshots(lister, lambda: 5.0, clock)
    lister.fail = RuntimeError("apiserver unavailable")
    with pytest.raises(RuntimeError, match="unavailable"):
        snapshots.pods("team-a", {"a"})
    lister.fail = None
    assert names(snapshots.pods("team-a", {"a"})) == ["a-w1"]  # the next read lists: nothing stale was cached
    assert len(lister.calls) == 2 and snapshots.listings == 1


def test_a_namespace_no_sweep_reads_any_more_does_not_keep_its_pods() -> None:
    lister, clock = Lister([pod("a-w1", "a"), pod("b-w1", "b", namespace="team-b")]), Clock()
    snapshots = PodSnapshots(lister, lambda: 5.0, clock)
    snapshots.pods("team-a", {"a"})
    clock.now += 6
    snapshots.pods("team-b", {"b"})
    assert set(snapshots._snapshots) == {"team-b"}


class WatchedLock:
    """A lock that counts the threads that asked for it (held or waiting)."""

    def __init__(self) -> None:
        self._lock, self.asked = threading.Lock(), 0
        self.changed = threading.Condition()

    def __enter__(self) -> None:
        with self.changed:
            self.asked += 1
            self.changed.notify_all()
        self._lock.acquire()

    def __exit__(self, *_: object) -> None:
        self._lock.release()


def test_sweeps_that_read_while_a_listing_is_in_flight_wait_for_it_instead_of_listing() -> None:
    inside, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow_list(namespace: str, selector: str) -> list[dict[str, Any]]:
        calls.append(namespace)
        inside.set()
        assert release.wait(30)
        return [pod("a-w1", "a"), pod("b-w1", "b")]

    snapshots = PodSnapshots(slow_list, lambda: 5.0, Clock())
    lock = WatchedLock()
    snapshots._locks["team-a"] = lock  # type: ignore[assignment]  # the namespace's lock, observable
    results: dict[str, list[str]] = {}

    def read(cluster: str) -> None:
        results[cluster] = names(snapshots.pods("team-a", {cluster}))

    first = threading.Thread(target=read, args=("a",))
    first.start()
    assert inside.wait(30)
    others = [threading.Thread(target=read, args=(c,)) for c in ("b", "a", "b")]
    for t in others:
        t.start()
    with lock.changed:  # every reader is at the namespace's lock (one holds it, listing) before the listing ends
        assert lock.changed.wait_for(lambda: lock.asked == 4 or len(calls) > 1, timeout=30)
    release.set()
    for t in [first, *others]:
        t.join(30)
    assert calls == ["team-a"]  # one LIST for the four reads
    assert results == {"a": ["a-w1"], "b": ["b-w1"]}
