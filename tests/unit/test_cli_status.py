"""`sweepctl status`'s text: what a user reads, never a Python dict or another scheduler's fields."""

from __future__ import annotations

import pytest

from sweep_operator.cli.status import format_status

STATUS = {
    "phase": "Running",
    "message": "running: RayJob digits-abc123 Running",
    "runId": "abc123",
    "rayJobName": "digits-abc123",
    "trialsSummary": "3/8 (2 running)",
    "trials": {"total": 6, "pending": 1, "running": 2, "terminated": 3, "errored": 0},
    "bestTrial": {
        "id": "t1",
        "metric": "val_loss",
        "value": 0.12345678901234,
        "config": {"lr": 0.0031622776601683794, "hidden": 64, "nesterov": True, "layers": [64, 32]},
    },
}


def test_status_prints_counts_and_the_best_config_as_words_not_python_dicts() -> None:
    """Issue 28: `trials: 3/8  {'total': 6, ...}` and `{'lr': 0.0031622776601683794}` were Python reprs."""
    text = format_status("digits", "ml", STATUS)
    lines = text.splitlines()
    assert "  trials:      3/8  (1 pending, 2 running, 3 terminated)" in lines  # `2 running` once
    assert "  best trial:  t1  val_loss=0.123457" in lines
    assert "  config:      lr=0.003162  hidden=64  nesterov=true  layers=[64,32]" in lines
    assert "{'" not in text and "True" not in text


def test_status_before_any_trial_has_no_empty_brackets() -> None:
    text = format_status("digits", "ml", {"phase": "Starting", "trialsSummary": "0/8", "trials": {"total": 0}})
    assert "  trials:      0/8" in text.splitlines() and "()" not in text


def test_the_sandbox_summary_prints_the_best_config_as_words(capsys: pytest.CaptureFixture[str]) -> None:
    from sweep_operator.cli.sandbox import _report

    _report({"phase": "Succeeded", "bestTrial": STATUS["bestTrial"], "checkpoints": {"verified": True}})
    out = capsys.readouterr().out
    assert "best trial:  t1  val_loss=0.123457\n" in out and "config:      lr=0.003162  hidden=64" in out
    assert "{'" not in out


def test_progress_counts_are_out_of_the_trials_the_sweep_asks_for(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28: run-local's line and the sandbox's bar counted out of the trials Ray had started (`0/1`)."""
    from sweep_operator.cli.run_local import ProgressLine
    from sweep_operator.cli.sandbox import _finished_of

    ProgressLine(planned=100)({"trials": {"total": 1, "running": 1}})
    assert "trials 0/100 done, 1 running, 0 errored" in capsys.readouterr().err
    assert _finished_of({"trialsSummary": "2/100 (1 running)"}) == (2, 100)
    assert _finished_of({}) == (0, 0)


def test_status_says_how_much_gpu_time_was_held_without_training_by_cause() -> None:
    """Issue 26: the GPU-seconds a held deletion (or a preemption) kept, as status.idleGpuSeconds records them."""
    text = format_status(
        "digits", "ml", {"phase": "Deleting", "idleGpuSeconds": {"heldDeletion": 7200.0, "preemption": 360.0}}
    )
    assert "  idle GPUs:   held deletion 2 GPU-h, after a preemption 0.1 GPU-h" in text.splitlines(), text
    assert "idle GPUs" not in format_status("digits", "ml", {"phase": "Running"})
    every = {"heldDeletion": 3600.0, "preemption": 3600.0, "stopping": 36.0, "unscheduledTrials": 1800.0}
    text = format_status("digits", "ml", {"phase": "Running", "idleGpuSeconds": every})
    line = "  idle GPUs:   held deletion 1 GPU-h, after a preemption 1 GPU-h, stopping 0.01 GPU-h, no trial running 0.5 GPU-h"
    assert line in text.splitlines(), text
