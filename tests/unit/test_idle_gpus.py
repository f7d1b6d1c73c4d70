"""Hold the data, not the GPUs (issue 26, section 2): when a held RayCluster's workers go, as a table."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator.reconcile.idle_gpus import FreeWorkers, cause_of, decide_free_workers, driver_stopped, idle_status

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
    assert cause_of(free, {"phase": "Running"}) == "held-deletion"
    assert cause_of(free, {"phase": "Suspended", "kueue": {"preemptions": 1}}) == "preemption"
    once = idle_status({}, "held-deletion", 30.0)
    twice = idle_status(once, "held-deletion", 12.5)
    assert twice == {"idleGpuSeconds": {"heldDeletion": 42.5}}
    assert idle_status(twice, "preemption", 1.0)["idleGpuSeconds"] == {"heldDeletion": 42.5, "preemption": 1.0}
