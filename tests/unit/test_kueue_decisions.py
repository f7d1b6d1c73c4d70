"""Kueue mode decisions (sweep_operator.reconcile.kueue), table-driven.

Each case names the Kueue source whose behaviour it depends on (kubernetes-sigs/kueue):
- pkg/controller/jobframework/reconciler.go ReconcileGenericJob: step 6 (Evicted -> stopJob suspends the RayJob, the
  quota is cleared only once the job is no longer active), step 7 (Admitted -> startJob unsuspends it);
- pkg/workload/workload.go SetQuotaReservation (Evicted reset to False "Previously: ..."),
  UnsetQuotaReservationWithCondition; pkg/workload/admissionchecks.go SyncAdmittedCondition;
- pkg/scheduler/flavorassigner/flavorassigner.go Assignment.Message ("couldn't assign flavors to pod set ...").
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

import pytest
from pydantic import ValidationError

from sweep_contracts.status_models import KueueStatus, SweepStatus
from sweep_operator.policy import Admit, Reject
from sweep_operator.reconcile.kueue import (
    AdmittedTime,
    KueueFacts,
    KueuePhase,
    advance_admitted_time,
    decide_kueue_admission,
    driver_deadline_at,
    kueue_created_status,
    kueue_outcome,
    kueue_run,
    kueue_view,
    queue_name_for,
    status_for_run_phase,
)
from sweep_operator.reconcile.workloads import (
    KueueError,
    WorkloadFacts,
    kueue_managed,
    our_queue_steps_aside,
    workload_of,
)
from sweep_operator.settings import OperatorLimits, Settings, SettingsError
from sweep_operator.status import read_status, status_document, updated
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, gpu_sweep

T0 = 1_800_000_000.0
WAITING = (
    "couldn't assign flavors to pod set gpu-workers: insufficient unused quota for nvidia.com/gpu in flavor "
    "default-flavor, 4 more needed"
)
PREEMPTION = (
    "Preempted to accommodate a workload (UID: u1, JobUID: j1) due to prioritization in the ClusterQueue; "
    "preemptor path: /gpu-cq; preemptee path: /gpu-cq"
)


def iso(t: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cond(type_: str, status: bool, reason: str, message: str, at: float) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": iso(at),
    }


def workload(*conditions: dict[str, Any], cq: str = "", name: str = "rayjob-s-abc123-1a2b3") -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if cq:
        status["admission"] = {"clusterQueue": cq, "podSetAssignments": []}
    return {"metadata": {"name": name, "creationTimestamp": iso(T0)}, "spec": {"queueName": "team-a"}, "status": status}


QUEUED = workload(cond("QuotaReserved", False, "WaitingForQuota", WAITING, T0 + 1))
ADMITTED = workload(
    cond("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue gpu-cq", T0 + 10),
    cond("Admitted", True, "Admitted", "The workload is admitted", T0 + 10),
    cq="gpu-cq",
)
EVICTING = workload(
    cond("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue gpu-cq", T0 + 10),
    cond("Admitted", True, "Admitted", "The workload is admitted", T0 + 10),
    cond("Evicted", True, "Preempted", PREEMPTION, T0 + 100),
    cond("Preempted", True, "InClusterQueue", PREEMPTION, T0 + 100),
    cq="gpu-cq",
)
REQUEUED = workload(
    cond("QuotaReserved", False, "PendingEvaluation", PREEMPTION, T0 + 130),
    cond("Admitted", False, "NoReservation", "The workload has no reservation", T0 + 130),
    cond("Evicted", True, "Preempted", PREEMPTION, T0 + 100),
    cond("Requeued", True, "Preempted", PREEMPTION, T0 + 130),
)
READMITTED = workload(
    cond("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue gpu-cq", T0 + 500),
    cond("Admitted", True, "Admitted", "The workload is admitted", T0 + 500),
    cond("Evicted", False, "QuotaReserved", "Previously: " + PREEMPTION, T0 + 500),
    cond("Requeued", True, "Preempted", PREEMPTION, T0 + 130),
    cq="gpu-cq",
)
FINISHED = workload(cond("Finished", True, "Succeeded", "Job finished successfully.", T0 + 900), cq="gpu-cq")
# finish.go Finish sets Finished alone: the admission's conditions stay as they were.
ADMITTED_THEN_FINISHED = workload(
    cond("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue gpu-cq", T0 + 10),
    cond("Admitted", True, "Admitted", "The workload is admitted", T0 + 10),
    cond("Finished", True, "Succeeded", "Job finished successfully.", T0 + 40),
    cq="gpu-cq",
)


def facts(wl: dict[str, Any] | None, *, suspended: bool, deployment: str, ever: bool = False) -> KueueFacts:
    return KueueFacts("team-a", suspended, deployment, WorkloadFacts.from_object(wl) if wl else None, ever)


# (case, facts, phase, message start, admitted_at, stopped_at)
VIEWS = [
    (
        "no workload yet (reconciler.go handleJobWithNoWorkload creates it)",
        facts(None, suspended=True, deployment="Suspended"),
        KueuePhase.WAITING_FOR_WORKLOAD,
        "Queued (Kueue: team-a): waiting for Kueue to create the Workload",
        None,
        None,
    ),
    (
        "waiting for quota: Kueue's admission message (flavorassigner.go Assignment.Message)",
        facts(QUEUED, suspended=True, deployment="Suspended"),
        KueuePhase.QUEUED,
        f"Queued (Kueue: team-a): {WAITING}",
        None,
        None,
    ),
    (
        "no condition yet: the scheduler has not looked",
        facts(workload(), suspended=True, deployment="Suspended"),
        KueuePhase.QUEUED,
        "Queued (Kueue: team-a): waiting for the ClusterQueue to evaluate it",
        None,
        None,
    ),
    (
        "admitted (SyncAdmittedCondition), RayJob still suspended: startJob unsuspends it next",
        facts(ADMITTED, suspended=True, deployment="Suspended"),
        KueuePhase.ADMITTED,
        "Admitted by Kueue: ClusterQueue gpu-cq",
        T0 + 10,
        None,
    ),
    (
        "admitted and running",
        facts(ADMITTED, suspended=False, deployment="Running", ever=True),
        KueuePhase.ADMITTED,
        "Admitted by Kueue",
        T0 + 10,
        None,
    ),
    (
        "evicted, KubeRay releasing the cluster (reconciler.go step 6: quota held while the job is active)",
        facts(EVICTING, suspended=True, deployment="Suspending", ever=True),
        KueuePhase.PREEMPTED,
        f"Preempted (Kueue: team-a): {PREEMPTION}; the RayCluster is released once its checkpoints are verified",
        T0 + 10,  # Admitted stays True beside Evicted until the reservation is unset
        T0 + 100,
    ),
    (
        "evicted and requeued: waiting to be readmitted",
        facts(REQUEUED, suspended=True, deployment="Suspended", ever=True),
        KueuePhase.PREEMPTED,
        f"Preempted (Kueue: team-a): {PREEMPTION}; waiting to be readmitted",
        None,
        T0 + 100,
    ),
    (
        "readmitted: SetQuotaReservation reset Evicted to False",
        facts(READMITTED, suspended=True, deployment="Suspended", ever=True),
        KueuePhase.ADMITTED,
        "Admitted by Kueue",
        T0 + 500,
        None,
    ),
    (
        "admission lost without an Evicted condition, after an admission",
        facts(QUEUED, suspended=True, deployment="Suspended", ever=True),
        KueuePhase.PREEMPTED,
        f"Preempted (Kueue: team-a): {WAITING}",
        None,
        T0 + 1,
    ),
    (
        "finished",
        facts(FINISHED, suspended=False, deployment="Complete", ever=True),
        KueuePhase.FINISHED,
        "Kueue: Workload",
        None,
        T0 + 900,
    ),
    (
        "finished after an admission (Admitted stays True: finish.go Finish)",
        facts(ADMITTED_THEN_FINISHED, suspended=False, deployment="Complete"),
        KueuePhase.FINISHED,
        "Kueue: Workload",
        T0 + 10,
        T0 + 40,
    ),
]


@pytest.mark.parametrize("case,given,phase,message,admitted_at,stopped_at", VIEWS, ids=[v[0] for v in VIEWS])
def test_kueue_view(
    case: str, given: KueueFacts, phase: KueuePhase, message: str, admitted_at: float | None, stopped_at: float | None
) -> None:
    view = kueue_view(given)
    assert view.phase is phase
    assert view.message.startswith(message), view.message
    assert view.admitted_at == admitted_at
    assert view.stopped_at == stopped_at


def test_queued_printer_text_names_the_local_queue() -> None:
    assert kueue_view(facts(QUEUED, suspended=True, deployment="Suspended")).summary == "Queued (Kueue: team-a)"
    assert (
        kueue_view(facts(REQUEUED, suspended=True, deployment="Suspended", ever=True)).summary
        == "Preempted (Kueue: team-a)"
    )


def test_admitted_time_counts_only_admitted_intervals() -> None:
    """Admitted at T0+10, evicted at T0+100 (the Evicted condition's time, not the late reconcile's), readmitted
    at T0+500: 90 s counted, the queue time in between is not."""
    clock = AdmittedTime()
    steps = [
        (QUEUED, False, "Suspended", T0 + 5, 0.0, None),
        (ADMITTED, True, "Suspended", T0 + 12, 2.0, T0 + 10),
        (ADMITTED, False, "Running", T0 + 60, 50.0, T0 + 10),
        (EVICTING, True, "Suspending", T0 + 110, 90.0, None),
        (REQUEUED, True, "Suspended", T0 + 300, 90.0, None),
        (READMITTED, True, "Suspended", T0 + 510, 100.0, T0 + 500),
    ]
    for wl, suspended, deployment, now, active, since in steps:
        view = kueue_view(facts(wl, suspended=suspended, deployment=deployment, ever=clock.admissions > 0))
        clock = advance_admitted_time(clock, view, now)
        assert clock.active_seconds(now) == pytest.approx(active), (wl["status"]["conditions"], now)
        assert clock.since == since
    assert (clock.admissions, clock.preemptions) == (2, 1)
    assert clock.first_admitted_at == T0 + 10


def test_deadline_is_paused_while_not_admitted_and_resumes_with_what_is_left() -> None:
    budget = 3600.0
    running = AdmittedTime(seconds=0.0, since=T0, admissions=1)
    assert running.deadline_at(budget, T0 + 100) == T0 + 3600
    paused = AdmittedTime(seconds=1000.0, since=None, admissions=1, preemptions=1)
    assert paused.deadline_at(budget, T0 + 5000) is None  # paused: no deadline to pass
    assert paused.remaining_seconds(budget, T0 + 99999) == 2600.0  # the wall clock does not eat it
    readmitted = AdmittedTime(seconds=1000.0, since=T0 + 5000, admissions=2, preemptions=1)
    assert readmitted.deadline_at(budget, T0 + 5001) == T0 + 5000 + 2600


def test_startup_deadline_starts_at_admission_not_creation() -> None:
    assert AdmittedTime().startup_deadline_at(600) is None  # queued: the startup clock has not started
    assert AdmittedTime(since=T0 + 3600, admissions=1).startup_deadline_at(600) == T0 + 4200


def test_driver_deadline_while_suspended_is_now_plus_what_is_left() -> None:
    """KubeRay starts the readmitted attempt from the RayJob's runtimeEnvYAML at once: while suspended the env's
    SWEEP_DEADLINE_AT is kept at now + remaining, so it never runs past the admitted budget."""
    paused = AdmittedTime(seconds=1000.0)
    assert driver_deadline_at(paused, 3600, T0) == T0 + 2600
    assert driver_deadline_at(AdmittedTime(seconds=0.0, since=T0), 3600, T0 + 50) == T0 + 3600
    assert driver_deadline_at(AdmittedTime(seconds=5000.0), 3600, T0) == T0  # spent: due now


@pytest.mark.parametrize("late", [0.0, 30.0])
def test_a_late_reconcile_closes_the_interval_at_the_eviction(late: float) -> None:
    clock = AdmittedTime(since=T0 + 10, admissions=1)
    view = kueue_view(facts(EVICTING, suspended=True, deployment="Suspending", ever=True))
    after = advance_admitted_time(clock, view, T0 + 100 + late)
    assert after.seconds == 90.0 and after.since is None and after.preemptions == 1


def test_an_admission_no_pass_saw_is_counted_once_from_the_workloads_own_times() -> None:
    """An attempt Kueue admitted and that finished between two passes (a short attempt, a busy operator): the pass
    that finds the Workload Finished counts the admission and its 30 s, from Admitted's and Finished's times; the
    next passes do not count it again."""
    view = kueue_view(facts(ADMITTED_THEN_FINISHED, suspended=False, deployment="Complete"))
    clock = advance_admitted_time(AdmittedTime(), view, T0 + 100)
    assert (clock.seconds, clock.since, clock.admissions) == (30.0, None, 1)
    assert clock.first_admitted_at == clock.last_admission_at == T0 + 10
    assert advance_admitted_time(clock, view, T0 + 200) == clock
    assert AdmittedTime.from_status(clock.to_status()) == clock  # and after a restart


def test_an_admission_evicted_before_any_pass_saw_it_counts_the_admission_and_the_preemption() -> None:
    evicting = kueue_view(facts(EVICTING, suspended=True, deployment="Suspending"))
    clock = advance_admitted_time(AdmittedTime(), evicting, T0 + 120)
    assert (clock.seconds, clock.since, clock.admissions, clock.preemptions) == (90.0, None, 1, 1)
    assert advance_admitted_time(clock, evicting, T0 + 130) == clock
    requeued = kueue_view(facts(REQUEUED, suspended=True, deployment="Suspended", ever=True))
    assert advance_admitted_time(clock, requeued, T0 + 140) == clock  # Admitted False now: nothing more to count


def test_an_admission_seen_is_closed_at_the_finish_not_at_the_late_pass() -> None:
    seen = advance_admitted_time(
        AdmittedTime(), kueue_view(facts(ADMITTED, suspended=False, deployment="Running")), T0 + 12
    )
    assert (seen.since, seen.last_admission_at) == (T0 + 10, T0 + 10)
    view = kueue_view(facts(ADMITTED_THEN_FINISHED, suspended=False, deployment="Complete", ever=True))
    closed = advance_admitted_time(seen, view, T0 + 300)
    assert (closed.seconds, closed.since, closed.admissions) == (30.0, None, 1)
    assert advance_admitted_time(closed, view, T0 + 400) == closed


def test_a_clock_recorded_before_admissions_had_an_identity_is_not_counted_twice() -> None:
    legacy = AdmittedTime.from_status(
        KueueStatus.model_validate({"admittedSeconds": 30, "admissions": 1, "firstAdmittedAt": iso(T0 + 10)})
    )
    view = kueue_view(facts(ADMITTED_THEN_FINISHED, suspended=False, deployment="Complete", ever=True))
    assert advance_admitted_time(legacy, view, T0 + 100) == legacy


def test_admitted_time_round_trips_through_the_status() -> None:
    clock = AdmittedTime(
        seconds=90.0, since=T0 + 500, admissions=2, preemptions=1, first_admitted_at=T0 + 10, last_admission_at=T0 + 500
    )
    assert AdmittedTime.from_status(clock.to_status()) == clock
    assert AdmittedTime.from_status(None) == AdmittedTime()


@pytest.mark.parametrize(
    "status,field",
    [
        ({"admittedSeconds": -1}, "status.kueue.admittedSeconds"),
        ({"preemptions": -1}, "status.kueue.preemptions"),
        ({"admittedSince": "yesterday"}, "status.kueue.admittedSince"),
        ({"lastAdmissionAt": "soon"}, "status.kueue.lastAdmissionAt"),
    ],
)
def test_a_bad_recorded_clock_names_the_field(status: dict[str, Any], field: str) -> None:
    with pytest.raises(KueueError, match=field.replace(".", r"\.")):
        AdmittedTime.from_status(KueueStatus.model_validate(status))


@pytest.mark.parametrize(
    "status,field", [({"admittedSeconds": "x"}, "admittedSeconds"), ({"preemptions": 1.5}, "preemptions")]
)
def test_a_clock_field_of_the_wrong_type_is_named_where_the_status_is_read(status: dict[str, Any], field: str) -> None:
    """A value of the wrong type never reaches the clock: the status model refuses it, naming the field (the
    lenient read then leaves status.kueue out rather than guess at it)."""
    with pytest.raises(ValidationError, match=field):
        KueueStatus.model_validate(status)
    assert read_status({"phase": "Suspended", "kueue": status}).kueue is None


@pytest.mark.parametrize(
    "bad,field",
    [
        ({"metadata": {}}, "metadata.name"),
        ({"metadata": {"name": "w"}, "status": {"conditions": {"type": "Admitted"}}}, "status.conditions"),
        (
            {"metadata": {"name": "w"}, "status": {"conditions": [{"type": "Admitted", "status": "yes"}]}},
            r"status.conditions\[0\]",
        ),
    ],
)
def test_an_unreadable_workload_names_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(KueueError, match=field):
        WorkloadFacts.from_object(bad)


def test_the_workload_of_a_rayjob_is_the_one_it_controls() -> None:
    """jobframework ConstructWorkload sets a controller ownerReference to the job."""
    rayjob = {"metadata": {"uid": "u-1", "labels": {"kueue.x-k8s.io/queue-name": "team-a"}}}
    mine = {
        "metadata": {
            "name": "w1",
            "creationTimestamp": iso(T0),
            "ownerReferences": [{"uid": "u-1", "controller": True}],
        }
    }
    other = {
        "metadata": {
            "name": "w2",
            "creationTimestamp": iso(T0 + 1),
            "ownerReferences": [{"uid": "u-2", "controller": True}],
        }
    }
    assert workload_of(rayjob, [other, mine]) is mine
    assert workload_of(rayjob, [other]) is None
    assert kueue_managed(rayjob) and not kueue_managed({"metadata": {"labels": {}}})


# ---- what steps aside in Kueue mode


@pytest.mark.parametrize(
    "env,spec_queue,namespace,expected",
    [
        (
            {"SWEEP_KUEUE_DEFAULT_QUEUE": "default", "SWEEP_KUEUE_NAMESPACE_QUEUES": "team-a=a-queue"},
            "gpu-q",
            "team-a",
            "gpu-q",
        ),  # spec.queueName wins
        (
            {"SWEEP_KUEUE_DEFAULT_QUEUE": "default", "SWEEP_KUEUE_NAMESPACE_QUEUES": "team-a=a-queue"},
            "",
            "team-a",
            "a-queue",
        ),  # the chart's per-namespace entry
        (
            {"SWEEP_KUEUE_DEFAULT_QUEUE": "default", "SWEEP_KUEUE_NAMESPACE_QUEUES": "team-a=a-queue"},
            "",
            "team-b",
            "default",
        ),  # the chart's default queue
        ({"SWEEP_KUEUE_DEFAULT_QUEUE": "default", "SWEEP_KUEUE_NAMESPACE_QUEUES": "team-c="}, "", "team-c", ""),
        ({}, "", "team-b", ""),  # Kueue mode off
    ],
)
def test_queue_name_for(env: dict[str, str], spec_queue: str, namespace: str, expected: str) -> None:
    settings = Settings.from_env(env)
    assert queue_name_for(spec_queue, settings.kueue_queue_for(namespace)) == expected


@pytest.mark.parametrize(
    "env,field",
    [
        ({"SWEEP_KUEUE_NAMESPACE_QUEUES": "team-a"}, "SWEEP_KUEUE_NAMESPACE_QUEUES"),
        ({"SWEEP_KUEUE_DEFAULT_QUEUE": "Team_Queue"}, "SWEEP_KUEUE_DEFAULT_QUEUE"),
    ],
)
def test_a_bad_queue_setting_stops_the_operator_naming_the_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(SettingsError, match=field):
        Settings.from_env(env)


def test_our_namespace_budget_and_fifo_step_aside_only_in_kueue_mode() -> None:
    assert our_queue_steps_aside("team-a") is True
    assert our_queue_steps_aside("") is False


def test_kueue_admission_never_queues_but_per_sweep_caps_still_hold() -> None:
    """Far over the namespace budget (maxGpusPerNamespace 1) yet admitted: Kueue's quota decides when it runs."""
    limits = OperatorLimits(max_gpus_per_namespace=1, max_gpus_per_sweep=16, max_workers_per_sweep=16)
    sweep = parse_sweep(changed(gpu_sweep(), {"spec.trial.workers": 2, "spec.tune.maxConcurrentTrials": 2}))
    decision = decide_kueue_admission(sweep.spec, limits)
    assert isinstance(decision, Admit) and decision.demand.gpus == 4
    capped = OperatorLimits(max_gpus_per_sweep=2, max_gpus_per_namespace=32)
    refused = decide_kueue_admission(sweep.spec, capped)
    assert isinstance(refused, Reject)
    assert any("maxGpusPerSweep" in str(p) for p in refused.problems)


