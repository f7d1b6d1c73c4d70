"""The Tune trial driver: a function trainable that builds a V2 TorchTrainer per trial and calls `.fit()` (R17).

Trial params go in `train_loop_config`; TuneReportCallback is built inside the trial (R18); the Trainer gets
`ray.train`'s RunConfig and FailureConfig, never `ray.tune`'s (R19), with every retry class set (R12)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import ray.train
from ray import tune
from ray.train.v2.api.callback import UserCallback  # also importable when V1 is selected, so R2 can be checked

from sweep_contracts import constants, s3_layout
from sweep_contracts.api import SweepSpec, parse_quantity
from sweep_contracts.runspec import RunSpec

from . import pbt, ray_internals, storage, trial_stop
from .commit_records import CommitRecordCallback, backfill_trial
from .search import EntrypointError

logger = logging.getLogger(__name__)

# Key of the sweep context inside train_loop_config; paramSpace names starting with "_sweep" are reserved.
CONTEXT_KEY = "_sweep"
# A trial driver's CPU share when the cluster has no trial-driver resource (a plain Ray cluster).
FALLBACK_TRIAL_DRIVER_CPU = 0.1
RANKS_REPORTED_KEY = "ranks_reported"
RANK_SPREAD_SUFFIX = "_rank_spread"


def load_train_loop(reference: str) -> Callable[[dict[str, Any]], None]:
    """`module:function` -> the function; EntrypointError naming spec.trainLoop when it cannot be imported."""
    module_name, _, function_name = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EntrypointError(f"spec.trainLoop: cannot import module {module_name!r}: {exc}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise EntrypointError(f"spec.trainLoop: module {module_name!r} has no function {function_name!r}")
    return function


def worker_resources(spec: SweepSpec) -> dict[str, float]:
    """Ray resources of one train worker: CPU (and GPU) only. Pod memory is a Kubernetes limit (R15), not Ray's."""
    res = spec.trial.resources_per_worker
    resources = {"CPU": float(parse_quantity(res.cpu))}
    if res.gpu:
        resources["GPU"] = float(res.gpu)
    return resources


def scaling_config(spec: SweepSpec) -> ray.train.ScalingConfig:
    """`ScalingConfig(num_workers, use_gpu, resources_per_worker)`; never `trainer_resources`, which V2 rejects (R4)."""
    return ray.train.ScalingConfig(
        num_workers=spec.trial.workers,
        use_gpu=spec.trial.resources_per_worker.gpu > 0,
        resources_per_worker=worker_resources(spec),
    )


def train_failure_config(spec: SweepSpec) -> ray.train.FailureConfig:
    """All three V2 retry classes, explicitly: Ray's defaults retry controller and preemption failures forever (R12)."""
    policy = spec.failure_policy
    return ray.train.FailureConfig(
        max_failures=policy.worker_failures,
        controller_failure_limit=policy.controller_failures,
        max_preemption_failures=policy.preemption_failures,
    )


def checkpoint_config(spec: SweepSpec) -> ray.train.CheckpointConfig:
    """Retention: numToKeep ranked by scoreAttribute (default tune.metric); Ray always keeps the latest too.

    Under pbt nothing is deleted: Ray's retention cannot be vetoed and would delete a donor's checkpoint at the
    donor's next commit, before the trial that exploits it has copied it (checkpoint_manager.py,
    `_save_state_and_delete_old_checkpoints`)."""
    ckpt = spec.checkpoints
    attribute = ckpt.score_attribute or spec.tune.metric
    num_to_keep = None if is_pbt(spec) else ckpt.num_to_keep
    if attribute is None:
        return ray.train.CheckpointConfig(num_to_keep=num_to_keep)
    return ray.train.CheckpointConfig(
        num_to_keep=num_to_keep,
        checkpoint_score_attribute=attribute,
        checkpoint_score_order=ckpt.score_order or spec.tune.mode or "max",
    )


class RankReportCallback(UserCallback):
    """Forwards, with rank 0's metrics, how many ranks reported and how far `metric` differs between ranks.

    `ranks_reported` equal to the world size on every report shows every rank reported the same number of times
    (R8); `<metric>_rank_spread` > 0 means the loop reported a per-rank value instead of an aggregate (R9).
    Must come before TuneReportCallback, which forwards `metrics[0]`.
    """

    def __init__(self, metric: str | None):
        self._metric = metric
        self._warned = False

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        extra: dict[str, Any] = {RANKS_REPORTED_KEY: len(metrics)}
        values = [m.get(self._metric) for m in metrics] if self._metric else []
        if values and all(isinstance(v, (int, float)) for v in values):
            spread = float(max(values) - min(values))
            extra[f"{self._metric}{RANK_SPREAD_SUFFIX}"] = spread
            if spread > 0 and not self._warned:
                self._warned = True
                logger.warning(
                    "%s differs across ranks (spread %g): Ray Train keeps rank 0's value only; aggregate it across "
                    "ranks before ray.train.report",
                    self._metric,
                    spread,
                )
        # A new dict for rank 0, so Train's own copy (kept with the checkpoint) is left as the loop reported it.
        metrics[0] = {**metrics[0], **extra}


def is_pbt(spec: SweepSpec) -> bool:
    return spec.tune.scheduler.type == "pbt"


