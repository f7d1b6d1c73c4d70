"""What a Tune stop does to a trial's Train run: Train's own `abort()` frees its worker group and placement group,
then the checkpoint folders the stop left uploaded but uncommitted are removed (KUBERAY-KUEUE.md, Ray #54305, #58515).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import pickle
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import tune

from sweep_contracts import s3_layout

from . import ray_internals, storage

logger = logging.getLogger(__name__)

# The abort waits for the controller to abort its workers (Train gives them 5 s) and to stop its placement-group
# cleaner (up to 12 s when the State API is slow); a stopping trial is force-killed by Tune only after 600 s. When the
# experiment itself ends Tune allows 10 s, but then the driver exits and Ray removes every placement group of its job.
ABORT_TIMEOUT_S = 30.0
# Tune's force-kill of a stopping trial actor (TUNE_FORCE_TRIAL_CLEANUP_S) minus this margin bounds the abort.
FORCE_KILL_MARGIN_S = 5.0
_POLL_S = 0.2
_DRAIN_BATCH = 8


class AbortOutcome(enum.Enum):
    """How a stop ended the trial's Train run."""

    NOT_STARTED = "no fit() was running"  # stopped before fit() or after it returned
    NO_CONTROLLER = "the controller never sent its handle"
    ABORTED = "aborted through TrainController.abort()"
    TIMED_OUT = "the abort did not finish in time"


def abort_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """ABORT_TIMEOUT_S, kept below the point where Tune force-kills the stopping trial (the controller would die with
    it, without abort)."""
    env = os.environ if env is None else env
    try:
        force_kill_s = float(
            env.get(ray_internals.ENV_TUNE_FORCE_TRIAL_CLEANUP, ray_internals.TUNE_FORCE_TRIAL_CLEANUP_DEFAULT_S)
        )
    except ValueError:
        force_kill_s = ray_internals.TUNE_FORCE_TRIAL_CLEANUP_DEFAULT_S
    return max(1.0, min(ABORT_TIMEOUT_S, force_kill_s - FORCE_KILL_MARGIN_S))


# ------------------------------------------------------------------------------- the controller's handle


@dataclass(frozen=True)
class ControllerSlot:
    """Where the controller leaves its own handle for its trial: one key in Ray's GCS key-value store (no process of
    its own, unlike a holder actor; trial drivers share the head). Picklable: it travels inside the callback.

    A trial's slot has a key the sweep's driver can name too (`for_trial`: the Ray job and the trial id), so a
    graceful stop can reach the trial's workers; the value also says where the run commits (`train_run_dir`)."""

    key: str
    train_run_dir: str = ""
    token: str = ""

    @classmethod
    def new(cls) -> ControllerSlot:
        return cls(f"{SLOT_PREFIX}{uuid.uuid4().hex}")

    @classmethod
    def for_trial(cls, job_id: str, trial_id: str, train_run_dir: str = "") -> ControllerSlot:
        return cls(trial_slot_key(job_id, trial_id), train_run_dir, uuid.uuid4().hex)

    def send(self, controller: Any) -> None:
        # ActorHandle pickles out of band by design (ActorHandle.__reduce__); the trial, its owner, unpickles it.
        ray_internals.kv_put(self.key, pickle.dumps((controller, self.train_run_dir, self.token)))

    def receive(self) -> Any:
        published = self.receive_published()
        return published[0] if published else None

    def receive_published(self) -> tuple[Any, str, str] | None:
        """(controller handle, train run dir, token) as sent, or None before the controller sent it."""
        data = ray_internals.kv_get(self.key)
        if not data:
            return None
        value = pickle.loads(data)
        return value if isinstance(value, tuple) and len(value) == 3 else None

    def clear(self) -> None:
        # A retried trial's slot has the same key: only the value this slot sent is removed.
        published = self.receive_published() if self.token else None
        if published is None or published[2] == self.token:
            ray_internals.kv_del(self.key)


SLOT_PREFIX = "train-controller/"


def trial_slot_key(job_id: str, trial_id: str) -> str:
    """The trial's slot: unique in a Ray cluster (trial ids are unique within one driver's experiment)."""
    return f"{SLOT_PREFIX}{job_id}/{trial_id}"


class SendControllerHandle(ray_internals.ControllerCallback):
    """Runs inside the Train controller actor: at start, sends that actor's handle to the trial's slot.

    `fit()` keeps the controller's handle to itself; only the controller knows it is `current_actor`."""

    def __init__(self, slot: ControllerSlot):
        self._slot = slot

    def after_controller_start(self, train_run_context: Any) -> None:
        try:
            self._slot.send(ray.get_runtime_context().current_actor)
        except Exception:
            # Training goes on; only a Tune stop of this trial would then leave its placement group behind.
            logger.warning("could not hand the Train controller to its trial; a stop cannot abort it", exc_info=True)


