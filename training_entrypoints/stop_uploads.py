"""A graceful stop's wait for the checkpoint uploads in flight: each trial's Train workers are probed until every upload
seen is in Ray's snapshot, or the stop's time for uploads runs out."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray

from sweep_contracts import s3_layout

from . import ray_internals, storage
from .trial_stop import ControllerSlot, trial_slot_key

logger = logging.getLogger(__name__)

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