# ---- one reconcile pass in Kueue mode


def rayjob_for(wl: dict[str, Any] | None, *, suspended: bool, deployment: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "s-abc123", "uid": "rj-uid", "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
        "spec": {"suspend": suspended},
        "status": {"jobDeploymentStatus": deployment},
    }


def owned(wl: dict[str, Any]) -> dict[str, Any]:
    return {**wl, "metadata": {**wl["metadata"], "ownerReferences": [{"uid": "rj-uid", "controller": True}]}}


def run_at(
    status: SweepStatus,
    wl: dict[str, Any] | None,
    *,
    suspended: bool,
    deployment: str,
    now: float,
    budget: float = 3600.0,
) -> Any:
    run = kueue_run(
        status, rayjob_for(wl, suspended=suspended, deployment=deployment), [owned(wl)] if wl else [], now, budget
    )
    assert run is not None
    return run


def test_a_rayjob_without_the_queue_label_is_not_a_kueue_run() -> None:
    plain = {"metadata": {"name": "x", "labels": {}}, "spec": {}, "status": {}}
    assert kueue_run(read_status({}), plain, [], T0, 3600) is None
    assert kueue_run(read_status({}), None, [], T0, 3600) is None


def test_queued_pass_pauses_the_deadline_and_says_kueues_message() -> None:
    """A queued sweep: phase Queued with Kueue's message, no deadlineAt (no deadline can pass), and the RayJob's
    SWEEP_DEADLINE_AT kept at now + the whole budget (KubeRay starts the attempt from it at admission)."""
    previous = read_status({"phase": "Starting", "deadlineAt": iso(T0 + 3600), "startedAt": iso(T0)})
    run = run_at(previous, QUEUED, suspended=True, deployment="Suspended", now=T0 + 60)
    seen = status_for_run_phase(previous, run, T0 + 60)
    assert "deadlineAt" not in status_document(seen)
    out = kueue_outcome(previous, updated(previous, phase="Suspended"), run, T0 + 60, rayjob_deadline_at=T0 + 3600)
    written = status_document(out.status)
    assert written["phase"] == "Queued" and written["message"] == f"Queued (Kueue: team-a): {WAITING}"
    assert "deadlineAt" not in written and "startedAt" not in written
    assert written["kueue"]["summary"] == "Queued (Kueue: team-a)" and written["kueue"]["state"] == "Queued"
    assert ("Admitted", False, "QueuedByKueue", f"Queued (Kueue: team-a): {WAITING}") in out.conditions
    assert out.driver_deadline_at == T0 + 60 + 3600
    assert out.drop_suspend  # Kueue controls spec.suspend


