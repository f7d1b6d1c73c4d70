"""Continuing a sweep on its own run root: a RayJob retry, or a resumed attempt N > 1 of an ended sweep (R16).

Tune 2.58 restores an experiment exactly as it ended, which is not what continuing needs:

- a trial the deadline stopped is TERMINATED like one that finished (`TuneController._schedule_trial_stop`); only its
  last result tells them apart: Tune sets `done` when the function returns or a scheduler/stopper ends the trial;
- the experiment's own stopper comes back from the saved state (`TuneController.__setstate__` restores `_stopper`),
  so a spent time budget would stop the resumed run at once, whatever budget the new attempt has;
- the search algorithm is restored marked finished (`set_finished` at the stop) and with its old `num_samples`:
  `Tuner.restore` has no way to raise it (`TunerInternal._fit_resume` passes no `num_samples`, and
  `tune.run` skips `add_configurations` on a resumed run).

So the entrypoint edits Tune's newest experiment-state file before `Tuner.restore` reads it (stopped trials reopened,
the stopper dropped, errored trials given their retry budget again) and restores the search algorithm into the
subclasses below, which reopen it and raise its sample count to the run spec's `tune.numSamples`. Another Tuner
writing into the same experiment (the other way to raise num_samples) would replace Tune's experiment state, and a
later retry would restore that second Tuner alone: the first attempt's trials would drop out of the result. The
experiment-state format is ray 2.58's (pinned, R1); the e2e test `tests/e2e/test_sandbox_resume.py` runs it for real.

The pure parts (decisions over the run root's documents) come first; I/O is at the bottom.
"""

from __future__ import annotations

import enum
import itertools
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.tune import Callback
from ray.tune.result import EXPR_PROGRESS_FILE, EXPR_RESULT_FILE
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter, SearchGenerator

from sweep_contracts.tune_state import TrialRecord, trial_records

logger = logging.getLogger(__name__)

# Tune's trial statuses (ray.tune.experiment.Trial): the ones a restore resumes without being asked twice.
TERMINATED, ERROR, PENDING = "TERMINATED", "ERROR", "PENDING"
EXPERIMENT_STATE_PATTERN = "experiment_state-*.json"  # TuneController.CKPT_FILE_TMPL
# runner_data keys that belong to the attempt that wrote them, not to the one that continues.
_ATTEMPT_BOUND_RUNNER_KEYS = ("_stopper", "_should_stop_experiment")


class RunMode(enum.Enum):
    """What to do with the run root (R16): each run has its own prefix; reusing one is a recovery, said out loud."""

    NEW = "new"
    RESUME = "resume"  # Tune restores its experiment: a RayJob retry inside an attempt, or attempt N > 1
    FINISHED = "finished"  # this attempt already wrote result.json: refuse to overwrite it
    NOTHING_TO_RESUME = "nothing-to-resume"  # attempt N > 1 on a run root without an experiment: fail closed


def decide_run_mode(attempt: int, has_experiment: bool, result_attempt: int | None) -> RunMode:
    """`result_attempt`: the attempt that wrote `_sweep/result.json` (None when there is none; a file from before
    attempts were recorded counts as attempt 1). A result of an earlier attempt is what a resume continues."""
    if result_attempt is not None and result_attempt >= attempt:
        return RunMode.FINISHED
    if has_experiment:
        return RunMode.RESUME
    return RunMode.NOTHING_TO_RESUME if attempt > 1 else RunMode.NEW


def document_attempt(document: Mapping[str, Any] | None) -> int | None:
    """The attempt a status/result document was written by; 1 for documents from before attempts were recorded."""
    if document is None:
        return None
    value = document.get("attempt", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"attempt: got {value!r}; expected an integer >= 1")
    return value


# ------------------------------------------------------------------------------------ Tune's trials


@dataclass(frozen=True)
class RestoredTrial:
    """One trial as Tune's experiment state left it."""

    id: str
    status: str
    done: bool  # its last result says the trial ended on its own terms (returned, or a scheduler/stopper ended it)


