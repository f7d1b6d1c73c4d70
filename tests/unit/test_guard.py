"""The checkpoint guard's decisions as tables over facts (R22): what releases, what holds, what is audited.

docs/guard.md states the same rules; each row there names the test here that proves it.
"""

from __future__ import annotations

from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator.reconcile.guard import (
    Backoff,
    GuardFacts,
    GuardTarget,
    RunRecords,
    Verify,
    after_verification,
    backoff_seconds,
    decide_before_verification,
    skip_requested,
)
from sweep_operator.reconcile.verdicts import (
    EMPTY_RUN_ROOT,
    Hold,
    Release,
    decide_after_verification,
    reported_checkpoints,
    target_of,
)
from tests.support.fakes import FakeResult, Finding

TARGET = GuardTarget("s3://b/sweeps/ml/digits-abc123", "http://127.0.0.1:9", "us-east-1", True, 60, "digits", "abc123")
BACKOFF = {"attempt": 0, "base_backoff": 30, "max_backoff": 600}


BEFORE = [
    # (case, facts, expected decision type, audited, words in the reason)
    (
        "escape hatch",
        GuardFacts("RayJob", "j", skip=True, target=TARGET),
        Release,
        True,
        constants.ANNOTATION_SKIP_VERIFICATION,
    ),
    (
        "escape hatch even without a target",
        GuardFacts("RayCluster", "c", skip=True),
        Release,
        True,
        "without verifying",
    ),
    ("never admitted", GuardFacts("TrainingSweep", "s", never_admitted=True), Release, False, "never admitted"),
    (
        "target unknown",
        GuardFacts("TrainingSweep", "s", target_unknown="no run root recorded", started=("a run id in status",)),
        Hold,
        False,
        "no run root recorded (a run id in status)",
    ),
    ("target unknown, no reason given", GuardFacts("RayCluster", "c"), Hold, False, "unknown"),
    (
        "verification disabled at admission",
        GuardFacts("RayJob", "j", target=GuardTarget("s3://b/p", verify=False)),
        Release,
        True,
        "verifyCheckpoints was false",
    ),
    ("a run that may have written", GuardFacts("RayJob", "j", target=TARGET), Verify, False, ""),
]


@pytest.mark.parametrize("case,facts,kind,audited,words", BEFORE, ids=[row[0] for row in BEFORE])
def test_guard_before_verification(case: str, facts: GuardFacts, kind: type, audited: bool, words: str) -> None:
    decision = decide_before_verification(facts, **BACKOFF)
    assert isinstance(decision, kind), case
    if isinstance(decision, Release):
        assert decision.audit is audited and words in decision.reason
    elif isinstance(decision, Hold):
        assert words in decision.reason and "sweepctl release" in decision.reason, "a hold says why and the way out"
        assert decision.retry_after == 30
    else:
        assert decision == Verify(TARGET)


REPORTED = {
    "bestTrial": {"id": "t1", "checkpointUri": "s3://b/sweeps/ml/digits-abc123/train/t1/checkpoint_epoch-000001"}
}
AFTER = [
    # (case, result, status.json, result.json, readable, expected, audited, words)
    ("verified checkpoints", FakeResult(True, checked=4), None, None, True, Release, False, "verified complete"),
    (
        "a missing file",
        FakeResult(False, (Finding("missing-file"),), checked=3),
        REPORTED,
        None,
        True,
        Hold,
        False,
        "missing-file",
    ),
    ("S3 error", FakeResult(False, (Finding("s3-error"),), checked=0), None, None, False, Hold, False, "s3-error"),
    (
        "empty run root and an S3 error",
        FakeResult(
            False,
            (
                Finding(EMPTY_RUN_ROOT),
                Finding("s3-error"),
            ),
            checked=0,
        ),
        None,
        None,
        True,
        Hold,
        False,
        "s3-error",
    ),
    (
        "an empty run root",
        FakeResult(False, (Finding(EMPTY_RUN_ROOT),), checked=0),
        None,
        None,
        True,
        Release,
        True,
        "nothing to protect",
    ),
    (
        "no checkpoint, none reported",
        FakeResult(True, checked=0),
        {"bestTrial": None, "trials": {"total": 1, "errored": 1}},
        None,
        True,
        Release,
        True,
        "reports none",
    ),
    ("no checkpoint, but one reported", FakeResult(True, checked=0), REPORTED, None, True, Hold, False, "reported 1"),
    (
        "no checkpoint, result reports one",
        FakeResult(True, checked=0),
        None,
        {"trialResults": [{"checkpointUri": "s3://b/x"}]},
        True,
        Hold,
        False,
        "reported 1",
    ),
    (
        "no checkpoint, status unreadable",
        FakeResult(True, checked=0),
        None,
        None,
        False,
        Hold,
        False,
        "could not be read",
    ),
]