def test_admitted_pass_starts_the_deadline_and_the_startup_clock_at_admission() -> None:
    previous = read_status({"phase": "Queued", "kueue": {"state": "Queued"}})
    run = run_at(previous, ADMITTED, suspended=True, deployment="Suspended", now=T0 + 12)
    seen = status_for_run_phase(previous, run, T0 + 12)
    assert seen.started_at == iso(T0 + 10) and seen.deadline_at == iso(T0 + 10 + 3600)
    out = kueue_outcome(previous, updated(previous, phase="Suspended"), run, T0 + 12)
    assert out.status.phase == "Starting"  # Kueue admitted it; KubeRay has not unsuspended yet
    assert status_document(out.status)["kueue"]["admissions"] == 1
    assert status_document(out.status)["kueue"]["clusterQueue"] == "gpu-cq"
    assert out.events == (("Normal", "AdmittedByKueue", "admitted by Kueue: ClusterQueue gpu-cq (LocalQueue team-a)"),)
    assert out.driver_deadline_at is None  # admitted: the attempt's deadline is set; not rewritten under it


def test_preempted_pass_is_suspended_with_one_warning_and_the_clock_stops_at_the_eviction() -> None:
    running = read_status(
        {"phase": "Running", "kueue": {"state": "Admitted", "admittedSince": iso(T0 + 10), "admissions": 1}}
    )
    run = run_at(running, EVICTING, suspended=True, deployment="Suspending", now=T0 + 105)
    out = kueue_outcome(running, updated(running, phase="Suspended"), run, T0 + 105, rayjob_deadline_at=T0 + 3000)
    written = status_document(out.status)
    assert written["phase"] == "Suspended" and written["message"].startswith("Preempted (Kueue: team-a): ")
    assert written["kueue"]["admittedSeconds"] == 90 and written["kueue"]["preemptions"] == 1
    assert "admittedSince" not in written["kueue"] and "deadlineAt" not in written
    assert [e[1] for e in out.events] == ["PreemptedByKueue"]
    assert out.driver_deadline_at == T0 + 105 + 3600 - 90
    again = kueue_outcome(
        out.status,
        out.status,
        run_at(out.status, REQUEUED, suspended=True, deployment="Suspended", now=T0 + 300),
        T0 + 300,
    )
    assert again.events == ()  # once per preemption


