"""Benchmark: what our driver costs over the same sweep written by hand against Ray (Tune over Train V2).

    .venv/bin/python bench/entrypoint_overhead.py [--repeat 1] [--skip-digits | --only digits_2x2 | --only resume]

Two workloads, each run by hand (a script like the field review's) and through `python -m training_entrypoints.sweep`
(a RayJob rendered by the operator, run by training_entrypoints.local) on one shared local Ray, so cluster startup
is out of both: the review's scalar objective (2 trials x 1 worker; target ratio <= 1.10) and the digits MLP
(2 trials x 2 workers, gloo; target <= 1.05). The review's original Tune-only scalar example is timed too, for
reference (it has no Train run per trial). The resume row (issue 16) times, in one run on the same Ray, a fresh
start to its first epoch and the resume of that sweep (attempt 2, after its deadline stopped it) to its first new
epoch. The asha row (issue 26; `--only asha`, its own local Ray with room for one trial) runs an ASHA sweep of 4
trials through our driver and written with Ray's documented pattern: trials completed and total time. Prints one
JSON object; wall-clock seconds are the best of --repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sweep_contracts import constants
from sweep_operator.rendering import build_rayjob
from sweep_operator.validation import parse_sweep
from training_entrypoints.local import LocalRayCluster, LocalRaySize, run_rayjob, runtime_env_vars

REVIEW_TUNE_ONLY = """
import sys
import ray
from ray import tune

def objective(config):
    for step in range(2):
        tune.report({"score": -(config["x"] - 3) ** 2, "step": step})

ray.init()
tuner = tune.Tuner(
    tune.with_resources(objective, {"cpu": 1}),
    param_space={"x": tune.grid_search([1, 3])},
    tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=1),
    run_config=tune.RunConfig(storage_path=sys.argv[1], name="scalar-example", verbose=0),
)
results = tuner.fit()
best = results.get_best_result()
assert len(results) == 2 and not results.errors and best.config["x"] == 3 and best.metrics["score"] == 0
ray.shutdown()
"""

# Tune over Train V2 written directly against Ray, as the review recommends (function trainable, TuneReportCallback).
HANDWRITTEN = """
import sys
import ray
import ray.train
from ray import tune
from ray.train.torch import TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.search import BasicVariantGenerator
from {module} import train_loop

ROOT, WORKERS = sys.argv[1], {workers}

def trial(config):
    trial_id = tune.get_context().get_trial_id()
    TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=WORKERS, resources_per_worker={{"CPU": 1.0}}),
        run_config=ray.train.RunConfig(
            name=trial_id,
            storage_path=ROOT + "/train",
            failure_config=ray.train.FailureConfig(max_failures=1, controller_failure_limit=3, max_preemption_failures=5),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2{score}),
            callbacks=[TuneReportCallback()],
        ),
    ).fit()

ray.init()
tuner = tune.Tuner(
    tune.with_resources(trial, {{"CPU": 0, "sweep_trial_driver": 1}}),
    param_space={space},
    tune_config=tune.TuneConfig(metric="{metric}", mode="{mode}", search_alg=BasicVariantGenerator(max_concurrent={concurrent})),
    run_config=tune.RunConfig(storage_path=ROOT, name="tune", failure_config=tune.FailureConfig(max_failures=0)),
)
results = tuner.fit()
assert len(results) == 2 and not results.errors
ray.shutdown()
"""

# Issue 26: ASHA over Train V2 with room for one trial's workers, written with Ray's documented Tune-over-Train pattern
# (a function trainable calling TorchTrainer.fit, TuneReportCallback). When Tune stops a trial, its Train controller
# dies without abort() and the worker group's placement group stays reserved, so the next trial's group cannot start.
ASHA_HANDWRITTEN = """
import json
import sys
import ray
import ray.train
from ray import tune
from ray.train.torch import TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler
from tests.e2e.stop_probe_loop import train_loop

ROOT, CPUS = sys.argv[1], {cpus}

def trial(config):
    trial_id = tune.get_context().get_trial_id()
    TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker={{"CPU": float(CPUS)}}),
        run_config=ray.train.RunConfig(
            name=trial_id,
            storage_path=ROOT + "/train",
            failure_config=ray.train.FailureConfig(max_failures=0),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            callbacks=[TuneReportCallback()],
        ),
    ).fit()

