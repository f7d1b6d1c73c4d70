"""The sandbox's job runner: each RayJob's entrypoint really runs, with its runtime env, on a local Ray (CPU only).

Plugs into the KubeRay stand-in (`JobRunner`): `start()` returns a handle whose `poll()` reports the run's phase
and whose `stop()` ends the driver and its local Ray, as KubeRay stopping a job would.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .kuberay import JobPoll, RunPhase

log = logging.getLogger(__name__)
POLL_SECONDS = 1.0


class LocalRayRun:
    """One attempt of one RayJob, run by `training_entrypoints.local.run_rayjob` in a background thread."""

    def __init__(
        self,
        rayjob: Mapping[str, Any],
        log_dir: Path,
        prepare: Callable[[Mapping[str, Any]], None] | None,
        code_dirs: Sequence[Path] = (),
    ):
        self.rayjob = rayjob
        self.log_dir = log_dir
        self.code_dirs = tuple(code_dirs)
        self._prepare = prepare
        self._stop = threading.Event()
        self._result: Any = None
        self._error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"rayjob-{rayjob['metadata']['name']}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from training_entrypoints.local import LocalRunError, run_rayjob

        try:
            if self._prepare is not None:
                self._prepare(self.rayjob)
            self._result = run_rayjob(
                self.rayjob,
                workdir=self.log_dir,
                code_dirs=self.code_dirs,
                log_dir=self.log_dir,
                stop_event=self._stop,
            )
        except LocalRunError as exc:
            self._error = str(exc)
        except Exception as exc:  # a runner bug must fail the job, not hang it
            log.exception("local run of %s failed", self.rayjob["metadata"]["name"])
            self._error = f"{type(exc).__name__}: {exc}"

    def poll(self) -> JobPoll:
        if self._thread.is_alive():
            # A stopped job stays RUNNING until its driver exits (its graceful stop on SIGTERM), as in Ray's supervisor.
            return JobPoll(RunPhase.RUNNING, recheck_after=POLL_SECONDS)
        if self._stop.is_set():
            return JobPoll(RunPhase.STOPPED, "Job was stopped", float("inf"))
        if self._error is not None:
            return JobPoll(RunPhase.FAILED, self._error, float("inf"))
        result = self._result
        if result is not None and result.ok:
            return JobPoll(RunPhase.SUCCEEDED, "Job finished successfully.", float("inf"))
        detail = (result.message if result is not None else "") or f"see {self.log_dir}/driver.log"
        code = result.returncode if result is not None else "?"
        return JobPoll(
            RunPhase.FAILED, f"Job entrypoint command failed with exit code {code}: {detail}"[:2000], float("inf")
        )

    def stop(self) -> None:
        self._stop.set()

    def driver_log(self) -> bytes:
        """The driver's output so far (stdout and stderr, as `ray job logs` shows them)."""
        try:
            return (self.log_dir / "driver.log").read_bytes()
        except FileNotFoundError:
            return b""

    def wait(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


class LocalRayRunner:
    """`JobRunner` that runs RayJobs for real; `prepare(rayjob)` runs first (the sandbox creates missing buckets).

    `code_dirs` (`sweepctl sandbox up --code DIR`) go first on every job's PYTHONPATH, driver and Ray workers alike:
    a user's own train loop, standing in for the code an image would carry."""

    def __init__(
        self,
        state_dir: Path,
        prepare: Callable[[Mapping[str, Any]], None] | None = None,
        code_dirs: Sequence[Path] = (),
    ):
        self.state_dir = Path(state_dir)
        self.prepare = prepare
        self.code_dirs = tuple(code_dirs)
        self.runs: list[LocalRayRun] = []
        self._lock = threading.Lock()

    def start(self, rayjob: Mapping[str, Any], cluster_name: str) -> LocalRayRun:
        log_dir = self.state_dir / "runs" / cluster_name
        log_dir.mkdir(parents=True, exist_ok=True)
        run = LocalRayRun(rayjob, log_dir, self.prepare, self.code_dirs)
        with self._lock:
            self.runs.append(run)
        return run

    def stop_all(self, timeout: float = 60.0) -> None:
        with self._lock:
            runs = list(self.runs)
        for run in runs:
            run.stop()
        for run in runs:
            run.wait(timeout)
