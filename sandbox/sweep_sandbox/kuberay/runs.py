"""The runs the KubeRay stand-in started: one per RayCluster object of a RayJob, stopped when its cluster is gone, the
RayJob is deleted or the stand-in stops."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..controllers import Key, Obj
from .runners import JobPoll, JobRunner, RunHandle, RunPhase


class RunRegistry:
    """Each RayJob's run on its current cluster (by uid), and the latest run's output after its cluster goes.
    Thread-safe: the reconcile workers and the informer threads share it."""

    def __init__(self, runner: JobRunner) -> None:
        self.runner = runner
        self._lock = threading.Lock()
        self._runs: dict[Key, tuple[str, RunHandle]] = {}  # RayJob -> (its cluster's uid, the run on it)
        self._driver_runs: dict[Key, RunHandle] = {}  # the latest run of each RayJob, kept after its cluster goes
        self._gone: set[str] = set()  # uids of clusters the watch saw deleted (a stale cache read starts no run)

    def run_for(self, key: Key, rayjob: Mapping[str, Any], cluster: Obj) -> RunHandle:
        """The run on this cluster object (by uid): a cluster recreated under the same name gets a new run, as the
        submitter resubmits the job to it."""
        cluster_uid = cluster["metadata"].get("uid", cluster["metadata"]["name"])
        with self._lock:
            current = self._runs.get(key)
            gone = cluster_uid in self._gone
        if current is not None and current[0] == cluster_uid:
            return current[1]
        if gone:
            return NO_RUN  # the cache still had a cluster that is gone: no pods, no job; the next reconcile recreates
        if current is not None:
            current[1].stop()
        handle = self.runner.start(rayjob, cluster["metadata"]["name"])
        with self._lock:
            self._runs[key] = (cluster_uid, handle)
            self._driver_runs[key] = handle
        return handle

    def current(self, key: Key) -> RunHandle | None:
        with self._lock:
            found = self._runs.get(key)
        return found[1] if found is not None else None

    def stop_run(self, key: Key) -> None:
        with self._lock:
            current = self._runs.pop(key, None)
        if current is not None:
            current[1].stop()

    def cluster_gone(self, uid: str) -> None:
        """The cluster object is gone, so are its pods (ownerReference GC): the run on it ends."""
        with self._lock:
            self._gone.add(uid)
            gone = [key for key, (cluster_uid, _) in self._runs.items() if cluster_uid == uid]
            handles = [self._runs.pop(key)[1] for key in gone]
        for handle in handles:
            handle.stop()

    def driver_log(self, key: Key) -> bytes:
        """The output of the RayJob's latest run (empty before it starts): the submitter pod's log."""
        with self._lock:
            handle = self._driver_runs.get(key)
        read = getattr(handle, "driver_log", None)  # a test's own runner may not keep its output
        return read() if read is not None else b""

    def stop_all(self) -> None:
        with self._lock:
            runs, self._runs = list(self._runs.values()), {}
        for _, handle in runs:
            handle.stop()


class LookAgainAfterStop:
    """A run whose stop also queues its RayJob: KubeRay polls a running job's info on each reconcile, so it sees the
    job end however it was stopped; a scripted run that only ends when stopped would otherwise never be looked at."""

    def __init__(self, run: RunHandle, look_again: Callable[[], None]) -> None:
        self._run, self._look_again = run, look_again

    def poll(self) -> JobPoll:
        return self._run.poll()

    def stop(self) -> None:
        self._run.stop()
        self._look_again()


class _NoRun:
    """The run on a cluster that is already gone: its job is not found (GetJobInfo fails), nothing to stop."""

    def poll(self) -> JobPoll:
        return JobPoll(RunPhase.STARTING)

    def stop(self) -> None:
        return None


NO_RUN = _NoRun()
