"""A Tune stop aborts the trial's Train run and removes what the stop left uncommitted (training_entrypoints.trial_stop).

Ray is never started here: the controller, its GCS slot and their object refs are stand-ins resolved by a patched
`ray.get`/`ray.wait`."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import (
    _CheckpointManagerState,
    _TrainingResultState,
)
from ray.tune.trainable import function_trainable

from sweep_contracts.runspec import build_run_spec
from sweep_operator.validation import parse_sweep
from tests.support.factories import cpu_sweep
from tests.support.waiting import wait_for
from training_entrypoints import ray_internals, stop_uploads, trainable, trial_stop
from training_entrypoints.trial_stop import AbortOutcome, TrialTrainRun


class Ref:
    """An object ref stand-in: `ready_after` polls before it resolves to `value` (or raises `error`)."""

    def __init__(self, value: Any = None, *, ready_after: int = 0, error: BaseException | None = None):
        self.value, self.ready_after, self.error = value, ready_after, error


class Method:
    def __init__(self, result: Any):
        self.result = result
        self.calls: list[tuple[Any, ...]] = []

    def remote(self, *args: Any) -> Ref:
        self.calls.append(args)
        return self.result(*args) if callable(self.result) else self.result


class FakeController:
    def __init__(self, abort_ref: Ref):
        self.abort = Method(abort_ref)


class FakeSlot:
    """The GCS slot: hands out `controllers` one read at a time, repeating the last."""

    def __init__(self, controllers: list[Any]):
        self._controllers = controllers
        self.sent: list[Any] = []
        self.cleared = False

    def receive(self) -> Any:
        return self._controllers.pop(0) if len(self._controllers) > 1 else self._controllers[0]

    def send(self, controller: Any) -> None:
        self.sent.append(controller)

    def clear(self) -> None:
        self.cleared = True


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    def get(ref: Ref | list[Ref], timeout: float | None = None) -> Any:
        if isinstance(ref, list):
            return [get(r) for r in ref]
        if ref.error:
            raise ref.error
        return ref.value

    def wait(refs: list[Ref], timeout: float | None = None) -> tuple[list[Ref], list[Ref]]:
        ref = refs[0]
        if ref.ready_after <= 0:
            return [ref], []
        ref.ready_after -= 1
        return [], [ref]

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "kill", lambda actor: None)
    monkeypatch.setattr(trial_stop, "_POLL_S", 0.001)


def running(slot: Any) -> TrialTrainRun:
    run = TrialTrainRun("t_00001", "/nowhere", slot=slot)
    run.fit_started = True
    return run


# ------------------------------------------------------------------------------------------- the abort


def test_a_stop_aborts_the_controller_the_slot_received_draining_reports_meanwhile(fake_ray: None) -> None:
    """The controller is stuck in a report until the queue is drained; abort() then ends it (exit_actor: an actor
    error for the caller). Its handle shows up in the slot a moment after fit() started."""
    controller = FakeController(Ref(error=ray.exceptions.RayActorError(), ready_after=3))
    run = running(FakeSlot([None, controller]))
    drained: list[int] = []
    assert run.abort(5.0, drain=lambda: drained.append(1)) is AbortOutcome.ABORTED
    assert controller.abort.calls == [()] and len(drained) == 3 and run.stopping


def test_an_abort_that_does_not_finish_is_given_up_within_its_bound(fake_ray: None) -> None:
    controller = FakeController(Ref(ready_after=10**9))
    run = running(FakeSlot([controller]))
    assert run.abort(0.05) is AbortOutcome.TIMED_OUT


def test_a_controller_that_never_sends_its_handle_is_reported(fake_ray: None) -> None:
    run = running(FakeSlot([None]))
    assert run.abort(0.05) is AbortOutcome.NO_CONTROLLER


def test_a_stop_before_fit_keeps_fit_from_starting_and_a_stop_after_fit_does_nothing(fake_ray: None) -> None:
    class Trainer:
        fitted = False

        def fit(self) -> None:
            self.fitted = True

    early = TrialTrainRun("t_00001", "/nowhere", slot=FakeSlot([None]))
    assert early.abort(1.0) is AbortOutcome.NOT_STARTED
    trainer = Trainer()
    assert early.fit(trainer) is None and not trainer.fitted

    slot = FakeSlot([None])
    done = TrialTrainRun("t_00002", "/nowhere", slot=slot)
    done.fit(trainer)
    assert trainer.fitted and done.fit_ended and done.slot is None and slot.cleared
    assert done.abort(1.0) is AbortOutcome.NOT_STARTED


def test_fit_errors_after_a_stop_are_the_stops_not_the_trials(fake_ray: None) -> None:
    """Tune marks a stopped trial TERMINATED before stopping it; fit()'s error after the abort must not turn it ERROR,
    while an error of a trial nobody stopped still fails it."""

    class Failing:
        def fit(self) -> None:
            raise ray.exceptions.RayActorError()

    run = TrialTrainRun("t_00001", "/nowhere", slot=FakeSlot([None]))
    with pytest.raises(ray.exceptions.RayActorError):
        run.fit(Failing())

    stopped = TrialTrainRun("t_00002", "/nowhere", slot=FakeSlot([None]))
    started = threading.Event()

    class AbortedWhileFitting:
        def fit(self) -> None:
            started.set()
            stopped.stopping = True  # what abort() sets before it reaches the controller
            raise ray.exceptions.RayActorError()

    assert stopped.fit(AbortedWhileFitting()) is None and started.is_set()


def test_the_abort_bound_stays_below_tunes_force_kill() -> None:
    assert trial_stop.abort_timeout_s({}) == trial_stop.ABORT_TIMEOUT_S
    assert trial_stop.abort_timeout_s({ray_internals.ENV_TUNE_FORCE_TRIAL_CLEANUP: "20"}) == 15.0
    assert trial_stop.abort_timeout_s({ray_internals.ENV_TUNE_FORCE_TRIAL_CLEANUP: "2"}) == 1.0
    assert (
        trial_stop.abort_timeout_s({ray_internals.ENV_TUNE_FORCE_TRIAL_CLEANUP: "soon"}) == trial_stop.ABORT_TIMEOUT_S
    )


def test_stop_trial_run_cleans_checkpoints_only_after_a_confirmed_abort(
    fake_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once abort() returned no controller or worker can upload or commit; after a timeout one still might."""
    cleaned: list[str] = []
    monkeypatch.setattr(trial_stop, "remove_uncommitted_checkpoints", cleaned.append)
    monkeypatch.setattr(trial_stop, "drain_tune_reports", lambda: None)
    assert trial_stop.stop_trial_run("never-started") is AbortOutcome.NOT_STARTED

    run = trial_stop.begin_trial_run("t_00001", "/store/train/t_00001")
    run.slot, run.fit_started = FakeSlot([FakeController(Ref(None))]), True
    assert trial_stop.stop_trial_run("t_00001", 1.0) is AbortOutcome.ABORTED
    assert cleaned == ["/store/train/t_00001"]
    assert trial_stop.stop_trial_run("t_00001") is AbortOutcome.NOT_STARTED  # one stop, one abort

    slow = trial_stop.begin_trial_run("t_00002", "/store/train/t_00002")
    slow.slot, slow.fit_started = FakeSlot([FakeController(Ref(ready_after=10**9))]), True
    assert trial_stop.stop_trial_run("t_00002", 0.05) is AbortOutcome.TIMED_OUT
    assert cleaned == ["/store/train/t_00001"]