def test_readmission_continues_with_what_is_left() -> None:
    preempted = read_status(
        {
            "phase": "Suspended",
            "kueue": {
                "state": "Preempted",
                "admittedSeconds": 90,
                "admissions": 1,
                "preemptions": 1,
                "firstAdmittedAt": iso(T0 + 10),
            },
        }
    )
    run = run_at(preempted, READMITTED, suspended=True, deployment="Suspended", now=T0 + 501)
    out = kueue_outcome(preempted, preempted, run, T0 + 501)
    assert out.status.deadline_at == iso(T0 + 500 + 3600 - 90)
    assert out.status.started_at == iso(T0 + 10)  # the sweep's first admission stays its start
    assert status_for_run_phase(preempted, run, T0 + 501).started_at == iso(T0 + 500)  # startup: this admission
    assert status_document(out.status)["kueue"]["admissions"] == 2


def test_a_terminal_phase_is_left_as_decided() -> None:
    previous = read_status(
        {"phase": "Running", "kueue": {"state": "Admitted", "admittedSince": iso(T0 + 10), "admissions": 1}}
    )
    decided = updated(previous, phase="Succeeded", deadline_at=iso(T0 + 3610))
    out = kueue_outcome(
        previous, decided, run_at(previous, FINISHED, suspended=False, deployment="Complete", now=T0 + 900), T0 + 900
    )
    assert out.status.phase == "Succeeded" and out.status.deadline_at == iso(T0 + 3610)
    assert out.conditions == () and out.driver_deadline_at is None
    ended = kueue_outcome(
        updated(previous, deadline_at=iso(T0 + 3610)),
        read_status({"phase": "Succeeded"}),
        out_run := run_at(previous, FINISHED, suspended=False, deployment="Complete", now=T0 + 900),
        T0 + 900,
    )
    assert ended.status.deadline_at == iso(T0 + 3610) and out_run.view.phase is KueuePhase.FINISHED