ray.init()
tuner = tune.Tuner(
    tune.with_resources(trial, {{"CPU": 0, "sweep_trial_driver": 1}}),
    param_space={{"x": tune.grid_search([3, 1, 0, -1]), "steps": 4, "steps_at_x_3": 2}},
    tune_config=tune.TuneConfig(
        metric="score", mode="max", max_concurrent_trials=1,
        scheduler=ASHAScheduler(time_attr="training_iteration", max_t=2, grace_period=1),
    ),
    run_config=tune.RunConfig(storage_path=ROOT, name="tune", failure_config=tune.FailureConfig(max_failures=0)),
)
results = tuner.fit()
print("ASHA_RESULT " + json.dumps({{"terminated": sum(1 for r in results if r.error is None), "errored": len(results.errors)}}))
ray.shutdown()
"""


def asha_manifest(cpus: int) -> dict[str, Any]:
    """tests/e2e/test_entrypoints_trial_stop.py's sweep: 4 trials one at a time, one worker taking every CPU."""
    from tests.e2e.test_entrypoints_trial_stop import asha_sweep

    doc = asha_sweep()
    doc["spec"]["trial"]["resourcesPerWorker"]["cpu"] = str(cpus)
    return doc


def trials_reported(tune_dir: Path) -> int:
    """Tune trials whose result.json has a row (they trained), from the experiment's directory."""
    return sum(1 for r in tune_dir.glob("trial_*/result.json") if r.read_text().strip())


def asha_row(env: dict[str, str], base: Path, stall_s: float) -> dict[str, Any]:
    """ASHA on room for one trial: trials that ended TERMINATED, and the wall time, ours against the hand-written.
    The hand-written sweep waits for its next trial's worker group forever (Train V2 waits for resources without a
    timeout): it is stopped after `stall_s` and counted as stalled."""
    cpus = 2
    size = LocalRaySize(num_cpus=cpus, num_gpus=0, resources={constants.TRIAL_DRIVER_RESOURCE: 1.0})
    row: dict[str, Any] = {"local_ray": size.describe()}
    with LocalRayCluster(size, env=env) as cluster:
        run_env = {**cluster.env, "RAY_ADDRESS": cluster.address, constants.ENV_TRAIN_V2: "1"}
        started = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, "-c", ASHA_HANDWRITTEN.format(cpus=cpus), str(base / "asha-plain")],
                env=run_env, cwd=REPO, capture_output=True, text=True, timeout=stall_s,
            )  # fmt: skip
            line = next((x for x in done.stdout.splitlines() if x.startswith("ASHA_RESULT ")), None)
            counts: dict[str, Any] = json.loads(line.split(" ", 1)[1]) if line else {}
            counts["exit_code"] = done.returncode
        except subprocess.TimeoutExpired:
            counts = {"stalled": True, "terminated": None}
        plain_s = time.monotonic() - started
        counts["trials_that_reported"] = trials_reported(base / "asha-plain" / "tune")
        row["handwritten"] = {"seconds": round(plain_s, 1), **counts}
    with LocalRayCluster(size, env=env) as cluster:
        doc = asha_manifest(cpus)
        rayjob = build_rayjob(parse_sweep(doc), "asha1", deadline_at=int(time.time()) + 3600, storage_uri=str(base))
        started = time.monotonic()
        outcome = run_rayjob(rayjob, cluster=cluster, workdir=REPO, log_dir=base / "asha-logs")
        ours_s = time.monotonic() - started
        trials = (outcome.result or {}).get("trialResults") or []
        row["driver"] = {
            "seconds": round(ours_s, 1),
            "ok": outcome.ok,
            "terminated": sum(1 for t in trials if t.get("status") == "TERMINATED"),
            "errored": sum(1 for t in trials if t.get("status") == "ERROR"),
        }
    row["time_ratio"] = round(ours_s / plain_s, 3)
    return row


