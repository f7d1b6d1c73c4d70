"""Resume decisions (reconcile.resume, pure): when a resume starts, from what, with which deadline; when it is
refused and what the status says; the automatic policy after a cluster loss (issue 16)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from sweep_contracts.status_models import SweepStatus
from sweep_operator.reconcile import attempts
from sweep_operator.reconcile import resume as r
from sweep_operator.reconcile.attempts import Attempt, RayJobEnd, RunRootCheck
from sweep_operator.reconcile.resume import (
    AutoResume,
    Idle,
    NotResumable,
    Refuse,
    ResumeFacts,
    StartAttempt,
    VerifyFirst,
)
from sweep_operator.reconcile.verdicts import target_of
from sweep_operator.status import read_status, status_document, updated

NOW = 1_800_000_000.0
ROOT = "s3://bucket/sweeps/ml/digits-abc123"
VERIFIED = RunRootCheck(ROOT, verified=True, checked=4)
FIRST = Attempt(
    1,
    "digits-abc123",
    started_at=NOW - 4000,
    ended_at=NOW - 400,
    outcome="DeadlineExceeded",
    active_seconds=3600,
    deadline_at=NOW - 400,
    num_samples=4,
)
FAILED_EARLY = replace(FIRST, ended_at=NOW - 3000, outcome="Failed")  # ran 1000 of its 3600 s
# What KubeRay v1.7.0 (rayjob_controller.go) leaves on a RayJob whose head is gone, in K8sJobMode.
HEAD_UNREACHABLE = RayJobEnd(
    "Failed",
    "JobStatusCheckTimeoutExceeded",
    "Job status checks have been failing since 2026-12-03 14:00:00; exceeded timeout of 300s",
    "RUNNING",
)
SUBMITTER_LOST_HEAD = RayJobEnd(
    "Failed",
    "SubmissionFailed",
    "Job submission has failed. Reason: BackoffLimitExceeded. Message: Job has reached the specified backoff limit",
    "RUNNING",
)


def facts(**changes: object) -> ResumeFacts:
    base = ResumeFacts(
        sweep="digits",
        phase="DeadlineExceeded",
        run_id="abc123",
        now=NOW,
        requested_generation=1,
        resumed_generation=0,
        attempts=(FIRST,),
        num_samples=4,
        startup_seconds=600,
        graceful_stop_seconds=60,
        max_active_seconds=3 * 24 * 3600,
    )
    return replace(base, **changes)


def stored(row: Attempt) -> dict:
    """An attempt's row as the API stores it (camelCase JSON)."""
    return row.to_status().model_dump(by_alias=True, exclude_none=True, mode="json")


# ------------------------------------------------------------------------------------------- manual resume


@pytest.mark.parametrize(
    ("changes", "expected", "says"),
    [
        pytest.param({"requested_generation": 0}, Idle, "", id="no spec.resume"),
        pytest.param({"requested_generation": 2, "resumed_generation": 2}, Idle, "", id="generation already acted on"),
        pytest.param({"deleting": True}, Idle, "", id="sweep being deleted"),
        pytest.param({"phase": "Running"}, NotResumable, "the sweep is Running, not ended", id="running"),
        pytest.param({"phase": "Queued"}, NotResumable, "the sweep is Queued, not ended", id="queued"),
        pytest.param({"phase": None, "run_id": None}, NotResumable, "not yet admitted, not ended", id="never admitted"),
        pytest.param({"phase": "Invalid", "run_id": None}, NotResumable, "Invalid and never ran", id="invalid"),
        pytest.param({"phase": "Failed", "run_id": None}, NotResumable, "status.runId is unset", id="ended, no run id"),
        pytest.param(
            {"phase": "Succeeded"}, NotResumable, "raise spec.tune.numSamples", id="succeeded, same numSamples"
        ),
        pytest.param(
            {"resume_active_seconds": None}, NotResumable, "spec.resume.activeSeconds", id="deadline spent, no new time"
        ),
        pytest.param(
            {"resume_active_seconds": None, "attempts": (replace(FIRST, active_seconds=None),)},
            NotResumable,
            "deadline is unknown",
            id="budget of the last attempt unknown",
        ),
        pytest.param({"resume_active_seconds": 3600}, VerifyFirst, "", id="deadline exceeded, more time: verify first"),
        pytest.param(
            {"phase": "Failed", "attempts": (FAILED_EARLY,), "resume_active_seconds": None},
            VerifyFirst,
            "",
            id="failed early, the remainder is enough",
        ),
        pytest.param(
            {"phase": "Succeeded", "num_samples": 8, "resume_active_seconds": 1200},
            VerifyFirst,
            "",
            id="succeeded, numSamples raised",
        ),
        pytest.param(
            {"phase": "BudgetExhausted", "resume_active_seconds": 1200}, VerifyFirst, "", id="budget exhausted"
        ),
    ],
)
def test_manual_resume_before_verification(changes: dict, expected: type, says: str) -> None:
    decision = r.decide(facts(**changes))
    assert type(decision) is expected
    if says:
        assert says in decision.reason
    if isinstance(decision, VerifyFirst):
        assert decision.trigger == attempts.TRIGGER_RESUME and decision.attempt == 2
        assert decision.generation == facts(**changes).requested_generation


