"""The runner seam of the KubeRay stand-in: what runs a RayJob's entrypoint on its cluster, and the scripted runner
that follows per-RayJob outcomes for fast tests."""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sweep_contracts import constants

from ..controllers import Key


class RunPhase(str, enum.Enum):
    """Where a run is; the stand-in maps it onto the RayJob (jobDeploymentStatus, jobStatus)."""

    STARTING = "STARTING"  # the cluster's pods are not ready (the RayJob stays Initializing)
    PENDING = "PENDING"  # submitted, not started
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


class PendingReason(str, enum.Enum):
    """Why a cluster's pods do not start (what the operator must diagnose, R6/R20)."""

    INSUFFICIENT_GPU = "InsufficientGPU"  # kube-scheduler: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.
    UNSCHEDULABLE = "Unschedulable"  # kube-scheduler: no node matches the selector / tolerates the taints
    IMAGE_PULL = "ImagePullBackOff"  # kubelet: ErrImagePull, then ImagePullBackOff
    QUOTA = "ExceededQuota"  # the worker pods are refused by a ResourceQuota (KubeRay's FailedToCreateWorkerPod)


@dataclass(frozen=True)
class PendingPods:
    """Emulate a cluster whose pods stay Pending, with the pod conditions and Events Kubernetes would produce."""

    reason: PendingReason = PendingReason.INSUFFICIENT_GPU
    nodes: int = 3
    message: str = ""  # overrides the scheduler/kubelet/quota message
    workers: int | None = None  # worker pods to create (default: the worker groups' replicas, at least 1)


@dataclass(frozen=True)
class JobPoll:
    """What a run reports. `recheck_after`: seconds until it may change (None: poll; inf: only when stopped)."""

    phase: RunPhase
    message: str = ""
    recheck_after: float | None = None
    pending_pods: PendingPods | None = None


class RunHandle(Protocol):
    """One attempt of one RayJob. Called from the stand-in's worker threads: both must be quick and thread-safe."""

    def poll(self) -> JobPoll:
        """STARTING while the "cluster" is not ready, then PENDING/RUNNING, then a terminal phase."""
        ...

    def stop(self) -> None:
        """Stop the attempt (KubeRay's StopJob on a RayJob deletion, its cluster gone, stand-in stop); idempotent."""
        ...

    def driver_log(self) -> bytes:
        """What the driver printed so far (the submitter pod's log under `emulate_pods`)."""
        ...


class JobRunner(Protocol):
    """The seam for what runs a RayJob's entrypoint. `start` is called once per RayCluster object (uid): once per
    attempt, and again when a cluster is recreated under a Running RayJob (attempt = status.failed). A run lives as
    long as its cluster object, as the job on real pods would. The scripted runner follows a script;
    the sandbox's real runner runs spec.entrypoint with spec.runtimeEnvYAML's env_vars on a local Ray instance and
    reports STARTING until Ray is up, RUNNING while the process lives, SUCCEEDED/FAILED by its exit code."""

    def start(self, rayjob: Mapping[str, Any], cluster_name: str) -> RunHandle: ...


@dataclass(frozen=True)
class Outcome:
    """What one attempt of a RayJob does in the ScriptedRunner."""

    result: Literal["succeed", "fail", "hang", "pending"]
    run_seconds: float = 0.0  # RUNNING this long before the result
    startup_seconds: float = 0.0  # the cluster takes this long to become ready
    submit_seconds: float = 0.0  # the job stays PENDING this long once the cluster is ready
    message: str = ""
    pending_pods: PendingPods | None = None
    # After a stop the job stays RUNNING this long, then STOPPED: the driver's graceful stop on SIGTERM, which Ray's
    # supervisor allows RAY_JOB_STOP_WAIT_TIME_S for (JobSupervisor.run); 0 stops at once, as a driver without one.
    stop_seconds: float = 0.0
    # What the driver prints (the submitter pod's log, read through pods/log when pods are emulated)
    log: str = ""

    @classmethod
    def succeed(cls, after: float = 0.1, *, startup: float = 0.0, submit: float = 0.0) -> Outcome:
        return cls("succeed", after, startup, submit)

    @classmethod
    def fail(
        cls,
        after: float = 0.1,
        message: str = "Job entrypoint command failed with exit code 1",
        *,
        startup: float = 0.0,
    ) -> Outcome:
        return cls("fail", after, startup, 0.0, message)

    @classmethod
    def hang(cls, *, startup: float = 0.0, stop_seconds: float = 0.0) -> Outcome:
        """RUNNING until stopped: a RayJob deletion (StopJob), the Jobs API's stop or its cluster gone; a deadline
        alone does not. `stop_seconds`: how long the driver takes to stop gracefully once asked."""
        return cls("hang", math.inf, startup, stop_seconds=stop_seconds)

    @classmethod
    def pending(cls, reason: PendingReason = PendingReason.INSUFFICIENT_GPU, **pods: Any) -> Outcome:
        """The pods never start for `reason`. With workers desired (replicas > 0) the cluster never becomes ready
        and the RayJob stays Initializing; with replicas 0 (autoscaled from minReplicas 0) the head alone makes it
        ready, the RayJob runs (jobStatus RUNNING) and the workers the job asks for stay Pending, as in KubeRay."""
        return cls("pending", 0.0, math.inf, pending_pods=PendingPods(reason, **pods))