WORKLOADS: dict[str, dict[str, Any]] = {
    "scalar": {
        "target": 1.10,
        "manifest": REPO / "examples" / "review-scalar.yaml",
        "script": HANDWRITTEN.format(
            module="training_entrypoints.loops.scalar", workers=1, score="", space='{"x": tune.grid_search([1, 3])}',
            metric="score", mode="max", concurrent=1,
        ),
    },
    "digits_2x2": {
        "target": 1.05,
        "manifest": None,  # built below: examples/digits-cpu.yaml with a 2-value grid, 2 trials at once
        "script": HANDWRITTEN.format(
            module="training_entrypoints.loops.digits_mlp", workers=2,
            score=', checkpoint_score_attribute="val_loss", checkpoint_score_order="min"',
            space='{"lr": tune.grid_search([0.05, 0.0005]), "hidden": 32, "epochs": 3}',
            metric="val_loss", mode="min", concurrent=2,
        ),
    },
}  # fmt: skip


def digits_manifest() -> dict[str, Any]:
    import yaml

    doc = yaml.safe_load((REPO / "examples" / "digits-cpu.yaml").read_text())
    doc["spec"]["paramSpace"] = {"lr": {"grid": [0.05, 0.0005]}, "hidden": 32, "epochs": 3}
    doc["spec"]["tune"].update({"numSamples": 1, "maxConcurrentTrials": 2, "searcher": {"type": "grid"}})
    return doc


