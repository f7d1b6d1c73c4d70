"""The in-cluster driver (`python -m training_entrypoints.sweep`): one sweep run as Ray Tune over Ray Train V2.

Everything that can be wrong with the input is checked before Ray starts (exit 2); a sweep with a failed trial
exits 1 after writing its result file; a sweep stopped by its deadline exits 0 with its checkpoints persisted.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping

from sweep_operator import constants, s3_layout
from sweep_operator.problems import SpecError
from sweep_operator.runspec import RunSpec, deadline_from_env

from . import preflight, storage
from .progress import SweepProgressCallback, TrialSummary, public_config, result_document, status_document
from .search import EntrypointError, build_param_space, build_scheduler, build_searcher
from .trainable import load_train_loop, make_trial_driver, trial_driver_resources, worker_resources

logger = logging.getLogger("training_entrypoints.sweep")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INPUT = 2
_TRUE = ("1", "true", "yes")


class RunMode(enum.Enum):
    """What to do with the run root (R16): each run has its own prefix; reusing one is a recovery, said out loud."""

    NEW = "new"
    RESUME = "resume"  # a RayJob retry of this run: Tune restores its experiment, Train its snapshots
    FINISHED = "finished"  # result.json exists: refuse to overwrite a finished run


def decide_run_mode(has_result: bool, has_experiment: bool) -> RunMode:
    if has_result:
        return RunMode.FINISHED
    return RunMode.RESUME if has_experiment else RunMode.NEW


def require_train_v2() -> None:
    """Fail fast unless Ray Train V2 is what `ray.train.torch.TorchTrainer` resolves to (R2)."""
    flag = os.environ.get(constants.ENV_TRAIN_V2)
    from ray.train.torch import TorchTrainer

    if (flag is not None and flag.strip().lower() not in _TRUE) or not TorchTrainer.__module__.startswith("ray.train.v2."):
        raise EntrypointError(
            f"{constants.ENV_TRAIN_V2}={flag!r}: this entrypoint needs Ray Train V2 (the 2.58 default); "
            f"unset the variable or set it to 1 (got TorchTrainer from {TorchTrainer.__module__})"
        )


@dataclass
class SweepPlan:
    """Everything the Tuner needs, built and checked before Ray starts."""

    run_spec: RunSpec
    param_space: dict[str, Any]
    searcher: Any
    scheduler: Any
    deadline_at: float | None


def plan_sweep(env: Mapping[str, str], *, load_user_code: bool = True) -> SweepPlan:
    """Parse SWEEP_RUN_SPEC and SWEEP_DEADLINE_AT and build the search; EntrypointError/SpecError/ValueError on bad input.

    `load_user_code=False` leaves the trainLoop's import to the caller (main records the run's status first)."""
    run_spec = RunSpec.from_env(env)
    deadline_at = deadline_from_env(env)
    require_train_v2()
    spec = run_spec.spec
    if spec.tune.metric and not spec.tune.mode:
        raise EntrypointError(f"spec.tune.mode: required with metric {spec.tune.metric!r}")
    if load_user_code:
        load_train_loop(spec.train_loop)  # the image must have it; fail here rather than in every trial
    return SweepPlan(
        run_spec=run_spec,
        param_space=build_param_space(spec.param_space),
        searcher=build_searcher(spec),
        scheduler=build_scheduler(spec),
        deadline_at=deadline_at,
    )


def time_budget_s(deadline_at: float | None, graceful_stop_s: float, now: float) -> float | None:
    """Tune's time budget: stop `graceful_stop_s` before the sweep deadline so the last checkpoints land."""
    return None if deadline_at is None else deadline_at - now - graceful_stop_s


def deadline_was_reached(deadline_at: float | None, graceful_stop_s: float, now: float) -> bool:
    """Whether the sweep ran into its stop time (the deadline less `graceful_stop_s`), judged on the wall clock
    against the same absolute time Tune's budget and the trials' own deadline checks come from. Not on how long
    `fit()` took: the setup before `fit()` already counts against the budget (a busy machine once made a sweep
    stopped by its deadline read as finished)."""
    return deadline_at is not None and now >= deadline_at - graceful_stop_s


def trial_dirname(trial: Any) -> str:
    """`tune/<trialId>` mirrors `train/<trialId>`."""
    return str(trial.trial_id)


def _best_committed_checkpoint(trial_dir: str, attribute: str | None, order: str | None) -> str | None:
    """The trial's best checkpoint among those Ray's snapshot commits (the latest without a score)."""
    import ray.train

    try:
        result = ray.train.Result.from_path(trial_dir)
    except (RuntimeError, OSError, FileNotFoundError):
        return None
    candidates = [(ckpt, m) for ckpt, m in (result.best_checkpoints or []) if attribute and attribute in m]
    if candidates:
        pick = min if order == "min" else max
        return pick(candidates, key=lambda c: c[1][attribute])[0].path
    return result.checkpoint.path if result.checkpoint else None


