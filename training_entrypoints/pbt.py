"""Population-based training over Ray Train V2: Tune's PBT clones a Tune checkpoint, so every Tune report of a PBT
trial carries a tiny one that points at the trial's last *committed* Train checkpoint, and a trial restored from a
pointer starts a new Train run seeded with a copy of that checkpoint (so `ray.train.get_checkpoint()` returns it in
any loop). The scheduler records each exploit (donor, step, config change) for the run's status.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import queue
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from ray.train.v2.api.callback import UserCallback
from ray.tune import Trainable
from ray.tune.schedulers import PopulationBasedTraining

from sweep_contracts import s3_layout
from sweep_contracts.timestamps import rfc3339

from . import ray_internals, storage
from .commit_records import record_checkpoint

logger = logging.getLogger(__name__)

POINTER_FILE: Final = "committed_checkpoint.json"  # the one file of a PBT trial's Tune checkpoint
RESULT_TRAIN_RUN_KEY: Final = "train_run"
CHECKPOINT_PATH_KEY: Final = "checkpoint_path"  # what TuneReportCallback adds to a result with a checkpoint (R18)  # the Train run (train/<name>/) a PBT trial's result came from
# Lineage in `_sweep/status.json`: the newest exploits, bounded (a long sweep perturbs thousands of times).
LINEAGE_MAX: Final = 50
_QUEUE_POLL_S: Final = 0.5
_TRAIN_RUN_TOKEN_HEX: Final = 6


# ------------------------------------------------------------------------------------------ the pointer


@dataclass(frozen=True)
class CheckpointPointer:
    """What a PBT trial's Tune checkpoint says: the committed Train checkpoint `train/<train_run>/<checkpoint>` of
    trial `trial_id`, as it stood after the trial's `iteration`-th report with `config`."""

    trial_id: str
    train_run: str
    checkpoint: str
    iteration: int
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str) -> CheckpointPointer:
        doc = json.loads(text)
        names = ("trial_id", "train_run", "checkpoint")
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) and doc[k] for k in names):
            raise ValueError(f"{POINTER_FILE}: expected trial_id, train_run and checkpoint, got {text[:200]!r}")
        for name in (doc["train_run"], doc["checkpoint"]):
            if "/" in name or name in (".", ".."):
                raise ValueError(f"{POINTER_FILE}: {name!r} is not a directory name")
        iteration = doc.get("iteration")
        config = doc.get("config")
        return cls(
            doc["trial_id"],
            doc["train_run"],
            doc["checkpoint"],
            iteration if isinstance(iteration, int) else 0,
            config if isinstance(config, dict) else {},
        )


