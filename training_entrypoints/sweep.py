"""The in-cluster driver (`python -m training_entrypoints.sweep`): one sweep run as Ray Tune over Ray Train V2.

Everything that can be wrong with the input is checked before Ray starts (exit 2); a sweep with a failed trial
exits 1 after writing its result file; a sweep stopped by its deadline exits 0 with its checkpoints persisted; a sweep
stopped by SIGTERM (Ray's Jobs API stop) stops gracefully, records the stop in its status and exits 0 (no result file:
the run is unfinished, and the next attempt resumes it).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants, s3_layout
from sweep_contracts.problems import SpecError
from sweep_contracts.runspec import RunSpec, deadline_from_env

from . import commit_records, graceful_stop, preflight, resume, storage, tracking
from .pbt import LineagePBT
from .progress import SweepProgressCallback, result_document, status_document, utc_now
from .resume import RunMode
from .search import EntrypointError, build_param_space, build_scheduler, build_searcher
from .trainable import load_train_loop, make_trial_driver, trial_driver_resources, worker_resources
from .trial_results import final_summaries, trial_dirname

logger = logging.getLogger("training_entrypoints.sweep")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_STOPPED = 0  # Ray marks a job it stopped STOPPED whatever the code; 0 says the stop went as asked
_TRUE = ("1", "true", "yes")


def decide_run_mode(
    has_result: bool, has_experiment: bool, *, attempt: int = 1, result_attempt: int | None = None
) -> RunMode:
    """New, resume or finished (R16): `resume.decide_run_mode` with `result_attempt` defaulting to 1 for a result
    file that names none (one from before attempts were recorded)."""
    return resume.decide_run_mode(attempt, has_experiment, (result_attempt or 1) if has_result else None)


def require_train_v2() -> None:
    """Fail fast unless Ray Train V2 is what `ray.train.torch.TorchTrainer` resolves to (R2)."""
    flag = os.environ.get(constants.ENV_TRAIN_V2)
    from ray.train.torch import TorchTrainer

    if (flag is not None and flag.strip().lower() not in _TRUE) or not TorchTrainer.__module__.startswith(
        "ray.train.v2."
    ):
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

    @property
    def attempt(self) -> int:
        """Attempt N of the run (the run spec's `attempt`); N > 1 continues an ended sweep on the same run root."""
        return self.run_spec.attempt


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
    """Look at the run root: nothing there (new), a Tune experiment (resume), or a result file this attempt wrote
    (finished); attempt N > 1 continues the experiment an earlier attempt ended, and refuses a run root without one."""
    from ray import tune

    layout = run_spec.layout
    result = storage.read_json(layout.result_path)
    return decide_run_mode(
        result is not None,
        tune.Tuner.can_restore(layout.tune_dir),
        attempt=run_spec.attempt,
        result_attempt=resume.document_attempt(result),
    )


@dataclass
class AttemptLedger:
    """This attempt's record and the earlier ones, as every status and result document of the attempt carries them."""

    attempt: int
    earlier: list[dict[str, Any]]
    record: dict[str, Any]

    def facts(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "attempts": resume.with_attempt(self.earlier, self.record)}


def restore_tuner(
    plan: SweepPlan,
    trainable: Any,
    progress: SweepProgressCallback,
    budget: float | None,
    stop: graceful_stop.GracefulStop | None = None,
    tracker: tracking.MlflowTracker | None = None,
) -> tuple[Any, resume.ContinuePlan]:
    """Tuner.restore of the run's experiment, set up to continue rather than restart (training_entrypoints.resume).

    Finished trials stay as they are; unfinished trials and those the deadline stopped resume from their last
    committed checkpoint (same trial id, so Train finds its snapshot); errored trials are resumed from theirs too
    (`resume_errored`, never `restart_errored`: a restart would throw away the checkpoints the guard kept and give the
    trial a new id, orphaning train/<old id>), with `failurePolicy.trialFailures` retries again. Tune restores the
    searcher's state, so it does not suggest what it already ran, and the sample count is raised to the run spec's."""
    from ray import tune

    run_spec = plan.run_spec
    spec, layout = run_spec.spec, run_spec.layout
    continued = resume.prepare_experiment(layout.tune_dir)
    tuner = tune.Tuner.restore(
        layout.tune_dir, trainable=trainable, resume_unfinished=True, resume_errored=True, restart_errored=False
    )
    # Tuner.restore has no tune_config or run_config argument in 2.58: the restored Tuner keeps the first attempt's.
    internal = tuner._local_tuner
    # The sweep's clock for this attempt (SWEEP_DEADLINE_AT) decides the budget; the old stopper was dropped above.
    internal._tune_config.time_budget_s = budget
    internal._tune_config.search_alg = resume.continuing_search(
        internal._tune_config.search_alg,
        num_samples=spec.tune.num_samples,
        continued=continued.continued,
        max_concurrent_trials=internal._tune_config.max_concurrent_trials,
    )
    internal._tune_config.max_concurrent_trials = None  # already applied by continuing_search (a ConcurrencyLimiter)
    # This attempt's progress callback (its attempt facts), not the pickled one of the first attempt; KeepTrialLogs
    # first, before any logger that came back with the pickled run config.
    ours = (SweepProgressCallback, resume.KeepTrialLogs, graceful_stop.GracefulStopCallback)
    callbacks = [c for c in (internal._run_config.callbacks or []) if not isinstance(c, ours)]
    internal._run_config.callbacks = [resume.KeepTrialLogs(), *callbacks, progress]
    if stop is not None:
        # This attempt's stop, not the pickled one of an earlier attempt (whose signal state was not kept).
        internal._run_config.callbacks.append(graceful_stop.GracefulStopCallback(stop))
        internal._run_config.stop = graceful_stop.GracefulStopper(stop)
    # This attempt's tracker: the pickled callback of an earlier attempt holds none.
    internal._run_config.callbacks = tracking.install(internal._run_config.callbacks, tracker)
    return tuner, continued


def run_sweep(plan: SweepPlan, mode: RunMode, ledger: AttemptLedger | None = None) -> int:
    """Run the Tuner on the connected Ray cluster and write the result file; the exit code."""
    import ray
    from ray import tune

    run_spec = plan.run_spec
    spec, layout = run_spec.spec, run_spec.layout
    ledger = ledger or AttemptLedger(
        plan.attempt,
        [],
        resume.attempt_record(
            plan.attempt, started_at=utc_now(), deadline_at=plan.deadline_at, num_samples=spec.tune.num_samples
        ),
    )
    budget = time_budget_s(plan.deadline_at, spec.deadlines.graceful_stop_seconds, time.time())
    if budget is not None and budget <= 0:
        message = (
            f"the deadline {plan.deadline_at:.0f} leaves no time to train (gracefulStopSeconds "
            f"{spec.deadlines.graceful_stop_seconds})"
        )
        print(f"sweep: {message}", file=sys.stderr)
        _record_failure(plan, ledger, message)
        return EXIT_FAILED

    cluster = ray.cluster_resources()
    driver_resources = trial_driver_resources(cluster)
    trainable = tune.with_resources(make_trial_driver(run_spec), driver_resources)
    progress = SweepProgressCallback(layout, spec.tune.metric, spec.tune.mode, attempt_facts=ledger.facts())
    # From here a SIGTERM (Ray's Jobs API stop: KubeRay's StopJob, the operator's graceful stop) stops Tune gracefully.
    stop = graceful_stop.from_env(spec.deadlines.graceful_stop_seconds)
    restore_signals = graceful_stop.install(stop)
    # Off Tune's event loop: its thread talks to the MLflow server; the progress documents carry what it last saw.
    tracker = tracking.start_tracker(run_spec)
    progress.extra_facts = _extra_facts(tracker, plan.scheduler)
    try:
        return _tune(plan, mode, ledger, trainable, progress, budget, stop, cluster, driver_resources, tracker)
    finally:
        restore_signals()
        if tracker is not None:
            tracker.finish(tracking.RUN_FAILED, timeout_s=0)  # only where _tune raised: it finished it otherwise


def _new_tuner(
    plan: SweepPlan,
    trainable: Any,
    progress: SweepProgressCallback,
    budget: float | None,
    stop: graceful_stop.GracefulStop,
    tracker: tracking.MlflowTracker | None,
) -> Any:
    """The Tuner of a new run (a resumed one is restored: `restore_tuner`)."""
    from ray import tune
    from ray.tune.search import Searcher

    spec, layout = plan.run_spec.spec, plan.run_spec.layout
    return tune.Tuner(
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
            callbacks=tracking.install([progress, graceful_stop.GracefulStopCallback(stop)], tracker),
            stop=graceful_stop.GracefulStopper(stop),
        ),
    )


