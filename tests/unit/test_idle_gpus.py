"""Hold the data, not the GPUs (issue 26, section 2): when a held RayCluster's workers go, as a table."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator.reconcile.idle_gpus import (
    MAX_LOOK_GAP_S,
    STOPPING,
    SUSPEND_LOOK_S,
    SUSPEND_WAIT_S,
    UNSCHEDULED_TRIALS,
    FreeWorkers,
    cause_of,
    decide_free_workers,
    decide_suspend_workers,
    driver_stopped,
    idle_status,
    no_trial_running,
    stop_outran_suspend,
    stopping_gpu_seconds,
    suspend_patch,
    unscheduled_gpu_seconds,
)
from sweep_operator.status import read_status, status_document, updated

DELETED_AT = 1_800_000_000.0  # 2027-01-15T08:00:00Z
GRACE = 60.0


def _time(epoch: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cluster(deleting: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "digits-r1-abcde", "namespace": "ml", "finalizers": [constants.FINALIZER]}
    if deleting:
        meta["deletionTimestamp"] = _time(DELETED_AT)
    return {"metadata": meta}


def pod(name: str, node_type: str, gpus: int, scheduled: float, cluster_name: str = "digits-r1-abcde") -> dict:
    return {
        "metadata": {"name": name, "labels": {"ray.io/cluster": cluster_name, "ray.io/node-type": node_type}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {constants.GPU_RESOURCE: gpus}}}]},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _time(scheduled)}]},
    }


PODS = [
    pod("head", "head", 0, DELETED_AT - 600),
    pod("w1", "worker", 1, DELETED_AT - 600),  # held 1 GPU since the deletion
    pod("w2", "worker", 4, DELETED_AT + 10),  # scheduled after it began
    pod("other", "worker", 8, DELETED_AT - 600, cluster_name="someone-else"),
]
RUNNING = {"metadata": {"name": "digits-r1"}, "status": {"jobStatus": "RUNNING"}}


@pytest.mark.parametrize(
    ("case", "body", "rayjob", "now", "expected"),
    [
        ("not being deleted", cluster(deleting=False), None, DELETED_AT + 999, None),
        ("driver may still train, window open", cluster(), RUNNING, DELETED_AT + GRACE - 1, None),
        ("window passed", cluster(), RUNNING, DELETED_AT + GRACE, ("w1", "w2", GRACE * 1 + (GRACE - 10) * 4)),
        ("job ended", cluster(), {**RUNNING, "status": {"jobStatus": "SUCCEEDED"}}, DELETED_AT + 20, ("w1", "w2", 60)),
        ("RayJob gone", cluster(), None, DELETED_AT + 20, ("w1", "w2", 20 + 10 * 4)),
        (
            "RayJob deleting: KubeRay stopped the job",
            cluster(),
            {**RUNNING, "metadata": {"name": "digits-r1", "deletionTimestamp": _time(DELETED_AT)}},
            DELETED_AT + 20,
            ("w1", "w2", 60),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_held_clusters_workers_go_once_the_driver_stopped_or_the_window_passed(
    case: str, body: dict, rayjob: dict | None, now: float, expected: tuple | None
) -> None:
    free = decide_free_workers(body, rayjob, PODS, now, GRACE)
    if expected is None:
        assert free is None, case
        return
    assert isinstance(free, FreeWorkers), case
    *names, gpu_seconds = expected
    assert free.pods == tuple(names), "only this cluster's workers; its head stays"
    assert free.gpu_seconds == pytest.approx(gpu_seconds), case
    assert free.cause == "held-deletion" and free.why


def test_nothing_to_free_when_the_workers_are_gone_already() -> None:
    assert decide_free_workers(cluster(), None, [PODS[0]], DELETED_AT + 999, GRACE) is None


def test_the_driver_is_running_only_while_the_job_is_not_terminal() -> None:
    assert driver_stopped(RUNNING) == ""
    for status in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert status in driver_stopped({"metadata": {}, "status": {"jobStatus": status}})


def test_a_hold_after_a_kueue_preemption_is_counted_as_preemption_and_holds_add_up() -> None:
    free = FreeWorkers(("w1",), 30.0, "window passed")
    assert cause_of(free, read_status({"phase": "Running"})) == "held-deletion"
    assert cause_of(free, read_status({"phase": "Suspended", "kueue": {"preemptions": 1}})) == "preemption"
    once = updated(read_status({}), idle_status(read_status({}), "held-deletion", 30.0))
    twice = updated(once, idle_status(once, "held-deletion", 12.5))
    assert status_document(twice) == {"idleGpuSeconds": {"heldDeletion": 42.5}}
    added = updated(twice, idle_status(twice, "preemption", 1.0))
    assert status_document(added)["idleGpuSeconds"] == {"heldDeletion": 42.5, "preemption": 1.0}


# --------------------------------------------------------------- where the operator starts the deletion: suspend first

RAYJOB = {"metadata": {"name": "digits-r1", "uid": "rj-uid"}, "status": {"jobStatus": "STOPPED"}}


def live_cluster(groups: list[dict] | None = None, autoscaling: bool = True, owner: str = "rj-uid") -> dict:
    owners = [{"kind": "RayJob", "name": "digits-r1", "uid": owner, "controller": True}]
    meta = {"name": "digits-r1-abcde", "namespace": "ml", "resourceVersion": "42", "ownerReferences": owners}
    spec = {
        "enableInTreeAutoscaling": autoscaling,
        "workerGroupSpecs": groups if groups is not None else [{"groupName": "gpu-workers", "replicas": 2}],
    }
    return {"metadata": meta, "spec": spec}


def test_the_suspend_patch_suspends_every_group_turns_the_autoscaler_off_and_is_conditional() -> None:
    """KubeRay v1.7.0 refuses a suspended group with the in-tree autoscaler on (utils/validation.go
    ValidateRayClusterSpec), so the patch turns it off; a merge patch replaces the list, so it carries the
    resourceVersion it was computed from."""
    patch = suspend_patch(live_cluster([{"groupName": "a", "replicas": 2}, {"groupName": "b", "suspend": True}]))
    assert patch == {
        "metadata": {"resourceVersion": "42"},
        "spec": {
            "workerGroupSpecs": [
                {"groupName": "a", "replicas": 2, "suspend": True},
                {"groupName": "b", "suspend": True},
            ],
            "enableInTreeAutoscaling": False,
        },
    }
    assert "enableInTreeAutoscaling" not in (suspend_patch(live_cluster(autoscaling=False)) or {})["spec"]
    assert suspend_patch(live_cluster([{"groupName": "a", "suspend": True}])) is None
    assert suspend_patch(live_cluster([])) is None


@pytest.mark.parametrize(
    ("case", "body", "pods", "now", "since", "expected"),
    [
        ("no cluster", None, [], 100.0, None, (False, None)),
        ("the cluster is being deleted (not reconciled)", cluster(), PODS, 100.0, None, (False, None)),
        ("another RayJob's cluster", live_cluster(owner="someone-else"), PODS, 100.0, None, (False, None)),
        ("groups running: suspend, look again soon", live_cluster(), PODS, 100.0, None, (True, SUSPEND_LOOK_S)),
        (
            "suspended, workers still up: wait",
            live_cluster([{"groupName": "g", "suspend": True}]),
            PODS,
            105.0,
            100.0,
            (False, SUSPEND_LOOK_S),
        ),
        (
            "suspended, workers gone: delete",
            live_cluster([{"groupName": "g", "suspend": True}]),
            PODS[:1],
            105.0,
            100.0,
            (False, None),
        ),
        (
            "KubeRay did not act in time: delete",
            live_cluster([{"groupName": "g", "suspend": True}]),
            PODS,
            100.0 + SUSPEND_WAIT_S,
            100.0,
            (False, None),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_the_operator_suspends_the_worker_groups_before_it_deletes_a_rayjob(
    case: str, body: dict | None, pods: list, now: float, since: float | None, expected: tuple
) -> None:
    step = decide_suspend_workers(body, RAYJOB, pods, now, since)
    assert (step.patch is not None, step.wait_s) == expected, case
    assert step.why


def test_the_heads_job_status_counts_as_the_driver_stopped_when_the_rayjobs_is_stale() -> None:
    """After a preemption KubeRay no longer polls the job: the RayJob says RUNNING, the head says STOPPED."""
    assert driver_stopped(RUNNING, head_status="RUNNING") == ""
    assert "head says" in driver_stopped(RUNNING, head_status="STOPPED")
    free = decide_free_workers(cluster(), RUNNING, PODS, DELETED_AT + 20, GRACE, head_status="STOPPED")
    assert free is not None and free.pods == ("w1", "w2")


def test_stopping_counts_the_workers_gpu_seconds_since_the_stop_was_asked() -> None:
    body = live_cluster()
    assert stopping_gpu_seconds(body, PODS, DELETED_AT, DELETED_AT + 30) == pytest.approx(30 * 1 + 20 * 4)


def test_a_stop_kuberay_ended_by_deleting_the_cluster_counts_until_the_deletion_began() -> None:
    """The stopped job's cluster deleted by KubeRay before the operator's suspend (shutdownAfterJobFinishes): the
    stop holds its workers until the deletion began, from which instant the guard's hold counts them."""
    deleting = cluster()  # deletionTimestamp DELETED_AT
    asked = DELETED_AT - 5
    assert stopping_gpu_seconds(deleting, PODS, asked, DELETED_AT + 30) == pytest.approx(5 * 1 + 0 * 4)
    free = decide_free_workers(deleting, None, PODS, DELETED_AT + 30, GRACE)
    assert free is not None and free.gpu_seconds == pytest.approx(30 * 1 + 20 * 4), "the hold starts there"