def read_pointer(checkpoint: Any) -> CheckpointPointer | None:
    """The pointer in a Tune checkpoint (`tune.get_checkpoint()`), None when it holds none (not a PBT trial's)."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        path = os.path.join(directory, POINTER_FILE)
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            return CheckpointPointer.from_json(f.read())


# ------------------------------------------------------------------------------- which Train run starts


@dataclass(frozen=True)
class TrainRunStart:
    """The Train run a PBT trial starts: its name under train/, and the pointer it was seeded from (None: a first
    run, or a continuation of the trial's own run)."""

    name: str
    seeded_from: CheckpointPointer | None = None
    iteration: int = 0  # the Tune reports the trial made before this run (its pointer's)


def latest_committed(snapshot: Mapping[str, Any] | None) -> str | None:
    latest = (snapshot or {}).get(ray_internals.SNAPSHOT_LATEST_RESULT)
    name = latest.get(ray_internals.SNAPSHOT_DIR_NAME) if isinstance(latest, dict) else None
    return name if isinstance(name, str) else None


def choose_train_run(
    trial_id: str,
    pointer: CheckpointPointer | None,
    own_snapshot: Callable[[str], Mapping[str, Any] | None],
    token: Callable[[], str] = lambda: uuid.uuid4().hex[:_TRAIN_RUN_TOKEN_HEX],
) -> TrainRunStart:
    """Pure: no pointer -> the trial's first run (`train/<trialId>`, which Train resumes from its own snapshot on a
    retry). A pointer at the trial's own run whose snapshot still ends at that checkpoint -> continue that run (no
    copy). Anything else (another trial's checkpoint after an exploit, or an own run that committed more than Tune
    saw) -> a new run, seeded from the pointer."""
    if pointer is None:
        return TrainRunStart(trial_id)
    if pointer.trial_id == trial_id and latest_committed(own_snapshot(pointer.train_run)) == pointer.checkpoint:
        return TrainRunStart(pointer.train_run, iteration=pointer.iteration)
    return TrainRunStart(f"{trial_id}-pbt{pointer.iteration}-{token()}", pointer, pointer.iteration)


def seeded_snapshot(checkpoint: str, metrics: Mapping[str, Any], ray_version: str) -> dict[str, Any]:
    """Ray 2.58's `_CheckpointManagerState` naming one committed checkpoint as the latest (checkpoint_manager.py):
    Train's checkpoint manager loads it at the run's start and hands the checkpoint to every worker."""
    result = {"version": 0, "checkpoint_dir_name": checkpoint, "metrics": dict(metrics)}
    return {
        "ray_version": ray_version,
        "checkpoint_results": [result],
        "checkpoint_report_indices": [0],
        "latest_checkpoint_result": result,
        "pending_training_results": [],
        "pending_validation_specs": [],
        "current_report_index": 1,
        "validated_checkpoint_dir_names": [],
        "timed_out_validation_checkpoint_dir_names": [],
        "failed_validation_checkpoint_dir_names": [],
    }


class SeedError(RuntimeError):
    """The donor's committed checkpoint cannot be copied (gone, or not committed)."""


def seed_train_run(train_root: str, run_name: str, pointer: CheckpointPointer) -> str:
    """Copy the pointed committed checkpoint into `train/<run_name>/` with a snapshot that commits it and a commit
    record of the copy; returns the new run's directory. Nothing is written before the donor's snapshot is read."""
    import pyarrow.fs as pafs
    import ray

    source_run = s3_layout.join(train_root, pointer.train_run)
    snapshot = storage.read_json(s3_layout.join(source_run, ray_internals.SNAPSHOT_FILENAME))
    results = [r for r in (snapshot or {}).get("checkpoint_results", []) if isinstance(r, dict)]
    entry = next((r for r in results if r.get(ray_internals.SNAPSHOT_DIR_NAME) == pointer.checkpoint), None)
    if entry is None:
        raise SeedError(
            f"train/{pointer.train_run}/{pointer.checkpoint} is not committed by its run's snapshot; cannot start "
            f"trial's new run from it"
        )
    target_run = s3_layout.join(train_root, run_name)
    fs, source_path = storage.filesystem(s3_layout.join(source_run, pointer.checkpoint))
    _, target_path = storage.filesystem(s3_layout.join(target_run, pointer.checkpoint))
    infos = fs.get_file_info(pafs.FileSelector(source_path, recursive=True, allow_not_found=True))
    files = [i for i in infos if i.type == pafs.FileType.File and i.base_name != s3_layout.COMMIT_RECORD_FILE]
    if not files:
        raise SeedError(f"train/{pointer.train_run}/{pointer.checkpoint} holds no files (deleted?)")
    for info in files:
        rel = info.path[len(source_path.rstrip("/")) + 1 :]
        destination = f"{target_path.rstrip('/')}/{rel}"
        fs.create_dir(posixpath.dirname(destination), recursive=True)
        fs.copy_file(info.path, destination)  # S3: CopyObject, no download
    found = entry.get("metrics")
    metrics: dict[str, Any] = found if isinstance(found, dict) else {}
    storage.write_json(
        s3_layout.join(target_run, ray_internals.SNAPSHOT_FILENAME),
        seeded_snapshot(pointer.checkpoint, metrics, ray.__version__),
    )
    record_checkpoint(s3_layout.join(target_run, pointer.checkpoint))
    logger.info("PBT: train/%s starts from a copy of train/%s/%s (%d files)", run_name, pointer.train_run,
                pointer.checkpoint, len(files))  # fmt: skip
    return target_run


# ------------------------------------------------------------------------------- reporting to Tune


class CommittedCheckpointCallback(UserCallback):
    """Runs in the Train controller after Ray registered a report (its checkpoint committed): hands rank 0's metrics
    and the committed checkpoint's folder to the trial, which reports them to Tune with a pointer. A one-slot queue,
    as TuneReportCallback's: Train waits for Tune to take each report."""

    def __init__(self, report_queue: Any):
        self._queue = report_queue

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        name = posixpath.basename(str(checkpoint.path).rstrip("/")) if checkpoint is not None else None
        self._queue.put((dict(metrics[0]), name))


@dataclass
class PointerReporter:
    """The PBT trial's side: `run(fit)` runs Train's `fit()` on a thread and reports each Train result to Tune from
    the trial's own thread, with a Tune checkpoint pointing at the last committed Train checkpoint (Tune's PBT
    saves and clones the checkpoint of a trial's last result)."""

    trial_id: str
    train_run: str
    config: dict[str, Any]
    report_queue: Any
    train_run_uri: str
    committed: str | None = None  # the last committed checkpoint of this run (a seeded run starts with one)
    iteration: int = 0
    reported: list[dict[str, Any]] = field(default_factory=list)

    def callback(self) -> CommittedCheckpointCallback:
        return CommittedCheckpointCallback(self.report_queue)

    def run(self, fit: Callable[[], Any], report: Callable[..., None] | None = None) -> None:
        from ray import tune

        report = report or tune.report
        outcome: dict[str, BaseException] = {}

        def fit_thread() -> None:
            try:
                fit()
            except BaseException as exc:  # handed to the trial's thread, which raises it as the trial's error
                outcome["error"] = exc

        thread = threading.Thread(target=fit_thread, name=f"pbt-fit-{self.trial_id}", daemon=True)
        thread.start()
        while True:
            item = self._next(thread)
            if item is None:
                break
            self.report_one(*item, report=report)
        thread.join()
        if "error" in outcome:
            raise outcome["error"]

    def _next(self, thread: threading.Thread) -> tuple[dict[str, Any], str | None] | None:
        from ray.util.queue import Empty

        while True:
            try:
                item: tuple[dict[str, Any], str | None] = self.report_queue.get(block=True, timeout=_QUEUE_POLL_S)
                return item
            except (Empty, queue.Empty):
                if not thread.is_alive():
                    try:
                        last: tuple[dict[str, Any], str | None] = self.report_queue.get_nowait()
                        return last
                    except (Empty, queue.Empty):
                        return None

    def report_one(self, metrics: dict[str, Any], checkpoint: str | None, *, report: Callable[..., None]) -> None:
        """One Train result to Tune: the metrics, where they came from, and the pointer (from the first commit on)."""
        from ray import tune

        if checkpoint is not None:
            self.committed = checkpoint
        self.iteration += 1
        metrics = {**metrics, RESULT_TRAIN_RUN_KEY: self.train_run}
        if checkpoint is not None:  # what TuneReportCallback forwards (R18): the progress files and verifier read it
            metrics[CHECKPOINT_PATH_KEY] = s3_layout.strip_scheme(s3_layout.join(self.train_run_uri, checkpoint))
        if self.committed is None:
            report(metrics)
            return
        pointer = CheckpointPointer(self.trial_id, self.train_run, self.committed, self.iteration, self.config)
        directory = tempfile.mkdtemp(prefix="pbt-pointer-")
        try:
            with open(os.path.join(directory, POINTER_FILE), "w", encoding="utf-8") as f:
                f.write(pointer.to_json())
            report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))
        finally:
            shutil.rmtree(directory, ignore_errors=True)