def test_a_resume_starts_attempt_two_on_the_same_run_root_after_verification() -> None:
    decision = r.decide(facts(resume_active_seconds=3600, num_samples=6, verification=VERIFIED))
    assert isinstance(decision, StartAttempt)
    assert (decision.attempt, decision.rayjob_name, decision.active_seconds) == (2, "digits-abc123-a2", 3600)
    assert decision.deadline_at == NOW + 3600 and decision.started_at == NOW
    assert decision.num_samples == 6 and decision.checkpoints_at_start == 4 and decision.generation == 1
    assert ROOT in decision.message and "spec.resume.generation 1" in decision.message


def test_without_new_time_the_attempt_gets_the_remainder_of_the_last_budget() -> None:
    decision = r.decide(facts(phase="Failed", attempts=(FAILED_EARLY,), verification=VERIFIED))
    assert isinstance(decision, StartAttempt) and decision.active_seconds == 3600 - 1000


def test_the_operators_cap_bounds_the_attempts_budget() -> None:
    decision = r.decide(facts(resume_active_seconds=10_000, max_active_seconds=7200, verification=VERIFIED))
    assert isinstance(decision, StartAttempt) and decision.active_seconds == 7200


def test_a_remainder_too_short_for_the_startup_window_is_not_resumable() -> None:
    # 3600 - 3200 = 400 s left, but startupSeconds is 600.
    decision = r.decide(facts(phase="Failed", attempts=(replace(FIRST, ended_at=NOW - 800, outcome="Failed"),)))
    assert isinstance(decision, NotResumable) and "400s, less than the 601s" in decision.reason


def test_the_third_attempt_counts_from_the_recorded_rows() -> None:
    second = Attempt(
        2,
        "digits-abc123-a2",
        attempts.TRIGGER_RESUME,
        1,
        NOW - 300,
        NOW - 100,
        "DeadlineExceeded",
        active_seconds=200,
        num_samples=4,
    )
    decision = r.decide(
        facts(
            attempts=(FIRST, second),
            requested_generation=2,
            resumed_generation=1,
            resume_active_seconds=900,
            verification=VERIFIED,
        )
    )
    assert isinstance(decision, StartAttempt) and decision.attempt == 3 and decision.rayjob_name == "digits-abc123-a3"


# ------------------------------------------------------------------------------------- fail closed: refusals

MISSING = (
    ("missing-file", "sweeps/ml/digits-abc123/train/t1/checkpoint_epoch-000002/model.pt", "listed in its manifest"),
    ("missing-manifest", "sweeps/ml/digits-abc123/train/t2/checkpoint_epoch-000001/", "rank 1 of 2"),
)


@pytest.mark.parametrize(
    ("check", "says", "missing"),
    [
        pytest.param(
            RunRootCheck(ROOT, False, 2, MISSING),
            "is not verified, so the resume does not start",
            (
                "missing-file sweeps/ml/digits-abc123/train/t1/checkpoint_epoch-000002/model.pt",
                "missing-manifest sweeps/ml/digits-abc123/train/t2/checkpoint_epoch-000001/",
            ),
            id="objects missing",
        ),
        pytest.param(
            RunRootCheck(ROOT, False, 0, (("s3-error", "", "AccessDenied on ListObjectsV2"),)),
            "AccessDenied",
            ("s3-error",),
            id="S3 error",
        ),
        pytest.param(
            RunRootCheck(ROOT, False, 0, (("empty-run-root", ROOT, "no object"),)),
            "holds no object",
            (f"empty-run-root {ROOT}",),
            id="empty run root",
        ),
        pytest.param(
            RunRootCheck(ROOT, True, 0, reported=(f"{ROOT}/train/t1/checkpoint_epoch-000002",)),
            "the run reported 1",
            (f"missing-checkpoint {ROOT}/train/t1/checkpoint_epoch-000002",),
            id="checkpoints reported, none found",
        ),
        pytest.param(
            RunRootCheck(ROOT, True, 0, records_readable=False),
            "could not be read",
            (),
            id="no checkpoint, records unreadable",
        ),
    ],
)
def test_a_run_root_that_is_not_verified_is_refused_naming_what_is_missing(
    check: RunRootCheck, says: str, missing: tuple[str, ...]
) -> None:
    decision = r.decide(facts(resume_active_seconds=3600, verification=check))
    assert isinstance(decision, Refuse)
    assert says in decision.reason and decision.missing == missing
    patch = r.refusal_patch(decision, now=NOW)
    assert patch["resumedGeneration"] == 1  # consumed: a new `sweepctl resume` asks again
    assert patch["lastResume"].outcome == "Refused" and (patch["lastResume"].missing or []) == list(missing)
    assert patch["message"].startswith("resume refused: ") and "phase" not in patch
    assert r.event_for(decision) == ("Warning", "ResumeRefused", f"resume refused: {decision.reason}")