def _tune(
    plan: SweepPlan,
    mode: RunMode,
    ledger: AttemptLedger,
    trainable: Any,
    progress: SweepProgressCallback,
    budget: float | None,
    stop: graceful_stop.GracefulStop,
    cluster: Mapping[str, float],
    driver_resources: Mapping[str, float],
    tracker: tracking.MlflowTracker | None = None,
) -> int:
    run_spec = plan.run_spec
    spec, layout = run_spec.spec, run_spec.layout
    known: tuple[str, ...] = ()
    if mode is RunMode.RESUME:
        logger.warning(
            "recovering run %s from %s (attempt %d: %s)", run_spec.run_id, layout.tune_dir, plan.attempt,
            "a resume of the ended run" if ledger.earlier else "a retry of this attempt",
        )  # fmt: skip
        tuner, continued = restore_tuner(plan, trainable, progress, budget, stop, tracker)
        known = continued.known
        plan.scheduler = tuner._local_tuner._tune_config.scheduler  # the restored experiment's own
        if isinstance(plan.scheduler, LineagePBT):  # an ended run's exploits stay in its lineage
            plan.scheduler.restore_lineage((storage.read_json(layout.status_path) or {}).get("lineage"))
        progress.extra_facts = _extra_facts(tracker, plan.scheduler)
        ledger.record = {**ledger.record, "resumedTrials": sorted(continued.continued)}
        progress.attempt_facts = ledger.facts()
    else:
        logger.info("new run %s under %s", run_spec.run_id, layout.root)
        tuner = _new_tuner(plan, trainable, progress, budget, stop, tracker)
    results = tuner.fit()
    # A trial's last records may have been cut short (its controller aborted by a stop): every committed checkpoint
    # is proven before the final records name them.
    commit_records.backfill_run(layout.train_storage_path)
    if stop.triggered:
        return _record_graceful_stop(plan, ledger, progress, stop, known, tracker)
    deadline_reached = deadline_was_reached(plan.deadline_at, spec.deadlines.graceful_stop_seconds, time.time())

    # Every trial of every attempt: the restored experiment holds them all, so the best is chosen over all of them.
    summaries = final_summaries(results, run_spec)
    failed = [s for s in summaries if s.error]
    phase = "Failed" if failed else ("DeadlineExceeded" if deadline_reached else "Succeeded")
    ledger.record = resume.finish_record(
        ledger.record, ended_at=utc_now(), phase=phase, new_trials=[s.id for s in summaries if s.id not in set(known)]
    )
    facts = ledger.facts()
    run_info = {"namespace": run_spec.namespace, "sweep": run_spec.sweep, "runId": run_spec.run_id}
    document = result_document(
        summaries,
        spec.tune.metric,
        spec.tune.mode,
        run=run_info,
        deadline_reached=deadline_reached,
        attempt_facts=facts,
    )
    status = status_document(summaries, spec.tune.metric, spec.tune.mode, phase=phase, attempt_facts=facts)
    if isinstance(plan.scheduler, LineagePBT):
        status["lineage"] = plan.scheduler.document()
    if tracker is not None:
        tracking.record_best_checkpoints(tracker, {s.id: s.checkpoint_uri for s in summaries if s.checkpoint_uri})
        tracked = tracker.finish(tracking.end_status(phase))  # bounded: what the server did not take is counted
        for doc in (status, document):
            doc.update({} if tracked is None else {"tracking": tracked})
    storage.write_json(layout.status_path, status)
    storage.write_json(layout.result_path, document)
    _print_summary(document, layout.result_path)
    if failed:
        for summary in failed:
            print(f"sweep: trial {summary.id} failed: {summary.error}", file=sys.stderr)
        print(f"sweep: {resource_diagnosis(run_spec, cluster, driver_resources)}", file=sys.stderr)
        return EXIT_FAILED
    if deadline_reached:
        print(
            f"sweep: stopped {spec.deadlines.graceful_stop_seconds} s before the deadline; checkpoints so far are kept"
        )
    return EXIT_OK