@pytest.mark.parametrize("case,result,progress,final,readable,kind,audited,words", AFTER, ids=[row[0] for row in AFTER])
def test_guard_after_verification(
    case: str, result: FakeResult, progress: Any, final: Any, readable: bool, kind: type, audited: bool, words: str
) -> None:
    decision = decide_after_verification(result, progress=progress, final=final, progress_readable=readable, **BACKOFF)
    assert isinstance(decision, kind), case
    assert after_verification(RunRecords(result, progress, final, readable), Backoff(0, 30, 600)) == decision
    assert words in decision.reason
    if isinstance(decision, Release):
        assert decision.audit is audited


def test_a_deletions_holds_are_spaced_by_its_attempt_and_its_sweeps_backoff_settings() -> None:
    """The pure decisions take the backoff as a fact: the deletion's attempt and its sweep's retry settings (the
    defaults when the sweep is gone or its spec cannot be read)."""
    from sweep_operator.reconcile.facts import DeletionFacts
    from tests.support.factories import changed, cpu_sweep

    sweep = changed(cpu_sweep(), {"spec.deletion.retryBackoffSeconds": 5, "spec.deletion.maxRetryBackoffSeconds": 60})
    assert Backoff.of(DeletionFacts("RayJob", {}, attempt=3, sweep=sweep)) == Backoff(3, 5, 60)
    assert Backoff.of(DeletionFacts("RayJob", {}, attempt=1)) == Backoff(1, 30.0, 600.0)
    assert Backoff.of(DeletionFacts("RayJob", {}, attempt=1, sweep={"spec": {"image": 7}})) == Backoff(1, 30.0, 600.0)
    failed = FakeResult(False, (Finding("missing-file"),), checked=1)
    held = after_verification(RunRecords(failed), Backoff(3, 5, 60))
    assert isinstance(held, Hold) and held.retry_after == 40


def test_guard_holds_with_capped_exponential_backoff() -> None:
    """R22: a failed check keeps the finalizer and re-checks with capped exponential backoff."""
    failed = FakeResult(False, (Finding("missing-file"),), checked=1)
    first, tenth = (decide_after_verification(failed, attempt=n, base_backoff=30, max_backoff=600) for n in (0, 10))
    assert isinstance(first, Hold) and isinstance(tenth, Hold)
    assert (first.retry_after, tenth.retry_after) == (30, 600)
    assert [backoff_seconds(a, 5, 60) for a in range(6)] == [5, 10, 20, 40, 60, 60]


def test_guard_target_travels_as_one_annotation_and_fails_closed_when_unreadable() -> None:
    """Issue 12, defect 4: the facts are fixed at creation; a damaged annotation yields no target (so: hold)."""
    text = TARGET.to_annotation()
    assert GuardTarget.from_annotation(text) == TARGET
    assert target_of({"metadata": {"annotations": {constants.ANNOTATION_GUARD: text}}}) == TARGET
    for damaged in ("", "{", "[]", '{"runRoot": 3}', '{"runRoot": "/local/path"}', '{"endpointUrl": "x"}'):
        assert GuardTarget.from_annotation(damaged) is None, damaged
    assert GuardTarget.from_annotation('{"runRoot": "s3://b/p", "verify": "no"}').verify is True, (
        "only an explicit false skips"
    )


def test_escape_hatch_annotation_is_exactly_true() -> None:
    assert skip_requested(None, {constants.ANNOTATION_SKIP_VERIFICATION: " True "})
    assert not skip_requested({constants.ANNOTATION_SKIP_VERIFICATION: "yes"}, None)


def test_reported_checkpoints_reads_status_and_result() -> None:
    assert reported_checkpoints(
        REPORTED, {"trialResults": [{"checkpointUri": "s3://b/y"}, {"checkpointUri": None}]}
    ) == ["s3://b/sweeps/ml/digits-abc123/train/t1/checkpoint_epoch-000001", "s3://b/y"]
    assert reported_checkpoints(None, {"bestTrial": "garbage"}) == []


# ---- one deletion: the decision, the verification it takes, what it tells
SWEEP = {"metadata": {"name": "digits", "namespace": "ml", "generation": 3}, "spec": {}, "status": {"phase": "Running"}}
RAYJOB = {"metadata": {"name": "digits-abc123", "namespace": "ml"}}


