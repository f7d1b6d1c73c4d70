"""Each Ray-internal name training_entrypoints.ray_internals pins exists, and does what we rely on, in the installed ray.

A Ray upgrade that renames or reshapes one fails here, naming it, instead of a sweep leaking its worker groups."""

from __future__ import annotations

import dataclasses
import inspect
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray
import ray.train
from ray.runtime_context import RuntimeContext
from ray.train._internal import session as train_session
from ray.train.v2._internal import constants as train_constants
from ray.train.v2._internal.execution.checkpoint import checkpoint_manager
from ray.train.v2._internal.execution.controller.controller import TrainController
from ray.train.v2.api import data_parallel_trainer
from ray.tune.execution import tune_controller
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.trainable import function_trainable
from ray.tune.trainable.trainable import Trainable

from training_entrypoints import ray_internals


def test_the_controller_start_hook_runs_inside_the_controller_actor() -> None:
    """`after_controller_start(train_run_context)` is called from TrainController's constructor, i.e. in the actor."""
    hook = getattr(ray_internals.ControllerCallback, ray_internals.CONTROLLER_START_HOOK)
    assert list(inspect.signature(hook).parameters) == ["self", "train_run_context"]
    assert f'"{ray_internals.CONTROLLER_START_HOOK}"' in inspect.getsource(TrainController._start)
    assert "self._start()" in inspect.getsource(TrainController.__init__)
    assert isinstance(getattr(RuntimeContext, "current_actor", None), property)


def test_run_config_callbacks_that_are_not_user_callbacks_reach_the_controller() -> None:
    """RunConfig accepts any RayTrainCallback; fit() passes the non-UserCallback ones to the controller as they are."""
    callback = ray_internals.ControllerCallback()
    assert ray.train.RunConfig(callbacks=[callback]).callbacks == [callback]
    source = inspect.getsource(data_parallel_trainer.DataParallelTrainer._create_default_callbacks)
    assert "not isinstance(cb, UserCallback)" in source


def test_controller_abort_is_trains_clean_stop_of_the_worker_group() -> None:
    """`TrainController.abort` (async) aborts the worker group, which shuts its placement group down, then exits."""
    abort = getattr(TrainController, ray_internals.CONTROLLER_ABORT_METHOD)
    # Ray adds `_ray_trace_ctx` to an actor class's methods once tracing was set up in this process (another test
    # started Ray): not part of the method's own signature.
    params = [p for p in inspect.signature(abort).parameters if p != "_ray_trace_ctx"]
    assert inspect.iscoroutinefunction(abort) and params == ["self"]
    source = inspect.getsource(abort)
    assert "self._worker_group.abort()" in source and "exit_actor()" in source
    # fit() itself aborts only on Ctrl-C in the main thread: a Tune trial runs fit() in another thread.
    assert "abort.remote()" in inspect.getsource(data_parallel_trainer.DataParallelTrainer._register_sigint_handler)


def test_function_trainables_take_mixins_and_tunes_stop_calls_their_cleanup() -> None:
    class Probe(Trainable):
        def cleanup(self) -> None:
            super().cleanup()

    def fn(config: dict[str, object]) -> None:
        pass

    setattr(fn, ray_internals.TRAINABLE_MIXINS_ATTR, (Probe,))
    cls = function_trainable.wrap_function(fn)
    mro = cls.__mro__
    assert mro.index(Probe) < mro.index(function_trainable.FunctionTrainable)
    assert getattr(cls, ray_internals.TRAINABLE_CLEANUP_METHOD) is Probe.cleanup
    assert f"self.{ray_internals.TRAINABLE_CLEANUP_METHOD}()" in inspect.getsource(Trainable.stop)


def test_tunes_force_kill_of_a_stopping_trial_is_what_the_abort_stays_under() -> None:
    source = inspect.getsource(tune_controller.TuneController.__init__)
    default = int(ray_internals.TUNE_FORCE_TRIAL_CLEANUP_DEFAULT_S)
    assert f'os.environ.get("{ray_internals.ENV_TUNE_FORCE_TRIAL_CLEANUP}", "{default}")' in source
    end_of_experiment = int(ray_internals.TUNE_END_OF_EXPERIMENT_CLEANUP_S)
    assert f"self._actor_force_cleanup_timeout: int = {end_of_experiment}" in source


def test_tune_report_callback_blocks_on_the_sessions_one_slot_queue() -> None:
    """TuneReportCallback puts into the session's `_inter_actor_queue` (maxsize 1): the queue trial_stop drains."""
    assert "_get_or_create_inter_actor_queue()" in inspect.getsource(TuneReportCallback.__init__)
    create = inspect.getsource(train_session._TrainSession._get_or_create_inter_actor_queue)
    assert f"self.{ray_internals.SESSION_REPORT_QUEUE_ATTR} = ray_queue.Queue(1" in create
    assert f"self.{ray_internals.SESSION_REPORT_QUEUE_ATTR}: " in inspect.getsource(train_session._TrainSession.reset)


def test_the_snapshot_file_and_fields_naming_checkpoint_folders() -> None:
    assert train_constants.CHECKPOINT_MANAGER_SNAPSHOT_FILENAME == ray_internals.SNAPSHOT_FILENAME
    fields = checkpoint_manager._CheckpointManagerState.model_fields
    assert {*ray_internals.SNAPSHOT_RESULT_LISTS, ray_internals.SNAPSHOT_LATEST_RESULT} <= set(fields)
    assert ray_internals.SNAPSHOT_DIR_NAME in checkpoint_manager._TrainingResultState.model_fields


