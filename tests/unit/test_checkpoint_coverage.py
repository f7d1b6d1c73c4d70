"""Said early, not at the deletion: trials that reported `warnAfterReports` times or ended without a committed
checkpoint give the condition CheckpointsCommitted=False and one Warning Event per change, from the run's progress
document (pure: checkpoint_coverage, run_phase.coverage_changes, decide_run, decide_finish)."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_contracts.checkpoint_coverage import checkpoint_coverage
from sweep_contracts.status_models import SweepStatus
from sweep_operator.reconcile.run_phase import coverage_changes, decide_finish, decide_run
from sweep_operator.status import read_status, rfc3339
from tests.support.fakes import T0, FakeResult
from tests.unit.test_run_phase import RUNNING, facts, job

CKPT = "s3://b/sweeps/ns/s-r1/train/t1/checkpoint_1"


def row(trial: str, status: str = "RUNNING", reports: int = 0, checkpoint: str | None = None) -> dict[str, Any]:
    return {"id": trial, "status": status, "reports": reports, "checkpointUri": checkpoint}


@pytest.mark.parametrize(
    ("rows", "judged", "without"),
    [
        ([row("t1", reports=2)], None, None),  # below the threshold, still running: nothing to say yet
        ([row("t1", reports=3)], 1, ["t1"]),
        ([row("t1", reports=3, checkpoint=CKPT)], 1, []),
        ([row("t1", "TERMINATED", reports=1)], 1, ["t1"]),  # ended with none
        ([row("t1", "ERROR", reports=0)], None, None),  # failed before its first report: nothing it could save
        ([row("t1", "ERROR", reports=1), row("t2", reports=5, checkpoint=CKPT)], 2, ["t1"]),
        ([{"id": "t1", "status": "TERMINATED", "reports": "many"}, "junk"], 1, ["t1"]),  # the tenant's document
    ],
)
def test_checkpoint_coverage(rows: list[Any], judged: int | None, without: list[str] | None) -> None:
    coverage = checkpoint_coverage({"trialResults": rows}, 3)
    if judged is None:
        assert coverage is None
        return
    assert coverage is not None
    assert coverage.judged == judged and [t.id for t in coverage.without] == without
    assert coverage.ok is (not without)


def test_a_sweep_with_nothing_to_protect_says_so_and_how_to_fix_it() -> None:
    coverage = checkpoint_coverage({"trialResults": [row("t1", reports=4), row("t2", "TERMINATED", 6)]}, 3)
    assert coverage is not None
    assert coverage.message.startswith("no trial has committed a checkpoint: this sweep has nothing to resume from")
    assert "trial t1 reported 3+ times; trial t2 ended" in coverage.message
    assert "spec.checkpoints.warnAfterReports (now 3)" in coverage.message
    assert "R7" not in coverage.message and "issue" not in coverage.message


def test_the_warning_is_an_event_once_per_change_and_a_condition_always() -> None:
    first = checkpoint_coverage({"trialResults": [row("t1", reports=3)]}, 3)
    conditions, events = coverage_changes(SweepStatus(conditions=[]), first)
    assert [(c[0], c[1], c[2]) for c in conditions] == [("CheckpointsCommitted", False, "NoCommittedCheckpoint")]
    assert [(e.type, e.reason) for e in events] == [("Warning", "NoCommittedCheckpoint")]
    stored = {"type": "CheckpointsCommitted", "status": "False", "reason": "NoCommittedCheckpoint"}
    said = read_status({"conditions": [{**stored, "message": conditions[0][3], "lastTransitionTime": rfc3339(T0)}]})
    assert said.conditions, "a stored condition, as the API keeps it"
    later = checkpoint_coverage({"trialResults": [row("t1", reports=9)]}, 3)  # more reports, the same fact
    assert coverage_changes(said, later)[1] == []
    ended = checkpoint_coverage({"trialResults": [row("t1", "TERMINATED", reports=9)]}, 3)
    assert [e.reason for e in coverage_changes(said, ended)[1]] == ["NoCommittedCheckpoint"]
    fixed = checkpoint_coverage({"trialResults": [row("t1", reports=9, checkpoint=CKPT)]}, 3)
    conditions, events = coverage_changes(said, fixed)
    assert conditions[0][1] is True and events == []


def test_a_running_sweep_gets_the_condition_and_event_within_the_pass_that_polled_it() -> None:
    coverage = checkpoint_coverage({"trialResults": [row("t1", reports=3)]}, 3)
    decision = decide_run(facts(RUNNING, job(), coverage=coverage))
    assert decision.status is not None
    condition = next(c for c in decision.status.conditions or [] if c.type == "CheckpointsCommitted")
    assert (condition.status, condition.reason) == ("False", "NoCommittedCheckpoint")
    assert [e.reason for e in decision.events] == ["NoCommittedCheckpoint"]


def test_the_spec_sets_the_threshold_and_the_finish_judges_the_result() -> None:
    result = {"trialResults": [row("t1", "TERMINATED", reports=2)]}
    decision = decide_finish(facts({**RUNNING, "phase": "Succeeded"}, None), FakeResult(True), None, result)
    assert decision.status is not None
    condition = next(c for c in decision.status.conditions or [] if c.type == "CheckpointsCommitted")
    assert condition.status == "False"
    assert "NoCommittedCheckpoint" in [e.reason for e in decision.events]
    running = checkpoint_coverage({"trialResults": [row("t1", reports=4)]}, 5)
    assert running is None  # a loop that checkpoints every 5 reports sets warnAfterReports: 5


def test_run_local_prints_the_same_warning_while_it_runs_once_per_change(capsys: pytest.CaptureFixture[str]) -> None:
    from sweep_operator.cli.run_local import ProgressLine

    progress = ProgressLine(planned=1, warn_after_reports=3)
    progress({"trials": {"total": 1, "running": 1}, "trialResults": [row("t1", reports=2)]})
    assert "warning" not in capsys.readouterr().err
    for reports in (3, 4):  # the same fact twice: said once
        progress({"trials": {"total": 1, "running": 1}, "trialResults": [row("t1", reports=reports)]})
    err = capsys.readouterr().err
    assert err.count("run-local: warning: no trial has committed a checkpoint") == 1
    progress.warn_if_uncheckpointed({"trialResults": [row("t1", "TERMINATED", reports=5)]})
    assert "trial t1 ended" in capsys.readouterr().err