class DrainReportsOnStop(Trainable):
    """Mixed into a PBT trial's function trainable before the abort mixin: when Tune pauses or stops the trial, its
    Train controller may be blocked handing a report to the one-slot queue nobody reads any more; a thread empties
    the queue until the trial actor goes, so the abort behind it runs."""

    def cleanup(self) -> None:
        report_queue = _QUEUES.get(self.trial_id)
        if report_queue is not None:
            threading.Thread(target=_drain_forever, args=(report_queue,), name="pbt-drain", daemon=True).start()
        super().cleanup()


_QUEUES: dict[str, Any] = {}


def _drain_forever(report_queue: Any) -> None:
    from ray.util.queue import Empty

    while True:
        try:
            report_queue.get(block=True, timeout=_QUEUE_POLL_S)
        except Empty:
            continue
        except Exception:  # the queue actor is gone with the trial
            return


def new_report_queue(trial_id: str) -> Any:
    from ray.util.queue import Queue

    report_queue = Queue(1, actor_options={"num_cpus": 0})
    _QUEUES[trial_id] = report_queue
    return report_queue


# ------------------------------------------------------------------------------------------ lineage


@dataclass(frozen=True)
class Exploit:
    """One exploit as Tune's PBT log shows it: `trial` continues from `donor`'s checkpoint at the donor's `step`,
    with the donor's config changed as `changes` says ({param: [donor's value, new value]})."""

    trial: str
    donor: str
    step: int
    changes: dict[str, list[Any]]
    at: str

    def document(self) -> dict[str, Any]:
        return {"trial": self.trial, "donor": self.donor, "step": self.step, "changes": self.changes, "at": self.at}


