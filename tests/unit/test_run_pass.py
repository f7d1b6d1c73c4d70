"""One run pass's decision (reconcile.run_pass, issue 29): the run-phase rules, the GPU-hour measurement and Kueue
mode applied in one order to facts read before; which rule wins where two meet is stated there once."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sweep_contracts.api import Phase
from sweep_operator.reconcile.actions import DeleteRayJob, Finish, RecordDeadlineStop, RecordGpuHours, ReleaseBudget
from sweep_operator.reconcile.run_pass import PodsRead, RunReads, decide_run_pass
from sweep_operator.status import rfc3339, status_document
from tests.unit.test_run_phase import RUNNING, facts, job, kinds
from tests.unit.test_usage import T0 as USAGE_T0
from tests.unit.test_usage import pod

CLUSTER = "digits-r1-raycluster"


def pods_read(*, hours_ago: float, gpus: int, record: bool = True) -> PodsRead:
    # test_usage's pods are scheduled relative to its own T0; shift them onto this pass's clock
    body = pod("w1", gpus=gpus, cluster=CLUSTER, scheduled=-hours_ago * 3600)
    return PodsRead((body,), frozenset({CLUSTER}), None, None, record=record)


def decide(status: dict[str, Any], reads: RunReads, **spec: Any) -> Any:
    sweep = facts(status, job(), now=USAGE_T0, spec=spec)
    return decide_run_pass(sweep, reads, reconcile_seconds=10, refresh_seconds=60)


RUNNING_NOW = {**RUNNING, "deadlineAt": rfc3339(USAGE_T0 + 3600), "startedAt": rfc3339(USAGE_T0 - 7200)}


def test_a_spent_budget_stops_a_running_sweep_with_one_stop_and_the_ledger_record_first() -> None:
    decision = decide(RUNNING_NOW, RunReads(pods=pods_read(hours_ago=2, gpus=4)), budget={"gpuHours": 1})
    assert decision.status.phase == Phase.BUDGET_EXHAUSTED
    assert kinds(decision.actions) == [RecordGpuHours, DeleteRayJob, ReleaseBudget, Finish]
    assert decision.actions[0].usage == decision.status.usage and decision.actions[0].terminal


def test_a_run_the_run_phase_ended_keeps_its_phase_and_a_single_stop() -> None:
    past = {**RUNNING_NOW, "deadlineAt": rfc3339(USAGE_T0 - 3600)}
    decision = decide(past, RunReads(pods=pods_read(hours_ago=2, gpus=4, record=False)), budget={"gpuHours": 1})
    assert decision.status.phase == Phase.DEADLINE_EXCEEDED
    assert kinds(decision.actions).count(DeleteRayJob) == 1 and RecordGpuHours not in kinds(decision.actions)


def test_the_run_phase_judges_the_clock_in_the_facts_and_the_status_as_read_stays() -> None:
    past = {**RUNNING_NOW, "deadlineAt": rfc3339(USAGE_T0 - 3600)}
    sweep = facts(past, job(), now=USAGE_T0)
    held = replace(sweep, clock={"deadlineAt": None})  # Kueue holds the run: no deadline counts
    assert sweep.judged_status.deadline_at == past["deadlineAt"] and held.judged_status.deadline_at is None
    assert held.status.deadline_at == past["deadlineAt"]
    ended = decide_run_pass(sweep, RunReads(), reconcile_seconds=10, refresh_seconds=60)
    kept = decide_run_pass(held, RunReads(), reconcile_seconds=10, refresh_seconds=60)
    assert ended.status.phase == Phase.DEADLINE_EXCEEDED and kept.status.phase == Phase.RUNNING


def test_a_held_sweep_past_its_deadline_is_stopped_with_an_event_and_nothing_else_of_the_run_phase() -> None:
    from sweep_operator.reconcile.run_pass import decide_held_pass

    held = {**RUNNING_NOW, "phase": "Deleting", "deadlineAt": rfc3339(USAGE_T0 - 3600)}
    decision = decide_held_pass(facts(held, job(), now=USAGE_T0), None, refresh_seconds=60)
    assert kinds(decision.actions) == [DeleteRayJob, RecordDeadlineStop] and decision.status is None  # no phase change
    assert [e.reason for e in decision.events] == ["StoppedWhileHeld"] and "its deadline" in decision.events[0].message
    on_time = decide_held_pass(
        facts({**held, "deadlineAt": rfc3339(USAGE_T0 + 60)}, job(), now=USAGE_T0), None, refresh_seconds=60
    )
    assert on_time.actions == () and on_time.events == ()


def test_a_held_sweep_whose_budget_is_spent_is_stopped_and_keeps_measuring() -> None:
    from sweep_operator.reconcile.run_pass import decide_held_pass

    held = {**RUNNING_NOW, "phase": "Deleting"}
    sweep = facts(held, job(), now=USAGE_T0, spec={"budget": {"gpuHours": 1}})
    decision = decide_held_pass(sweep, pods_read(hours_ago=2, gpus=4), refresh_seconds=60)
    assert kinds(decision.actions) == [RecordGpuHours, DeleteRayJob]  # no ReleaseBudget/Finish: the guard holds it
    assert decision.status is not None and decision.status.phase == "Deleting" and decision.status.usage
    assert "GPU-hour budget is spent" in decision.events[-1].message


# ------------------------------------------------------------------ one decision over everything read (issue 29)
def _ended_with_a_resume() -> tuple[Any, Any]:
    """An ended CPU sweep whose spec asks for a resume, and what its pass read: the verification the decision asks
    for (resume.planned)."""
    from sweep_operator.reconcile.facts import SweepFacts
    from tests.unit.test_resume_decisions import NOW, Ports, ended_body
    from tests.unit.test_run_phase import LIMITS

    doc, sweep = ended_body(**{"spec.resume": {"generation": 1, "activeSeconds": 3600}})
    return SweepFacts(doc, NOW, LIMITS, sweep), Ports().reads(doc, sweep)


def _budgets(caps: Any, hours: Any = None) -> Any:
    from sweep_operator.reconcile.run_pass import BudgetReads
    from tests.unit.test_run_phase import LIMITS

    return BudgetReads(caps, "8/8", hours, LIMITS)


def test_a_resume_waiting_for_the_budgets_and_the_run_pass_make_one_decision_with_the_record_first() -> None:
    """The resume that waits for namespace capacity records the budgets' answer (ReserveBudget) in the pass's one
    decision: its message the first time, then, once written, before the run pass's own status and actions (the
    pass used to act twice: the record alone, then the run pass)."""
    from sweep_operator.policy import Demand, Queue
    from sweep_operator.reconcile.actions import ReserveBudget
    from sweep_operator.reconcile.run_pass import ResumeRead

    facts, records = _ended_with_a_resume()
    reads = RunReads(resume=ResumeRead(records, _budgets(Queue(Demand(workers=1, gpus=4), "4 GPUs wanted, 2 free"))))
    first = decide_run_pass(facts, reads, reconcile_seconds=10, refresh_seconds=60)
    (record,) = [a for a in first.actions if isinstance(a, ReserveBudget)]
    assert first.actions[0] is record and not record.admitted and record.attempt == "resume-2"
    assert first.status is not None and (first.status.message or "").endswith("4 GPUs wanted, 2 free")
    written = replace(facts, body={**facts.body, "status": status_document(first.status)})
    again = decide_run_pass(written, reads, reconcile_seconds=10, refresh_seconds=60)
    assert kinds(again.actions)[:1] == [ReserveBudget] and kinds(again.actions).count(ReserveBudget) == 1
    assert again.status is None or again.status.message == first.status.message, "the run pass, same wait"


def test_a_resume_the_budgets_admit_creates_its_attempt_after_recording_the_answer() -> None:
    from sweep_operator.policy import Admit, Demand
    from sweep_operator.reconcile.actions import CreateRayJob, ReserveBudget
    from sweep_operator.reconcile.run_pass import ResumeRead

    facts, records = _ended_with_a_resume()
    reads = RunReads(resume=ResumeRead(records, _budgets(Admit(Demand(workers=1, gpus=0)))))
    decision = decide_run_pass(facts, reads, reconcile_seconds=10, refresh_seconds=60)
    assert kinds(decision.actions) == [ReserveBudget, CreateRayJob] and decision.actions[0].admitted
    assert decision.actions[1].attempt == 2 and decision.status.phase == Phase.STARTING
    queued = decide_run_pass(facts, replace(reads, queue="team-a"), reconcile_seconds=10, refresh_seconds=60)
    assert queued.status.phase == Phase.QUEUED, "in Kueue mode the attempt waits for Kueue's admission"


def test_an_admission_decides_once_over_the_caps_and_the_gpu_hour_ledger_read_before() -> None:
    """The GPU caps admit; the namespace's GPU-hour ledger, read before deciding, has no room: one decision,
    queued or refused, with the record of the answer first. Without a ledger to ask, the same read admits."""
    from sweep_operator.gpu_time import NamespaceBudget
    from sweep_operator.policy import Admit, demand_of
    from sweep_operator.reconcile.actions import CreateRayJob, ReserveBudget
    from sweep_operator.reconcile.hours_ledger import HoursLedger
    from sweep_operator.reconcile.run_pass import decide_admit_pass
    from sweep_operator.rendering import RenderContext

    fresh = facts({}, None, now=USAGE_T0)
    assert fresh.sweep is not None
    caps = Admit(demand_of(fresh.sweep.spec))
    full = HoursLedger.from_object(None, NamespaceBudget(0.01, 86_400))
    refused = decide_admit_pass(fresh, _budgets(caps, full), RenderContext())
    assert kinds(refused.actions) == [ReserveBudget] and not refused.actions[0].admitted
    assert refused.status.phase in (Phase.QUEUED, Phase.INVALID) and "GPU-hour" in (refused.status.message or "")
    admitted = decide_admit_pass(fresh, _budgets(caps), RenderContext())
    assert kinds(admitted.actions) == [ReserveBudget, CreateRayJob] and admitted.actions[0].admitted


def test_gpus_up_with_no_trial_running_are_counted_in_the_decision_and_recorded_by_an_action() -> None:
    """unscheduled-trials: GPU workers up between the pass's look at the pods and the one before, while the driver's
    status shows no trial running, go into status.idleGpuSeconds and a RecordIdleGpus action (the metric)."""
    from sweep_operator.reconcile.actions import RecordIdleGpus

    trials = {"total": 4, "running": 0, "pending": 2, "terminated": 2}  # trained, now waiting for Tune
    idle = {**RUNNING_NOW, "trainingStartedAt": rfc3339(USAGE_T0 - 3000), "trials": trials}
    read = pods_read(hours_ago=1, gpus=2, record=False)
    for body in read.pods:
        body["metadata"].setdefault("labels", {})["ray.io/node-type"] = "worker"
    pods = replace(read, previous_look=USAGE_T0 - 30)
    decision = decide(idle, RunReads(pods=pods))
    (record,) = [a for a in decision.actions if isinstance(a, RecordIdleGpus)]
    assert record.cause == "unscheduled-trials" and record.gpu_seconds == pytest.approx(60.0)
    counted = decision.status.idle_gpu_seconds
    assert counted is not None and counted.unscheduled_trials == pytest.approx(60.0)
    first_look = decide(idle, RunReads(pods=replace(pods, previous_look=None)))
    assert not [a for a in first_look.actions if isinstance(a, RecordIdleGpus)], "nothing before a first look"
    # Partly idle: 6 GPUs up, one trial running of the factory's 2 workers x 1 GPU: the other 4 are idle too.
    six = pods_read(hours_ago=1, gpus=6, record=False)
    for body in six.pods:
        body["metadata"].setdefault("labels", {})["ray.io/node-type"] = "worker"
    one = {**idle, "trials": {**trials, "running": 1, "pending": 1}}
    decided = decide(one, RunReads(pods=replace(six, previous_look=USAGE_T0 - 30)))
    (partly,) = [a for a in decided.actions if isinstance(a, RecordIdleGpus)]
    assert partly.gpu_seconds == pytest.approx(30 * (6 - 2 * 1)), partly
    assert not [a for a in decide(one, RunReads(pods=pods)).actions if isinstance(a, RecordIdleGpus)], "2 up, 2 used"