def final_summaries(results: Any, run_spec: RunSpec) -> list[TrialSummary]:
    """One summary per trial from Tune's ResultGrid; checkpoint URIs come from each trial's committed snapshot."""
    spec = run_spec.spec
    metric, mode = spec.tune.metric, spec.tune.mode
    attribute = spec.checkpoints.score_attribute or metric
    order = spec.checkpoints.score_order or mode
    summaries = []
    for result in results:
        trial_id = os.path.basename(result.path.rstrip("/"))
        value = None
        if metric and mode:
            frame = result.metrics_dataframe
            if frame is not None and metric in frame:
                series = frame[metric].dropna()
                value = float(series.min() if mode == "min" else series.max()) if len(series) else None
        path = _best_committed_checkpoint(run_spec.layout.trial_dir(trial_id), attribute, order)
        summaries.append(
            TrialSummary(
                id=trial_id,
                status="ERROR" if result.error else "TERMINATED",
                config=public_config(dict(result.config or {})),
                value=value,
                checkpoint_uri=storage.to_uri(path, run_spec.run_root) if path else None,
                error=_one_line(result.error) if result.error else None,
            )
        )
    return summaries


def _one_line(error: BaseException, limit: int = 2000) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _resource_text(resources: Mapping[str, float]) -> str:
    shown = {k: v for k, v in sorted(resources.items()) if not k.startswith(("node:", "memory", "object_store"))}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown.items()) + "}"


def resource_diagnosis(run_spec: RunSpec, cluster: Mapping[str, float], driver: Mapping[str, float]) -> str:
    """Which resources one trial asks for and which the cluster has (R12, R14)."""
    spec = run_spec.spec
    return (
        f"each trial asks for {spec.trial.workers} train worker(s) x {_resource_text(worker_resources(spec))} "
        f"plus a trial driver {_resource_text(driver)}; the cluster has {_resource_text(cluster)} in total. "
        f"Workers wait {os.environ.get(constants.ENV_WORKER_GROUP_START_TIMEOUT, '60')} s per attempt "
        f"({constants.ENV_WORKER_GROUP_START_TIMEOUT}) and retry spec.failurePolicy.controllerFailures="
        f"{spec.failure_policy.controller_failures} times"
    )


def current_run_mode(run_spec: RunSpec) -> RunMode:
    """Look at the run root: nothing there (new), a Tune experiment (resume) or a result file (finished)."""
    from ray import tune

    layout = run_spec.layout
    return decide_run_mode(storage.exists(layout.result_path), tune.Tuner.can_restore(layout.tune_dir))


def run_sweep(plan: SweepPlan, mode: RunMode) -> int:
    """Run the Tuner on the connected Ray cluster and write the result file; the exit code."""
    import ray
    from ray import tune
    from ray.tune.search import Searcher

    run_spec = plan.run_spec
    spec, layout = run_spec.spec, run_spec.layout
    budget = time_budget_s(plan.deadline_at, spec.deadlines.graceful_stop_seconds, time.time())
    if budget is not None and budget <= 0:
        print(f"sweep: the deadline {plan.deadline_at:.0f} leaves no time to train (gracefulStopSeconds "
              f"{spec.deadlines.graceful_stop_seconds})", file=sys.stderr)
        return EXIT_FAILED

    cluster = ray.cluster_resources()
    driver_resources = trial_driver_resources(cluster)
    trainable = tune.with_resources(make_trial_driver(run_spec), driver_resources)
    progress = SweepProgressCallback(layout, spec.tune.metric, spec.tune.mode)
    if mode is RunMode.RESUME:
        logger.warning("recovering run %s from %s (a retry of this run, R16)", run_spec.run_id, layout.tune_dir)
        tuner = tune.Tuner.restore(layout.tune_dir, trainable=trainable, resume_unfinished=True, resume_errored=True)
        # A restored Tuner keeps its first TuneConfig, whose budget would restart from now; the sweep's one clock
        # (SWEEP_DEADLINE_AT) decides instead. Tuner.restore has no tune_config argument in 2.58.
        internal = getattr(tuner, "_local_tuner", None)
        if internal is not None and budget is not None:
            internal._tune_config.time_budget_s = budget
    else:
        logger.info("new run %s under %s", run_spec.run_id, layout.root)
        tuner = tune.Tuner(
            trainable,
            param_space=plan.param_space,
            tune_config=tune.TuneConfig(
                metric=spec.tune.metric,
                mode=spec.tune.mode,
                search_alg=plan.searcher,
                scheduler=plan.scheduler,
                num_samples=spec.tune.num_samples,
                max_concurrent_trials=spec.tune.max_concurrent_trials if isinstance(plan.searcher, Searcher) else None,
                time_budget_s=budget,
                trial_dirname_creator=trial_dirname,
            ),
            # Tune's own RunConfig and FailureConfig, not Train's (R19): trial retries only.
            run_config=tune.RunConfig(
                name=s3_layout.TUNE_EXPERIMENT_NAME,
                storage_path=layout.tune_storage_path,
                failure_config=tune.FailureConfig(max_failures=spec.failure_policy.trial_failures),
                callbacks=[progress],
            ),
        )
    results = tuner.fit()
    deadline_reached = deadline_was_reached(plan.deadline_at, spec.deadlines.graceful_stop_seconds, time.time())

    summaries = final_summaries(results, run_spec)
    run_info = {"namespace": run_spec.namespace, "sweep": run_spec.sweep, "runId": run_spec.run_id}
    document = result_document(summaries, spec.tune.metric, spec.tune.mode, run=run_info, deadline_reached=deadline_reached)
    failed = [s for s in summaries if s.error]
    phase = "Failed" if failed else ("DeadlineExceeded" if deadline_reached else "Succeeded")
    storage.write_json(layout.status_path, status_document(summaries, spec.tune.metric, spec.tune.mode, phase=phase))
    storage.write_json(layout.result_path, document)
    _print_summary(document, layout.result_path)
    if failed:
        for summary in failed:
            print(f"sweep: trial {summary.id} failed: {summary.error}", file=sys.stderr)
        print(f"sweep: {resource_diagnosis(run_spec, cluster, driver_resources)}", file=sys.stderr)
        return EXIT_FAILED
    if deadline_reached:
        print(f"sweep: stopped {spec.deadlines.graceful_stop_seconds} s before the deadline; checkpoints so far are kept")
    return EXIT_OK