def test_a_stop_outran_the_suspend_only_when_the_deletion_came_after_the_ask_and_before_a_suspend() -> None:
    groups = {"workerGroupSpecs": [{"groupName": "gpu", "replicas": 2}]}
    deleting = {**cluster(), "spec": groups}
    suspended = {**cluster(), "spec": {"workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "suspend": True}]}}
    assert stop_outran_suspend(deleting, DELETED_AT - 5)
    assert stop_outran_suspend(deleting, DELETED_AT + 0.9), "the same second: deletionTimestamp has whole seconds"
    assert not stop_outran_suspend(deleting, DELETED_AT + 1), "asked after the deletion began (a preemption)"
    assert not stop_outran_suspend(deleting, None), "no stop asked (a user deleted the cluster)"
    assert not stop_outran_suspend(suspended, DELETED_AT - 5), "suspended first: recorded at the suspend"
    assert not stop_outran_suspend({**cluster(deleting=False), "spec": groups}, DELETED_AT - 5)


def test_unscheduled_trials_count_gpu_workers_between_looks_while_no_trial_runs() -> None:
    running = read_status({"phase": "Running", "trials": {"total": 4, "running": 0, "pending": 1}})
    now = DELETED_AT + 100
    assert no_trial_running(running)
    assert not no_trial_running(read_status({"phase": "Running", "trials": {"total": 4, "running": 1}}))
    assert not no_trial_running(read_status({"phase": "Running", "trials": {"total": 0, "running": 0}})), (
        "before any trial"
    )
    assert not no_trial_running(read_status({"phase": "Starting", "trials": {"total": 4, "running": 0}}))
    assert unscheduled_gpu_seconds(running, PODS, now - 10, now) == pytest.approx(10 * (1 + 4 + 8))
    assert unscheduled_gpu_seconds(running, PODS, None, now) == 0.0, "no previous look: nothing billed"
    assert unscheduled_gpu_seconds(running, PODS, now - 3600, now) == pytest.approx(MAX_LOOK_GAP_S * 13)
    gone = [{**p, "metadata": {**p["metadata"], "deletionTimestamp": _time(now)}} for p in PODS]
    assert unscheduled_gpu_seconds(running, gone, now - 10, now) == 0.0
    for cause, field in ((UNSCHEDULED_TRIALS, "unscheduledTrials"), (STOPPING, "stopping")):
        recorded = updated(read_status({}), idle_status(read_status({}), cause, 5.0))
        assert status_document(recorded) == {"idleGpuSeconds": {field: 5.0}}


def test_gpus_past_what_the_running_trials_use_are_counted_too() -> None:
    """Partly idle: fewer trials run than the workers hold (the search near its end, ASHA's stops). PODS hold 13
    GPUs; with 2 GPUs a trial and 3 trials running, 7 are idle; with 7 running (14 GPUs asked), none is."""
    now = DELETED_AT + 100
    status = read_status({"phase": "Running", "trials": {"total": 8, "running": 3}})
    assert unscheduled_gpu_seconds(status, PODS, now - 10, now, gpus_per_trial=2) == pytest.approx(10 * 7)
    busy = read_status({"phase": "Running", "trials": {"total": 8, "running": 7}})
    assert unscheduled_gpu_seconds(busy, PODS, now - 10, now, gpus_per_trial=2) == 0.0
    assert unscheduled_gpu_seconds(status, PODS, now - 10, now) == 0.0, "a trial's size unknown: nothing guessed"
    none = read_status({"phase": "Running", "trials": {"total": 8, "running": 0}})
    assert unscheduled_gpu_seconds(none, PODS, now - 10, now, gpus_per_trial=2) == pytest.approx(10 * 13)
    starting = read_status({"phase": "Starting", "trials": {"total": 8, "running": 3}})
    assert unscheduled_gpu_seconds(starting, PODS, now - 10, now, gpus_per_trial=2) == 0.0


def test_only_pods_the_cluster_owns_are_its_workers() -> None:
    """A pod wearing KubeRay's labels without the cluster's ownerReference (a tenant's) is never deleted or counted."""
    body = cluster()
    body["metadata"]["uid"] = "cluster-uid"
    owned = pod("w1", "worker", 1, DELETED_AT - 600)
    owned["metadata"]["ownerReferences"] = [{"kind": "RayCluster", "uid": "cluster-uid", "controller": True}]
    forged = pod("w2", "worker", 4, DELETED_AT - 600)
    forged["metadata"]["ownerReferences"] = [{"kind": "RayCluster", "uid": "another", "controller": True}]
    free = decide_free_workers(
        body, None, [owned, forged, pod("w3", "worker", 2, DELETED_AT - 600)], DELETED_AT + 5, GRACE
    )
    assert free is not None and free.pods == ("w1",) and free.gpu_seconds == pytest.approx(5.0)