def test_the_status_right_after_the_create_is_queued_without_a_deadline() -> None:
    created = status_document(
        kueue_created_status(read_status({"phase": "Starting", "deadlineAt": iso(T0), "startedAt": iso(T0)}), "team-a")
    )
    assert created["phase"] == "Queued" and "deadlineAt" not in created and "startedAt" not in created
    assert created["message"].startswith("Queued (Kueue: team-a): waiting for Kueue")


def test_a_kueue_sweep_holds_none_of_the_namespace_budget_after_a_ledger_rebuild() -> None:
    """An operator restart rebuilds the namespace ledger from the sweeps' statuses: a Kueue sweep (status.kueue)
    is held by Kueue's quota and is not counted, so it never queues the namespace's other sweeps."""
    from sweep_operator.admission_ledger import AdmissionLedger

    running = {
        "metadata": {"name": "kq", "namespace": "ml"},
        "spec": gpu_sweep()["spec"],
        "status": {"runId": "abc123", "phase": "Running", "kueue": {"localQueue": "team-a"}},
    }
    plain = {
        "metadata": {"name": "own", "namespace": "ml"},
        "spec": gpu_sweep()["spec"],
        "status": {"runId": "def456", "phase": "Running"},
    }
    ledger = AdmissionLedger(lambda namespace: [running, plain], lambda namespace: [])
    spec = parse_sweep(gpu_sweep("new", "ml")).spec
    decision = ledger.decide("ml", "new", "2026-12-03T10:00:00Z", spec, OperatorLimits(max_gpus_per_namespace=8))
    assert isinstance(decision, Admit)  # 4 (own) + 4 (new) fit in 8: the Kueue sweep's 4 GPUs are Kueue's
    assert ledger.in_use("ml").gpus == 8