def _print_summary(document: Mapping[str, Any], where: str) -> None:
    best = document.get("bestTrial")
    counts = document["trials"]
    print(f"sweep: {counts['terminated']} terminated, {counts['errored']} errored of {counts['total']} trials; result in {where}")
    if best:
        print(f"sweep: best trial {best['id']} {best['metric']}={best['value']:g} config={best['config']} "
              f"checkpoint={best['checkpointUri']}")


def connect_ray(plan: SweepPlan) -> None:
    """Join the RayJob's cluster (RAY_ADDRESS); anywhere else start a local Ray sized so nested Tune + Train fits."""
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init()
        return
    from .local import plan_local_ray

    size = plan_local_ray(plan.run_spec.spec)
    logger.info("no RAY_ADDRESS: starting a local Ray with %s", size.describe())
    ray.init(
        address="local",
        num_cpus=size.num_cpus,
        num_gpus=size.num_gpus,
        resources=size.resources,
        object_store_memory=size.object_store_bytes,
        include_dashboard=False,
    )


def main(env: Mapping[str, str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    env = os.environ if env is None else env
    try:
        plan = plan_sweep(env, load_user_code=False)
    except (EntrypointError, SpecError, ValueError) as exc:
        for line in str(exc).splitlines():
            print(f"sweep: {line}", file=sys.stderr)
        return EXIT_INPUT
    run_root = plan.run_spec.run_root
    try:
        # Before anything else touches the run root: a missing permission fails here, in seconds, naming the action.
        preflight.check_run_root(run_root)
    except preflight.PreflightError as exc:
        return _preflight_failed(run_root, exc)
    # The run's status exists before any user code runs: the checkpoint guard reads "no checkpoint reported" from
    # it, and a trainLoop that fails at import then never leaves a cluster held for nothing.
    first_attempt = _record_start(plan)
    try:
        load_train_loop(plan.run_spec.spec.train_loop)
    except (EntrypointError, SpecError, ValueError) as exc:
        for line in str(exc).splitlines():
            print(f"sweep: {line}", file=sys.stderr)
        if first_attempt:
            _record_failure(plan, str(exc))
        return EXIT_INPUT
    mode = current_run_mode(plan.run_spec)
    if mode is RunMode.FINISHED:
        print(
            f"sweep: run {plan.run_spec.run_id} already finished ({plan.run_spec.layout.result_path} exists); "
            "a new run needs a new run id (R16)",
            file=sys.stderr,
        )
        return EXIT_INPUT
    import ray

    connect_ray(plan)
    try:
        try:
            preflight.check_gpu_workers(plan.run_spec)
        except preflight.PreflightError as exc:
            return _preflight_failed(run_root, exc)
        return run_sweep(plan, mode)
    finally:
        ray.shutdown()


def _record_start(plan: SweepPlan) -> bool:
    """Write `_sweep/status.json` (no trial yet) unless an earlier attempt of this run wrote one, whose records of
    reported checkpoints must stay; True on the run's first attempt."""
    layout, spec = plan.run_spec.layout, plan.run_spec.spec
    if storage.exists(layout.status_path):
        return False
    storage.write_json(layout.status_path, status_document([], spec.tune.metric, spec.tune.mode, phase="Starting"))
    return True


def _record_failure(plan: SweepPlan, message: str) -> None:
    layout, spec = plan.run_spec.layout, plan.run_spec.spec
    document = {**status_document([], spec.tune.metric, spec.tune.mode, phase="Failed"), "message": message}
    storage.write_json(layout.status_path, document)


def _preflight_failed(run_root: str, exc: preflight.PreflightError) -> int:
    print(f"sweep: {exc}", file=sys.stderr)
    recorded = preflight.record_failure(run_root, exc.failure)
    where = s3_layout.RunLayout(run_root).status_path
    print(f"sweep: the failure is {'recorded in' if recorded else 'not recorded (no write access) in'} {where}", file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
