"""`sweepctl render -f FILE [--limits FILE] [--run-id ID]`: the RayJob the operator would create, as YAML."""

from __future__ import annotations

import argparse
import sys
import time

from .common import EXIT_OK, EXIT_USAGE, UsageError, load_documents, load_limits


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("render", help="print the KubeRay RayJob a TrainingSweep becomes")
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="TrainingSweep manifest ('-': stdin)")
    p.add_argument("--limits", metavar="FILE", help="operator limits YAML (maxWorkersPerSweep, ...)")
    p.add_argument("--run-id", help="run id (default: a fresh one)")
    p.add_argument(
        "--deadline-at", type=int, metavar="EPOCH", help="sweep deadline in epoch seconds (default: now + activeSeconds)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..policy import effective_active_seconds
    from ..problems import SpecError
    from ..rendering import build_rayjob, check_run_id, new_run_id, to_yaml
    from ..validation import parse_sweep

    limits = load_limits(args.limits)
    docs = load_documents(args.filename)
    if len(docs) != 1:
        raise UsageError(f"{args.filename}: expected one TrainingSweep, found {len(docs)} documents")
    try:
        sweep = parse_sweep(docs[0], limits)
    except SpecError as exc:
        for problem in exc.problems:
            print(f"{args.filename}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    run_id = args.run_id or new_run_id()
    try:
        check_run_id(run_id)
    except ValueError as exc:
        raise UsageError(f"--run-id: {exc}") from None
    deadline = args.deadline_at or int(time.time()) + effective_active_seconds(sweep.spec, limits)
    sys.stdout.write(to_yaml(build_rayjob(sweep, run_id, limits, deadline_at=deadline)))
    return EXIT_OK