def train_run_config(
    run_spec: RunSpec,
    trial_id: str,
    extra_callbacks: Sequence[Any] = (),
    *,
    run_name: str | None = None,
    tune_reporter: Any | None = None,
) -> ray.train.RunConfig:
    """The Trainer's `ray.train.RunConfig` for one trial. Must be called inside a Tune trial (R18).

    `extra_callbacks` are controller callbacks (the one that lets a Tune stop abort the run: trial_stop). Under pbt
    the run may be named otherwise (`run_name`: a trial's later runs) and `tune_reporter` (pbt.PointerReporter's
    callback) takes TuneReportCallback's place."""
    from ray.tune.integration.ray_train import TuneReportCallback

    spec = run_spec.spec
    name = run_name or trial_id
    return ray.train.RunConfig(
        name=name,
        storage_path=run_spec.layout.train_storage_path,
        failure_config=train_failure_config(spec),
        checkpoint_config=checkpoint_config(spec),
        # TuneReportCallback forwards rank 0's metrics and the checkpoint path, not the checkpoint (R18). The commit
        # record of a checkpoint starts before it: Tune's report may wait on the trial to take it.
        callbacks=[
            RankReportCallback(spec.tune.metric),
            CommitRecordCallback(run_spec.layout.trial_dir(name)),
            tune_reporter if tune_reporter is not None else TuneReportCallback(),
            *extra_callbacks,
        ],
    )


def trial_context(run_spec: RunSpec, trial_id: str) -> dict[str, str]:
    """What a train loop may want to know about its sweep, under train_loop_config["_sweep"]."""
    return {
        "namespace": run_spec.namespace,
        "sweep": run_spec.sweep,
        "runId": run_spec.run_id,
        "trialId": trial_id,
        "runRoot": run_spec.run_root,
    }


def backfill_trial_records(train_run_dir: str) -> list[str]:
    """The trial's missing commit records, written before its run starts again; never raises (the verifier says
    which checkpoints stay unproven)."""
    try:
        return backfill_trial(train_run_dir)
    except Exception as exc:
        logger.warning("could not backfill commit records under %s: %s", train_run_dir, exc)
        return []


def make_trial_driver(run_spec: RunSpec) -> Callable[[dict[str, Any]], None]:
    """The function trainable Tune runs once per trial."""

    def trial_driver(config: dict[str, Any]) -> None:
        from ray.train.torch import TorchTrainer

        trial_id = tune.get_context().get_trial_id()
        trial_stop.log_in_trial_actor()
        start = pbt.TrainRunStart(trial_id)
        if is_pbt(run_spec.spec):
            start = pbt_train_run(run_spec, trial_id)
        run_dir = run_spec.layout.trial_dir(start.name)
        run = trial_stop.begin_trial_run(trial_id, run_dir)
        # A retried or resumed trial reports the same folder names again: an orphan left by an earlier stop or a
        # killed driver must not be merged into.
        trial_stop.remove_uncommitted_checkpoints(run.train_run_dir)
        # A controller of this trial that died between Ray's snapshot and our record left a checkpoint unproven.
        backfill_trial_records(run.train_run_dir)
        reporter = None
        if is_pbt(run_spec.spec):
            reporter = pbt.PointerReporter(
                trial_id, start.name, dict(config), pbt.new_report_queue(trial_id), run_dir,
                committed=pbt.latest_committed(storage.read_json(s3_layout.join(run_dir, ray_internals.SNAPSHOT_FILENAME))),
                iteration=start.iteration,
            )  # fmt: skip
        trainer = TorchTrainer(
            load_train_loop(run_spec.spec.train_loop),
            train_loop_config={**config, CONTEXT_KEY: trial_context(run_spec, trial_id)},
            scaling_config=scaling_config(run_spec.spec),
            run_config=train_run_config(
                run_spec,
                trial_id,
                [run.controller_callback()],
                run_name=start.name,
                tune_reporter=reporter.callback() if reporter is not None else None,
            ),
        )
        if reporter is None:
            # A retried or resumed trial has the same id, so Train continues from its own snapshot in storage.
            run.fit(trainer)
        else:
            reporter.run(lambda: run.fit(trainer))

    trial_driver.__name__ = trial_driver.__qualname__ = "trial_driver"
    # Tune's stop of the trial aborts its Train run (trial_stop.AbortTrainRunOnStop.cleanup); under pbt the report
    # queue is drained first, so an abort never waits behind a report nobody takes.
    mixins: tuple[type, ...] = (trial_stop.AbortTrainRunOnStop,)
    if is_pbt(run_spec.spec):
        mixins = (pbt.DrainReportsOnStop, *mixins)
    setattr(trial_driver, ray_internals.TRAINABLE_MIXINS_ATTR, mixins)
    return trial_driver


def pbt_train_run(run_spec: RunSpec, trial_id: str) -> pbt.TrainRunStart:
    """The Train run a PBT trial starts (pbt.choose_train_run); a run started from a pointer at another trial's
    checkpoint, or at one its own run has moved past, is seeded with a copy of it first."""
    layout = run_spec.layout
    pointer = pbt.read_pointer(tune.get_checkpoint())

    def own_snapshot(name: str) -> Any:
        return storage.read_json(s3_layout.join(layout.trial_dir(name), ray_internals.SNAPSHOT_FILENAME))

    start = pbt.choose_train_run(trial_id, pointer, own_snapshot)
    if start.seeded_from is not None:
        pbt.seed_train_run(layout.train_storage_path, start.name, start.seeded_from)
    return start


def trial_driver_resources(cluster_resources: dict[str, float]) -> dict[str, float]:
    """Resources of one trial driver (R5, R14): the head's trial-driver slot when the cluster offers one, so exactly
    maxConcurrentTrials drivers fit and none holds a CPU its train workers need; a small CPU share otherwise."""
    if cluster_resources.get(constants.TRIAL_DRIVER_RESOURCE, 0) >= 1:
        return {"CPU": 0, constants.TRIAL_DRIVER_RESOURCE: 1}
    return {"CPU": FALLBACK_TRIAL_DRIVER_CPU}