def kueue_pass_facts(*, rayjob_deadline: float | None) -> Any:
    """A Kueue sweep's pass facts: its RayJob (queue label, suspended, waiting) as the operator rendered it."""
    from sweep_contracts.runtime_env import encode, run_spec_of
    from sweep_operator.reconcile.facts import SweepFacts
    from sweep_operator.rendering import build_rayjob

    body = {**gpu_sweep("s", "ml"), "status": {"runId": "abc123", "phase": "Starting"}}
    body["metadata"] = {**body["metadata"], "uid": "u1", "generation": 1}
    sweep = parse_sweep(body)
    rayjob = build_rayjob(sweep, "abc123")
    rayjob["metadata"] = {**rayjob["metadata"], "uid": "rj-uid", "labels": {"kueue.x-k8s.io/queue-name": "team-a"}}
    rayjob["spec"] = {**rayjob["spec"], "suspend": True, "runtimeEnvYAML": encode(run_spec_of(rayjob), None)}
    if rayjob_deadline is not None:
        rayjob["spec"]["runtimeEnvYAML"] = encode(run_spec_of(rayjob), int(rayjob_deadline))
    rayjob["status"] = {"jobDeploymentStatus": "Suspended"}
    limits = OperatorLimits()
    return SweepFacts(body, T0 + 60, limits, sweep, rayjob_body=rayjob, run_spec=run_spec_of(rayjob))


