"""Every Ray 2.58 name below the public API that the entrypoints rely on, in one place.

tests/unit/test_entrypoints_ray_internals.py checks each against the installed ray, so an upgrade that moves one fails
there, by name, instead of leaking worker groups in a running sweep."""

from __future__ import annotations

from typing import Any

# ControllerCallback is a DeveloperAPI that `ray.train` does not re-export; RunConfig(callbacks=) accepts it and the
# controller calls `after_controller_start` inside the controller actor, where `current_actor` is the controller.
from ray.train.v2._internal.execution.callback import ControllerCallback

__all__ = ["ControllerCallback"]

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


def tune_session_report_queue() -> Any | None:
    """The running trial's TuneReportCallback queue (a `ray.util.queue.Queue`), or None before the first report."""
    from ray.train._internal.session import get_session

    session = get_session()
    return getattr(session, SESSION_REPORT_QUEUE_ATTR, None) if session is not None else None
