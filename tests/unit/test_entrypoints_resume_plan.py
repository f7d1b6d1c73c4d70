"""Continuing a sweep on its run root (training_entrypoints.resume): run mode, Tune's experiment state, the searcher,
attempt records (R16). Documents are built with ray 2.58's own objects (`Trial.get_json_state`,
`BasicVariantGenerator.save_to_dir`), so they have the shape `TuneController.resume` reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from ray import tune
from ray.tune.execution.experiment_state import _find_newest_experiment_checkpoint
from ray.tune.execution.placement_groups import PlacementGroupFactory
from ray.tune.experiment import Experiment
from ray.tune.experiment.trial import Trial
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Searcher, SearchGenerator

from sweep_contracts import constants
from sweep_contracts.runspec import build_run_spec
from sweep_contracts.s3_layout import RunLayout
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep
from training_entrypoints import resume
from training_entrypoints.checkpointing import state_dict_digest
from training_entrypoints.resume import RunMode
from training_entrypoints.sweep import _record_start, decide_run_mode, plan_sweep


@pytest.mark.parametrize(
    ("attempt", "has_experiment", "result_attempt", "mode"),
    [
        (1, False, None, RunMode.NEW),
        (1, True, None, RunMode.RESUME),  # a KubeRay retry inside the first attempt
        (1, True, 1, RunMode.FINISHED),
        (2, True, 1, RunMode.RESUME),  # the resume of an ended sweep continues its experiment
        (2, True, None, RunMode.RESUME),  # attempt 2 retried before it wrote a result
        (2, True, 2, RunMode.FINISHED),  # a retry of an attempt that already finished
        (3, True, 2, RunMode.RESUME),
        (2, False, None, RunMode.NOTHING_TO_RESUME),  # fail closed: nothing to continue
        (2, False, 1, RunMode.NOTHING_TO_RESUME),
    ],
)
def test_the_attempt_number_decides_what_a_used_run_root_means_R16(
    attempt: int, has_experiment: bool, result_attempt: int | None, mode: RunMode
) -> None:
    assert resume.decide_run_mode(attempt, has_experiment, result_attempt) is mode


def test_a_result_file_without_an_attempt_is_the_first_attempts_R16() -> None:
    assert resume.document_attempt({"bestTrial": None}) == 1
    assert resume.document_attempt(None) is None
    assert decide_run_mode(True, True, attempt=2) is RunMode.RESUME
    assert decide_run_mode(True, True) is RunMode.FINISHED
    with pytest.raises(ValueError, match="attempt: got 0"):
        resume.document_attempt({"attempt": 0})


# ------------------------------------------------------------------------------ Tune's experiment state


def trial_row(trial_id: str, status: str, last_result: dict[str, Any], num_failures: int = 0) -> list[str]:
    trial = Trial(
        "trial_driver", stub=True, trial_id=trial_id, placement_group_factory=PlacementGroupFactory([{"CPU": 0.1}])
    )
    trial.create_placement_group_factory()  # as TuneController.add_trial does before the trial is saved
    trial.set_status(status)
    trial.run_metadata.last_result = last_result
    trial.run_metadata.num_failures = num_failures
    return list(trial.get_json_state())


def experiment_state() -> dict[str, Any]:
    """An experiment the deadline ended: one trial returned, one was stopped mid-run, one never started, one errored."""
    return {
        "trial_data": [
            trial_row("a_00000", Trial.TERMINATED, {"epoch": 3, "done": True}),
            trial_row("a_00001", Trial.TERMINATED, {"epoch": 1, "done": False}),
            trial_row("a_00002", Trial.TERMINATED, {}),
            trial_row("a_00003", Trial.ERROR, {"epoch": 0, "done": False}, num_failures=1),
            trial_row("a_00004", Trial.RUNNING, {"epoch": 2, "done": False}),
        ],
        "runner_data": {
            "_stopper": {"_type": "CLOUDPICKLE_FALLBACK", "value": "00"},
            "_should_stop_experiment": False,
            "_iteration": 9,
        },
        "stats": {},
    }


def test_trials_the_deadline_stopped_are_told_apart_from_finished_ones() -> None:
    """Tune marks both TERMINATED (TuneController._schedule_trial_stop); only `done` in the last result differs."""
    plan = resume.plan_continue(resume.restored_trials(experiment_state()))
    assert plan.finished == ("a_00000",)
    assert plan.stopped == ("a_00001", "a_00002")
    assert plan.errored == ("a_00003",)
    assert plan.unfinished == ("a_00004",)
    assert set(plan.continued) == {"a_00001", "a_00002", "a_00003", "a_00004"}


def test_the_reopened_state_resumes_stopped_trials_retries_errored_ones_and_drops_the_spent_stopper() -> None:
    state = experiment_state()
    before = json.dumps(state)
    reopened = resume.reopen_experiment_state(state, resume.plan_continue(resume.restored_trials(state)))
    assert json.dumps(state) == before  # a new document
    trials = {}
    for trial_json, metadata_json in reopened["trial_data"]:
        trial = Trial.from_json_state(trial_json, stub=True)  # what TuneController._restore_trials does
        trial.restore_run_metadata(metadata_json)
        trials[trial.trial_id] = trial
    assert {t: trials[t].status for t in trials} == {
        "a_00000": Trial.TERMINATED,  # kept: not run again
        "a_00001": Trial.PENDING,
        "a_00002": Trial.PENDING,
        "a_00003": Trial.ERROR,  # Tuner.restore(resume_errored=True) requeues it
        "a_00004": Trial.PENDING,  # Trial.__setstate__ turns RUNNING into PENDING itself
    }
    assert trials["a_00003"].run_metadata.num_failures == 0  # trialFailures retries again in this attempt
    assert trials["a_00000"].run_metadata.last_result["done"] is True
    assert "_stopper" not in reopened["runner_data"] and "_should_stop_experiment" not in reopened["runner_data"]
    assert reopened["runner_data"]["_iteration"] == 9


def test_the_newest_experiment_state_is_the_one_tune_resumes_from(tmp_path: Path) -> None:
    original = json.dumps(experiment_state())
    for stamp in ("2026-12-03_10-00-00", "2026-12-03_11-00-00"):
        (tmp_path / f"experiment_state-{stamp}.json").write_text(original)
    (tmp_path / "basic-variant-state-2026-12-03_12-00-00.json").write_text("{}")
    _, path = resume.newest_experiment_state(str(tmp_path))
    assert path == _find_newest_experiment_checkpoint(str(tmp_path))
    plan = resume.prepare_experiment(str(tmp_path))
    assert plan.stopped == ("a_00001", "a_00002")
    rewritten = json.loads(Path(path).read_text())
    assert [json.loads(t)["status"] for t, _ in rewritten["trial_data"]][1] == Trial.PENDING
    assert (tmp_path / "experiment_state-2026-12-03_10-00-00.json").read_text() == original  # older ones untouched
    assert resume.prepare_experiment(str(tmp_path / "nowhere")) == resume.ContinuePlan()


def test_a_malformed_experiment_state_names_the_row() -> None:
    with pytest.raises(ValueError, match=r"trial_data\[0\]: expected two JSON documents"):
        resume.restored_trials({"trial_data": [["{", "{}"]]})


# ------------------------------------------------------------------------------ the searcher


def _noop(config: dict[str, Any]) -> None:
    return None


def ended_generator(tmp_path: Path, *, num_samples: int, grid: bool) -> tuple[list[Trial], Path]:
    """A BasicVariantGenerator that drew two trials before the deadline stopped the experiment, saved as Tune does."""
    space: dict[str, Any] = {"lr": tune.loguniform(1e-3, 1e-1)}
    if grid:
        space["hidden"] = tune.grid_search([16, 32])
    generator = BasicVariantGenerator(max_concurrent=2, random_state=7)
    generator.add_configurations([Experiment(name="tune", run=_noop, config=space, num_samples=num_samples)])
    drawn = [generator.next_trial(), generator.next_trial()]
    generator.on_trial_complete(drawn[0].trial_id)  # finished; drawn[1] was stopped without telling the searcher
    generator.set_finished()  # TuneController._stop_experiment_if_needed
    generator.save_to_dir(str(tmp_path), session_str="2026-12-03_10-00-00")
    return drawn, tmp_path


def draw_all(generator: Any) -> list[Trial]:
    trials = []
    while (trial := generator.next_trial()) is not None:
        generator.on_trial_complete(trial.trial_id)
        trials.append(trial)
    return trials


def test_a_raised_num_samples_adds_new_configurations_after_the_old_ones(tmp_path: Path) -> None:
    drawn, where = ended_generator(tmp_path, num_samples=3, grid=False)
    generator = resume.ContinuingVariantGenerator(num_samples=5, continued=[drawn[1].trial_id], max_concurrent=2)
    generator.restore_from_dir(str(where))
    assert not generator.is_finished() and generator.total_samples == 5
    assert generator._live_trials == {drawn[1].trial_id}  # the stopped trial still holds its slot until it ends
    generator.on_trial_complete(drawn[1].trial_id)
    new = draw_all(generator)
    prefix = drawn[0].trial_id[:-5]
    assert [t.trial_id for t in new] == [f"{prefix}{i:05d}" for i in (2, 3, 4)]
    seen = {d.config["lr"] for d in drawn}
    assert not seen & {t.config["lr"] for t in new}  # never a configuration it already ran
    assert generator.is_finished()


def test_the_same_num_samples_only_draws_what_the_deadline_left_undrawn(tmp_path: Path) -> None:
    _, where = ended_generator(tmp_path, num_samples=2, grid=True)  # 2 samples x 2 grid points: 4 trials
    generator = resume.ContinuingVariantGenerator(num_samples=2, continued=[], max_concurrent=2)
    generator.restore_from_dir(str(where))
    new = draw_all(generator)
    assert len(new) == 2 and generator.total_samples == 4
    assert sorted(t.config["hidden"] for t in new) == [16, 32]


def test_a_raised_grid_repeats_the_grid_as_tune_counts_num_samples(tmp_path: Path) -> None:
    _, where = ended_generator(tmp_path, num_samples=1, grid=True)
    generator = resume.ContinuingVariantGenerator(num_samples=2, continued=[], max_concurrent=2)
    generator.restore_from_dir(str(where))
    new = draw_all(generator)
    assert generator.total_samples == 4
    assert sorted(t.config["hidden"] for t in new) == [16, 32]


def test_a_lower_num_samples_drops_no_trial() -> None:
    assert resume.samples_to_add(4, 2) == 0
    assert resume.samples_to_add(2, 5) == 3


class RecordingSearcher(Searcher):
    """A Searcher that suggests lr = 1, 2, 3 ... and keeps what it suggested in its state (as optuna keeps its study)."""

    def __init__(self) -> None:
        super().__init__(metric="val_loss", mode="min")
        self.suggested: list[float] = []

    def suggest(self, trial_id: str) -> dict[str, Any]:
        self.suggested.append(float(len(self.suggested) + 1))
        return {"lr": self.suggested[-1]}

    def on_trial_complete(self, trial_id: str, result: Any = None, error: bool = False) -> None:
        return None

    def get_state(self) -> dict[str, Any]:
        return {"suggested": list(self.suggested)}

    def set_state(self, state: dict[str, Any]) -> None:
        self.suggested = list(state["suggested"])

    def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
        Path(checkpoint_dir, f"recording-{session_str}.json").write_text(json.dumps(self.get_state()))

    def restore_from_dir(self, checkpoint_dir: str) -> None:
        (path,) = Path(checkpoint_dir).glob("recording-*.json")
        self.set_state(json.loads(path.read_text()))


def test_a_searcher_continues_where_it_stopped_with_more_samples(tmp_path: Path) -> None:
    first = SearchGenerator(ConcurrencyLimiter(RecordingSearcher(), max_concurrent=2))
    first.add_configurations([Experiment(name="tune", run=_noop, config={}, num_samples=2)])
    stopped = [first.next_trial(), first.next_trial()]
    first.set_finished()
    first.save_to_dir(str(tmp_path), session_str="s1")

    restored = resume.continuing_search(
        RecordingSearcher(), num_samples=3, continued=[stopped[1].trial_id], max_concurrent_trials=2
    )
    assert isinstance(restored, resume.ContinuingSearchGenerator)
    restored.restore_from_dir(str(tmp_path))
    assert restored.searcher.live_trials == {t.trial_id for t in stopped} & {stopped[1].trial_id}
    restored.searcher.on_trial_complete(stopped[1].trial_id)
    new = draw_all(restored)
    assert [t.config["lr"] for t in new] == [3.0]  # not 1.0 or 2.0 again
    assert restored.is_finished()


def test_random_and_grid_search_continue_in_a_variant_generator() -> None:
    continued = resume.continuing_search(
        BasicVariantGenerator(max_concurrent=3), num_samples=4, continued=["x"], max_concurrent_trials=None
    )
    assert isinstance(continued, resume.ContinuingVariantGenerator) and continued.max_concurrent == 3


# ------------------------------------------------------------------------------ attempt records


def test_attempt_records_keep_earlier_attempts_and_a_retry_keeps_its_start() -> None:
    first = resume.finish_record(
        resume.attempt_record(1, started_at="t0", deadline_at=100.0, num_samples=2),
        ended_at="t1", phase="DeadlineExceeded", new_trials=["b", "a"],
    )  # fmt: skip
    assert first["newTrials"] == ["a", "b"] and first["phase"] == "DeadlineExceeded"
    second = resume.attempt_record(2, started_at="t2", deadline_at=200.0, num_samples=3, continued=["b"])
    rows = resume.with_attempt([first], second)
    assert [r["attempt"] for r in rows] == [1, 2] and rows[1]["resumedTrials"] == ["b"]
    retried = resume.with_attempt(rows, {**second, "startedAt": "t3"})
    assert [r["startedAt"] for r in retried] == ["t0", "t2"]


def test_a_result_from_before_attempts_were_recorded_stands_for_attempt_one() -> None:
    legacy = {"deadlineReached": True, "errors": [], "finishedAt": "t1"}
    assert resume.previous_attempts(None, legacy) == [
        {"attempt": 1, "startedAt": None, "endedAt": "t1", "phase": "DeadlineExceeded"}
    ]
    assert resume.previous_attempts({"attempts": [{"attempt": 1, "phase": "Failed"}]}, legacy)[0]["phase"] == "Failed"
    assert resume.previous_attempts(None, None) == []


def run_env(tmp_path: Path, attempt: int) -> dict[str, str]:
    body = json.loads(
        build_run_spec(parse_sweep(changed(cpu_sweep(), {})), "abc123", storage_uri=str(tmp_path)).to_json()
    )
    if attempt > 1:
        body["attempt"] = attempt
    return {constants.ENV_RUN_SPEC: json.dumps(body), constants.ENV_DEADLINE_AT: "1900000000"}


def test_attempt_two_starts_from_the_ended_status_keeping_its_trial_records_R16(tmp_path: Path) -> None:
    plan1 = plan_sweep(run_env(tmp_path, 1), load_user_code=False)
    ledger, wrote = _record_start(plan1)
    assert wrote and ledger.facts()["attempt"] == 1
    status_path = Path(plan1.run_spec.layout.status_path)
    ended = {
        **json.loads(status_path.read_text()),
        "phase": "DeadlineExceeded",
        "trialResults": [{"id": "a_00000", "status": "TERMINATED", "checkpointUri": "x"}],
        "attempts": [{**ledger.record, "endedAt": "t1", "phase": "DeadlineExceeded"}],
    }
    status_path.write_text(json.dumps(ended))

    _, wrote2 = _record_start(plan_sweep(run_env(tmp_path, 2), load_user_code=False))
    status = json.loads(status_path.read_text())
    assert wrote2 and status["phase"] == "Starting" and status["attempt"] == 2
    assert status["trialResults"] == ended["trialResults"]  # the guard still sees what was reported
    assert [(a["attempt"], a["phase"]) for a in status["attempts"]] == [(1, "DeadlineExceeded"), (2, "Running")]

    _, wrote_again = _record_start(plan_sweep(run_env(tmp_path, 2), load_user_code=False))  # a KubeRay retry
    assert not wrote_again and json.loads(status_path.read_text()) == status


# ------------------------------------------------------------------------------ weights digest


def test_the_weights_digest_is_the_same_in_memory_and_in_the_checkpoint_file_R7(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    torch.save(model.state_dict(), tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    assert state_dict_digest(model.state_dict()) == state_dict_digest(loaded)
    with torch.no_grad():
        model[0].weight[0, 0] += 1e-6
    assert state_dict_digest(model.state_dict()) != state_dict_digest(loaded)


def test_the_run_spec_carries_the_attempt_and_a_first_attempt_spec_is_unchanged_R16(tmp_path: Path) -> None:
    from sweep_contracts.runspec import RunSpec

    sweep = parse_sweep(changed(cpu_sweep(), {}))
    first = build_run_spec(sweep, "abc123", storage_uri=str(tmp_path))
    assert "attempt" not in json.loads(first.to_json()) and RunSpec.from_json(first.to_json()).attempt == 1
    third = build_run_spec(sweep, "abc123", storage_uri=str(tmp_path), attempt=3)
    assert RunSpec.from_json(third.to_json()) == third
    body = json.loads(third.to_json())
    for bad in (0, "2", True):
        with pytest.raises(ValueError, match=r"SWEEP_RUN_SPEC attempt: got"):
            RunSpec.from_json(json.dumps({**body, "attempt": bad}))


def test_a_completed_trial_is_saved_with_done_even_after_tune_cached_its_metadata(tmp_path: Path) -> None:
    """Tune sets `done` in place on the last result (TuneController._process_trial_result); the metadata's JSON was
    cached by an earlier experiment checkpoint. The progress callback's on_trial_complete drops that cache."""
    from training_entrypoints.progress import SweepProgressCallback

    trial = Trial(
        "trial_driver", stub=True, trial_id="a_00000", placement_group_factory=PlacementGroupFactory([{"CPU": 0.1}])
    )
    trial.create_placement_group_factory()
    trial.run_metadata.last_result = {"epoch": 3, "done": False}
    trial.run_metadata.get_json_state()  # an experiment checkpoint after the last report
    trial.run_metadata.last_result.update(done=True)  # what Tune does when the function returns
    assert json.loads(trial.run_metadata.get_json_state())["last_result"]["done"] is False  # Tune's stale cache
    callback = SweepProgressCallback(RunLayout(str(tmp_path)), "val_loss", "min", demand_reader=None)
    callback.on_trial_complete(0, [trial], trial)
    callback.flush()
    row = [trial.get_json_state()[0], trial.run_metadata.get_json_state()]
    assert resume.restored_trials({"trial_data": [row]})[0].done is True