def _extra_facts(tracker: tracking.MlflowTracker | None, scheduler: Any) -> Any:
    """What each status document adds: the tracker's block, and a PBT sweep's lineage (bounded)."""
    if tracker is None and not isinstance(scheduler, LineagePBT):
        return None

    def facts() -> dict[str, Any]:
        found = dict(tracker.document_facts()) if tracker is not None else {}
        if isinstance(scheduler, LineagePBT):
            found["lineage"] = scheduler.document()
        return found

    return facts


def _record_graceful_stop(
    plan: SweepPlan,
    ledger: AttemptLedger,
    progress: SweepProgressCallback,
    stop: graceful_stop.GracefulStop,
    known: tuple[str, ...],
    tracker: tracking.MlflowTracker | None = None,
) -> int:
    """The sweep was stopped by a signal: `_sweep/status.json` says so (phase Stopped, `stoppedBy`, what each trial
    last reported); no result file, so the run stays unfinished and a later attempt (a Kueue readmission, a resume)
    continues it from the committed checkpoints."""
    run_spec = plan.run_spec
    spec, layout = run_spec.spec, run_spec.layout
    summaries = progress.summaries()
    ledger.record = resume.finish_record(
        ledger.record,
        ended_at=utc_now(),
        phase="Stopped",
        new_trials=[s.id for s in summaries if s.id not in set(known)],
    )
    record = stop.record(run_spec.run_root)
    document = status_document(
        summaries, spec.tune.metric, spec.tune.mode, phase="Stopped", attempt_facts=ledger.facts()
    )
    document.update(stoppedBy=graceful_stop.STOPPED_BY_SIGNAL, stop=record)
    tracked = tracker.finish(tracking.end_status("Stopped")) if tracker is not None else None
    if tracked is not None:
        document["tracking"] = tracked
    storage.write_json(layout.status_path, document)
    reported = [t["id"] for t in record["trials"] if t["reportedAfterStop"]]
    print(
        f"sweep: stopped by {record['signal']} after {record['waitedSeconds']} s: "
        f"{len(reported)} of {len(record['trials'])} running trial(s) reported once more and were stopped"
        + (" (the wait ran out)" if record["timedOut"] else "")
        + f"; status in {layout.status_path}"
    )
    return EXIT_STOPPED