def test_a_run_root_without_checkpoints_and_none_reported_resumes_from_the_start() -> None:
    decision = r.decide(facts(resume_active_seconds=3600, verification=RunRootCheck(ROOT, True, 0)))
    assert isinstance(decision, StartAttempt) and decision.warnings


def test_many_missing_objects_are_named_up_to_the_status_limit() -> None:
    problems = tuple(("missing-file", f"k/{i}", "gone") for i in range(30))
    decision = r.decide(facts(resume_active_seconds=3600, verification=RunRootCheck(ROOT, False, 30, problems)))
    assert isinstance(decision, Refuse) and len(decision.missing) == attempts.MAX_MISSING_NAMED
    assert "(and 25 more)" in decision.reason


# ---------------------------------------------------------------------------- failurePolicy.resumeOnClusterLoss


@pytest.mark.parametrize(
    ("end", "lost"),
    [
        pytest.param(HEAD_UNREACHABLE, True, id="JobStatusCheckTimeoutExceeded: head unreachable"),
        pytest.param(SUBMITTER_LOST_HEAD, True, id="SubmissionFailed while RUNNING: submitter lost the head"),
        pytest.param(
            RayJobEnd("Failed", "AppFailed", "Ray head pod not found.", "RUNNING"),
            True,
            id="AppFailed: head pod not found (SidecarMode)",
        ),
        pytest.param(
            RayJobEnd("Failed", "AppFailed", "Submitter completed but Ray job not found in RayCluster.", "RUNNING"),
            True,
            id="AppFailed: head restarted, job table lost",
        ),
        pytest.param(
            RayJobEnd("Failed", "AppFailed", "Job entrypoint command failed with exit code 1", "FAILED"),
            False,
            id="AppFailed: the application failed",
        ),
        pytest.param(
            RayJobEnd("Failed", "SubmissionFailed", "Job submission has failed.", ""),
            False,
            id="SubmissionFailed before the job ran",
        ),
        pytest.param(
            RayJobEnd("Failed", "DeadlineExceeded", "passed the activeDeadlineSeconds", "RUNNING"),
            False,
            id="activeDeadlineSeconds",
        ),
        pytest.param(RayJobEnd("Failed", "PreRunningDeadlineExceeded", "", ""), False, id="never started"),
        pytest.param(
            RayJobEnd("Retrying", "JobStatusCheckTimeoutExceeded", "", "RUNNING"), False, id="KubeRay still retrying"
        ),
        pytest.param(replace(HEAD_UNREACHABLE, driver_phase="Failed"), False, id="the driver recorded its own end"),
        pytest.param(None, False, id="RayJob gone (deleted by someone)"),
    ],
)
def test_cluster_loss_is_read_from_kuberays_failure_reasons(end: RayJobEnd | None, lost: bool) -> None:
    assert (attempts.cluster_loss(end) is not None) is lost


def auto(**changes: object) -> ResumeFacts:
    base = facts(
        phase="Failed",
        requested_generation=0,
        attempts=(FAILED_EARLY,),
        rayjob_end=HEAD_UNREACHABLE,
        resume_on_cluster_loss=2,
    )
    return replace(base, **changes)


def test_a_lost_cluster_is_resumed_automatically_with_an_event_when_opted_in() -> None:
    decision = r.decide(auto())
    assert isinstance(decision, AutoResume) and decision.attempt == 2 and decision.generation is None
    kind, reason, message = r.event_for(decision)
    assert (kind, reason) == ("Normal", "AutoResume")
    assert "automatic resume 1/2" in message and "JobStatusCheckTimeoutExceeded" in message
    started = r.decide(auto(verification=VERIFIED))
    assert isinstance(started, StartAttempt) and started.trigger == attempts.TRIGGER_CLUSTER_LOSS
    assert started.active_seconds == 2600 and "failurePolicy.resumeOnClusterLoss" in started.message
    assert "resumedGeneration" not in r.start_patch(
        read_status({"runId": "abc123", "attempts": [stored(FAILED_EARLY)]}), started
    )


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        pytest.param({"resume_on_cluster_loss": 0}, Idle, id="not opted in (the default)"),
        pytest.param(
            {"rayjob_end": SUBMITTER_LOST_HEAD.__class__("Failed", "AppFailed", "exit 1", "FAILED")},
            Idle,
            id="an application failure",
        ),
        pytest.param({"phase": "DeadlineExceeded"}, Idle, id="not Failed"),
        pytest.param(
            {"last_resume": attempts.LastResume(2, attempts.TRIGGER_CLUSTER_LOSS, attempts.OUTCOME_REFUSED)},
            Idle,
            id="this loss was already refused once",
        ),
        pytest.param(
            {"requested_generation": 1, "resume_active_seconds": 1200},
            VerifyFirst,
            id="a manual resume takes precedence",
        ),
    ],
)
def test_the_automatic_policy_applies_only_to_a_final_cluster_loss(changes: dict, expected: type) -> None:
    assert type(r.decide(auto(**changes))) is expected


