"""A stop the operator decided (the startup deadline, the deadline, a spent budget) is carried out even when its
pass fails or the operator restarts before it ran: the sweep's phase has ended by then, and a RayJob left running
would hold its GPUs until KubeRay's active deadline (hours)."""

from __future__ import annotations

import threading
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from sweep_contracts import constants
from sweep_contracts.status_models import SweepStatus
from sweep_operator.reconcile.controller import SweepController
from sweep_operator.reconcile.run_phase import unstopped_rayjob
from sweep_operator.settings import OperatorLimits, Settings
from sweep_operator.status import read_status, updated
from tests.support.fake_kube import FakeKube
from tests.support.fake_s3 import FakeS3
from tests.support.fakes import T0, Clock, FakeVerifier
from tests.support.waiting import wait_for
from tests.unit.test_controller import World, add_sweep


def make_world(**kwargs: Any) -> World:
    kube, s3, verifier, clock = FakeKube(), FakeS3(), FakeVerifier(), Clock()
    events: list[tuple[str, str, str, str]] = []
    settings = Settings(
        limits=OperatorLimits(max_gpus_per_namespace=8),
        status_poll_seconds=0,
        s3_endpoint_url="https://operator-default.example",
        s3_region="eu-west-1",
    )
    controller = SweepController(
        settings,
        kube,
        lambda endpoint, region: s3,
        lambda body, type_, reason, message: events.append((body["metadata"]["name"], type_, reason, message)),
        verifier=verifier,
        clock=clock,
        **kwargs,
    )
    return World(kube, s3, verifier, clock, events, controller)


def running_past_its_startup_deadline(world: World) -> str:
    """A sweep Running by KubeRay's word whose startup deadline passes: the operator fails it and stops the run."""
    add_sweep(world, "digits", **{"spec.deadlines.startupSeconds": 60})
    name = world.reconcile("digits")["rayJobName"]
    world.kube.set_rayjob_status(
        name, "ml", jobDeploymentStatus="Running", jobStatus="RUNNING", rayClusterName=f"{name}-x7k2p"
    )
    assert world.reconcile("digits")["phase"] == "Running"
    return name


def deleted(world: World, name: str) -> bool:
    return ("delete_rayjob", name) in world.kube.calls


def test_a_failed_stop_pass_is_tried_again() -> None:
    world = make_world(guard_workers=1)  # as in the operator: the stop queue has a thread of its own
    name = running_past_its_startup_deadline(world)
    real_get, failed = world.kube.get_rayjob, threading.Event()

    def get_rayjob(namespace: str, rayjob: str) -> Any:
        if threading.current_thread().name.startswith("graceful-stop") and not failed.is_set():
            failed.set()
            raise ApiException(status=503, reason="Service Unavailable")
        return real_get(namespace, rayjob)

    world.kube.get_rayjob = get_rayjob  # type: ignore[method-assign]  # the API fails the stop's first read
    world.clock.now = T0 + 61
    assert world.reconcile("digits")["phase"] == "Failed"
    wait_for(failed.is_set, 10, what="the stop's pass failed once")
    wait_for(lambda: deleted(world, name), 30, what="the stop tried again and the RayJob deleted")
    world.controller.close()


def test_a_restarted_operator_stops_the_running_rayjob_of_a_sweep_it_had_stopped() -> None:
    world = make_world(guard_workers=1)
    name = running_past_its_startup_deadline(world)
    world.controller.stopping.close(timeout=0)  # the process goes before its stop queue ran the stop
    world.clock.now = T0 + 61
    assert world.reconcile("digits")["phase"] == "Failed"
    time.sleep(0.2)
    assert not deleted(world, name)
    restarted = make_world()
    restarted.kube, restarted.s3, restarted.clock = world.kube, world.s3, world.clock
    restarted.controller = SweepController(
        world.controller.settings,
        world.kube,
        lambda endpoint, region: world.s3,
        lambda *event: None,
        verifier=world.verifier,
        clock=world.clock,
    )
    world.clock.now += 10
    restarted.reconcile("digits")  # the RayJob watch's first events feed its cache, then the sweep's pass
    assert deleted(world, name), "the stop decided before the restart was never carried out"
    calls = len(world.kube.calls)
    restarted.reconcile("digits")  # now deleting: the guard's, not stopped again
    assert [c for c in world.kube.calls[calls:] if c[0] == "delete_rayjob"] == []


