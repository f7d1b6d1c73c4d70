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


# ------------------------------------------------------------------------------- uploads in flight at a stop
#
# A Train worker's report reaches its controller only after the report's checkpoint is uploaded (in call order); the
# controller commits it (Ray's snapshot) when it polls the report. An abort kills the workers, and with them any upload
# in flight: a graceful stop first waits, within its window, for the uploads in flight to be committed.

UPLOAD_POLL_S = 0.25
UPLOAD_CALL_TIMEOUT_S = 10.0  # one probe of a worker or the controller (each only reads)


@dataclass(frozen=True)
class WorkerUploads:
    """One Train worker's reports not yet handed to its controller: {report index: checkpoint folder}, the folder
    None where the report's arguments could not be seen; reports known to carry no checkpoint are left out."""

    calls: int
    handed: int
    in_flight: dict[int, str | None]


def probe_worker_uploads() -> WorkerUploads | None:
    """Runs on a Train worker (`RayTrainWorker.execute`, the actor's one thread, which also answers the controller's
    polls): reads the context's report counters and the upload pool's arguments. Never blocks: the counters are read
    without `report_order_condition`, which a report holds while it waits for the controller's next poll."""
    context = ray_internals.train_context()
    if context is None:
        return None
    calls = int(getattr(context, ray_internals.CONTEXT_REPORT_CALLS))
    handed = int(getattr(context, ray_internals.CONTEXT_REPORTS_HANDED))
    seen = _reports_in_flight(context)
    in_flight: dict[int, str | None] = {}
    for index in range(handed + 1, calls + 1):
        name, has_checkpoint = seen.get(index, (None, True))
        if has_checkpoint:
            in_flight[index] = name
    return WorkerUploads(calls, handed, in_flight)


def _reports_in_flight(context: Any) -> dict[int, tuple[str | None, bool]]:
    """{report index: (checkpoint folder, whether it carries a checkpoint)} for the reports this process is uploading
    or has queued: the pool's queued work items and the frames of the threads running Train's report code."""
    import sys

    from ray.train.v2._internal.execution import context as train_context_module

    found: dict[int, tuple[str | None, bool]] = {}

    def note(index: Any, name: Any, checkpoint: Any) -> None:
        if isinstance(index, int) and not isinstance(index, bool) and index not in found:
            found[index] = (name if isinstance(name, str) else None, checkpoint is not None)

    pool = getattr(context, ray_internals.CONTEXT_UPLOAD_POOL, None)
    for item in _queued_work_items(getattr(pool, ray_internals.POOL_WORK_QUEUE_ATTR, None)):
        args = getattr(item, "args", None)
        if isinstance(args, tuple) and len(args) == 4:  # (checkpoint_dir_name, metrics, checkpoint, report_call_index)
            note(args[3], args[0], args[2])
    source = train_context_module.__file__
    names = (ray_internals.ASYNC_UPLOAD_FUNCTION, ray_internals.CONTEXT_REPORT_METHOD)
    for top in list(sys._current_frames().values()):
        frame: Any = top
        while frame is not None:
            code = frame.f_code
            if code.co_name in names and code.co_filename == source:
                local = frame.f_locals
                note(
                    local.get(ray_internals.UPLOAD_ARG_REPORT_INDEX),
                    local.get(ray_internals.UPLOAD_ARG_DIR_NAME),
                    local.get("checkpoint"),
                )
            frame = frame.f_back
    return found


def _queued_work_items(work_queue: Any) -> list[Any]:
    """The items of a thread pool's work queue, without taking any: a `queue.SimpleQueue` (what ThreadPoolExecutor
    uses) shows no contents, but the garbage collector's view of it holds its list of items."""
    import gc

    if work_queue is None:
        return []
    if hasattr(work_queue, "queue"):  # queue.Queue
        return list(work_queue.queue)
    items: list[Any] = []
    for referent in gc.get_referents(work_queue):
        if isinstance(referent, list):
            items.extend(referent)
    return items


def _worker_actors(controller: Any) -> list[Any]:
    """Runs in the Train controller (`__ray_call__`, on its event loop): its workers' actor handles; only reads."""
    group = getattr(controller, ray_internals.CONTROLLER_WORKER_GROUP_METHOD)()
    if group is None:
        return []
    return [
        getattr(w, ray_internals.WORKER_ACTOR_ATTR) for w in getattr(group, ray_internals.WORKER_GROUP_WORKERS_METHOD)()
    ]


def merge_in_flight(probes: Iterable[WorkerUploads | None]) -> dict[int, str | None]:
    """The trial's uploads in flight over its workers (the ranks agree on a report's folder: Train syncs it)."""
    merged: dict[int, str | None] = {}
    for probe in probes:
        for index, name in (probe.in_flight if probe is not None else {}).items():
            merged[index] = merged.get(index) or name
    return merged