def test_automatic_resumes_stop_at_the_policys_count() -> None:
    second = Attempt(
        2,
        "digits-abc123-a2",
        attempts.TRIGGER_CLUSTER_LOSS,
        None,
        NOW - 2900,
        NOW - 2800,
        "Failed",
        active_seconds=2600,
        num_samples=4,
    )
    third = Attempt(
        3,
        "digits-abc123-a3",
        attempts.TRIGGER_CLUSTER_LOSS,
        None,
        NOW - 2700,
        NOW - 2600,
        "Failed",
        active_seconds=2500,
        num_samples=4,
    )
    assert isinstance(r.decide(auto(attempts=(FAILED_EARLY, second))), AutoResume)  # 1 of 2 done
    spent = r.decide(auto(attempts=(FAILED_EARLY, second, third)))
    assert isinstance(spent, NotResumable) and "2 automatic resume(s)" in spent.reason
    assert "sweepctl resume digits" in spent.reason
    patch = r.refusal_patch(spent, now=NOW)
    assert patch["lastResume"].attempt == 4 and "resumedGeneration" not in patch
    # Recorded once: the next pass is Idle, not another Event.
    assert isinstance(
        r.decide(
            auto(
                attempts=(FAILED_EARLY, second, third), last_resume=attempts.LastResume.from_status(patch["lastResume"])
            )
        ),
        Idle,
    )


# -------------------------------------------------------------------------------------------- status rows


def test_start_and_end_patches_record_the_attempts_and_the_total_time() -> None:
    status = read_status(
        {
            "runId": "abc123",
            "phase": "DeadlineExceeded",
            "rayJobName": "digits-abc123",
            "startedAt": r.rfc3339(NOW - 4000),
            "finishedAt": r.rfc3339(NOW - 400),
            "deadlineAt": r.rfc3339(NOW - 400),
            "checkpoints": {"verified": True, "checked": 4},
        }
    )
    first = attempts.attempts_of(status, num_samples=4)
    assert first[0].number == 1 and first[0].active_seconds == 3600 and first[0].ran_seconds == 3600
    assert first[0].checkpoints_verified == 4 and first[0].outcome == "DeadlineExceeded"
    decision = r.decide(facts(attempts=first, resume_active_seconds=1800, verification=VERIFIED))
    assert isinstance(decision, StartAttempt)
    patch = r.start_patch(status, decision, num_samples=4)
    assert (
        patch["phase"] == "Starting" and patch["rayJobName"] == "digits-abc123-a2" and patch["resumedGeneration"] == 1
    )
    assert patch["checkpoints"] is None and patch["finishedAt"] is None  # the new end is verified again
    assert patch["startedAt"] == r.rfc3339(NOW) and first[0].started_at == NOW - 4000  # the startup clock restarts
    assert [row.attempt for row in patch["attempts"]] == [1, 2] and patch["totalRanSeconds"] == 3600
    assert patch["attempts"][1].model_dump(by_alias=True, exclude_none=True) == {
        "attempt": 2,
        "rayJobName": "digits-abc123-a2",
        "trigger": "Resume",
        "generation": 1,
        "startedAt": r.rfc3339(NOW),
        "activeSeconds": 1800,
        "deadlineAt": r.rfc3339(NOW + 1800),
        "numSamples": 4,
        "checkpointsAtStart": 4,
    }
    running = updated(status, patch)
    ended = attempts.end_patch(running, phase="Succeeded", now=NOW + 1000, checkpoints_verified=6)
    assert ended["attempts"][1].outcome == "Succeeded" and ended["attempts"][1].ran_seconds == 1000
    assert ended["attempts"][1].checkpoints_verified == 6 and ended["totalRanSeconds"] == 4600
    again = attempts.end_patch(updated(running, ended), phase="Succeeded", now=NOW + 2000)
    assert again == {}  # closed once; a later pass changes nothing


def test_rows_round_trip_through_the_status() -> None:
    row = Attempt(
        2,
        "digits-abc123-a2",
        attempts.TRIGGER_CLUSTER_LOSS,
        None,
        NOW,
        NOW + 61,
        "Failed",
        "AppFailed",
        600,
        NOW + 600,
        8,
        3,
        5,
    )
    assert Attempt.from_status(row.to_status()) == row and stored(row)["ranSeconds"] == 61


def test_facts_are_read_from_the_sweep_object() -> None:
    spec = SimpleNamespace(
        resume=SimpleNamespace(generation=3, active_seconds=900),
        tune=SimpleNamespace(num_samples=6),
        deadlines=SimpleNamespace(startup_seconds=600, graceful_stop_seconds=60),
        failure_policy=SimpleNamespace(resume_on_cluster_loss=1),
    )
    body = {
        "metadata": {"name": "digits"},
        "status": {
            "phase": "Failed",
            "runId": "abc123",
            "resumedGeneration": 2,
            "attempts": [stored(FIRST)],
            "lastResume": {"attempt": 2, "trigger": "Resume", "outcome": "Refused"},
        },
    }
    got = r.facts_from_sweep(body, read_status(body["status"]), spec=spec, now=NOW, max_active_seconds=7200)
    assert (got.requested_generation, got.resumed_generation, got.resume_active_seconds) == (3, 2, 900)
    assert got.attempts == (FIRST,) and got.num_samples == 6 and got.resume_on_cluster_loss == 1
    assert got.last_resume == attempts.LastResume(2, "Resume", "Refused") and got.next_attempt == 2