def run_script(script: str, cluster: LocalRayCluster, root: Path) -> float:
    env = {**cluster.env, "RAY_ADDRESS": cluster.address, constants.ENV_TRAIN_V2: "1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script, str(root)], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"hand-written run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return elapsed


def run_driver(doc: dict[str, Any], cluster: LocalRayCluster, root: Path, run_id: str) -> float:
    rayjob = build_rayjob(parse_sweep(doc), run_id, deadline_at=int(time.time()) + 3600, storage_uri=str(root))
    started = time.monotonic()
    outcome = run_rayjob(rayjob, cluster=cluster, workdir=REPO, log_dir=root / "logs")
    elapsed = time.monotonic() - started
    if not outcome.ok:
        raise RuntimeError(f"driver run failed: {outcome.message}\n{Path(outcome.log_path).read_text()[-3000:]}")
    return elapsed


def resume_row(cluster: LocalRayCluster, root: Path, first_attempt_s: float) -> dict[str, Any]:
    """Fresh start -> first epoch, and resume -> first new epoch, of one digits trial (1 worker) on the same Ray.

    Attempt 1 starts the sweep and holds after its first epoch (tests.support.entrypoint_loops:digits_resume_probe)
    until its deadline stops it; attempt 2 continues it on the same run root. Both are timed from the driver's
    launch to the `reported_at` of the epoch's report, so both include the driver's start, Tune, the trial's
    placement and the Train worker group; the resume adds its restore (experiment state, searcher, checkpoint)."""
    import yaml

    hold = root / "hold"
    root.mkdir(parents=True, exist_ok=True)
    hold.write_text("held")
    doc = yaml.safe_load((REPO / "examples" / "digits-cpu.yaml").read_text())
    doc["spec"].update(
        trainLoop="tests.support.entrypoint_loops:digits_resume_probe",
        paramSpace={"lr": 0.05, "hidden": 32, "epochs": 3, "hold_after_epoch": 0, "hold_file": str(hold)},
    )
    doc["spec"]["tune"].update({"numSamples": 1, "maxConcurrentTrials": 1, "searcher": {"type": "random"}})
    doc["spec"]["trial"].update({"workers": 1})
    doc["spec"]["deadlines"].update({"gracefulStopSeconds": 1})
    rayjob = build_rayjob(
        parse_sweep(doc), "resume1", deadline_at=int(time.time() + first_attempt_s), storage_uri=str(root)
    )
    launched = time.time()
    first = run_rayjob(rayjob, cluster=cluster, workdir=REPO, log_dir=root / "logs1")
    if not first.ok or not first.result or not first.result.get("deadlineReached"):
        raise RuntimeError(f"attempt 1 did not end at its deadline: {first.message}")
    (trial,) = [t["id"] for t in first.result["trialResults"]]
    rows_path = Path(first.run_root) / "tune" / trial / "result.json"
    fresh_rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    hold.unlink()
    body = json.loads(runtime_env_vars(rayjob)[constants.ENV_RUN_SPEC])
    body["attempt"] = 2
    overrides = {constants.ENV_RUN_SPEC: json.dumps(body), constants.ENV_DEADLINE_AT: str(int(time.time() + 600))}
    resumed = time.time()
    second = run_rayjob(rayjob, cluster=cluster, env_overrides=overrides, workdir=REPO, log_dir=root / "logs2")
    if not second.ok:
        raise RuntimeError(f"attempt 2 failed: {second.message}")
    new_rows = [json.loads(line) for line in rows_path.read_text().splitlines()][len(fresh_rows) :]
    if not new_rows or new_rows[0]["epoch"] != fresh_rows[-1]["epoch"] + 1:
        raise RuntimeError(f"attempt 2 did not continue after epoch {fresh_rows[-1]['epoch']}: {new_rows[:1]}")
    fresh_s = fresh_rows[0]["reported_at"] - launched
    resume_s = new_rows[0]["reported_at"] - resumed
    return {
        "fresh_start_to_first_epoch_s": round(fresh_s, 2),
        "resume_to_first_new_epoch_s": round(resume_s, 2),
        "ratio": round(resume_s / fresh_s, 3),
        "resumed_at_epoch": new_rows[0]["epoch"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant; the best time counts")
    parser.add_argument("--skip-digits", action="store_true", help="only the scalar workload")
    parser.add_argument(
        "--only",
        choices=sorted([*WORKLOADS, "resume", "asha"]),
        help="only this row (e.g. digits_2x2 with --repeat 3; asha runs only with --only asha)",
    )
    parser.add_argument(
        "--resume-first-attempt-s",
        type=float,
        default=45.0,
        help="deadline of the resume row's first attempt (it must reach its first epoch by then)",
    )
    parser.add_argument(
        "--asha-stall-s", type=float, default=300.0, help="the asha row's hand-written sweep is stopped after this"
    )
    args = parser.parse_args()
    import yaml

    size = LocalRaySize(num_cpus=4, num_gpus=0, resources={constants.TRIAL_DRIVER_RESOURCE: 2.0})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    report: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        "repeat": args.repeat,
        "local_ray": size.describe(),
    }
    if args.only == "asha":  # its own local Ray, sized for one trial's workers
        with tempfile.TemporaryDirectory(prefix="bench-entrypoint-") as tmp:
            report["asha"] = asha_row(env, Path(tmp), args.asha_stall_s)
        report["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
        print(json.dumps(report, indent=1))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-entrypoint-") as tmp, LocalRayCluster(size, env=env) as cluster:
        base = Path(tmp)
        if args.only in (None, "resume"):
            rows = [resume_row(cluster, base / f"resume-{i}", args.resume_first_attempt_s) for i in range(args.repeat)]
            best = min(rows, key=lambda r: r["resume_to_first_new_epoch_s"])
            report["resume"] = {**best, "samples": rows}
        if args.only == "resume":
            report["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
            print(json.dumps(report, indent=1))
            return 0
        report["review_tune_only_s"] = round(run_script(REVIEW_TUNE_ONLY, cluster, base / "review"), 2)
        for name, workload in WORKLOADS.items():
            if (name == "digits_2x2" and args.skip_digits) or (args.only and name != args.only):
                continue
            doc = yaml.safe_load(workload["manifest"].read_text()) if workload["manifest"] else digits_manifest()
            plain: list[float] = []
            ours: list[float] = []
            for i in range(args.repeat):
                # Alternate which goes first, so a warm-up or a neighbour's load does not always favour one side.
                order = ("plain", "driver") if i % 2 == 0 else ("driver", "plain")
                for kind in order:
                    if kind == "plain":
                        plain.append(run_script(workload["script"], cluster, base / f"{name}-plain-{i}"))
                    else:
                        ours.append(run_driver(doc, cluster, base / f"{name}-driver-{i}", f"bench{i}"))
            report[name] = {
                "handwritten_s": round(min(plain), 2),
                "driver_s": round(min(ours), 2),
                "samples_s": {"handwritten": [round(x, 1) for x in plain], "driver": [round(x, 1) for x in ours]},
                "ratio": round(min(ours) / min(plain), 3),
                "target": workload["target"],
                "meets_target": min(ours) / min(plain) <= workload["target"],
            }
    report["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
