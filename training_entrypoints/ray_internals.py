"""Every Ray 2.58 name below the public API that the entrypoints rely on, in one place.

tests/unit/test_entrypoints_ray_internals.py checks each against the installed ray, so an upgrade that moves one fails
there, by name, instead of leaking worker groups in a running sweep."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

# ControllerCallback is a DeveloperAPI that `ray.train` does not re-export; RunConfig(callbacks=) accepts it and the
# controller calls `after_controller_start` inside the controller actor, where `current_actor` is the controller.
from ray.train.v2._internal.execution.callback import ControllerCallback

__all__ = ["ControllerCallback"]

T = TypeVar("T")

CONTROLLER_START_HOOK = "after_controller_start"
# `TrainController.abort`: Train's own clean stop (aborts the worker group, which removes its placement group, then
# exits the actor). `DataParallelTrainer.fit` calls it only from a Ctrl-C handler on the main thread.
CONTROLLER_ABORT_METHOD = "abort"

# `wrap_function` builds a function trainable's class from `train_func.__mixins__ + (FunctionTrainable,)`; a mixin's
# `cleanup` runs in the trial actor when Tune stops the trial (`Trainable.stop`), before the actor goes.
TRAINABLE_MIXINS_ATTR = "__mixins__"
TRAINABLE_CLEANUP_METHOD = "cleanup"

# Tune force-kills a stopping trial actor after TUNE_FORCE_TRIAL_CLEANUP_S (default 600 s); when the experiment ends it
# gives every stopping actor TUNE_END_OF_EXPERIMENT_CLEANUP_S (`TuneController._actor_force_cleanup_timeout`).
ENV_TUNE_FORCE_TRIAL_CLEANUP = "TUNE_FORCE_TRIAL_CLEANUP_S"
TUNE_FORCE_TRIAL_CLEANUP_DEFAULT_S = 600.0
TUNE_END_OF_EXPERIMENT_CLEANUP_S = 10.0

# TuneReportCallback hands rank 0's metrics to the trial through this session queue (one slot, a blocking put that
# holds the controller's event loop). A stopped trial reads no more results, so an abort queued behind a blocked put
# never runs unless the queue is drained.
SESSION_REPORT_QUEUE_ATTR = "_inter_actor_queue"

# Ray Train's commit record in a Train run dir and the fields of `_CheckpointManagerState` naming checkpoint folders.
SNAPSHOT_FILENAME = "checkpoint_manager_snapshot.json"
SNAPSHOT_RESULT_LISTS = ("checkpoint_results", "pending_training_results")
SNAPSHOT_LATEST_RESULT = "latest_checkpoint_result"
SNAPSHOT_DIR_NAME = "checkpoint_dir_name"
# `_CheckpointManagerState.current_report_index`: how many reports the controller processed when it wrote the snapshot
# (`CheckpointManager.register_checkpoint` counts the report, then writes the snapshot, in one step of its event loop).
# A checkpoint reported by call k (1-based, as the worker counts) is committed once a snapshot says k or more.
SNAPSHOT_REPORT_INDEX = "current_report_index"

# ---------------------------------------------------------------- uploads in flight (a graceful stop waits for them)
# Ray adds `__ray_call__(fn, *args)` to every actor class (ray/actor.py `_modify_class`): fn(instance, *args) runs in
# the actor. On the controller (an async actor) it runs on its event loop, so what we run there only reads.
ACTOR_CALL_METHOD = "__ray_call__"
# `TrainController.get_worker_group()` -> its WorkerGroup (None between groups); `WorkerGroup.get_workers()` -> Worker
# objects whose `actor` is the RayTrainWorker actor handle.
CONTROLLER_WORKER_GROUP_METHOD = "get_worker_group"
WORKER_GROUP_WORKERS_METHOD = "get_workers"
WORKER_ACTOR_ATTR = "actor"
# `RayTrainWorker.execute(fn, *args)` runs fn on the worker actor's one thread (`WorkerGroup.execute_async` uses it),
# the thread that also answers the controller's `poll_status`: what we run there must never block.
WORKER_EXECUTE_METHOD = "execute"
# `TrainContext` (train/v2/_internal/execution/context.py): `report` counts each call in `report_call_index` (its
# report's index, 1-based); the report reaches the worker's result queue, in call order, only after its checkpoint's
# upload (`_wait_then_report`, which then counts it in `current_report_index`). Calls counted but not yet handed over
# are uploads in flight: on the training thread (SYNC) or the context's `checkpoint_upload_threadpool` (ASYNC, one
# thread, `_upload_checkpoint_and_report(checkpoint_dir_name, metrics, checkpoint, report_call_index)`).
CONTEXT_REPORT_CALLS = "report_call_index"
CONTEXT_REPORTS_HANDED = "current_report_index"
CONTEXT_UPLOAD_POOL = "checkpoint_upload_threadpool"
CONTEXT_REPORT_METHOD = "report"
ASYNC_UPLOAD_FUNCTION = "_upload_checkpoint_and_report"
UPLOAD_ARG_DIR_NAME = "checkpoint_dir_name"
UPLOAD_ARG_REPORT_INDEX = "report_call_index"
# `ThreadPoolExecutor._work_queue` (a `queue.SimpleQueue`): submitted work items not started yet (`_WorkItem.args`, as
# submitted).
POOL_WORK_QUEUE_ATTR = "_work_queue"


# `TrainContext._upload_checkpoint` retries a whole upload, 3 attempts, when its error names a transient S3 failure;
# `TrainContext.report` takes its count (CONTEXT_REPORT_CALLS) back when it skips a report (a worker failed while the
# ranks agreed on the checkpoint's name), and then submits nothing.
CHECKPOINT_UPLOAD_ATTEMPTS = 3


def report_call_index() -> int | None:
    """How many reports this Train worker has made (None outside a Train worker)."""
    context = train_context()
    return getattr(context, CONTEXT_REPORT_CALLS) if context is not None else None


def retry_checkpoint_upload(attempt: Callable[[], T]) -> T:
    """Run one checkpoint upload with the retries Ray gives its own (same errors, attempts and backoff)."""
    from ray._common.retry import call_with_retry
    from ray.train.v2._internal.constants import AWS_RETRYABLE_TOKENS

    return call_with_retry(attempt, "upload checkpoint", AWS_RETRYABLE_TOKENS, CHECKPOINT_UPLOAD_ATTEMPTS)


# Ray's GCS key-value store (what Ray's own libraries use for small shared records); reachable from every worker.
KV_NAMESPACE = "sweeps.dev"


def kv_put(key: str, value: bytes) -> None:
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(key, value, overwrite=True, namespace=KV_NAMESPACE)


def kv_get(key: str) -> bytes | None:
    from ray.experimental.internal_kv import _internal_kv_get

    value = _internal_kv_get(key, namespace=KV_NAMESPACE)
    return bytes(value) if value is not None else None


def kv_del(key: str) -> None:
    from ray.experimental.internal_kv import _internal_kv_del

    _internal_kv_del(key, namespace=KV_NAMESPACE)


def train_context() -> Any | None:
    """This Train worker's TrainContext (ray.train.v2), or None outside a Train worker."""
    from ray.train.v2._internal.execution.context import get_train_context

    try:
        return get_train_context()
    except RuntimeError:  # "TrainContext has not been initialized."
        return None


def current_job_id() -> str:
    """The Ray job of this process: the driver's, and so its trial actors' and their Train controllers'."""
    import ray

    return str(ray.get_runtime_context().get_job_id())


def tune_session_report_queue() -> Any | None:
    """The running trial's TuneReportCallback queue (a `ray.util.queue.Queue`), or None before the first report."""
    from ray.train._internal.session import get_session

    session = get_session()
    return getattr(session, SESSION_REPORT_QUEUE_ATTR, None) if session is not None else None