@pytest.mark.parametrize(
    ("sweep", "run_id", "attempt", "expected"),
    [
        ("digits", "abc123", 2, "digits-abc123-a2"),
        ("digits", "abc123", 12, "digits-abc123-a12"),
        ("x" * 40, "abc123", 2, None),  # shortened with a hash, still unique per attempt
        ("9lives", "abc123", 2, None),  # not DNS-1035 (leading digit)
    ],
)
def test_every_attempt_gets_its_own_rayjob_name_within_kuberays_limit(
    sweep: str, run_id: str, attempt: int, expected: str | None
) -> None:
    name = attempts.attempt_rayjob_name(sweep, run_id, attempt)
    assert len(name) <= 47 and name[0].isalpha() and name.endswith(f"-{run_id}-a{attempt}")
    if expected:
        assert name == expected
    assert name != attempts.attempt_rayjob_name(sweep, run_id, attempt + 1)


def test_the_rayjob_of_a_resumed_attempt_carries_the_attempt_its_deadline_and_the_same_run_root() -> None:
    from sweep_contracts import constants, runtime_env
    from sweep_contracts.runtime_env import deadline_of, run_spec_of
    from sweep_operator.rendering import RenderContext, build_rayjob, rayjob_name
    from sweep_operator.validation import parse_sweep
    from tests.support.factories import cpu_sweep

    sweep = parse_sweep({**cpu_sweep("digits", "ml"), "metadata": {"name": "digits", "namespace": "ml", "uid": "u1"}})
    first = build_rayjob(sweep, "abc123", RenderContext())
    root = run_spec_of(first).run_root
    decision = r.decide(facts(resume_active_seconds=3600, num_samples=12, verification=VERIFIED))
    assert isinstance(decision, StartAttempt)
    recorded = target_of(first)
    rayjob = attempts.attempt_rayjob(sweep, "abc123", RenderContext(), decision, recorded)
    run_spec = run_spec_of(rayjob)
    assert rayjob["metadata"]["name"] == "digits-abc123-a2" != rayjob_name("digits", "abc123")
    assert (run_spec.attempt, run_spec.run_root, run_spec.run_id) == (2, root, "abc123")
    assert run_spec.spec.deadlines.active_seconds == 3600 and run_spec.spec.tune.num_samples == 12
    assert deadline_of(rayjob) == int(NOW + 3600)
    assert rayjob["spec"]["activeDeadlineSeconds"] == 3600 + sweep.spec.deadlines.graceful_stop_seconds
    # Guarded as the first attempt: same finalizer, labels and guard annotation (same run root).
    assert rayjob["metadata"]["finalizers"] == first["metadata"]["finalizers"] == [constants.FINALIZER]
    assert rayjob["metadata"]["labels"] == first["metadata"]["labels"]
    # Its own run spec's digest and its own active deadline in its bounds (the attempt differs), else the same.
    mine = dict(rayjob["metadata"]["annotations"])
    assert mine.pop(constants.ANNOTATION_RUN_SPEC) == runtime_env.run_spec_digest(run_spec)
    from sweep_operator.run_metadata import RunBounds

    first_annotations = dict(first["metadata"]["annotations"])
    bounds = RunBounds.from_annotation(mine.pop(constants.ANNOTATION_BOUNDS))
    first_bounds = RunBounds.from_annotation(first_annotations.pop(constants.ANNOTATION_BOUNDS))
    assert bounds is not None and first_bounds is not None
    assert bounds.active_deadline_s == rayjob["spec"]["activeDeadlineSeconds"] != first_bounds.active_deadline_s
    assert replace(bounds, active_deadline_s=0) == replace(first_bounds, active_deadline_s=0)
    assert mine == {k: v for k, v in first_annotations.items() if k != constants.ANNOTATION_RUN_SPEC}
    with pytest.raises(ValueError, match="not the run root"):
        elsewhere = replace(recorded, run_root="s3://bucket/elsewhere/ml/digits-abc123")
        attempts.attempt_rayjob(sweep, "abc123", RenderContext(), decision, elsewhere)


