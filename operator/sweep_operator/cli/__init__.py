"""`sweepctl`: init, validate, render, verify, run-local, sandbox, status, logs, report, release, guarded.

Each subcommand lives in its own module with `register(subparsers)`; imports of heavy
dependencies (ray, boto3, kubernetes clients) happen inside the command, not here.
Exit codes: 0 success, 1 the operation failed (e.g. not verified), 2 usage or input error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .common import EXIT_USAGE, UsageError

# Subcommand modules, in the order `sweepctl --help` lists them.
COMMAND_MODULES = (
    "init",
    "validate",
    "render",
    "verify",
    "run_local",
    "sandbox",
    "status",
    "logs",
    "report",
    "release",
    "resume",
)


DISTRIBUTION = "trainingsweep-operator"


def distribution_version() -> str:
    """The installed distribution's version (`unknown` when run from a tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweepctl",
        description="TrainingSweep operator CLI: Ray Tune sweeps over Ray Train V2 in KubeRay RayJobs.",
    )
    parser.add_argument("--version", action="version", version=f"sweepctl {distribution_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            continue  # a subcommand not built yet
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"sweepctl {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
