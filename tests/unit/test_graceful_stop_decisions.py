"""The operator's graceful stop before a RayJob delete (reconcile.graceful_stop, issue 26): KubeRay's deletion path
stops a job at once (`rayjob_controller.go`, the deletion branch: StopJob), so the operator asks Ray's Jobs API first
and holds the delete by state, never longer than the window."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_operator.reconcile import graceful_stop as gs


def rayjob(job_status: str = "RUNNING", *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "s-r1", "uid": "u1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    return {"metadata": meta, "status": {"jobStatus": job_status, "jobId": "s-r1-abc", "dashboardURL": "h:8265"}}


@pytest.mark.parametrize(
    "body,why",
    [
        (None, "no RayJob"),
        (rayjob("SUCCEEDED"), "ended"),
        (rayjob("STOPPED"), "stopped"),
        (rayjob("FAILED"), "failed"),
        (rayjob(""), "never submitted"),
        (rayjob(deleting=True), "KubeRay's deletion branch already stopped it"),
    ],
)
def test_nothing_to_stop_deletes_at_once(body: Any, why: str) -> None:
    step = gs.decide_graceful_stop(body, addressable=True, requested_at=None, now=100.0, window=60)
    assert step == gs.StopStep(False, None, step.why), why


def test_a_running_job_is_asked_then_waited_for_at_most_the_window() -> None:
    first = gs.decide_graceful_stop(rayjob(), addressable=True, requested_at=None, now=100.0, window=60)
    assert first.request and first.wait_s == gs.FIRST_LOOK_S
    waiting = gs.decide_graceful_stop(rayjob(), addressable=True, requested_at=100.0, now=130.0, window=60)
    assert not waiting.request and waiting.wait_s is not None and 0 < waiting.wait_s <= 30
    assert gs.decide_graceful_stop(rayjob(), addressable=True, requested_at=100.0, now=160.0, window=60).wait_s is None
    # The job ended while asked: delete now, whatever the window says.
    assert (
        gs.decide_graceful_stop(rayjob("STOPPED"), addressable=True, requested_at=100.0, now=101, window=60).wait_s
        is None
    )
    # The driver recorded its own stop in _sweep/status.json: nothing left to wait for.
    done = gs.decide_graceful_stop(
        rayjob(), addressable=True, requested_at=100.0, now=101.0, window=60, driver_stopped=True
    )
    assert done.wait_s is None


def test_a_job_without_a_dashboard_url_or_id_is_left_to_kuberays_stop() -> None:
    step = gs.decide_graceful_stop(rayjob(), addressable=False, requested_at=None, now=100.0, window=60)
    assert not step.request and step.wait_s is None and "dashboard" in step.why


def test_the_window_is_the_graceful_stop_plus_kuberays_look_capped_by_the_operator() -> None:
    assert gs.window_s(300, 900) == 300 + gs.OBSERVE_MARGIN_S
    assert gs.window_s(3000, 900) == 900
    assert gs.window_s(0, 900) == gs.OBSERVE_MARGIN_S


def workload(uid: str, evicted: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "rayjob-s-r1-x",
            "creationTimestamp": "2026-12-05T00:00:00Z",
            "ownerReferences": [{"kind": "RayJob", "uid": uid, "controller": True}],
        },
        "spec": {"queueName": "team"},
        "status": {"conditions": [{"type": "Evicted", "status": evicted, "reason": "Preempted"}]},
    }


def test_a_kueue_eviction_is_read_from_the_workload_it_controls_never_from_spec_suspend() -> None:
    """Kueue's evict.IsEvicted (Evicted=True on the Workload whose controller is the RayJob, kueue.workload_of)."""
    job = {**rayjob(), "metadata": {"name": "s-r1", "uid": "u1", "labels": {"kueue.x-k8s.io/queue-name": "team"}}}
    assert gs.evicted_by_kueue(job, [workload("u1", "True")])
    assert not gs.evicted_by_kueue(job, [workload("u1", "False")])
    assert not gs.evicted_by_kueue(job, [workload("someone-else", "True")])
    suspended = {**job, "spec": {"suspend": True}}  # a suspend alone (anyone may set it) is no eviction
    assert not gs.evicted_by_kueue(suspended, [])
    assert not gs.evicted_by_kueue(rayjob(), [workload("u1", "True")]), "not a Kueue RayJob (no queue-name label)"


def test_a_stop_request_is_recorded_in_the_sweeps_status_and_read_back_only_for_its_rayjob() -> None:
    """An operator restart in the middle of a stop neither restarts the window nor forgets it: the request time is
    in status.gracefulStop (only the operator writes status), keyed by the RayJob's uid (a new run's RayJob of the
    same name is another stop)."""
    recorded = gs.request_status("uid-1", 1_800_000_000.4)
    assert recorded == {"gracefulStop": {"rayJobUid": "uid-1", "requestedAt": "2027-01-15T08:00:00Z"}}
    assert gs.recorded_request(recorded, "uid-1") == 1_800_000_000.0  # whole seconds: the window only shortens
    assert gs.recorded_request(recorded, "uid-2") is None
    assert gs.recorded_request({}, "uid-1") is None
    assert gs.recorded_request({"gracefulStop": {"rayJobUid": "uid-1", "requestedAt": "garbage"}}, "uid-1") is None
    assert gs.recorded_request(recorded, "") is None