def test_a_resumed_attempt_is_guarded_by_the_first_attempts_record_not_todays_spec() -> None:
    """Issue 25, defect 2 (R22): the tenant sets spec.deletion.verifyCheckpoints: false (and a short verification
    timeout) before resuming; attempt 2's guard annotation still verifies, with attempt 1's recorded facts, since
    the shared run root holds attempt 1's checkpoints."""
    from sweep_operator.rendering import RenderContext, build_rayjob
    from sweep_operator.validation import parse_sweep
    from tests.support.factories import changed, cpu_sweep

    doc = {**cpu_sweep("digits", "ml"), "metadata": {"name": "digits", "namespace": "ml", "uid": "u1"}}
    first = build_rayjob(parse_sweep(doc), "abc123", RenderContext())
    recorded = target_of(first)
    assert recorded is not None and recorded.verify
    edited = parse_sweep(
        changed(doc, {"spec.deletion.verifyCheckpoints": False, "spec.deletion.verificationTimeoutSeconds": 31})
    )
    decision = r.decide(facts(resume_active_seconds=3600, num_samples=12, verification=VERIFIED))
    assert isinstance(decision, StartAttempt)
    rayjob = attempts.attempt_rayjob(edited, "abc123", RenderContext(), decision, recorded)
    guarded = target_of(rayjob)
    assert guarded == recorded and guarded.verify is True and guarded.timeout_seconds != 31


def test_decisions_become_the_controllers_status_write_and_events() -> None:
    status = read_status(
        {
            "runId": "abc123",
            "phase": "DeadlineExceeded",
            "rayJobName": "digits-abc123",
            "finishedAt": "x",
            "attempts": [stored(FIRST)],
            "checkpoints": {"verified": True, "checked": 4, "verifiedAt": "y"},
            "conditions": [
                {
                    "type": "DeadlineExceeded",
                    "status": "True",
                    "reason": "GracefulStop",
                    "message": "",
                    "lastTransitionTime": "2026-12-03T14:00:00Z",
                }
            ],
        }
    )
    start = r.decide(facts(resume_active_seconds=3600, verification=VERIFIED))
    written = r.as_decision(status, start, generation=3, now=NOW)
    assert written is not None and written.status is not None
    new = status_document(written.status)
    assert new["phase"] == "Starting" and new["rayJobName"] == "digits-abc123-a2" and new["observedGeneration"] == 3
    assert "finishedAt" not in new and "checkpoints" not in new  # the attempt's end is verified afresh
    kinds = {c["type"]: (c["status"], c["reason"]) for c in new["conditions"]}
    assert kinds["DeadlineExceeded"] == ("False", "Resumed") and kinds["Admitted"] == ("True", "Resumed")
    assert [(e.type, e.reason) for e in written.events] == [("Normal", "Resumed")]
    refused = r.as_decision(
        status,
        r.decide(facts(resume_active_seconds=3600, verification=RunRootCheck(ROOT, False, 2, MISSING))),
        generation=3,
        now=NOW,
    )
    assert refused is not None and refused.status is not None
    assert refused.status.phase == "DeadlineExceeded" and refused.status.last_resume.outcome == "Refused"
    assert [(e.type, e.reason) for e in refused.events] == [("Warning", "ResumeRefused")]
    assert r.as_decision(status, r.decide(facts(resume_active_seconds=3600)), generation=3, now=NOW) is None


def test_the_ended_rayjob_is_read_from_the_object_or_from_what_the_status_recorded() -> None:
    body = {
        "status": {
            "jobDeploymentStatus": "Failed",
            "reason": "AppFailed",
            "jobStatus": "RUNNING",
            "message": "Ray head pod not found.",
        }
    }
    assert attempts.cluster_loss(attempts.rayjob_end_from(SweepStatus(), body)) is not None
    recorded = read_status(
        {"jobDeploymentStatus": "Failed", "reason": "JobStatusCheckTimeoutExceeded", "jobStatus": "RUNNING"}
    )
    assert attempts.cluster_loss(attempts.rayjob_end_from(recorded)) is not None
    assert attempts.cluster_loss(attempts.rayjob_end_from(recorded, driver_phase="Failed")) is None
    assert attempts.rayjob_end_from(SweepStatus()) is None


def test_only_a_pending_resume_or_the_policy_makes_an_ended_pass_ask() -> None:
    def spec(generation: int | None, policy: int) -> SimpleNamespace:
        resume = SimpleNamespace(generation=generation) if generation else None
        return SimpleNamespace(resume=resume, failure_policy=SimpleNamespace(resume_on_cluster_loss=policy))

    ended = read_status({"runId": "abc123", "phase": "DeadlineExceeded", "resumedGeneration": 1})
    assert not r.may_resume(ended, spec(None, 0)) and not r.may_resume(ended, spec(1, 0))
    assert r.may_resume(ended, spec(2, 0))
    assert not r.may_resume(ended, spec(1, 2)) and r.may_resume(updated(ended, phase="Failed"), spec(1, 2))
    assert not r.may_resume(read_status({"phase": "Failed"}), spec(2, 2))


# ----------------------------------------------------------------------------- one step, with fake ports