@pytest.mark.parametrize(
    ("facts", "result", "decided", "verified", "event", "on_sweep_too"),
    [
        (GuardFacts("RayJob", "digits-abc123", target=TARGET), FakeResult(True), Release, True, "Released", False),
        (
            GuardFacts("RayJob", "digits-abc123", target=TARGET),
            FakeResult(False, (Finding("missing-file"),)),
            Hold,
            True,
            "NotVerified",
            True,
        ),
        (GuardFacts("RayJob", "digits-abc123"), None, Hold, False, "NotVerified", True),  # no target: no verification
        (GuardFacts("RayJob", "digits-abc123", skip=True, target=TARGET), None, Release, False, "Bypassed", True),
    ],
)
def test_a_deletion_verifies_only_when_asked_and_tells_the_sweep_of_a_hold_or_a_bypass(
    facts: GuardFacts, result: FakeResult | None, decided: type, verified: bool, event: str, on_sweep_too: bool
) -> None:
    from sweep_operator.reconcile.facts import DeletionFacts
    from sweep_operator.reconcile.guard import Backoff, deletion_notice
    from sweep_operator.reconcile.guard_pipeline import verify_and_decide

    deletion = DeletionFacts("RayJob", RAYJOB, attempt=0, sweep=SWEEP)
    asked: list[str] = []

    def verify(target: GuardTarget) -> FakeResult:
        asked.append(target.run_root)
        assert result is not None
        return result

    def documents(target: GuardTarget) -> tuple[None, None, bool]:
        asked.append("documents")
        return None, None, True

    decision, ran = verify_and_decide(facts, Backoff.of(deletion), verify, documents)
    assert isinstance(decision, decided) and ran is (result if verified else None)
    assert asked == ([TARGET.run_root, "documents"] if verified else [])
    notice = deletion_notice(deletion, facts, decision)
    assert notice.reason.endswith(event) and "digits-abc123" in notice.message
    assert notice.objects == ((RAYJOB, SWEEP) if on_sweep_too else (RAYJOB,))
    assert notice.type == ("Normal" if event == "Released" else "Warning")


def test_a_sweeps_own_deletion_is_told_once_and_a_hold_without_verification_says_why() -> None:
    from sweep_operator.reconcile.facts import DeletionFacts
    from sweep_operator.reconcile.guard import deletion_notice, held_status

    deletion = DeletionFacts("TrainingSweep", SWEEP, attempt=2, sweep=SWEEP)
    hold = Hold("the run root cannot be determined", 120)
    notice = deletion_notice(deletion, GuardFacts("TrainingSweep", "digits"), hold)
    assert notice.objects == (SWEEP,)  # the sweep is the object: one Event, not two
    assert notice.message.endswith("the run root cannot be determined; re-checking in 120s")
    (condition,) = held_status(SWEEP, 1_800_000_000.0, notice.message)["conditions"]
    assert (condition.type, condition.status) == ("CheckpointsVerified", "False")
    assert condition.reason == "NotVerified"
    assert condition.message == notice.message and condition.observed_generation == 3


@pytest.mark.parametrize(
    ("finalizers", "missing"),
    [([constants.FINALIZER], False), ([], True), (["other/finalizer"], True)],
)
def test_the_operator_adds_the_guards_finalizer_itself(finalizers: list[str], missing: bool) -> None:
    from sweep_operator.reconcile.guard import missing_finalizer

    assert missing_finalizer({"metadata": {"name": "s", "finalizers": finalizers}}) is missing


@pytest.mark.parametrize(
    ("labels", "finalizers", "lost"),
    [
        ({}, [constants.FINALIZER], True),
        ({constants.LABEL_SWEEP: "digits"}, [constants.FINALIZER], False),
        ({}, [], False),  # not guarded (released, or never ours)
    ],
)
def test_a_guarded_object_without_its_sweep_label_is_noticed(
    labels: dict[str, str], finalizers: list[str], lost: bool
) -> None:
    from sweep_operator.reconcile.guard import label_lost

    assert label_lost({"metadata": {"name": "j", "labels": labels, "finalizers": finalizers}}) is lost


@pytest.mark.parametrize(
    ("status", "decided", "words"),
    [
        ({}, Release, "never admitted"),
        ({"phase": "Deleting", "message": 5}, Release, "never admitted"),  # a field that says nothing of a run
        ({"runId": "abc123"}, Hold, "run abc123 has no recorded run root (status.guard) (a run id in status)"),
        ({"runId": 7}, Hold, "status.runId cannot be read (status.runId (unreadable))"),
        ({"trainingStartedAt": 5}, Hold, "status.trainingStartedAt (unreadable)"),
        ({"rayClusterName": ["digits-abc123-raycluster"]}, Hold, "status.rayClusterName (unreadable)"),
        ({"guard": {"runRoot": 5}}, Hold, "status.guard cannot be read"),
        ("not an object", Hold, "status cannot be read"),
    ],
)
def test_a_sweeps_status_record_that_does_not_parse_holds_its_deletion(status: Any, decided: type, words: str) -> None:
    """The sweep's status is parsed when read, and a field that does not parse is left out; a record of a run left
    out that way is never taken for no record (fail closed): the deletion holds, and says which record."""
    from sweep_operator.reconcile.facts import DeletionFacts
    from sweep_operator.reconcile.guard import StorageDefaults, guard_facts

    sweep = {"metadata": {"name": "digits", "namespace": "ml"}, "spec": {}, "status": status}
    facts = guard_facts(DeletionFacts("TrainingSweep", sweep, attempt=0, sweep=sweep), StorageDefaults())
    decision = decide_before_verification(facts, **BACKOFF)
    assert isinstance(decision, decided) and words in decision.reason, decision