def _print_summary(document: Mapping[str, Any], where: str) -> None:
    best = document.get("bestTrial")
    counts = document["trials"]
    print(
        f"sweep: {counts['terminated']} terminated, {counts['errored']} errored of {counts['total']} trials; result in {where}"
    )
    if best:
        print(
            f"sweep: best trial {best['id']} {best['metric']}={best['value']:g} config={best['config']} "
            f"checkpoint={best['checkpointUri']}"
        )


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
    mode = current_run_mode(plan.run_spec)
    if mode is RunMode.FINISHED:
        print(
            f"sweep: run {plan.run_spec.run_id} attempt {plan.attempt} already finished "
            f"({plan.run_spec.layout.result_path} exists); a new run needs a new run id, a resume a higher attempt",
            file=sys.stderr,
        )
        return EXIT_INPUT
    # The run's status exists before any user code runs: the checkpoint guard reads "no checkpoint reported" from
    # it, and a trainLoop that fails at import then never leaves a cluster held for nothing.
    ledger, wrote_start = _record_start(plan)
    try:
        load_train_loop(plan.run_spec.spec.train_loop)
    except (EntrypointError, SpecError, ValueError) as exc:
        for line in str(exc).splitlines():
            print(f"sweep: {line}", file=sys.stderr)
        if wrote_start:
            _record_failure(plan, ledger, str(exc))
        return EXIT_INPUT
    if mode is RunMode.NOTHING_TO_RESUME:
        message = (
            f"attempt {plan.attempt} resumes run {plan.run_spec.run_id}, but {plan.run_spec.layout.tune_dir} holds no "
            "Tune experiment to continue"
        )
        print(f"sweep: {message}", file=sys.stderr)
        if wrote_start:
            _record_failure(plan, ledger, message)
        return EXIT_INPUT
    import ray

    connect_ray(plan)
    try:
        try:
            preflight.check_gpu_workers(plan.run_spec)
        except preflight.PreflightError as exc:
            return _preflight_failed(run_root, exc)
        return run_sweep(plan, mode, ledger)
    finally:
        ray.shutdown()


