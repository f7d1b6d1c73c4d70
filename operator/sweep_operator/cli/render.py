"""`sweepctl render -f FILE [--limits FILE] [--run-id ID]`: the RayJob the operator would create, as YAML.

The run spec inside runtimeEnvYAML (SWEEP_RUN_SPEC) is shown as indented JSON: the same document the operator
writes on one line, parsed alike by the driver.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from .common import EXIT_OK, load_limits, load_sweep, run_id_from


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("render", help="print the KubeRay RayJob a TrainingSweep becomes")
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="TrainingSweep manifest ('-': stdin)")
    p.add_argument("--limits", metavar="FILE", help="operator limits YAML (maxWorkersPerSweep, ...)")
    p.add_argument("--run-id", help="run id (default: a fresh one)")
    p.add_argument(
        "--deadline-at",
        type=int,
        metavar="EPOCH",
        help="sweep deadline in epoch seconds (default: now + activeSeconds)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..policy import effective_active_seconds
    from ..rendering import build_rayjob, to_yaml

    limits = load_limits(args.limits)
    sweep = load_sweep(args.filename, limits)
    run_id = run_id_from(args.run_id)
    deadline = args.deadline_at or int(time.time()) + effective_active_seconds(sweep.spec, limits)
    sys.stdout.write(cost_notes(sweep.spec))
    sys.stdout.write(to_yaml(readable(build_rayjob(sweep, run_id, limits, deadline_at=deadline))))
    return EXIT_OK


def cost_notes(spec: Any) -> str:
    """What the sweep's scheduler costs beyond its trials' epochs, as YAML comments above the RayJob (so the output
    still applies as it is)."""
    scheduler = spec.tune.scheduler
    if scheduler.type != "pbt":
        return ""
    lines = [
        f"scheduler pbt: every perturbation ({scheduler.time_attr} every {scheduler.perturbation_interval:g}) pauses "
        "trials, and a paused trial's Train run is stopped (its workers freed) and started again:",
        f"a new worker group of {spec.trial.workers} worker(s) (placement group, processes, framework init) and a "
        "reload of its checkpoint each time;",
        "an exploited trial's restart also copies the donor's committed checkpoint in S3 first.",
        "Under pbt every committed checkpoint is kept (checkpoints.numToKeep is not applied): plan the bucket's space.",
        "See docs/schedulers.md.",
    ]
    return "".join(f"# {line}\n" for line in lines)


def readable(rayjob: dict[str, Any]) -> dict[str, Any]:
    """`rayjob` with its run spec indented, one field a line: on one line it is a 2,000-character JSON string."""
    from sweep_contracts import constants, runtime_env

    from ..rendering import to_yaml

    spec = rayjob["spec"]
    env = runtime_env.decode(spec.get("runtimeEnvYAML"))
    env_vars = env.get("env_vars")
    if isinstance(env_vars, dict) and isinstance(env_vars.get(constants.ENV_RUN_SPEC), str):
        env_vars[constants.ENV_RUN_SPEC] = json.dumps(json.loads(env_vars[constants.ENV_RUN_SPEC]), indent=2) + "\n"
        spec["runtimeEnvYAML"] = to_yaml(env)
    return rayjob