def config_changes(before: Mapping[str, Any], after: Mapping[str, Any], names: list[str]) -> dict[str, list[Any]]:
    return {n: [before.get(n), after.get(n)] for n in names if before.get(n) != after.get(n)}


def lineage_document(exploits: list[dict[str, Any]], total: int) -> dict[str, Any]:
    """`lineage` in `_sweep/status.json`: the newest LINEAGE_MAX exploits, oldest first, and how many there were."""
    return {"exploits": total, "entries": exploits[-LINEAGE_MAX:]}


class LineagePBT(PopulationBasedTraining):
    """Tune's PopulationBasedTraining, recording each exploit for the run's status (bounded)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lineage: list[dict[str, Any]] = []
        self.exploits = 0

    def _exploit(self, tune_controller: Any, trial: Any, trial_to_clone: Any) -> None:
        donor_config = dict(trial_to_clone.config)
        step = self._trial_state[trial_to_clone].last_train_time
        super()._exploit(tune_controller, trial, trial_to_clone)
        names = list(self._hyperparam_mutations)
        exploit = Exploit(
            str(trial.trial_id),
            str(trial_to_clone.trial_id),
            int(step),
            config_changes(donor_config, trial.config, names),
            rfc3339(),
        )
        self.exploits += 1
        self.lineage = [*self.lineage, exploit.document()][-LINEAGE_MAX:]
        logger.info("PBT: trial %s continues from trial %s at step %d with %s", exploit.trial, exploit.donor,
                    exploit.step, exploit.changes or "the same config")  # fmt: skip

    def restore_lineage(self, document: Any) -> None:
        """An ended run's lineage (its `_sweep/status.json`), continued by a resume."""
        if isinstance(document, dict) and isinstance(document.get("entries"), list):
            self.lineage = [e for e in document["entries"] if isinstance(e, dict)][-LINEAGE_MAX:]
            total = document.get("exploits")
            self.exploits = total if isinstance(total, int) else len(self.lineage)

    def document(self) -> dict[str, Any]:
        return lineage_document(self.lineage, self.exploits)


class ClampToParamSpace:
    """PBT's explore step multiplies a continuous value by 0.8 or 1.2: keep it within the paramSpace bounds."""

    def __init__(self, bounds: Mapping[str, tuple[float, float]]):
        self.bounds = dict(bounds)

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        for name, (low, high) in self.bounds.items():
            value = config.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                clamped = min(max(value, low), high)
                config[name] = type(value)(clamped)
        return config