def ours(phase: str = "DeadlineExceeded", **rayjob_status: Any) -> tuple[SweepStatus, dict[str, Any]]:
    status = read_status({"phase": phase, "runId": "r1", "rayJobName": "digits-r1"})
    guard = '{"runRoot":"s3://b/sweeps/ml/digits-r1","runId":"r1","sweep":"digits"}'
    rayjob = {
        "metadata": {"name": "digits-r1", "annotations": {constants.ANNOTATION_GUARD: guard}},
        "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", **rayjob_status},
    }
    return status, rayjob


def test_only_the_operators_own_unfinished_rayjob_of_a_stopped_sweep_is_stopped_again() -> None:
    status, rayjob = ours()
    assert unstopped_rayjob(status, rayjob) == "digits-r1"
    for phase in ("Failed", "BudgetExhausted"):
        assert unstopped_rayjob(updated(status, phase=phase), rayjob) == "digits-r1"
    assert unstopped_rayjob(updated(status, phase="Succeeded"), rayjob) is None, "its job ended by itself"
    assert unstopped_rayjob(updated(status, phase="Running"), rayjob) is None, "the run pass's, not this rule's"
    assert unstopped_rayjob(status, None) is None
    assert unstopped_rayjob(*ours(jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")) is None, "KubeRay's TTL"
    assert unstopped_rayjob(*ours(jobDeploymentStatus="Failed", jobStatus="FAILED")) is None
    deleting = {**rayjob, "metadata": {**rayjob["metadata"], "deletionTimestamp": "2026-12-02T12:00:00Z"}}
    assert unstopped_rayjob(status, deleting) is None, "the guard's"
    # A tenant's RayJob wearing the name: no guard record (only the operator may write one), or another run's.
    assert unstopped_rayjob(status, {**rayjob, "metadata": {"name": "digits-r1"}}) is None
    other_run = {**rayjob, "metadata": {**rayjob["metadata"], "annotations": {constants.ANNOTATION_GUARD: "{}"}}}
    assert unstopped_rayjob(status, other_run) is None
    assert unstopped_rayjob(updated(status, run_id="r2"), rayjob) is None
    assert unstopped_rayjob(updated(status, ray_job_name="digits-r1-a2"), rayjob) is None


def test_an_ended_jobs_workers_are_suspended_unless_the_operators_own_stop_is_doing_it() -> None:
    """finished_workers: a finished job's cluster (KubeRay's TTL keeps it) loses its workers at the end, except while
    the operator's stop of that RayJob is under way (status.gracefulStop names it): the stop suspends them and
    records the GPU time it held."""
    from sweep_operator.reconcile.actions import SuspendWorkers
    from sweep_operator.reconcile.run_phase import finished_workers

    status, rayjob = ours("Succeeded", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED", rayClusterName="c1")
    rayjob["metadata"]["uid"] = "uid-rj"
    assert finished_workers(status, rayjob) == SuspendWorkers("digits-r1", "c1")
    stopping = updated(status, phase="DeadlineExceeded", graceful_stop={"rayJobUid": "uid-rj", "requestedAt": "x"})
    assert finished_workers(stopping, rayjob) is None
    another = updated(stopping, graceful_stop={"rayJobUid": "another", "requestedAt": "x"})
    assert finished_workers(another, rayjob) is not None
    assert finished_workers(*ours("Succeeded", rayClusterName="c1")) is None, "still running: not finished"
    assert finished_workers(updated(status, phase="Running"), rayjob) is None
    assert finished_workers(updated(status, run_id="r2"), rayjob) is None, "another run's RayJob"
