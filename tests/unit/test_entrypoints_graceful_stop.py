"""The driver's graceful stop (training_entrypoints.graceful_stop): SIGTERM, as Ray's job supervisor sends it
(`JobSupervisor.run`, ray 2.58's job_supervisor.py), becomes Tune's experiment stop once every trial running at the
signal reported once more, or the wait (the window less a margin) is over. Issue 26, section 0."""

from __future__ import annotations

import os
import pickle
import signal
from typing import Any

import pytest

from training_entrypoints import graceful_stop, stop_uploads
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


# ------------------------------------------------------------------------------- uploads in flight at the stop


class FakeUploads:
    """A started upload wait: `done` when the test says; `trials` as stop_uploads.TrialUploads."""

    def __init__(self, trials: dict[str, stop_uploads.TrialUploads]):
        self.trials = trials
        self.finished = False

    def done(self) -> bool:
        return self.finished


def test_the_uploads_get_the_window_less_what_stopping_the_trials_needs_after_them() -> None:
    """After the report wait, the margin is shared: the uploads in flight get up to half of it (at most all but
    UPLOAD_RESERVE_S of the window), the rest is for Tune's end-of-experiment cleanup and the status write."""
    assert graceful_stop.upload_wait_s(300) == 285  # report wait 270, 15 s kept
    assert graceful_stop.upload_wait_s(60) == 50  # report wait 40, a margin of 20 shared
    assert graceful_stop.upload_wait_s(30) == 25
    assert graceful_stop.upload_wait_s(0) == 0
    for window in (3, 9, 45, 90, 600, 3600):
        assert graceful_stop.report_wait_s(window) <= graceful_stop.upload_wait_s(window) < window
        assert window - graceful_stop.upload_wait_s(window) <= graceful_stop.UPLOAD_RESERVE_S
    stop = graceful_stop.from_env(60, {}, uploads=None)
    assert (stop.report_wait_s, stop.upload_wait_s, stop.start_upload_wait) == (40, 50, None)


def test_the_experiment_stops_only_once_the_uploads_in_flight_are_committed_or_their_time_is_over() -> None:
    clock = Clock()
    started: list[tuple[list[str], float, bool]] = []
    waits: list[FakeUploads] = []
    collecting: list[Any] = []

    def start(trial_ids: list[str], deadline: float, still_collecting: Any) -> FakeUploads:
        started.append((trial_ids, deadline, still_collecting()))
        collecting.append(still_collecting)
        waits.append(FakeUploads({}))
        return waits[-1]

    stop = GracefulStop(report_wait_s=40, upload_wait_s=50, clock=clock, start_upload_wait=start)
    stop.request("SIGTERM")
    clock.now += 2
    stop.note_trials(["a"])
    assert started == [(["a"], 100.0 + 50, True)]  # the deadline counts from the request
    stop.note_result("a", {})
    assert not stop.should_stop_all() and collecting[0]() is False  # reported: new uploads no longer join
    clock.now = 100.0 + 49
    assert not stop.should_stop_all()
    waits[0].finished = True
    assert stop.should_stop_all() and stop.triggered and not stop.timed_out

    # An upload that never ends holds the stop until the uploads' share of the window, not longer.
    late = GracefulStop(report_wait_s=40, upload_wait_s=50, clock=clock, start_upload_wait=start)
    clock.now = 0.0
    late.request("SIGTERM")
    late.note_trials(["b"])
    clock.now = 45.0  # the report wait is over, b never reported (its report waits for its upload)
    assert not late.should_stop_all() and late.timed_out and collecting[1]() is False
    clock.now = 50.0
    assert late.should_stop_all()


def test_without_an_upload_wait_the_stop_is_as_before_and_a_wait_that_cannot_start_is_no_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    stop = GracefulStop(report_wait_s=40, upload_wait_s=50, clock=clock)
    stop.request("SIGTERM")
    stop.note_trials(["a"])
    stop.note_result("a", {})
    assert stop.should_stop_all() and "uploads" not in stop.record("/store/ns/s-r1")

    def broken(*args: Any) -> Any:
        raise ConnectionError("GCS unreachable")

    failing = GracefulStop(report_wait_s=40, upload_wait_s=50, clock=clock, start_upload_wait=broken)
    failing.request("SIGTERM")
    failing.note_trials(["a"])
    failing.note_result("a", {})
    assert failing.should_stop_all() and "cannot wait for the uploads in flight" in caplog.text
    assert failing.record("/store/ns/s-r1")["uploads"]["waitedFor"] == 0


def uploads_of(trial_id: str, waited: dict[int, str | None], committed: set[int], cut: dict[int, str | None]) -> Any:
    return stop_uploads.TrialUploads(trial_id, waited=waited, committed=committed, not_waited=cut)


def test_the_stop_record_says_how_many_uploads_it_waited_for_and_names_each_it_could_not() -> None:
    clock = Clock()
    stop = GracefulStop(report_wait_s=40, upload_wait_s=50, clock=clock, start_upload_wait=lambda *a: None)
    stop.request("SIGTERM")
    stop.note_trials(["a", "b"])
    stop.uploads = FakeUploads(
        {
            "a": uploads_of("a", {3: "checkpoint_epoch-000002"}, {3}, {}),
            "b": uploads_of("b", {5: "checkpoint_epoch-000004", 6: None}, {5}, {6: None, 7: "checkpoint_epoch-000006"}),
        }
    )
    record = stop.record("/store/ns/s-r1")
    uploads = record["uploads"]
    assert (uploads["waitSeconds"], uploads["waitedFor"], uploads["committed"]) == (50, 3, 2)
    assert uploads["notWaitedFor"] == [
        {"trial": "b", "checkpoint": None},
        {"trial": "b", "checkpoint": "checkpoint_epoch-000006"},
    ]
    assert uploads["notWaitedForCount"] == 2
    message = uploads["message"]
    assert message.startswith("could not wait for 2 checkpoint upload(s) in flight")
    assert "trial b checkpoint checkpoint_epoch-000006" in message and "trial b (unnamed)" in message
    assert "waited for 3, 2 committed" in message
    by_id = {t["id"]: t for t in record["trials"]}
    assert (by_id["a"]["uploadsWaitedFor"], by_id["a"]["uploadsCommitted"], by_id["a"]["uploadsNotWaitedFor"]) == (
        1,
        1,
        [],
    )
    assert by_id["b"]["uploadsNotWaitedFor"] == [None, "checkpoint_epoch-000006"]
    assert graceful_stop.uploads_message(0, 0, []) is None
    assert graceful_stop.uploads_message(2, 2, []) == "waited for 2 checkpoint upload(s) in flight; 2 committed"


def test_the_stop_record_names_at_most_a_bounded_number_of_uploads_and_counts_the_rest() -> None:
    many = {i: f"checkpoint_epoch-{i:06d}" for i in range(30)}
    record = graceful_stop.uploads_record({"a": uploads_of("a", dict(many), set(), dict(many))}, 50)
    assert len(record["notWaitedFor"]) == graceful_stop.MAX_RECORDED_UPLOADS and record["notWaitedForCount"] == 30
    assert "and 25 more" in record["message"]
