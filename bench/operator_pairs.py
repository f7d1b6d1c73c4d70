"""Benchmark: the operator against a yardstick operator, alternating, in pairs (bench/operator_scale.py each run).

    .venv/bin/python bench/operator_pairs.py [--sweeps 1000] [--pairs 3] [--yardstick same-writes]
    .venv/bin/python bench/operator_pairs.py --against-tree DIR   # this tree's operator against another checkout's

Each pair runs the operator then the yardstick on a fresh emulator and stand-in (the order alternates so a drift
of the machine's load favours neither); the ratios are taken within a pair, and the medians over pairs are checked
against the goals: time to every RayJob and CPU per sweep within 1.15x, p99 apply -> RayJob within 1.5x, peak RSS
within 1.5x. With --against-tree the yardstick is the operator of another checkout (its operator/ and contracts/,
e.g. `git archive REV operator contracts | tar -x -C DIR`) run by this tree's bench, and the goal is the CPU per
sweep within 1.10x of it (a redesign must not cost). Prints one JSON object; the runs' logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GOALS = {"timeToEveryRayJob": 1.15, "cpuPerSweep": 1.15, "p99": 1.5, "peakRss": 1.5}
AGAINST_TREE_GOALS = {"cpuPerSweep": 1.10}


def run(operator: str, sweeps: int, extra: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "operator_scale.py"),
            "--sizes",
            str(sweeps),
            "--operator",
            operator,
            *extra,
        ],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        cwd=REPO,
    )
    size = json.loads(out.stdout)["sizes"][0]
    return {
        "operator": operator,
        "timeToEveryRayJob": size["allRayJobsSeconds"],
        "cpuPerSweep": size["operator"]["cpuSecondsPerSweep"],
        "p99": size["latencySeconds"]["p99"],
        "peakRss": size["operator"]["peakRssMiB"],
        "operatorRequestsPerSweep": size["operatorRequestsPerSweep"],
        "duplicates": size["rayjobs"]["duplicates"],
        "lost": size["rayjobs"]["lost"],
        "loadavg": [round(x, 1) for x in os.getloadavg()],
    }


def ratios(ours: dict[str, Any], yardstick: dict[str, Any]) -> dict[str, float | None]:
    """Ours over the yardstick's, per measure (None where the yardstick's is missing or zero)."""
    return {key: (round(ours[key] / yardstick[key], 3) if ours[key] and yardstick[key] else None) for key in GOALS}


def yardstick_run(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    if args.against_tree is None:
        return run(args.yardstick, args.sweeps, extra)
    return {**run("sweep", args.sweeps, [*extra, "--operator-tree", str(args.against_tree)]), "operator": "tree"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--yardstick", choices=("same-writes", "bare"), default="same-writes")
    parser.add_argument("--with-bare", action="store_true", help="also one run of the bare operator, for the record")
    parser.add_argument("--against-tree", type=Path, help="the yardstick: the operator of another checkout")
    args, extra = parser.parse_known_args(argv)
    yardstick = "tree" if args.against_tree is not None else args.yardstick
    goals = AGAINST_TREE_GOALS if args.against_tree is not None else GOALS
    pairs = []
    for i in range(args.pairs):
        order = ("sweep", yardstick) if i % 2 == 0 else (yardstick, "sweep")
        runs = {
            name: run("sweep", args.sweeps, extra) if name == "sweep" else yardstick_run(args, extra) for name in order
        }
        pairs.append({"order": list(order), "runs": runs, "ratios": ratios(runs["sweep"], runs[yardstick])})
        print(f"pair {i + 1}: {pairs[-1]['ratios']}", file=sys.stderr)
    medians = {
        key: round(statistics.median(values), 3)
        if (values := [p["ratios"][key] for p in pairs if p["ratios"][key]])
        else None
        for key in GOALS
    }
    report = {
        "benchmark": "operator_pairs",
        "sweeps": args.sweeps,
        "yardstick": yardstick,
        **({"againstTree": str(args.against_tree)} if args.against_tree is not None else {}),
        "goals": goals,
        "cpus": os.cpu_count(),
        "pairs": pairs,
        "medianRatios": medians,
        "met": {key: medians[key] is not None and medians[key] <= goal for key, goal in goals.items()},
        "correct": all(r["duplicates"] == 0 and r["lost"] == 0 for p in pairs for r in p["runs"].values()),
        **({"bare": run("bare", args.sweeps, extra)} if args.with_bare else {}),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
