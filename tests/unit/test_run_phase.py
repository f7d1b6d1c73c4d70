"""The run phase as tables over facts (no Kubernetes, no S3): RayJob state, deadlines and the sweep's status in,
the new status and the actions out (run_phase.decide_run, R6, R20)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sweep_contracts.status_models import SweepStatus, TrialCounts
from sweep_operator.reconcile.actions import DeleteRayJob, Diagnose, Finish, ReleaseBudget, SetSuspend, SuspendWorkers
from sweep_operator.reconcile.facts import SweepFacts
from sweep_operator.reconcile.run_phase import (
    deadline_passed,
    decide_finish,
    decide_run,
    ever_ran,
    startup_overdue,
    tick_due,
    trials_started,
)
from sweep_operator.settings import OperatorLimits
from sweep_operator.status import RayJobFacts, read_status, rfc3339, settled, status_document
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, gpu_sweep
from tests.support.fakes import T0, FakeResult, Finding

LIMITS = OperatorLimits(max_gpus_per_namespace=8)
JOB = "digits-r1"
RUNNING = {
    "phase": "Running",
    "runId": "r1",
    "rayJobName": JOB,
    "observedGeneration": 1,
    "startedAt": rfc3339(T0 - 600),
    "deadlineAt": rfc3339(T0 + 3600),
    "trainingStartedAt": rfc3339(T0 - 500),
    "trials": {"total": 8, "running": 2},
}
STARTING = {**RUNNING, "phase": "Starting", "trainingStartedAt": None, "trials": {"total": 0}}


def facts(
    status: dict[str, Any],
    rayjob: RayJobFacts | None,
    *,
    now: float = T0,
    spec: dict[str, Any] | None = None,
    **more: Any,
) -> SweepFacts:
    doc = changed(gpu_sweep(), {f"spec.{k}": v for k, v in (spec or {}).items()})
    doc["metadata"].update(uid="uid-1", generation=1, creationTimestamp=rfc3339(T0 - 700))
    doc["status"] = {k: v for k, v in status.items() if v is not None}
    return SweepFacts(doc, now, LIMITS, parse_sweep(doc, LIMITS), rayjob=rayjob, **more)


def job(deployment: str = "Running", status: str = "RUNNING", **fields: Any) -> RayJobFacts:
    return RayJobFacts(
        JOB, deployment_status=deployment, job_status=status, cluster_name="digits-r1-raycluster", **fields
    )


def kinds(actions: tuple[Any, ...]) -> list[type]:
    return [type(a) for a in actions]


# (case, facts, expected phase (None: status unchanged), the condition (type, status, reason) set, action kinds)
ROWS = [
    (
        "ended and unverified: free the budget, verify",
        facts({**RUNNING, "phase": "Succeeded"}, job("Complete", "SUCCEEDED")),
        None,
        None,
        [ReleaseBudget, Finish],
    ),
    (
        "ended and verified: only the budget",
        facts({**RUNNING, "phase": "Failed", "checkpoints": {"verifiedAt": rfc3339(T0)}}, job("Failed", "FAILED")),
        None,
        None,
        [ReleaseBudget],
    ),
    (
        "the RayJob was deleted outside the operator",
        facts(RUNNING, None),
        "Failed",
        ("Running", "False", "RayJobDeleted"),
        [ReleaseBudget],
    ),
    (
        "KubeRay is creating the cluster",
        facts(STARTING, job("Initializing", "")),
        "Starting",
        ("Running", "False", "Starting"),
        [],
    ),
    ("the job runs", facts(STARTING, job()), "Running", ("Running", "True", "Running"), []),
    (
        "the job succeeded",
        facts(RUNNING, job("Complete", "SUCCEEDED")),
        "Succeeded",
        ("Running", "False", "Succeeded"),
        [ReleaseBudget, Finish, SuspendWorkers],
    ),
    (
        "Tune's budget stopped it at the deadline and the driver exited 0",
        facts(RUNNING, job("Complete", "SUCCEEDED"), stopped_at_deadline=True),
        "DeadlineExceeded",
        ("DeadlineExceeded", "True", "GracefulStop"),
        [ReleaseBudget, Finish, SuspendWorkers],
    ),
    (
        "the deadline and its graceful window passed: stop through the guard",
        facts(RUNNING, job(), now=T0 + 3600 + 300),
        "DeadlineExceeded",
        ("DeadlineExceeded", "True", "SweepDeadline"),
        [DeleteRayJob, ReleaseBudget, Finish],
    ),
    (
        "the deadline passed, the graceful window has not: the driver stops its trials",
        facts(RUNNING, job(), now=T0 + 3601),
        "Running",
        ("DeadlineExceeded", "True", "GracefulStop"),
        [],
    ),
    (
        "KubeRay's activeDeadlineSeconds stopped it",
        facts(RUNNING, job("Failed", "", reason="DeadlineExceeded")),
        "DeadlineExceeded",
        ("DeadlineExceeded", "True", "ActiveDeadlineSeconds"),
        [ReleaseBudget, Finish, SuspendWorkers],
    ),
    (
        "startup overdue: the diagnosis is asked for first",
        facts(STARTING, job("Initializing", ""), now=T0 + 1800),
        None,
        None,
        [Diagnose],
    ),
    (
        "startup overdue, diagnosed: fail and stop",
        facts(STARTING, job("Initializing", ""), now=T0 + 1800, diagnosis="2 workers Pending"),
        "Failed",
        ("Running", "False", "StartupDeadlineExceeded"),
        [DeleteRayJob, ReleaseBudget, Finish],
    ),
    (
        "Running without a trial is not started: the startup clock still runs",
        facts(
            {**STARTING, "trials": {"total": 8, "pending": 8}}, job(), now=T0 + 1800, diagnosis="GPU workers Pending"
        ),
        "Failed",
        ("Running", "False", "StartupDeadlineExceeded"),
        [DeleteRayJob, ReleaseBudget, Finish],
    ),
    (
        "a trial runs: started, whatever the clock says",
        facts(RUNNING, job(), now=T0 + 1800),
        "Running",
        ("Running", "True", "Running"),
        [],
    ),
    (
        "KubeRay retries after a failed attempt: no startup clock until the next attempt starts",
        facts(
            {**STARTING, "attemptStartedAt": rfc3339(T0 - 3000)},
            job("Retrying", "", failed=1, start_time=rfc3339(T0 - 3000)),
            now=T0 + 1800,
        ),
        "Starting",
        ("Running", "False", "Starting"),
        [],
    ),
    (
        "KubeRay gave up before the job ever ran: the diagnosis is asked for",
        facts(STARTING, job("Failed", "FAILED", reason="AppFailed")),
        None,
        None,
        [Diagnose],
    ),
    (
        "KubeRay gave up before the job ever ran, diagnosed",
        facts(STARTING, job("Failed", "FAILED", reason="AppFailed"), diagnosis="image pull"),
        "Failed",
        ("Running", "False", "StartupFailed"),
        [ReleaseBudget, Finish, SuspendWorkers],
    ),
    (
        "a run that trained, then failed, needs no startup diagnosis",
        facts(RUNNING, job("Failed", "FAILED", reason="AppFailed")),
        "Failed",
        ("Running", "False", "Failed"),
        [ReleaseBudget, Finish, SuspendWorkers],
    ),
    (
        "suspended",
        facts(RUNNING, job("Suspended", "", suspended=True), spec={"suspend": True}),
        "Suspended",
        ("Running", "False", "Suspended"),
        [],
    ),
]


@pytest.mark.parametrize("case,given,phase,condition,actions", ROWS, ids=[row[0] for row in ROWS])
def test_decide_run(
    case: str, given: SweepFacts, phase: str | None, condition: tuple[str, str, str] | None, actions: list[type]
) -> None:
    decision = decide_run(given)
    assert kinds(decision.actions) == actions, case
    if phase is None:
        assert decision.status is None
        return
    assert decision.status is not None and decision.status.phase == phase
    assert condition in [(c.type, c.status, c.reason) for c in decision.status.conditions or []]
    if phase in ("Succeeded", "Failed", "DeadlineExceeded"):
        assert decision.status.finished_at == rfc3339(given.now)


def test_a_diagnosis_request_names_the_cluster_and_the_cap() -> None:
    (wanted,) = decide_run(facts(STARTING, job("Initializing", ""), now=T0 + 1800)).actions
    assert wanted == Diagnose("digits-r1-raycluster", JOB, workers_wanted=4, worker_cap=4)


def test_the_first_running_pass_records_training_start_and_the_attempt() -> None:
    status = decide_run(facts(STARTING, job(start_time=rfc3339(T0 - 60)))).status
    assert status is not None
    assert status.training_started_at == rfc3339(T0) and status.attempt_started_at == rfc3339(T0 - 60)
    assert status.job_deployment_status == "Running" and status.ray_cluster_name == "digits-r1-raycluster"


def test_polled_progress_lands_in_the_status() -> None:
    progress = {
        "trials": {"total": 8, "pending": 0, "running": 3, "terminated": 1, "errored": 0},
        "trialsSummary": "1/8",
        "waitingFor": None,
    }
    status = decide_run(facts({**RUNNING, "waitingFor": "2 worker pods Pending"}, job(), progress=progress)).status
    assert status is not None and status.trials is not None and status.trials.running == 3
    assert "waitingFor" not in status_document(status)


def test_a_spec_change_is_refused_but_suspend_is_carried_to_the_rayjob() -> None:
    given = facts({**RUNNING, "observedGeneration": 0}, job(), spec={"suspend": True})
    decision = decide_run(given)
    assert SetSuspend(JOB, True) in decision.actions
    assert [e.reason for e in decision.events] == ["Suspend"]
    assert decision.status is not None and decision.status.observed_generation == 1


@pytest.mark.parametrize(
    "result,phase,verified,reason",
    [
        (FakeResult(True), "Succeeded", "True", "Verified"),
        (FakeResult(False, (Finding("missing-file"),)), "Succeeded", "False", "NotVerified"),
        (FakeResult(True, checked=0), "Failed", "False", "NothingToProtect"),
    ],
    ids=["verified", "a file missing", "nothing to protect"],
)
def test_decide_finish(result: FakeResult, phase: str, verified: str, reason: str) -> None:
    decision = decide_finish(
        facts({**RUNNING, "phase": phase}, None), result, {"trials": {"total": 8, "errored": 8}}, None
    )
    assert decision.status is not None
    conditions = {c.type: (c.status, c.reason) for c in decision.status.conditions or []}
    assert conditions["CheckpointsVerified"] == (verified, reason)
    assert "Ready" not in conditions  # the status writer derives it (status.settled), as for every write
    written = {c.type: (c.status, c.reason) for c in settled(decision.status, 1, T0).conditions or []}
    assert written["Ready"][0] == ("True" if phase == "Succeeded" and verified == "True" else "False")
    assert [e.reason for e in decision.events] == (
        [] if verified == "True" else [reason if reason != "NotVerified" else "CheckpointsNotVerified"]
    )


# ------------------------------------------------------------------------------------------------ predicates


@pytest.mark.parametrize(
    "now,deadline,grace,passed", [(99, 100, 0, False), (100, 100, 0, True), (100, 100, 5, False), (105, 100, 5, True)]
)
def test_deadline_passed(now: float, deadline: float, grace: float, passed: bool) -> None:
    assert deadline_passed(now, deadline, grace) is passed


@pytest.mark.parametrize(
    "rayjob,status,now,overdue",
    [
        (job("Initializing", "", start_time=rfc3339(T0)), {}, T0 + 601, True),
        (job("Initializing", "", start_time=rfc3339(T0)), {}, T0 + 600, False),
        (
            job("Initializing", "", start_time=rfc3339(T0)),
            {"startedAt": rfc3339(T0 + 100)},
            T0 + 601,
            False,
        ),  # the later start counts
        (job("Retrying", "", failed=1, start_time=rfc3339(T0)), {}, T0 + 6000, False),
        (job("", "", failed=1, start_time=rfc3339(T0)), {}, T0 + 6000, False),
        (job("Initializing", ""), {}, T0 + 6000, False),  # no start recorded yet
    ],
    ids=["overdue", "on time", "the sweep's start is later", "retrying", "new after a retry", "not started"],
)
def test_startup_overdue(rayjob: RayJobFacts, status: dict[str, Any], now: float, overdue: bool) -> None:
    assert startup_overdue(rayjob, read_status(status), now, 600) is overdue


def test_ever_ran_and_trials_started() -> None:
    assert ever_ran(read_status({"trainingStartedAt": rfc3339(T0)}), job("Failed", "FAILED"))
    assert ever_ran(SweepStatus(), job())
    assert not ever_ran(SweepStatus(), job("Failed", "FAILED"))
    assert trials_started(TrialCounts(errored=1)) and not trials_started(TrialCounts(pending=4, total=4))
    assert not trials_started(None)


@pytest.mark.parametrize(
    "status,deleting,poll_due,due",
    [
        ({}, False, False, True),
        ({"phase": "Queued"}, False, False, True),
        ({"phase": "Running", "deadlineAt": rfc3339(T0 + 60)}, False, False, False),
        ({"phase": "Running", "deadlineAt": rfc3339(T0 + 60)}, False, True, True),
        ({"phase": "Running", "deadlineAt": rfc3339(T0 - 1)}, False, False, True),
        ({"phase": "Succeeded"}, False, False, True),
        ({"phase": "Succeeded", "checkpoints": {"verifiedAt": rfc3339(T0)}}, False, True, False),
        ({"phase": "Running"}, True, True, False),
        ({"phase": "Deleting", "runId": "r1", "deadlineAt": rfc3339(T0 - 1)}, True, False, True),
        ({"phase": "Deleting", "runId": "r1", "deadlineAt": rfc3339(T0 + 60)}, True, True, False),
    ],
    ids=[
        "new",
        "queued",
        "steady",
        "progress due",
        "deadline passed",
        "unverified end",
        "verified end",
        "deleting",
        "held past its deadline",  # issue 26, section 3: the held run's RayJob is still stopped at its deadline
        "held before its deadline",
    ],
)
def test_tick_due(status: dict[str, Any], deleting: bool, poll_due: bool, due: bool) -> None:
    body = {
        "metadata": {"name": "digits", **({"deletionTimestamp": rfc3339(T0)} if deleting else {})},
        "status": status,
    }
    assert tick_due(body, T0, poll_due) is due
    assert tick_due(body, T0, poll_due, read_status(status)) is due, "the status parsed once, by the cache"


@pytest.mark.parametrize(
    "edit,refused",
    [
        ({"suspend": True}, None),  # suspending attempt 2: its own deadline differs from spec.deadlines, not an edit
        ({"suspend": True, "image": "ghcr.io/example/other:2"}, "spec.image"),
        ({"deadlines.gracefulStopSeconds": 5}, "spec.deadlines"),
    ],
)
def test_a_resumed_attempt_is_compared_without_its_own_deadline(edit: dict[str, Any], refused: str | None) -> None:
    """Attempt 2 runs with spec.resume's activeSeconds (resume.attempt_sweep) while spec.deadlines.activeSeconds
    keeps attempt 1's: only a real edit is refused, and suspend still reaches the RayJob."""
    from sweep_contracts.runspec import build_run_spec

    resumed = {"resume": {"generation": 1, "activeSeconds": 7200}, "deadlines.activeSeconds": 3600}
    admitted = parse_sweep(changed(gpu_sweep(), {f"spec.{k}": v for k, v in resumed.items()}), LIMITS)
    deadlines = admitted.spec.deadlines.model_copy(update={"active_seconds": 7200})
    run_spec = build_run_spec(
        replace(admitted, spec=admitted.spec.model_copy(update={"deadlines": deadlines})), "r1", attempt=2
    )
    given = facts({**RUNNING, "observedGeneration": 0}, job(), spec={**resumed, **edit}, run_spec=run_spec)
    decision = decide_run(given)
    assert decision.status is not None
    message = decision.status.message or ""
    if refused is None:
        assert "spec change refused" not in message and "SpecChangeRefused" not in [e.reason for e in decision.events]
    else:
        assert f"spec change refused: {refused} changed" in message, message
    assert (SetSuspend(JOB, True) in decision.actions) == bool(edit.get("suspend"))


@pytest.mark.parametrize("asked,acted,due", [(1, 0, True), (1, 1, False)], ids=["resume pending", "resume acted on"])
def test_a_pending_resume_keeps_the_tick_due(asked: int, acted: int, due: bool) -> None:
    """An ended, verified sweep with a resume not acted on yet: the tick retries it, so a failed create of the
    attempt's RayJob (its status is only written after the create) is tried again without a new event."""
    body = {
        "metadata": {"name": "digits"},
        "spec": {"resume": {"generation": asked}},
        "status": {
            "phase": "DeadlineExceeded",
            "runId": "r1",
            "resumedGeneration": acted,
            "finishedAt": rfc3339(T0 - 10),
            "checkpoints": {"verifiedAt": rfc3339(T0)},
        },
    }
    assert tick_due(body, T0, False) is due
