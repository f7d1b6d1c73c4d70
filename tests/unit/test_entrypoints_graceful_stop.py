"""The driver's graceful stop (training_entrypoints.graceful_stop): SIGTERM, as Ray's job supervisor sends it
(`JobSupervisor.run`, ray 2.58's job_supervisor.py), becomes Tune's experiment stop once every trial running at the
signal reported once more, or the wait (the window less a margin) is over. Issue 26, section 0."""

from __future__ import annotations

import os
import pickle
import signal

import pytest

from training_entrypoints import graceful_stop
from training_entrypoints.graceful_stop import GracefulStop, GracefulStopper


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_window_is_rays_stop_wait_time_else_the_spec() -> None:
    assert graceful_stop.stop_window_s({"RAY_JOB_STOP_WAIT_TIME_S": "120"}, 300) == 120
    assert graceful_stop.stop_window_s({}, 300) == 300
    # Ray's supervisor parses it with int(): anything else is not a window it would honour.
    assert graceful_stop.stop_window_s({"RAY_JOB_STOP_WAIT_TIME_S": "1.5"}, 300) == 3
    assert graceful_stop.report_wait_s(300) == 270 and graceful_stop.report_wait_s(60) == 40
    assert graceful_stop.report_wait_s(0) == 0


def test_the_experiment_stops_once_each_running_trial_reported_again() -> None:
    clock = Clock()
    stop = GracefulStop(report_wait_s=40, clock=clock)
    stopper = GracefulStopper(stop)
    assert not stopper.stop_all()
    assert stopper("a", {"checkpoint_path": "bucket/ns/sweep-r1/train/a/checkpoint_epoch-000001"}) is False
    stop.request("SIGTERM")
    assert not stopper.stop_all(), "no step has said which trials run yet"
    stop.note_trials(["a", "b"])
    assert (
        stopper("a", {"checkpoint_path": "bucket/ns/sweep-r1/train/a/checkpoint_epoch-000002"}) is False
    )  # never one trial
    assert not stopper.stop_all()
    stop.note_ended("b")  # b finished on its own meanwhile: nothing to wait for
    assert stopper.stop_all() and stop.triggered and not stop.timed_out
    record = stop.record("s3://bucket/ns/sweep-r1")
    assert record["signal"] == "SIGTERM" and record["timedOut"] is False
    assert record["trials"][0] == {
        "id": "a",
        "reportedAfterStop": True,
        "checkpointUri": "s3://bucket/ns/sweep-r1/train/a/checkpoint_epoch-000002",
    }
    assert record["trials"][1]["id"] == "b" and record["trials"][1]["reportedAfterStop"] is False


def test_the_wait_is_bounded() -> None:
    clock = Clock()
    stop = GracefulStop(report_wait_s=40, clock=clock)
    stop.request("SIGTERM")
    stop.note_trials(["a"])
    clock.now += 39
    assert not stop.should_stop_all()
    clock.now += 1
    assert stop.should_stop_all() and stop.timed_out


def test_a_stop_with_no_trial_running_stops_at_the_next_step_and_is_not_pickled() -> None:
    stop = GracefulStop(report_wait_s=40)
    stop.request("SIGTERM")
    stop.note_trials([])
    assert stop.should_stop_all()
    copy = pickle.loads(pickle.dumps(GracefulStopper(stop)))  # Tune pickles its stopper with the experiment
    assert copy.stop.report_wait_s == 40 and not copy.stop.requested


def test_sigterm_only_requests_the_stop() -> None:
    stop = GracefulStop(report_wait_s=40)
    restore = graceful_stop.install(stop)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM"
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) is not None


@pytest.mark.parametrize("env,expected", [({}, 15.0), ({"RAY_JOB_STOP_WAIT_TIME_S": "60"}, 60.0)])
def test_the_local_runner_gives_the_driver_the_jobs_stop_wait_time(env: dict[str, str], expected: float) -> None:
    from training_entrypoints import local

    assert local.stop_wait_s(env) == expected