class Ports:
    """What a resume pass reads, faked: a verifier answer, the run's documents, a namespace budget's answer. `step`
    reads as `ports.resume_read` does (the verification only where `resume.planned` asks for it)."""

    def __init__(self, verified: bool = True, problems: tuple = (), waits: str | None = None) -> None:
        from tests.support.fakes import FakeResult, Finding

        self.result = FakeResult(verified=verified, checked=3, problems=[Finding(*p) for p in problems])
        self.waits = waits
        self.verified: list[str] = []

    def reads(self, doc: dict, sweep: object) -> r.ResumeReads:
        from dataclasses import replace

        from sweep_operator.reconcile.attempts import RunRootCheck
        from sweep_operator.reconcile.verdicts import status_target

        progress = {"phase": "Running"}
        failed = (doc.get("status") or {}).get("phase") == "Failed"
        records = r.ResumeReads(None, progress["phase"] if failed else None)
        target = status_target(doc)
        planned = r.planned(doc, sweep, records, now=NOW, max_active_seconds=86_400)
        if isinstance(planned, r.VerifyFirst) and target is not None:
            self.verified.append(target.run_root)
            check = RunRootCheck.from_result(
                self.result, progress=progress, final=None, records_readable=True, root=target.run_root
            )
            records = replace(records, verification=check)
        return records


def creates(decision: object) -> list[object]:
    from sweep_operator.reconcile.actions import CreateRayJob

    return [a for a in getattr(decision, "actions", ()) if isinstance(a, CreateRayJob)]


def ended_body(**spec_changes: object) -> tuple[dict, object]:
    from sweep_operator.rendering import RenderContext, build_rayjob
    from sweep_operator.validation import parse_sweep
    from tests.support.factories import changed, cpu_sweep

    doc = changed(cpu_sweep("digits", "ml"), {"spec.tune.numSamples": 4, **spec_changes})
    doc["metadata"].update(uid="u1", generation=2)
    sweep = parse_sweep(doc)
    from sweep_contracts.runtime_env import run_spec_of

    root = run_spec_of(build_rayjob(sweep, "abc123", RenderContext())).run_root
    doc["status"] = {
        "phase": "DeadlineExceeded",
        "runId": "abc123",
        "rayJobName": "digits-abc123",
        "startedAt": r.rfc3339(NOW - 4000),
        "finishedAt": r.rfc3339(NOW - 400),
        "deadlineAt": r.rfc3339(NOW - 400),
        "jobDeploymentStatus": "Complete",
        "jobStatus": "SUCCEEDED",
        "guard": {"runRoot": root, "endpointUrl": "", "region": "", "verify": True, "timeoutSeconds": 60},
        "checkpoints": {"verified": True, "checked": 3, "verifiedAt": r.rfc3339(NOW - 390)},
    }
    return doc, sweep


def step(doc: dict, sweep: object, ports: Ports) -> object:
    from sweep_operator.rendering import RenderContext

    reads = ports.reads(doc, sweep)
    admit = lambda sweep, attempt: ports.waits  # noqa: E731  the budgets' answer, read before deciding
    status = read_status(doc.get("status"))  # as the cache parsed it (`planned` above parses the body itself)
    return r.resume_step(
        doc, sweep, reads, admit, status=status, now=NOW, context=RenderContext(), max_active_seconds=86_400
    )


def written(decision: object) -> dict:
    """The status a step's decision writes, as the API stores it."""
    new = getattr(decision, "status", None)
    assert isinstance(new, SweepStatus)
    return status_document(new)


def test_a_step_verifies_then_creates_the_next_attempts_rayjob_and_records_it() -> None:
    doc, sweep = ended_body(**{"spec.resume": {"generation": 1, "activeSeconds": 3600}})
    ports = Ports()
    decision = step(doc, sweep, ports)
    assert ports.verified == [doc["status"]["guard"]["runRoot"]]
    (create,) = creates(decision)  # an action for the controller's _execute: the step itself creates nothing
    assert create.rayjob["metadata"]["name"] == "digits-abc123-a2" and create.attempt == 2 and create.owner_uid == "u1"
    new = written(decision)
    assert new["phase"] == "Starting" and new["resumedGeneration"] == 1
    assert [row["attempt"] for row in new["attempts"]] == [1, 2]
    assert [e.reason for e in decision.events] == ["Resumed"]
    assert step({**doc, "status": new}, sweep, Ports()) is None  # acted on: nothing more to do


def test_a_step_on_an_unverified_run_root_creates_nothing_and_names_what_is_missing() -> None:
    doc, sweep = ended_body(**{"spec.resume": {"generation": 1, "activeSeconds": 3600}})
    ports = Ports(verified=False, problems=(("missing-file", "sweeps/ml/digits-abc123/train/t1/c/w.pt", "gone"),))
    decision = step(doc, sweep, ports)
    assert creates(decision) == [] and written(decision)["phase"] == "DeadlineExceeded"
    assert written(decision)["lastResume"]["missing"] == ["missing-file sweeps/ml/digits-abc123/train/t1/c/w.pt"]
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "ResumeRefused")]


def test_a_step_waits_for_namespace_capacity_without_consuming_the_generation() -> None:
    doc, sweep = ended_body(**{"spec.resume": {"generation": 1, "activeSeconds": 3600}})
    new = written(step(doc, sweep, Ports(waits="needs 0 GPUs, 0 free")))
    assert "waits for namespace capacity" in new["message"]
    assert "resumedGeneration" not in new and new["phase"] == "DeadlineExceeded"