def committed_report_index(snapshot: Mapping[str, Any] | None) -> int:
    """How many reports Ray's snapshot says the controller processed (0 without a snapshot)."""
    value = (snapshot or {}).get(ray_internals.SNAPSHOT_REPORT_INDEX)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class TrialUploads:
    """What a stop's wait saw of one trial's uploads: those it waited for, which of them committed, and what it could
    not wait for (still uploading when its time ran out, or started after it stopped collecting)."""

    trial_id: str
    waited: dict[int, str | None] = field(default_factory=dict)
    committed: set[int] = field(default_factory=set)
    not_waited: dict[int, str | None] = field(default_factory=dict)
    error: str | None = None
    done: bool = False
    train_run_dir: str = ""

    def settle(self, in_flight: Mapping[int, str | None], committed_index: int, *, final: bool) -> bool:
        """Fold one look in (pure): a waited upload no worker still holds and the snapshot counts is committed.
        Returns whether every waited upload is committed. `final`: what is still in flight now cannot be waited for."""
        for index, name in self.waited.items():
            if index not in in_flight and index <= committed_index:
                self.committed.add(index)
            elif name is None and in_flight.get(index):
                self.waited[index] = in_flight[index]
        pending = {i for i in self.waited if i not in self.committed}
        if final:
            self.not_waited = {
                i: self.waited.get(i) or in_flight.get(i)
                for i in sorted(pending | set(in_flight))
                if i not in self.committed
            }
        return not pending

    @property
    def cut(self) -> list[str | None]:
        """The checkpoint folders (None: unnamed) the stop could not wait for."""
        return [self.not_waited[i] for i in sorted(self.not_waited)]


class UploadWait:
    """The driver's wait, during a graceful stop, for the uploads in flight of the trials it stops: one thread per
    trial reaches the trial's Train controller through its slot (`for_trial`), its workers through
    `TrainController.get_worker_group()`, and probes them (`probe_worker_uploads`) until each upload it saw is in Ray's
    snapshot, or `deadline` (monotonic). While `collecting()` is true (the stop still waits for reports) uploads newly
    seen in flight join the wait; after it, only those already seen are waited for."""

    def __init__(
        self,
        trial_ids: Iterable[str],
        deadline: float,
        collecting: Callable[[], bool],
        *,
        job_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.deadline = deadline
        self.collecting = collecting
        self.clock = clock
        self.job_id = job_id if job_id is not None else ray_internals.current_job_id()
        self.trials = {t: TrialUploads(t) for t in trial_ids}
        self._threads: list[threading.Thread] = []

    def start(self) -> UploadWait:
        for trial in self.trials.values():
            thread = threading.Thread(target=self._wait_trial, args=(trial,), name=f"stop-uploads-{trial.trial_id}",
                                      daemon=True)  # fmt: skip
            thread.start()
            self._threads.append(thread)
        return self

    def done(self) -> bool:
        return all(t.done for t in self.trials.values())

    def join(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))

    def _wait_trial(self, trial: TrialUploads) -> None:
        try:
            self._wait(trial)
        except Exception as exc:  # the stop goes on; what it saw in flight and Ray did not commit is recorded
            trial.error = f"{type(exc).__name__}: {exc}"
            trial.settle({}, self._committed_index(trial), final=True)
            logger.warning("trial %s: could not wait for its uploads in flight: %s", trial.trial_id, trial.error)
        finally:
            trial.done = True

    @staticmethod
    def _committed_index(trial: TrialUploads) -> int:
        if not trial.train_run_dir:
            return 0
        try:
            snapshot = storage.read_json(s3_layout.join(trial.train_run_dir, ray_internals.SNAPSHOT_FILENAME))
        except (OSError, ValueError):
            return 0
        return committed_report_index(snapshot if isinstance(snapshot, dict) else None)

    def _wait(self, trial: TrialUploads) -> None:
        slot = ControllerSlot(trial_slot_key(self.job_id, trial.trial_id))
        published = None
        while published is None and self.clock() < self.deadline and self.collecting():
            published = slot.receive_published()  # a trial still starting has sent none yet
            if published is None:
                time.sleep(UPLOAD_POLL_S)
        if published is None:
            return
        controller, trial.train_run_dir, _ = published
        workers = ray.get(
            getattr(controller, ray_internals.ACTOR_CALL_METHOD).remote(_worker_actors), timeout=UPLOAD_CALL_TIMEOUT_S
        )
        announced: set[int] = set()
        while True:
            probes = ray.get(
                [getattr(w, ray_internals.WORKER_EXECUTE_METHOD).remote(probe_worker_uploads) for w in workers],
                timeout=UPLOAD_CALL_TIMEOUT_S,
            )
            in_flight = merge_in_flight(probes)
            collecting = self.collecting()
            if collecting or (not trial.waited and not announced):
                for index, name in in_flight.items():
                    trial.waited.setdefault(index, name)
            new = set(trial.waited) - announced
            if new:
                announced |= new
                logger.warning(
                    "trial %s: the stop waits up to %.0f s for %d checkpoint upload(s) in flight: %s",
                    trial.trial_id, max(0.0, self.deadline - self.clock()), len(new),
                    ", ".join(str(trial.waited[i] or f"report {i}") for i in sorted(new)),
                )  # fmt: skip
            # The snapshot is read only once no worker holds a waited upload: the commit follows the handover.
            held = any(i in in_flight for i in trial.waited if i not in trial.committed)
            committed_index = self._committed_index(trial) if trial.waited and not held else 0
            out_of_time = self.clock() >= self.deadline
            settled = trial.settle(in_flight, committed_index, final=out_of_time)
            if settled and not collecting:
                trial.settle(in_flight, committed_index, final=True)
                trial.not_waited = {i: n for i, n in trial.not_waited.items() if i not in trial.waited}
                break
            if out_of_time:
                break
            time.sleep(UPLOAD_POLL_S)
        if trial.waited:
            cut = trial.cut
            logger.log(
                logging.WARNING if cut else logging.INFO,
                "trial %s: %d of %d upload(s) the stop waited for committed%s",
                trial.trial_id, len(trial.committed), len(trial.waited),
                f"; not waited for: {', '.join(str(c) for c in cut)}" if cut else "",
            )  # fmt: skip