def test_the_controller_sends_its_own_handle_and_a_failure_only_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    me = object()
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("C", (), {"current_actor": me})())
    slot = FakeSlot([None])
    trial_stop.SendControllerHandle(slot).after_controller_start(None)
    assert slot.sent == [me]

    def unreachable(controller: Any) -> None:
        raise ConnectionError("GCS unreachable")

    slot.send = unreachable  # a slot whose store fails
    trial_stop.SendControllerHandle(slot).after_controller_start(None)
    assert "a stop cannot abort it" in caplog.text


def test_the_slot_carries_a_pickled_handle_under_its_own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    store: dict[str, bytes] = {}
    monkeypatch.setattr(ray_internals, "kv_put", store.__setitem__)
    monkeypatch.setattr(ray_internals, "kv_get", store.get)
    monkeypatch.setattr(ray_internals, "kv_del", lambda key: store.pop(key, None))
    first, second = trial_stop.ControllerSlot.new(), trial_stop.ControllerSlot.new()
    assert first.key != second.key and first.receive() is None
    first.send({"handle": 1})
    assert first.receive() == {"handle": 1} and second.receive() is None
    first.clear()
    assert first.receive() is None and store == {}


# ---------------------------------------------------------------------------------- the trainable's side


def test_tunes_stop_of_the_trial_driver_runs_the_abort_then_tunes_own_cleanup_R17(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R17: the trial driver stays a function trainable; Tune builds its class with the abort mixin first, and an
    abort that fails never keeps Tune's own cleanup from running."""
    driver = trainable.make_trial_driver(build_run_spec(parse_sweep(cpu_sweep()), "abc123"))
    assert getattr(driver, ray_internals.TRAINABLE_MIXINS_ATTR) == (trial_stop.AbortTrainRunOnStop,)
    cls = function_trainable.wrap_function(driver)
    assert cls.cleanup is trial_stop.AbortTrainRunOnStop.cleanup

    calls: list[str] = []

    class TuneSide(function_trainable.FunctionTrainable):
        def cleanup(self) -> None:
            calls.append("tune cleanup")

    class Driver(trial_stop.AbortTrainRunOnStop, TuneSide):
        pass

    def failing_stop(trial_id: str) -> AbortOutcome:
        calls.append(f"abort {trial_id}")
        raise RuntimeError("boom")

    monkeypatch.setattr(trial_stop, "stop_trial_run", failing_stop)
    instance = Driver.__new__(Driver)
    instance._trial_info = None  # Trainable.trial_id then reads "default"
    instance.cleanup()
    assert calls == ["abort default", "tune cleanup"]


def test_the_trials_train_run_config_carries_the_controller_callback_after_tunes_R18(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray.tune.integration.ray_train as ray_train_integration

    monkeypatch.setattr(ray_train_integration, "_in_tune_session", lambda: True)
    monkeypatch.setattr(
        ray_train_integration,
        "get_session",
        lambda: type("S", (), {"_get_or_create_inter_actor_queue": lambda self: None})(),
    )
    run_spec = build_run_spec(parse_sweep(cpu_sweep()), "abc123")
    config = trainable.train_run_config(run_spec, "t_00000", [trial_stop.SendControllerHandle(None)])
    names = [type(c).__name__ for c in config.callbacks]
    assert names == ["RankReportCallback", "CommitRecordCallback", "TuneReportCallback", "SendControllerHandle"]


# ---------------------------------------------------------------------------- uncommitted checkpoints


def snapshot(committed: list[str], latest: str | None = None, pending: tuple[str, ...] = ()) -> dict[str, Any]:
    """A snapshot as Ray 2.58's checkpoint manager writes it (its own pydantic model)."""

    def result(name: str) -> _TrainingResultState:
        return _TrainingResultState(checkpoint_dir_name=name, metrics={})

    state = _CheckpointManagerState(
        checkpoint_results=[result(n) for n in committed],
        checkpoint_report_indices=list(range(len(committed))),
        latest_checkpoint_result=result(latest) if latest else None,
        pending_training_results=[result(n) for n in pending],
        pending_validation_specs=[False] * len(pending),
        current_report_index=len(committed),
        validated_checkpoint_dir_names=[],
        timed_out_validation_checkpoint_dir_names=[],
        failed_validation_checkpoint_dir_names=[],
    )
    return dict(json.loads(state.model_dump_json()))


def test_uncommitted_folders_are_those_no_snapshot_names() -> None:
    doc = snapshot(["checkpoint_epoch-000001"], latest="checkpoint_epoch-000002", pending=("checkpoint_epoch-000003",))
    folders = [f"checkpoint_epoch-00000{i}" for i in range(5)] + ["checkpoint_tmp", "rank_0", "other"]
    assert trial_stop.uncommitted_checkpoint_names(folders, doc) == [
        "checkpoint_epoch-000000",
        "checkpoint_epoch-000004",
        "checkpoint_tmp",
    ]
    assert trial_stop.uncommitted_checkpoint_names(["checkpoint_epoch-000000", "x"], None) == [
        "checkpoint_epoch-000000"
    ]


def write_checkpoint(root: Path, name: str, size: int) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "state").write_bytes(b"x" * size)


def test_a_stop_removes_its_orphan_checkpoint_folders_and_keeps_the_committed_ones(tmp_path: Path) -> None:
    """A resumed trial reports the same folder names again: an orphan left there would be merged into (R7, R11)."""
    write_checkpoint(tmp_path, "checkpoint_epoch-000001", 10)
    write_checkpoint(tmp_path, "checkpoint_epoch-000002", 20)
    write_checkpoint(tmp_path, "checkpoint_epoch-000003", 30)
    (tmp_path / "checkpoint_epoch-000003" / "nested").mkdir()
    (tmp_path / "checkpoint_epoch-000003" / "nested" / "more").write_bytes(b"y" * 5)
    (tmp_path / "checkpoint_manager_snapshot.json").write_text(json.dumps(snapshot(["checkpoint_epoch-000001"])))

    removed = trial_stop.remove_uncommitted_checkpoints(str(tmp_path))
    assert removed == trial_stop.RemovedCheckpoints(("checkpoint_epoch-000002", "checkpoint_epoch-000003"), 55)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_epoch-000001", "checkpoint_manager_snapshot.json"]


def test_without_a_snapshot_nothing_was_committed_and_an_unreadable_one_removes_nothing(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "fresh", "checkpoint_epoch-000000", 1)
    assert trial_stop.remove_uncommitted_checkpoints(str(tmp_path / "fresh")).names == ("checkpoint_epoch-000000",)
    assert trial_stop.remove_uncommitted_checkpoints(str(tmp_path / "missing")) == trial_stop.RemovedCheckpoints()

    write_checkpoint(tmp_path / "damaged", "checkpoint_epoch-000000", 1)
    (tmp_path / "damaged" / "checkpoint_manager_snapshot.json").write_text("{not json")
    assert trial_stop.remove_uncommitted_checkpoints(str(tmp_path / "damaged")) == trial_stop.RemovedCheckpoints()
    assert (tmp_path / "damaged" / "checkpoint_epoch-000000").exists()


# ------------------------------------------------------------------------------- uploads in flight at a stop


class Context:
    """A Train worker's TrainContext as probe_worker_uploads reads it: its report counters and upload pool."""

    def __init__(self, calls: int, handed: int, pool: Any):
        self.report_call_index, self.current_report_index, self.checkpoint_upload_threadpool = calls, handed, pool


def test_a_workers_probe_names_its_queued_uploads_and_leaves_out_reports_without_a_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reports 2 to 4 are called but not handed to the controller: 2 is uploading (its arguments unseen here), 3 is
    queued with a checkpoint, 4 is queued without one (no upload to wait for). The probe never takes Train's
    report_order_condition, which a report holds while it waits for the controller's next poll."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1)
    release = threading.Event()
    try:
        pool.submit(release.wait, 10)
        pool.submit(lambda *a: None, "checkpoint_epoch-000003", {}, object(), 3)
        pool.submit(lambda *a: None, "checkpoint_epoch-000004", {}, None, 4)
        monkeypatch.setattr(ray_internals, "train_context", lambda: Context(4, 1, pool))
        probe = stop_uploads.probe_worker_uploads()
        assert probe == stop_uploads.WorkerUploads(4, 1, {2: None, 3: "checkpoint_epoch-000003"})
    finally:
        release.set()
        pool.shutdown(wait=True)
    monkeypatch.setattr(ray_internals, "train_context", lambda: None)
    assert stop_uploads.probe_worker_uploads() is None
    assert stop_uploads.merge_in_flight(
        [probe, None, stop_uploads.WorkerUploads(4, 1, {2: "checkpoint_epoch-000002"})]
    ) == {
        2: "checkpoint_epoch-000002",
        3: "checkpoint_epoch-000003",
    }


def test_an_upload_counts_as_committed_only_once_no_worker_holds_it_and_the_snapshot_counts_its_report() -> None:
    """A half-uploaded folder is never committed: only Ray's snapshot (current_report_index) says a report was
    processed; an upload still in flight when the time is over is one the stop could not wait for."""
    trial = stop_uploads.TrialUploads("t", waited={2: None, 3: "checkpoint_epoch-000003"})
    assert not trial.settle({2: "checkpoint_epoch-000002", 3: "checkpoint_epoch-000003"}, 5, final=False)
    assert trial.waited[2] == "checkpoint_epoch-000002" and trial.committed == set()
    assert not trial.settle({3: "checkpoint_epoch-000003"}, 1, final=False)  # handed over, not yet in the snapshot
    assert not trial.settle({3: "checkpoint_epoch-000003"}, 2, final=False) and trial.committed == {2}
    assert not trial.settle({3: "checkpoint_epoch-000003", 4: None}, 2, final=True)
    assert trial.not_waited == {3: "checkpoint_epoch-000003", 4: None}
    assert trial.cut == ["checkpoint_epoch-000003", None]
    assert stop_uploads.committed_report_index({ray_internals.SNAPSHOT_REPORT_INDEX: 7}) == 7
    assert stop_uploads.committed_report_index(None) == stop_uploads.committed_report_index(
        {"current_report_index": "7"}
    )


class Worker:
    """A RayTrainWorker handle: `execute.remote(fn)` answers the next of `probes` (repeating the last)."""

    def __init__(self, probes: list[stop_uploads.WorkerUploads]):
        self.probes = probes
        self.execute = Method(lambda fn: Ref(self.probes.pop(0) if len(self.probes) > 1 else self.probes[0]))


def controller_of(worker: Worker) -> Any:
    """A Train controller handle whose `__ray_call__` answers its worker group's actors."""
    return type("Controller", (), {ray_internals.ACTOR_CALL_METHOD: Method(lambda fn: Ref([worker]))})()


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The GCS slots by key, holding (controller, train run dir, token) as sent (the fakes are not picklable)."""
    slots: dict[str, Any] = {}
    monkeypatch.setattr(trial_stop.ControllerSlot, "send", lambda self, c: slots.__setitem__(self.key, (c, self.train_run_dir, self.token)))  # fmt: skip
    monkeypatch.setattr(trial_stop.ControllerSlot, "receive_published", lambda self: slots.get(self.key))
    monkeypatch.setattr(stop_uploads, "UPLOAD_POLL_S", 0.001)
    return slots


def test_the_drivers_wait_reaches_the_workers_through_the_trials_slot_and_ends_once_the_upload_is_committed(
    fake_ray: None, published: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    in_flight = stop_uploads.WorkerUploads(2, 1, {2: "checkpoint_epoch-000001"})
    worker = Worker([in_flight, in_flight, stop_uploads.WorkerUploads(2, 2, {})])
    run = TrialTrainRun("t_00001", "/store/train/t_00001")
    monkeypatch.setattr(ray_internals, "current_job_id", lambda: "03000000")
    run.controller_callback()
    assert run.slot is not None and run.slot.key == "train-controller/03000000/t_00001"
    run.slot.send(controller_of(worker))
    # Ray's snapshot before and after the upload's report, the last repeated (as the worker's probes are): how
    # often the wait reads it depends on the machine's speed, not on what it decides.
    snapshots = [{"current_report_index": 1}, {"current_report_index": 2}]
    monkeypatch.setattr(
        trial_stop.storage, "read_json", lambda path: snapshots.pop(0) if len(snapshots) > 1 else snapshots[0]
    )
    collecting = [True]
    wait = stop_uploads.UploadWait(["t_00001"], deadline=10**9, collecting=lambda: collecting[0], job_id="03000000")
    wait.start()
    wait_for(lambda: wait.trials["t_00001"].waited, timeout=10, what="the upload seen in flight")
    collecting[0] = False  # the reports are in: no new upload joins the wait
    wait.join(10)
    trial = wait.trials["t_00001"]
    assert wait.done() and trial.waited == {2: "checkpoint_epoch-000001"} and trial.committed == {2}
    assert trial.cut == [] and trial.error is None and trial.train_run_dir == "/store/train/t_00001"


def test_a_wait_that_loses_the_workers_or_runs_out_of_time_records_what_it_could_not_wait_for(
    fake_ray: None, published: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trial_stop.storage, "read_json", lambda path: {"current_report_index": 1})
    in_flight = stop_uploads.WorkerUploads(2, 1, {2: "checkpoint_epoch-000001"})
    stuck = Worker([in_flight])
    lost = Worker([in_flight])
    answers = [Ref(in_flight), Ref(error=ray.exceptions.RayActorError())]
    lost.execute = Method(lambda fn: answers.pop(0) if len(answers) > 1 else answers[0])
    for trial_id, worker in (("stuck", stuck), ("lost", lost)):
        trial_stop.ControllerSlot.for_trial("j", trial_id, f"/store/train/{trial_id}").send(controller_of(worker))
    clock = [0.0]
    wait = stop_uploads.UploadWait(["stuck", "lost"], deadline=5.0, collecting=lambda: True, job_id="j",
                                 clock=lambda: clock[0])  # fmt: skip
    wait.start()
    wait_for(lambda: wait.trials["lost"].done and wait.trials["stuck"].waited, timeout=10, what="both probed")
    assert not wait.done()  # the stuck upload is still waited for
    clock[0] = 5.0
    wait.join(10)
    assert wait.done()
    assert wait.trials["stuck"].cut == ["checkpoint_epoch-000001"] and wait.trials["stuck"].error is None
    assert wait.trials["lost"].cut == ["checkpoint_epoch-000001"] and "RayActorError" in (
        wait.trials["lost"].error or ""
    )


def test_a_retried_trials_slot_is_not_cleared_by_the_run_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    store: dict[str, bytes] = {}
    monkeypatch.setattr(ray_internals, "kv_put", store.__setitem__)
    monkeypatch.setattr(ray_internals, "kv_get", store.get)
    monkeypatch.setattr(ray_internals, "kv_del", lambda key: store.pop(key, None))
    old = trial_stop.ControllerSlot.for_trial("j", "t", "/d")
    new = trial_stop.ControllerSlot.for_trial("j", "t", "/d")
    old.send("old controller")
    new.send("new controller")
    old.clear()
    assert new.receive() == "new controller" and new.receive_published() == ("new controller", "/d", new.token)
    new.clear()
    assert store == {}