def test_a_step_never_adopts_a_rayjob_of_another_run() -> None:
    doc, sweep = ended_body(**{"spec.resume": {"generation": 1, "activeSeconds": 3600}})
    (create,) = creates(step(doc, sweep, Ports()))
    foreign = {"metadata": {"name": "digits-abc123-a2", "labels": {"sweeps.dev/run-id": "zzz999"}}}
    ours = {"metadata": {"name": "digits-abc123-a2", "labels": {"sweeps.dev/run-id": "abc123"}}}
    owned_by_other = {"metadata": {**ours["metadata"], "ownerReferences": [{"uid": "other"}]}}
    assert not attempts.adoptable(foreign, create.run_id, create.owner_uid) and attempts.adoptable(ours, "abc123", "u1")
    assert not attempts.adoptable(owned_by_other, "abc123", "u1")
    taken = create.taken  # what _execute writes instead when the name is held by an object that is not this run's
    assert (
        written(taken)["lastResume"]["outcome"] == "NotResumable" and "is not this run's" in written(taken)["message"]
    )


def test_a_step_after_a_lost_cluster_resumes_automatically_with_an_event() -> None:
    doc, sweep = ended_body(**{"spec.failurePolicy.resumeOnClusterLoss": 1})
    doc["status"].update(
        phase="Failed",
        jobDeploymentStatus="Failed",
        reason="JobStatusCheckTimeoutExceeded",
        jobStatus="RUNNING",
        finishedAt=r.rfc3339(NOW - 3000),
    )
    decision = step(doc, sweep, Ports())
    assert [e.reason for e in decision.events][:1] == ["AutoResume"] and creates(decision)
    assert written(decision)["attempts"][-1]["trigger"] == "ClusterLoss"
    assert step(ended_body()[0], ended_body()[1], Ports()) is None  # nothing asked, no policy


def test_pending_tells_a_timer_tick_whether_an_ended_sweep_has_a_resume_to_act_on() -> None:
    def pending(body: dict) -> bool:
        return attempts.pending(body, read_status(body.get("status")))

    ended = {
        "runId": "abc123",
        "phase": "Failed",
        "jobDeploymentStatus": "Failed",
        "jobStatus": "RUNNING",
        "reason": "JobStatusCheckTimeoutExceeded",
        "resumedGeneration": 1,
    }
    assert not pending({"spec": {"resume": {"generation": 1}}, "status": ended})
    assert pending({"spec": {"resume": {"generation": 2}}, "status": ended})
    automatic = {"spec": {"failurePolicy": {"resumeOnClusterLoss": 1}}, "status": ended}
    assert pending(automatic)
    answered = {**ended, "lastResume": {"attempt": 2, "trigger": "ClusterLoss", "outcome": "Refused"}}
    assert not pending({**automatic, "status": answered})
    assert not pending({**automatic, "status": {**ended, "reason": "DeadlineExceeded"}})
    assert not pending({"spec": {"resume": {"generation": 2}}, "status": {"phase": "Failed"}})  # no run


def test_a_verification_from_before_the_end_is_not_the_end_of_run_one() -> None:
    """The guard verifies an earlier attempt's RayCluster as KubeRay deletes it, while the next attempt runs: that
    record must not stand for the end-of-run verification of the attempt that ends later."""
    from sweep_operator.reconcile.run_phase import awaiting_verification

    ended = {"phase": "Succeeded", "finishedAt": "2026-12-03T15:00:10Z"}
    assert awaiting_verification(read_status(ended))
    assert awaiting_verification(read_status({**ended, "checkpoints": {"verifiedAt": "2026-12-03T15:00:02Z"}}))
    assert not awaiting_verification(read_status({**ended, "checkpoints": {"verifiedAt": "2026-12-03T15:00:11Z"}}))
    assert not awaiting_verification(read_status({**ended, "checkpoints": {"verifiedAt": "2026-12-03T15:00:10Z"}}))
    assert not awaiting_verification(read_status({"phase": "Running", "finishedAt": None}))


@pytest.mark.parametrize(
    ("budget", "hours", "expected"),
    [
        ("admit", None, None),
        ("queue", None, "4 GPUs wanted, 2 free"),
        ("reject", None, "spec.trial: over the cap"),
        ("admit", {"phase": "Queued", "message": "the GPU-hour window frees up"}, "the GPU-hour window frees up"),
        ("admit", {"phase": "Queued"}, "the GPU-hour budget"),  # a decision without a message still refuses
    ],
)
def test_a_resume_waits_for_the_gpu_caps_then_the_gpu_hours(
    budget: str, hours: dict[str, str] | None, expected: str | None
) -> None:
    from sweep_contracts.problems import Problem
    from sweep_operator.policy import Admit, Demand, Queue, Reject
    from sweep_operator.reconcile.actions import Decision

    demand = Demand(workers=2, gpus=4)
    answer = {
        "admit": Admit(demand),
        "queue": Queue(demand, "4 GPUs wanted, 2 free"),
        "reject": Reject((Problem("spec.trial", "over the cap"),)),
    }[budget]
    assert attempts.budget_refusal(answer, Decision(read_status(hours)) if hours is not None else None) == expected