def _logged_trial(tmp_path: Path) -> Any:
    from types import SimpleNamespace

    import pyarrow.fs as pafs

    local, remote = tmp_path / "driver" / "t_00000", tmp_path / "storage" / "tune" / "t_00000"
    storage = SimpleNamespace(trial_fs_path=str(remote), storage_filesystem=pafs.LocalFileSystem())
    return SimpleNamespace(
        trial_id="t_00000",
        local_path=str(local),
        storage=storage,
        init_local_path=lambda: local.mkdir(parents=True, exist_ok=True),
    )


def test_a_continued_trial_keeps_the_rows_its_earlier_attempt_uploaded(tmp_path: Path) -> None:
    """On a new driver a continued trial's result.json and progress.csv come back from storage before Tune's loggers
    open them for appending (Tune itself brings them back only for trials with a Tune checkpoint)."""
    trial = _logged_trial(tmp_path)
    remote = Path(trial.storage.trial_fs_path)
    remote.mkdir(parents=True)
    (remote / "result.json").write_text('{"epoch": 0}\n{"epoch": 1}\n')
    (remote / "progress.csv").write_text("epoch\n0\n1\n")
    resume.KeepTrialLogs().on_trial_start(0, [trial], trial)
    assert (Path(trial.local_path) / "result.json").read_text() == '{"epoch": 0}\n{"epoch": 1}\n'
    assert (Path(trial.local_path) / "progress.csv").read_text() == "epoch\n0\n1\n"
    # A file this driver has been writing is not replaced by the stored copy.
    (Path(trial.local_path) / "result.json").write_text('{"epoch": 0}\n{"epoch": 1}\n{"epoch": 2}\n')
    resume.KeepTrialLogs().on_trial_start(0, [trial], trial)
    assert (Path(trial.local_path) / "result.json").read_text().count("epoch") == 3


def test_a_trial_that_never_reported_has_nothing_to_keep(tmp_path: Path) -> None:
    trial = _logged_trial(tmp_path)
    resume.KeepTrialLogs().on_trial_start(0, [trial], trial)
    assert not Path(trial.local_path).exists()


def test_tune_runs_keep_trial_logs_before_its_own_loggers() -> None:
    """What KeepTrialLogs relies on: Tune appends its default JSON and CSV loggers after the user's callbacks."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
    from ray.tune.utils.callback import _create_default_callbacks

    callbacks = _create_default_callbacks([resume.KeepTrialLogs()], metric="val_loss", mode="min")
    kinds = [type(c) for c in callbacks]
    assert kinds[0] is resume.KeepTrialLogs
    assert kinds.index(JsonLoggerCallback) > 0 and kinds.index(CSVLoggerCallback) > 0
