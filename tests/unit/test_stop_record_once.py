"""A stop's GPU time is added to status.idleGpuSeconds once, also across an operator restart: the write that adds
it marks status.gracefulStop (only the operator writes a sweep's status), which a restarted operator, whose memory
of recorded stops is empty, reads before it adds anything."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator.reconcile import graceful_stop
from sweep_operator.reconcile.controller import SweepController
from sweep_operator.settings import Settings
from sweep_operator.status import read_status, status_document, updated
from tests.support.fake_kube import FakeKube

ASKED = 1_800_000_000.0
DELETED = ASKED + 5  # KubeRay deleted the stopped job's cluster 5 s after the ask, before any suspend
NOW = DELETED + 30
GPUS = 2  # one worker pod with two GPUs: 5 s x 2 GPUs from the ask to the deletion
STOPPING_TOTAL = "trainingsweep_idle_gpu_seconds_total"


def _time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NoS3:
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("S3 was called")


def controller(kube: FakeKube) -> SweepController:
    return SweepController(
        Settings(status_poll_seconds=0), kube, NoS3(), lambda *event: None, verifier=NoS3(), clock=lambda: NOW
    )


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    sweep = {
        "apiVersion": f"{constants.GROUP}/{constants.VERSION}",
        "kind": "TrainingSweep",
        "metadata": {"name": "digits", "namespace": "ml", "finalizers": [constants.FINALIZER]},
        "status": status_document(
            updated(read_status({"phase": "Deleting"}), graceful_stop.request_status("uid-rj", ASKED))
        ),
    }
    kube.add("TrainingSweep", sweep)
    rayjob = {
        "metadata": {
            "name": "digits-r1",
            "namespace": "ml",
            "uid": "uid-rj",
            "labels": {constants.LABEL_SWEEP: "digits"},
            "deletionTimestamp": _time(DELETED),
        }
    }
    kube.add("RayJob", rayjob)
    cluster = {
        "metadata": {
            "name": "digits-r1-abcde",
            "namespace": "ml",
            "uid": "uid-rc",
            "finalizers": [constants.FINALIZER],
            "deletionTimestamp": _time(DELETED),
            "ownerReferences": [
                {"kind": constants.RAYJOB_KIND, "name": "digits-r1", "uid": "uid-rj", "controller": True}
            ],
        },
        "spec": {"workerGroupSpecs": [{"groupName": "gpu", "replicas": 1}]},
    }
    kube.add("RayCluster", cluster)
    kube.pods.append(
        {
            "metadata": {
                "name": "w1",
                "namespace": "ml",
                "labels": {constants.RAY_LABEL_CLUSTER: "digits-r1-abcde", constants.RAY_LABEL_NODE_TYPE: "worker"},
                "ownerReferences": [{"kind": "RayCluster", "name": "digits-r1-abcde", "uid": "uid-rc"}],
            },
            "spec": {"containers": [{"name": "c", "resources": {"limits": {constants.GPU_RESOURCE: GPUS}}}]},
            "status": {
                "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _time(ASKED - 600)}]
            },
        }
    )
    return kube


def guard_sees_the_deletion(made: SweepController, kube: FakeKube) -> None:
    """What the guard's RayCluster deletion handler does before it verifies (stopping.py)."""
    made.stopper.record_stop_outran_suspend(
        kube.get("RayCluster", "ml", "digits-r1-abcde") or {},
        kube.get_rayjob("ml", "digits-r1"),
        kube.get_sweep("ml", "digits"),
    )


def stopping(kube: FakeKube) -> float:
    return float(((kube.get_sweep("ml", "digits") or {}).get("status") or {}).get("idleGpuSeconds", {})["stopping"])


def test_a_restarted_operator_does_not_add_a_recorded_stop_again(kube: FakeKube) -> None:
    first = controller(kube)
    guard_sees_the_deletion(first, kube)
    assert stopping(kube) == pytest.approx(5 * GPUS)
    assert first.metrics.total(STOPPING_TOTAL, sweep="digits", cause="stopping") == pytest.approx(5 * GPUS)
    assert (kube.get_sweep("ml", "digits") or {})["status"]["gracefulStop"]["idleRecorded"] is True
    guard_sees_the_deletion(first, kube)  # the same process: its memory
    assert stopping(kube) == pytest.approx(5 * GPUS)

    restarted = controller(kube)  # nothing in memory; status.gracefulStop still names the stop
    listed = len([c for c in kube.calls if c[0] == "list_pods"])
    guard_sees_the_deletion(restarted, kube)
    assert len([c for c in kube.calls if c[0] == "list_pods"]) == listed + 1, "the restarted guard looked again"
    assert stopping(kube) == pytest.approx(5 * GPUS), "added a second time after the restart"
    assert restarted.metrics.total(STOPPING_TOTAL, sweep="digits", cause="stopping") == 0


def test_without_the_mark_a_restarted_operator_records_the_stop(kube: FakeKube) -> None:
    """The mark is what stops the second record: a stop recorded by no one yet is recorded after a restart."""
    restarted = controller(kube)
    guard_sees_the_deletion(restarted, kube)
    assert stopping(kube) == pytest.approx(5 * GPUS)
    assert restarted.metrics.total(STOPPING_TOTAL, sweep="digits", cause="stopping") == pytest.approx(5 * GPUS)


def test_the_mark_belongs_to_the_stop_of_the_rayjob_it_names() -> None:
    status = updated(read_status({}), graceful_stop.request_status("uid-rj", ASKED))
    assert graceful_stop.with_idle_recorded(status, "uid-other") == {}
    assert graceful_stop.with_idle_recorded(read_status({}), "uid-rj") == {}
    marked = updated(status, graceful_stop.with_idle_recorded(status, "uid-rj"))
    assert graceful_stop.idle_recorded(marked, "uid-rj")
    assert not graceful_stop.idle_recorded(marked, "uid-other")
    assert not graceful_stop.idle_recorded(status, "uid-rj")
    assert graceful_stop.recorded_request(marked, "uid-rj") == ASKED
