"""One run pass's decision (reconcile.run_pass, issue 29): the run-phase rules, the GPU-hour measurement and Kueue
mode applied in one order to facts read before; which rule wins where two meet is stated there once."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sweep_contracts.api import Phase
from sweep_operator.reconcile.actions import DeleteRayJob, Finish, RecordGpuHours, ReleaseBudget
from sweep_operator.reconcile.run_pass import PodsRead, RunReads, decide_run_pass
from sweep_operator.status import rfc3339
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
    assert decision.status["phase"] == Phase.BUDGET_EXHAUSTED
    assert kinds(decision.actions) == [RecordGpuHours, DeleteRayJob, ReleaseBudget, Finish]
    assert decision.actions[0].usage == decision.status["usage"] and decision.actions[0].terminal


def test_a_run_the_run_phase_ended_keeps_its_phase_and_a_single_stop() -> None:
    past = {**RUNNING_NOW, "deadlineAt": rfc3339(USAGE_T0 - 3600)}
    decision = decide(past, RunReads(pods=pods_read(hours_ago=2, gpus=4, record=False)), budget={"gpuHours": 1})
    assert decision.status["phase"] == Phase.DEADLINE_EXCEEDED
    assert kinds(decision.actions).count(DeleteRayJob) == 1 and RecordGpuHours not in kinds(decision.actions)


def test_the_run_phase_judges_the_clock_in_the_facts_and_the_status_as_read_stays() -> None:
    past = {**RUNNING_NOW, "deadlineAt": rfc3339(USAGE_T0 - 3600)}
    sweep = facts(past, job(), now=USAGE_T0)
    held = replace(sweep, clock={"deadlineAt": None})  # Kueue holds the run: no deadline counts
    assert sweep.judged_status["deadlineAt"] == past["deadlineAt"] and "deadlineAt" not in held.judged_status
    assert held.status["deadlineAt"] == past["deadlineAt"]
    ended = decide_run_pass(sweep, RunReads(), reconcile_seconds=10, refresh_seconds=60)
    kept = decide_run_pass(held, RunReads(), reconcile_seconds=10, refresh_seconds=60)
    assert ended.status["phase"] == Phase.DEADLINE_EXCEEDED and kept.status["phase"] == Phase.RUNNING


def test_a_held_sweep_past_its_deadline_is_stopped_with_an_event_and_nothing_else_of_the_run_phase() -> None:
    from sweep_operator.reconcile.run_pass import decide_held_pass

    held = {**RUNNING_NOW, "phase": "Deleting", "deadlineAt": rfc3339(USAGE_T0 - 3600)}
    decision = decide_held_pass(facts(held, job(), now=USAGE_T0), None, refresh_seconds=60)
    assert kinds(decision.actions) == [DeleteRayJob] and decision.status is None  # no phase change while held
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
    assert decision.status is not None and decision.status["phase"] == "Deleting" and decision.status["usage"]
    assert "GPU-hour budget is spent" in decision.events[-1].message