@dataclass(frozen=True)
class ContinuePlan:
    """Which restored trials are kept and which continue."""

    finished: tuple[str, ...] = ()  # kept with their results; never run again
    stopped: tuple[str, ...] = ()  # TERMINATED without `done`: stopped by the experiment's stop (the deadline)
    unfinished: tuple[str, ...] = ()  # RUNNING/PENDING/PAUSED: the driver was lost mid-run
    errored: tuple[str, ...] = ()  # ERROR: retried from their last committed checkpoint

    @property
    def continued(self) -> tuple[str, ...]:
        return self.stopped + self.unfinished + self.errored

    @property
    def known(self) -> tuple[str, ...]:
        return self.finished + self.continued


def plan_continue(trials: Iterable[RestoredTrial]) -> ContinuePlan:
    finished, stopped, unfinished, errored = [], [], [], []
    for trial in trials:
        if trial.status == TERMINATED:
            (finished if trial.done else stopped).append(trial.id)
        elif trial.status == ERROR:
            errored.append(trial.id)
        else:
            unfinished.append(trial.id)
    return ContinuePlan(tuple(finished), tuple(stopped), tuple(unfinished), tuple(errored))


def _trial_entries(state: Mapping[str, Any]) -> list[TrialRecord]:
    records = trial_records(state)  # the one reader of Tune's trial_data (sweep_contracts.tune_state)
    for i, record in enumerate(records):
        if "status" not in record.trial:
            raise ValueError(f"experiment state: trial_data[{i}]: no status")
    return records


def restored_trials(state: Mapping[str, Any]) -> list[RestoredTrial]:
    """The trials of a Tune experiment-state document (`experiment_state-*.json`, the file TuneController.resume reads)."""
    return [
        RestoredTrial(
            id=record.trial_id, status=str(record.trial["status"]), done=record.last_result.get("done") is True
        )
        for record in _trial_entries(state)
    ]


def reopen_experiment_state(state: Mapping[str, Any], plan: ContinuePlan) -> dict[str, Any]:
    """The experiment state a continuing attempt restores from (a new document; `state` is left as it is).

    Stopped trials go back to PENDING, which Tune's resume_unfinished continues with the same trial id (so Train
    finds its snapshot under train/<trialId>). Errored trials get their failure count reset: a resume is the user's
    request to try again, with `failurePolicy.trialFailures` retries as in any attempt (Tune counts failures per trial
    across restores otherwise, and one exhausted in the last attempt would never be retried). The experiment's
    stopper is dropped: the attempt's own time budget (SWEEP_DEADLINE_AT) replaces it."""
    stopped, errored = set(plan.stopped), set(plan.errored)
    rows = []
    for record in _trial_entries(state):
        trial, metadata, trial_id = record.trial, record.metadata, record.trial_id
        if trial_id in stopped:
            trial = {**trial, "status": PENDING}
        if trial_id in errored:
            metadata = {**metadata, "num_failures": 0, "num_failures_after_restore": 0}
        rows.append([json.dumps(trial, indent=2), json.dumps(metadata, indent=2)])
    runner = {k: v for k, v in dict(state.get("runner_data") or {}).items() if k not in _ATTEMPT_BOUND_RUNNER_KEYS}
    return {**state, "trial_data": rows, "runner_data": runner}


# ------------------------------------------------------------------------------------ the searcher


def samples_to_add(have: int, target: int) -> int:
    """How many more samples raise a search from `have` to `target` (never fewer: trials are not dropped)."""
    return max(0, target - have)


class ContinuingVariantGenerator(BasicVariantGenerator):
    """Random or grid search restored for a continuing attempt: reopened, `num_samples` raised to the run spec's.

    Tune calls `restore_from_dir` while resuming (TuneController.resume), after which this generator is the saved one
    (same random state, same trial-id prefix and counter) plus, when `num_samples` is higher, one more variant
    iterator for the extra samples: new configurations drawn after the old ones, never the same trial again. For a
    grid, `num_samples` counts repetitions of the grid, as in Tune."""

    def __init__(self, *, num_samples: int, continued: Iterable[str], **kwargs: Any):
        super().__init__(**kwargs)
        self._continue_num_samples = num_samples
        self._continue_live = frozenset(continued)

    def restore_from_dir(self, dirpath: str) -> None:
        target, live = self._continue_num_samples, self._continue_live
        super().restore_from_dir(dirpath)  # replaces this object's state with the saved generator's
        self._continue_num_samples, self._continue_live = target, live
        extend_variant_generator(self, target, live)