# ------------------------------------------------------------------------------------------ the trial run


@dataclass
class TrialTrainRun:
    """One trial's `fit()`, as its Tune trial actor sees it: the thread running `fit()` and Tune's stop share it."""

    trial_id: str
    train_run_dir: str  # train/<trialId>: where Train writes its checkpoints and snapshot
    slot: ControllerSlot | None = None
    fit_started: bool = False
    fit_ended: bool = False
    stopping: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def controller_callback(self) -> SendControllerHandle:
        if self.slot is None:
            try:
                self.slot = ControllerSlot.for_trial(ray_internals.current_job_id(), self.trial_id, self.train_run_dir)
            except Exception:  # no Ray job to name: the trial's own stop still finds it; a graceful stop cannot
                self.slot = ControllerSlot.new()
        return SendControllerHandle(self.slot)

    def fit(self, trainer: Any) -> Any:
        """`trainer.fit()`, unless Tune already stopped the trial; the error of a fit() that a stop aborted is not
        the trial's: Tune marked it TERMINATED before the stop, and an error here must not turn it into ERROR."""
        with self._lock:
            if self.stopping:
                return None
            self.fit_started = True
        try:
            return trainer.fit()
        except Exception as exc:
            if not self.stopping:
                raise
            logger.info("trial %s: fit() ended by its stop (%s)", self.trial_id, type(exc).__name__)
            return None
        finally:
            with self._lock:
                self.fit_ended = True
            self._release_slot()

    def _release_slot(self) -> None:
        slot, self.slot = self.slot, None
        if slot is not None:
            with contextlib.suppress(Exception):  # a key left behind costs a few bytes in the GCS, nothing more
                slot.clear()

    def abort(self, timeout_s: float, *, drain: Callable[[], None] | None = None) -> AbortOutcome:
        """Train's `abort()` on this trial's controller, waited for up to `timeout_s`.

        `drain` empties TuneReportCallback's queue while waiting: a stopped trial reads no more results, so the
        controller can be stuck in a report that holds its event loop, with the abort queued behind it."""
        with self._lock:
            self.stopping = True
            if not self.fit_started or self.fit_ended:
                return AbortOutcome.NOT_STARTED
            slot = self.slot
        deadline = time.monotonic() + timeout_s
        controller = self._wait_for_controller(slot, deadline)
        if controller is None:
            return AbortOutcome.NOT_STARTED if self.fit_ended else AbortOutcome.NO_CONTROLLER
        done = getattr(controller, ray_internals.CONTROLLER_ABORT_METHOD).remote()
        while True:
            ready, _ = ray.wait([done], timeout=_POLL_S)
            if ready:
                # abort() ends with exit_actor(): the controller is gone, as asked.
                with contextlib.suppress(ray.exceptions.RayActorError):
                    ray.get(ready[0])
                return AbortOutcome.ABORTED
            if time.monotonic() >= deadline:
                return AbortOutcome.TIMED_OUT
            if drain is not None:
                drain()

    def _wait_for_controller(self, slot: ControllerSlot | None, deadline: float) -> Any:
        """The controller's handle; None when fit() ended first or the controller sent none before `deadline`."""
        while slot is not None and not self.fit_ended:
            controller = slot.receive()
            if controller is not None:
                return controller
            if time.monotonic() >= deadline:
                return None
            time.sleep(_POLL_S)
        return None


_RUNS: dict[str, TrialTrainRun] = {}
_RUNS_LOCK = threading.Lock()


def begin_trial_run(trial_id: str, train_run_dir: str) -> TrialTrainRun:
    """Register this trial's run so that Tune's stop (`AbortTrainRunOnStop.cleanup`, same process) finds it."""
    run = TrialTrainRun(trial_id, train_run_dir)
    with _RUNS_LOCK:
        _RUNS[trial_id] = run
    return run


