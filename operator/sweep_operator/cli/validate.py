"""`sweepctl validate -f FILE...`: exit 0 when every TrainingSweep is valid, 2 with one line per problem."""

from __future__ import annotations

import argparse
import sys

from .common import EXIT_OK, EXIT_USAGE, load_documents, load_limits


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="check TrainingSweep manifests (schema, semantics, caps, bundle fit)")
    p.add_argument("-f", "--filename", action="append", required=True, metavar="FILE", help="manifest ('-': stdin)")
    p.add_argument("--limits", metavar="FILE", help="operator limits YAML (maxWorkersPerSweep, ...)")
    # `kubectl sweep validate NAME` validates the live object through a temporary file: the lines name the object.
    p.add_argument("--source-name", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..validation import validate_sweep

    limits = load_limits(args.limits)
    invalid = 0
    for path in args.filename:
        for i, doc in enumerate(load_documents(path)):
            shown = args.source_name or path
            where = shown if i == 0 else f"{shown}[{i}]"
            name = doc.get("metadata", {}).get("name", "?") if isinstance(doc, dict) else "?"
            problems = validate_sweep(doc, limits)
            if problems:
                invalid += 1
                for problem in problems:
                    print(f"{where}: {problem}", file=sys.stderr)
            else:
                print(f"{where}: TrainingSweep {name} is valid")
    return EXIT_USAGE if invalid else EXIT_OK