def extend_variant_generator(generator: BasicVariantGenerator, num_samples: int, continued: Iterable[str]) -> None:
    """Reopen a restored BasicVariantGenerator and raise it to `num_samples` (ray 2.58's attributes)."""
    from ray.tune.search.basic_variant import _TrialIterator

    iterators = list(generator._iterators)
    # Trials stopped by the deadline never told the generator they ended; keep only those that will run again.
    generator._live_trials = set(generator._live_trials) & set(continued)
    generator._finished = False
    if iterators:
        have = sum(it.num_samples for it in iterators)
        extra = samples_to_add(have, num_samples)
        if extra:
            per_sample = generator._total_samples // have if have else 1  # grid points per sample
            iterators.append(
                _TrialIterator(
                    uuid_prefix=generator._uuid_prefix,
                    num_samples=extra,
                    unresolved_spec=iterators[-1].unresolved_spec,
                    constant_grid_search=generator._constant_grid_search,
                    points_to_evaluate=[],
                    lazy_eval=False,
                    start=generator._total_samples,
                    random_state=generator._random_state,
                )
            )
            generator._total_samples += extra * per_sample
    generator._iterators = iterators
    generator._trial_generator = itertools.chain(*iterators)
    generator._trial_iter = None


class ContinuingSearchGenerator(SearchGenerator):
    """A Searcher (optuna) restored for a continuing attempt: its own state (what it already tried) comes back from
    the experiment, so it does not suggest those again; the sample count is raised and the finished mark cleared."""

    def __init__(self, searcher: Any, *, num_samples: int, continued: Iterable[str]):
        super().__init__(searcher)
        self._continue_num_samples = num_samples
        self._continue_live = frozenset(continued)

    def restore_from_dir(self, dirpath: str) -> None:
        super().restore_from_dir(dirpath)
        self._total_samples = self._total_samples + samples_to_add(self._total_samples, self._continue_num_samples)
        self._finished = False
        limiter = self.searcher
        while limiter is not None and not isinstance(limiter, ConcurrencyLimiter):
            limiter = getattr(limiter, "searcher", None)
        if limiter is not None:
            limiter.live_trials = set(limiter.live_trials) & set(self._continue_live)


def continuing_search(
    restored: Any, *, num_samples: int, continued: Iterable[str], max_concurrent_trials: int | None
) -> Any:
    """The search algorithm a restored Tuner runs with, built around the one Tune pickled with the experiment
    (`TuneConfig.search_alg` as the first attempt gave it: a BasicVariantGenerator, or a Searcher)."""
    if restored is None or isinstance(restored, BasicVariantGenerator):
        return ContinuingVariantGenerator(
            num_samples=num_samples,
            continued=continued,
            max_concurrent=getattr(restored, "max_concurrent", 0) or 0,
            constant_grid_search=getattr(restored, "_constant_grid_search", False),
        )
    if isinstance(restored, SearchGenerator):
        restored = restored.searcher
    if max_concurrent_trials and not isinstance(restored, ConcurrencyLimiter):
        restored = ConcurrencyLimiter(restored, max_concurrent=max_concurrent_trials)  # what tune.run would add
    return ContinuingSearchGenerator(restored, num_samples=num_samples, continued=continued)


# ------------------------------------------------------------------------------------ attempt records


def attempt_record(
    attempt: int,
    *,
    started_at: str,
    deadline_at: float | None,
    num_samples: int,
    continued: Iterable[str] = (),
) -> dict[str, Any]:
    """One attempt as `_sweep/status.json` and `_sweep/result.json` list it (`attempts[]`), while it runs."""
    return {
        "attempt": attempt,
        "startedAt": started_at,
        "endedAt": None,
        "phase": "Running",
        "deadlineAt": deadline_at,
        "numSamples": num_samples,
        "resumedTrials": sorted(continued),
        "newTrials": [],
    }


def finish_record(record: Mapping[str, Any], *, ended_at: str, phase: str, new_trials: Iterable[str]) -> dict[str, Any]:
    return {**record, "endedAt": ended_at, "phase": phase, "newTrials": sorted(new_trials)}