def test_a_plain_rayjob_is_no_kueue_run_and_its_workloads_are_not_read() -> None:
    from dataclasses import replace

    from sweep_operator.reconcile.kueue import kueue_run_of, workloads_wanted

    facts = kueue_pass_facts(rayjob_deadline=None)
    plain = {**facts.rayjob_body, "metadata": {**facts.rayjob_body["metadata"], "labels": {}}}
    assert workloads_wanted(facts) == "ml"  # a Kueue RayJob: its namespace's Workloads are read
    for other in (replace(facts, rayjob_body=plain), replace(facts, rayjob_body=None)):
        assert workloads_wanted(other) is None
        assert kueue_run_of(other, [owned(QUEUED)]) is None


@pytest.mark.parametrize("kueue", [{"admittedSeconds": "x"}, {"preemptions": 1.5}, "not an object"])
def test_a_recorded_clock_that_does_not_parse_stops_the_pass_instead_of_starting_again_at_zero(kueue: Any) -> None:
    """The lenient read leaves an unparseable status.kueue out; Kueue's clock is what the deadline counts, so the
    pass refuses to take that for no clock (the deadline would start again), naming the field."""
    from dataclasses import replace

    from sweep_operator.reconcile.kueue import kueue_run_of

    facts = kueue_pass_facts(rayjob_deadline=None)
    assert kueue_run_of(facts, [owned(QUEUED)]) is not None
    bad = replace(facts, body={**facts.body, "status": {"phase": "Queued", "runId": "abc123", "kueue": kueue}})
    assert bad.status.kueue is None and bad.status.run_id == "abc123"
    with pytest.raises(KueueError, match=r"status\.kueue"):
        kueue_run_of(bad, [owned(QUEUED)])