def log_in_trial_actor() -> None:
    """A trial actor configures no logging of ours (the driver's basicConfig is another process): without a handler
    the stop's INFO lines, which say what each stop freed and how long it took, would be dropped."""
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def stop_trial_run(trial_id: str, timeout_s: float | None = None) -> AbortOutcome:
    """Tune is stopping the trial: abort its Train run, then remove the checkpoints the stop left uncommitted."""
    with _RUNS_LOCK:
        run = _RUNS.pop(trial_id, None)
    if run is None:
        return AbortOutcome.NOT_STARTED
    started = time.monotonic()
    outcome = run.abort(abort_timeout_s() if timeout_s is None else timeout_s, drain=drain_tune_reports)
    took = time.monotonic() - started
    if outcome is AbortOutcome.ABORTED:
        logger.info("trial %s stopped by Tune: Train run aborted in %.1f s", trial_id, took)
        # The controller and its workers are gone: nothing can commit or upload any more.
        remove_uncommitted_checkpoints(run.train_run_dir)
    elif outcome in (AbortOutcome.TIMED_OUT, AbortOutcome.NO_CONTROLLER):
        logger.warning(
            "trial %s stopped by Tune: %s after %.1f s; its placement group stays reserved until the sweep's driver "
            "exits",
            trial_id,
            outcome.value,
            took,
        )
    return outcome


def drain_tune_reports() -> None:
    """Empty TuneReportCallback's queue (results of a stopped trial go nowhere), unblocking the controller."""
    from ray.util.queue import Empty

    queue = ray_internals.tune_session_report_queue()
    if queue is None:
        return
    for _ in range(_DRAIN_BATCH):
        try:
            queue.get_nowait()
        except Empty:
            return
        except ray.exceptions.RayActorError:
            return


class AbortTrainRunOnStop(tune.Trainable):
    """Mixed into the trial driver's function trainable (`__mixins__`): Tune's stop aborts the trial's Train run
    before the trial actor goes, which would otherwise kill the controller without `abort()` and leave the worker
    group's placement group reserved until the sweep's driver exits."""

    def cleanup(self) -> None:
        try:
            stop_trial_run(self.trial_id)
        except Exception:
            logger.exception("trial %s: aborting its Train run failed", self.trial_id)
        finally:
            super().cleanup()


# ------------------------------------------------------------------------------- uncommitted checkpoints


def committed_checkpoint_names(snapshot: Mapping[str, Any]) -> set[str]:
    """Checkpoint folders Ray's snapshot names (kept ones, the latest, and any still pending validation)."""
    names: set[str] = set()
    results: list[Any] = []
    for key in ray_internals.SNAPSHOT_RESULT_LISTS:
        value = snapshot.get(key)
        if isinstance(value, list):
            results.extend(value)
    results.append(snapshot.get(ray_internals.SNAPSHOT_LATEST_RESULT))
    for result in results:
        if isinstance(result, dict) and isinstance(result.get(ray_internals.SNAPSHOT_DIR_NAME), str):
            names.add(result[ray_internals.SNAPSHOT_DIR_NAME])
    return names


def uncommitted_checkpoint_names(folders: Iterable[str], snapshot: Mapping[str, Any] | None) -> list[str]:
    """`checkpoint_*` folders no snapshot names: uploaded by a report whose commit never happened."""
    committed = committed_checkpoint_names(snapshot) if snapshot is not None else set()
    return sorted(f for f in folders if f.startswith(s3_layout.CHECKPOINT_DIR_PREFIX) and f not in committed)


@dataclass(frozen=True)
class RemovedCheckpoints:
    names: tuple[str, ...] = ()
    bytes: int = 0


def remove_uncommitted_checkpoints(train_run_dir: str) -> RemovedCheckpoints:
    """Delete the Train run's uncommitted checkpoint folders (an `s3://` URI or a local path). Call it only when no
    controller or worker of the run is alive: a folder being uploaded is uncommitted too. Never raises."""
    import pyarrow.fs as pafs

    try:
        fs, path = storage.filesystem(train_run_dir)
        snapshot = storage.read_json(s3_layout.join(train_run_dir, ray_internals.SNAPSHOT_FILENAME))
        if snapshot is not None and not isinstance(snapshot, dict):
            return RemovedCheckpoints()
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        folders = [os.path.basename(i.path.rstrip("/")) for i in infos if i.type == pafs.FileType.Directory]
        names = uncommitted_checkpoint_names(folders, snapshot)
        total = 0
        for name in names:
            folder = f"{path.rstrip('/')}/{name}"
            files = fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
            total += sum(i.size or 0 for i in files if i.type == pafs.FileType.File)
            fs.delete_dir(folder)
    except (OSError, ValueError) as exc:
        logger.warning("could not remove uncommitted checkpoints under %s: %s", train_run_dir, exc)
        return RemovedCheckpoints()
    if names:
        logger.info("removed %d uncommitted checkpoint folder(s) (%d bytes) under %s: %s", len(names), total,
                    train_run_dir, ", ".join(names))  # fmt: skip
    return RemovedCheckpoints(tuple(names), total)