class ScriptedRun:
    """A scripted attempt: its phase follows the clock from start()."""

    def __init__(self, outcome: Outcome, rayjob_key: Key, cluster_name: str, attempt: int) -> None:
        self.outcome = outcome
        self.rayjob_key = rayjob_key
        self.cluster_name = cluster_name
        self.attempt = attempt
        self.started_at = time.monotonic()
        self.stopped = False
        self.stopped_at: float | None = None  # monotonic, the first stop
        self.stop_requests: list[float] = []  # wall clock of each stop asked (the Jobs API, a deletion, the cluster)

    def poll(self) -> JobPoll:
        o = self.outcome
        if self.stopped:
            assert self.stopped_at is not None
            left = self.stopped_at + o.stop_seconds - time.monotonic()
            if left > 0:  # Ray keeps the job RUNNING until its supervisor saw the driver exit
                return JobPoll(RunPhase.RUNNING, "stopping", recheck_after=left)
            return JobPoll(RunPhase.STOPPED, "Job was stopped", math.inf)
        if o.result == "pending":
            return JobPoll(RunPhase.STARTING, recheck_after=math.inf, pending_pods=o.pending_pods)
        elapsed = time.monotonic() - self.started_at
        marks = [
            (o.startup_seconds, RunPhase.STARTING),
            (o.startup_seconds + o.submit_seconds, RunPhase.PENDING),
            (o.startup_seconds + o.submit_seconds + o.run_seconds, RunPhase.RUNNING),
        ]
        for until, phase in marks:
            if elapsed < until:
                return JobPoll(phase, recheck_after=until - elapsed)
        if o.result == "succeed":
            return JobPoll(RunPhase.SUCCEEDED, "Job finished successfully.", math.inf)
        return JobPoll(RunPhase.FAILED, o.message, math.inf)

    def stop(self) -> None:
        self.stop_requests.append(time.time())
        if not self.stopped:
            self.stopped, self.stopped_at = True, time.monotonic()

    def driver_log(self) -> bytes:
        return self.outcome.log.encode()


class ScriptedRunner:
    """Per-RayJob scripted outcomes for fast tests; thread-safe.

        runner = ScriptedRunner(default=Outcome.succeed(0.2))
        runner.script("my-sweep", Outcome.fail(), Outcome.succeed())   # attempt 1 fails, the retry succeeds
        runner.script("flaky", *[Outcome.fail()] * 2, Outcome.succeed())  # fails twice (needs backoffLimit >= 2)
        runner.script("stuck", Outcome.pending(PendingReason.IMAGE_PULL))
        runner.script("slow", Outcome.hang())                          # until a deadline or a deletion stops it

    A script's key is a RayJob name or its `sweeps.dev/sweep` label; outcome i is for attempt i (counted from the
    RayJob's status.failed), the last repeats.
    """

    def __init__(self, default: Outcome | Iterable[Outcome] = Outcome.succeed()) -> None:
        self.default = [default] if isinstance(default, Outcome) else list(default)
        self._scripts: dict[str, list[Outcome]] = {}
        self._lock = threading.Lock()
        self.runs: list[ScriptedRun] = []

    def script(self, key: str, *outcomes: Outcome) -> None:
        if not outcomes:
            raise ValueError("a script needs at least one outcome")
        with self._lock:
            self._scripts[key] = list(outcomes)

    def outcome_for(self, rayjob: Mapping[str, Any], attempt: int) -> Outcome:
        meta = rayjob.get("metadata", {})
        keys = [meta.get("name", ""), (meta.get("labels") or {}).get(constants.LABEL_SWEEP, "")]
        with self._lock:
            script = next((self._scripts[k] for k in keys if k in self._scripts), self.default)
        return script[min(attempt, len(script) - 1)]

    def start(self, rayjob: Mapping[str, Any], cluster_name: str) -> ScriptedRun:
        attempt = int((rayjob.get("status") or {}).get("failed") or 0)
        meta = rayjob["metadata"]
        run = ScriptedRun(self.outcome_for(rayjob, attempt), (meta["namespace"], meta["name"]), cluster_name, attempt)
        with self._lock:
            self.runs.append(run)
        return run