@pytest.mark.parametrize(
    ("rayjob_deadline", "rewritten"),
    [
        (None, True),  # no SWEEP_DEADLINE_AT yet: set it to now + the admitted time left
        (T0 + 60 + 21600 - 20, False),  # within the tolerance of what is left: left as it is
    ],
)
def test_a_kueue_pass_drops_set_suspend_with_a_warning_and_keeps_the_driver_deadline_current(
    rayjob_deadline: float | None, rewritten: bool
) -> None:
    from sweep_contracts.runtime_env import decode
    from sweep_operator.reconcile.actions import Decision, Event, ReleaseBudget, SetRuntimeEnv, SetSuspend
    from sweep_operator.reconcile.kueue import kueue_run_of
    from sweep_operator.reconcile.run_pass import in_kueue_mode

    facts = kueue_pass_facts(rayjob_deadline=rayjob_deadline)
    run = kueue_run_of(facts, [owned(QUEUED)])
    assert run is not None
    assert run.active_seconds == 21600  # gpu_sweep's deadlines.activeSeconds
    asked = Decision(
        updated(facts.status, phase="Suspended"),
        (SetSuspend("s-abc123", True), ReleaseBudget()),
        (Event("Normal", "Kept", "the run-phase decision's Event"),),
    )
    decided = in_kueue_mode(facts, asked, run, reconcile_seconds=10)
    assert decided.status is not None and decided.status.phase == "Queued"
    assert [e.reason for e in decided.events] == ["Kept", "SuspendIgnoredInKueueMode"]
    assert decided.wants(SetSuspend) is None and decided.wants(ReleaseBudget) == ReleaseBudget()
    if rewritten:
        assert isinstance(decided.actions[0], SetRuntimeEnv)  # sent before the other actions and the write
        assert decided.actions[0].rayjob == facts.rayjob_body["metadata"]["name"]
        env = decode(decided.actions[0].runtime_env)["env_vars"]
        assert env["SWEEP_DEADLINE_AT"] == str(int(T0 + 60 + 21600))
    else:
        assert decided.wants(SetRuntimeEnv) is None
