"""The driver's decisions before Ray starts: input checks (R2, R13), run mode (R16), time budget, diagnosis (R12, R14)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_contracts.problems import SpecError
from sweep_contracts.runspec import build_run_spec
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep
from training_entrypoints.search import EntrypointError
from training_entrypoints.sweep import (
    RunMode,
    deadline_was_reached,
    decide_run_mode,
    plan_sweep,
    require_train_v2,
    resource_diagnosis,
    time_budget_s,
)


def run_spec_env(changes: dict[str, Any] | None = None, spec_patch: dict[str, Any] | None = None) -> dict[str, str]:
    """SWEEP_RUN_SPEC as the renderer writes it; `spec_patch` edits the JSON afterwards (values no validator saw)."""
    body = json.loads(build_run_spec(parse_sweep(changed(cpu_sweep(), changes or {})), "abc123").to_json())
    for path, value in (spec_patch or {}).items():
        node = body["spec"]
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return {constants.ENV_RUN_SPEC: json.dumps(body), constants.ENV_DEADLINE_AT: "1900000000"}


def test_a_valid_run_spec_plans_the_whole_search_before_ray_starts() -> None:
    plan = plan_sweep(run_spec_env())
    assert plan.deadline_at == 1900000000.0
    assert set(plan.param_space) == {"lr", "hidden", "epochs"}
    assert type(plan.searcher).__name__ == "BasicVariantGenerator"
    assert type(plan.scheduler).__name__ == "FIFOScheduler"


def test_an_unknown_scheduler_fails_before_any_trial_naming_the_field_R13() -> None:
    with pytest.raises(SpecError, match=r"spec\.tune\.scheduler\.type: got 'bogus'; allowed"):
        plan_sweep(run_spec_env(spec_patch={"tune.scheduler.type": "bogus"}))


def test_a_metric_scheduler_without_metric_fails_before_any_trial_R13() -> None:
    with pytest.raises(SpecError, match=r"spec\.tune\.metric: required by scheduler 'asha'"):
        plan_sweep(run_spec_env(spec_patch={"tune.scheduler.type": "asha", "tune.metric": None, "tune.mode": None}))


def test_a_missing_train_loop_fails_before_any_trial() -> None:
    with pytest.raises(EntrypointError, match=r"spec\.trainLoop: cannot import module 'nowhere'"):
        plan_sweep(run_spec_env({"spec.trainLoop": "nowhere:train_loop"}))


def test_missing_run_spec_says_where_it_comes_from() -> None:
    with pytest.raises(ValueError, match="SWEEP_RUN_SPEC is not set"):
        plan_sweep({})


@pytest.mark.parametrize("value", ["0", "false"])
def test_train_v1_is_refused_R2(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """R2: V2 is the 2.58 default; the entrypoint never runs with RAY_TRAIN_V2_ENABLED turned off."""
    monkeypatch.setenv(constants.ENV_TRAIN_V2, value)
    with pytest.raises(EntrypointError, match="needs Ray Train V2"):
        require_train_v2()


@pytest.mark.parametrize("value", [None, "1"])
def test_train_v2_default_or_explicit_is_accepted_R2(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(constants.ENV_TRAIN_V2, raising=False)
    else:
        monkeypatch.setenv(constants.ENV_TRAIN_V2, value)
    require_train_v2()


@pytest.mark.parametrize(
    ("has_result", "has_experiment", "mode"),
    [
        (False, False, RunMode.NEW),
        (False, True, RunMode.RESUME),
        (True, True, RunMode.FINISHED),
        (True, False, RunMode.FINISHED),
    ],
)
def test_reusing_a_run_root_is_a_decision_new_resume_or_finished_R16(
    has_result: bool, has_experiment: bool, mode: RunMode
) -> None:
    """R16: a run's prefix is its own; an experiment there means a retry of this run (resume), a result means done."""
    assert decide_run_mode(has_result, has_experiment) is mode


def test_time_budget_ends_graceful_stop_seconds_before_the_deadline() -> None:
    assert time_budget_s(1000.0, 60, now=400.0) == 540.0
    assert time_budget_s(None, 60, now=400.0) is None
    assert time_budget_s(1000.0, 60, now=990.0) < 0


def test_deadline_reached_is_judged_on_the_stop_time_not_on_how_long_fit_took() -> None:
    # budget computed at t=400 (540 s to the stop time at 940); setup ate 30 s, and fit() ran 515 s until Tune stopped
    # the trials at 940 + a little: fit alone ran for less than the budget, yet the deadline was what stopped it.
    assert deadline_was_reached(1000.0, 60, now=940.5)
    assert deadline_was_reached(1000.0, 60, now=940.0)
    assert not deadline_was_reached(1000.0, 60, now=939.0)  # finished before the stop time: the trials ended
    assert not deadline_was_reached(None, 60, now=10_000.0)  # no deadline, nothing reached


def test_resource_diagnosis_names_what_a_trial_asks_and_what_exists_R12_R14(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(constants.ENV_WORKER_GROUP_START_TIMEOUT, "5")
    run_spec = build_run_spec(
        parse_sweep(changed(cpu_sweep(), {"spec.trial.resourcesPerWorker": {"cpu": "2", "gpu": 0, "memory": "1Gi"}})),
        "abc123",
    )
    text = resource_diagnosis(
        run_spec,
        {"CPU": 4.0, "memory": 1e9, "node:127.0.0.1": 1.0, constants.TRIAL_DRIVER_RESOURCE: 2.0},
        {"CPU": 0, constants.TRIAL_DRIVER_RESOURCE: 1},
    )
    assert text.startswith(
        "each trial asks for 2 train worker(s) x {CPU: 2} plus a trial driver {CPU: 0, sweep_trial_driver: 1}"
    )
    assert "the cluster has {CPU: 4, sweep_trial_driver: 2} in total" in text
    assert "Workers wait 5 s per attempt" in text and "controllerFailures=3" in text