def _record_start(plan: SweepPlan) -> tuple[AttemptLedger, bool]:
    """Record this attempt in `_sweep/status.json`; (the attempt ledger, whether this call wrote the status).

    The run's first attempt writes a status with no trial yet. Attempt N > 1 rewrites the ended attempt's status as
    "Starting" with its trial records kept (the guard keeps reading which trials reported checkpoints) and this
    attempt appended to `attempts`. A retry inside an attempt leaves the status as its earlier try wrote it."""
    layout, spec = plan.run_spec.layout, plan.run_spec.spec
    status = storage.read_json(layout.status_path)
    result = storage.read_json(layout.result_path)
    attempts = resume.previous_attempts(status, result)
    record = resume.attempt_record(
        plan.attempt, started_at=utc_now(), deadline_at=plan.deadline_at, num_samples=spec.tune.num_samples
    )
    ongoing = [a for a in attempts if a["attempt"] == plan.attempt and a.get("endedAt") is None]
    if ongoing:
        record = {**record, "startedAt": ongoing[0].get("startedAt") or record["startedAt"]}
    ledger = AttemptLedger(plan.attempt, [a for a in attempts if a["attempt"] < plan.attempt], record)
    if status is None:
        document = status_document([], spec.tune.metric, spec.tune.mode, phase="Starting", attempt_facts=ledger.facts())
    elif (resume.document_attempt(status) or 1) < plan.attempt:
        kept = {k: v for k, v in status.items() if k not in ("pending", "message")}
        document = {**kept, **ledger.facts(), "phase": "Starting", "updatedAt": utc_now()}
    else:
        return ledger, False
    storage.write_json(layout.status_path, document)
    return ledger, True


def _record_failure(plan: SweepPlan, ledger: AttemptLedger, message: str) -> None:
    """The attempt failed before Tune ran: its status says so, keeping any earlier attempt's trial records."""
    layout, spec = plan.run_spec.layout, plan.run_spec.spec
    ledger.record = resume.finish_record(ledger.record, ended_at=utc_now(), phase="Failed", new_trials=())
    current = storage.read_json(layout.status_path) or status_document([], spec.tune.metric, spec.tune.mode)
    document = {**current, **ledger.facts(), "phase": "Failed", "message": message, "updatedAt": utc_now()}
    storage.write_json(layout.status_path, document)


def _preflight_failed(run_root: str, exc: preflight.PreflightError) -> int:
    print(f"sweep: {exc}", file=sys.stderr)
    recorded = preflight.record_failure(run_root, exc.failure)
    where = s3_layout.RunLayout(run_root).status_path
    print(
        f"sweep: the failure is {'recorded in' if recorded else 'not recorded (no write access) in'} {where}",
        file=sys.stderr,
    )
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