def test_the_gcs_key_value_store_and_out_of_band_actor_handles() -> None:
    """The controller's handle reaches its trial pickled through the GCS store (ActorHandle pickles out of band)."""
    from ray.actor import ActorHandle
    from ray.experimental import internal_kv

    assert list(inspect.signature(internal_kv._internal_kv_put).parameters) == [
        "key",
        "value",
        "overwrite",
        "namespace",
    ]
    assert list(inspect.signature(internal_kv._internal_kv_get).parameters) == ["key", "namespace"]
    assert {"key", "namespace"} <= set(inspect.signature(internal_kv._internal_kv_del).parameters)
    assert "out-of-band" in inspect.getsource(ActorHandle.__reduce__)


def test_async_checkpoint_uploads_retry_like_rays_and_a_skipped_report_takes_its_count_back() -> None:
    """Ray's retry of an upload (3 attempts on its transient S3 errors), the report counter a skipped report takes
    back, the upload's error put in the training thread's exception queue, and the pool flushed when the loop
    returns."""
    from ray.train.v2._internal.execution import context
    from ray.train.v2._internal.execution.worker_group import worker

    assert ray_internals.CONTEXT_REPORT_CALLS in context.TrainContext.__dataclass_fields__
    attempts = ray_internals.CHECKPOINT_UPLOAD_ATTEMPTS
    retry = f'@retry(description="upload checkpoint", max_attempts={attempts}, match=AWS_RETRYABLE_TOKENS)'
    assert retry in inspect.getsource(context.TrainContext)
    report = inspect.getsource(context.TrainContext.report)
    index = ray_internals.CONTEXT_REPORT_CALLS
    assert f"self.{index} += 1" in report and f"self.{index} -= 1" in report
    assert f"self.{ray_internals.CONTEXT_UPLOAD_POOL}.submit(" in report
    assert "get_exception_queue().put(" in report
    flush = inspect.getsource(worker.RayTrainWorker.run_train_fn)
    assert f"get_train_context().{ray_internals.CONTEXT_UPLOAD_POOL}.shutdown()" in flush


def test_an_upload_error_ray_would_not_retry_is_raised_at_once() -> None:
    calls = []

    def denied() -> None:
        calls.append(1)
        raise OSError("AWS Error ACCESS_DENIED during PutObject operation")

    with pytest.raises(OSError, match="ACCESS_DENIED"):
        ray_internals.retry_checkpoint_upload(denied)
    assert calls == [1]


def test_what_a_graceful_stop_reads_to_wait_for_uploads_in_flight() -> None:
    """The controller's worker group and its workers' actors, the worker's `execute`, `__ray_call__` on every actor,
    TrainContext's report counters (a call counted before its upload, handed over after it, in order), the upload
    pool and the async upload's arguments, and the snapshot's count of processed reports."""
    from ray import actor
    from ray.train.v2._internal.execution import context
    from ray.train.v2._internal.execution.worker_group import worker, worker_group

    assert callable(getattr(TrainController, ray_internals.CONTROLLER_WORKER_GROUP_METHOD))
    assert "return self._worker_group" in inspect.getsource(TrainController.get_worker_group)
    assert callable(getattr(worker_group.WorkerGroup, ray_internals.WORKER_GROUP_WORKERS_METHOD))
    assert ray_internals.WORKER_ACTOR_ATTR in inspect.signature(worker.Worker).parameters
    execute = getattr(worker.RayTrainWorker, ray_internals.WORKER_EXECUTE_METHOD)
    assert "return fn(*fn_args, **fn_kwargs)" in inspect.getsource(execute)
    assert f"def {ray_internals.ACTOR_CALL_METHOD}(" in inspect.getsource(actor)
    assert "return fn(self, *args, **kwargs)" in inspect.getsource(actor)

    fields = {f.name for f in dataclasses.fields(context.TrainContext)}
    assert {ray_internals.CONTEXT_REPORT_CALLS, ray_internals.CONTEXT_REPORTS_HANDED} <= fields
    assert ray_internals.CONTEXT_UPLOAD_POOL in fields and context.MAX_CHECKPOINT_UPLOAD_THREADS == 1
    report = inspect.getsource(getattr(context.TrainContext, ray_internals.CONTEXT_REPORT_METHOD))
    assert "self.report_call_index += 1" in report
    assert f"def {ray_internals.ASYNC_UPLOAD_FUNCTION}(" in report
    assert (
        f"{ray_internals.UPLOAD_ARG_DIR_NAME}: str,\n                    metrics: Dict[str, Any],\n"
        f'                    checkpoint: Optional["Checkpoint"],\n                    '
        f"{ray_internals.UPLOAD_ARG_REPORT_INDEX}: int," in report
    )
    assert "self.checkpoint_upload_threadpool.submit(" in report
    handover = inspect.getsource(context.TrainContext._wait_then_report)
    assert "self.get_result_queue().put(training_report)\n            self.current_report_index += 1" in handover
    assert ray_internals.POOL_WORK_QUEUE_ATTR in inspect.getsource(ThreadPoolExecutor.submit)
    assert ray_internals.SNAPSHOT_REPORT_INDEX in checkpoint_manager._CheckpointManagerState.model_fields
    register = inspect.getsource(checkpoint_manager.CheckpointManager.register_checkpoint)
    assert register.index("self._current_report_index += 1") < register.index("self._save_state_and_delete_old")