def previous_attempts(status: Mapping[str, Any] | None, result: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The attempts the run root records: status.json's list (newest), else result.json's; a result from before
    attempts were recorded stands for attempt 1."""
    for document in (status, result):
        rows = (document or {}).get("attempts")
        if isinstance(rows, list) and all(isinstance(r, dict) and isinstance(r.get("attempt"), int) for r in rows):
            return [dict(r) for r in rows]
    if result is not None:
        phase = (
            "Failed" if result.get("errors") else ("DeadlineExceeded" if result.get("deadlineReached") else "Succeeded")
        )
        return [
            {
                "attempt": document_attempt(result),
                "startedAt": None,
                "endedAt": result.get("finishedAt"),
                "phase": phase,
            }
        ]
    return []


def with_attempt(attempts: Iterable[Mapping[str, Any]], record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`attempts` with `record` in its place (a retry inside the attempt rewrites its own record), oldest first."""
    rows = {int(r["attempt"]): dict(r) for r in attempts}
    previous = rows.get(int(record["attempt"]))
    if previous and previous.get("startedAt") and record.get("startedAt") and previous.get("endedAt") is None:
        record = {**record, "startedAt": previous["startedAt"]}  # a KubeRay retry: the attempt began earlier
    rows[int(record["attempt"])] = dict(record)
    return [rows[k] for k in sorted(rows)]


# ------------------------------------------------------------------------------------ I/O


def newest_experiment_state(tune_dir: str) -> tuple[Any, str] | None:
    """(filesystem, path) of the experiment-state file Tune's resume reads (the newest by name), None without one."""
    import fnmatch

    import pyarrow.fs as pafs

    from . import storage

    fs, path = storage.filesystem(tune_dir)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=False))
    except FileNotFoundError:
        return None
    names = sorted(
        i.base_name
        for i in infos
        if i.type == pafs.FileType.File and fnmatch.fnmatch(i.base_name, EXPERIMENT_STATE_PATTERN)
    )
    return (fs, f"{path.rstrip('/')}/{names[-1]}") if names else None


def prepare_experiment(tune_dir: str) -> ContinuePlan:
    """Read Tune's newest experiment state under `tune_dir`, write back the reopened one; the plan. The file is
    rewritten whole (one PUT on S3): a driver lost right after still restores a consistent experiment."""
    found = newest_experiment_state(tune_dir)
    if found is None:
        return ContinuePlan()
    fs, path = found
    with fs.open_input_stream(path) as stream:
        state = json.loads(stream.read())
    plan = plan_continue(restored_trials(state))
    reopened = reopen_experiment_state(state, plan)
    if reopened != state:
        with fs.open_output_stream(path) as stream:
            stream.write(json.dumps(reopened).encode())
    logger.info(
        "continuing the experiment in %s: %d finished trial(s) kept, %d stopped, %d unfinished, %d errored continue",
        tune_dir, len(plan.finished), len(plan.stopped), len(plan.unfinished), len(plan.errored),
    )  # fmt: skip
    return plan


class KeepTrialLogs(Callback):
    """A continued trial keeps its learning curve. Tune 2.58's JSON and CSV loggers bring a restored trial's
    result.json and progress.csv back from storage only when the trial holds a Tune checkpoint
    (`LoggerCallback._restore_from_remote`); our checkpoints are Train V2's, under train/<trialId>, so on a new
    driver those files would start empty and be uploaded over the earlier rows. This callback copies them into the
    trial's local directory first: Tune runs the user's callbacks before the default loggers it appends
    (`tune.utils.callback._create_default_callbacks`), which then append to what was there."""

    FILES = (EXPR_RESULT_FILE, EXPR_PROGRESS_FILE)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        import pyarrow.fs as pafs

        for name in self.FILES:
            local = Path(trial.local_path, name)
            if local.exists() and local.stat().st_size > 0:
                continue  # this driver has been writing it: nothing to bring back
            remote = f"{str(trial.storage.trial_fs_path).rstrip('/')}/{name}"
            if Path(remote) == local:
                continue  # local storage: the remote file is this one
            fs = trial.storage.storage_filesystem
            if fs.get_file_info(remote).type != pafs.FileType.File:
                continue  # a trial that never reported
            trial.init_local_path()
            pafs.copy_files(remote, local.as_posix(), source_filesystem=fs)
            logger.info("trial %s: kept its %s from %s", trial.trial_id, name, remote)
