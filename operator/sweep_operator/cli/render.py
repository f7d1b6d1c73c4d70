"""`sweepctl render -f FILE [--limits FILE] [--run-id ID]`: the RayJob the operator would create, as YAML."""

from __future__ import annotations

import argparse
import sys
import time

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
    sys.stdout.write(to_yaml(build_rayjob(sweep, run_id, limits, deadline_at=deadline)))
    return EXIT_OK
