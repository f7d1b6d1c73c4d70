"""The operator's growth curves from `operator_scale.py --gpu --steady S` reports: per-sweep figures against sweeps.

    .venv/bin/python bench/growth_plot.py OUT.png BURST.json [STEADY.json ...]

The first report of a size gives its burst figures, a later one with a steady state adds that. Prints one JSON line
per size (the figures docs/benchmarks.md tabulates) and draws them, small, into OUT.png
(matplotlib, pinned in the `report` extra).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def growth_row(report: dict[str, Any], size: dict[str, Any]) -> dict[str, Any]:
    """One size's per-sweep figures (burst and steady), with the machine's load around the run."""
    n, op, steady = size["sweeps"], size["operator"], size.get("steady") or {}
    return {
        "sweeps": n,
        "loadavgBefore": report["machine"]["loadavgBefore"][0],
        "loadavgAfter": report["machine"]["loadavgAfter"][0],
        "allRayJobsSeconds": size["allRayJobsSeconds"],
        "cpuMsPerSweep": round(op["cpuSecondsPerSweep"] * 1000, 2),
        "requestsPerSweep": size["operatorRequestsPerSweep"],
        "p99Seconds": size["latencySeconds"]["p99"],
        "idleRssMiB": op["rssBeforeMiB"],
        "peakRssMiB": op["peakRssMiB"],
        "peakKiBPerSweepAboveIdle": round((op["peakRssMiB"] - op["rssBeforeMiB"]) * 1024 / n, 1),
        "steadyCpuMsPerSweepMinute": steady.get("cpuMsPerSweepMinute"),
        "steadyRequestsPerSweepMinute": steady.get("requestsPerSweepMinute"),
        "steadyS3GetsPerSweepMinute": steady.get("s3GetsPerSweepMinute"),
        "steadyS3DownloadsPerSweepMinute": steady.get("s3DownloadsPerSweepMinute"),
        "steadyRequests": steady.get("operatorRequests"),
        "duplicates": size["rayjobs"]["duplicates"],
        "lost": size["rayjobs"]["lost"],
    }


def draw(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [r["sweeps"] for r in rows]
    panels = [
        ("burst: CPU ms per sweep", "cpuMsPerSweep", None),
        ("burst: API requests per sweep", "requestsPerSweep", None),
        ("peak RSS KiB per sweep above idle", "peakKiBPerSweepAboveIdle", 150.0),
        ("steady: CPU ms per sweep-minute", "steadyCpuMsPerSweepMinute", 10.0),
        ("steady: requests per sweep-minute", "steadyRequestsPerSweepMinute", 0.5),
        ("p99 apply → RayJob, s", "p99Seconds", 2.0),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(9, 5), dpi=80)
    for ax, (title, key, goal) in zip(axes.flat, panels, strict=True):
        values = [r.get(key) for r in rows]
        ax.plot(sweeps, [v if v is not None else float("nan") for v in values], marker="o")
        if goal is not None:
            ax.axhline(goal, color="tab:red", linestyle="--", linewidth=1, label=f"goal {goal:g}")
            ax.legend(fontsize=7)
        ax.set_xscale("log")
        ax.set_xticks(sweeps, [f"{s:,}" for s in sweeps])
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
    fig.suptitle("trainingsweep-operator: per-sweep cost against sweeps (2-core machine, shared)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    by_size: dict[int, dict[str, Any]] = {}
    for path in argv[1:]:  # the first report of a size gives its burst figures; a later one adds its steady state
        report = json.loads(Path(path).read_text())
        for size in report["sizes"]:
            row = growth_row(report, size)
            known = by_size.setdefault(row["sweeps"], row)
            if known is not row and row["steadyCpuMsPerSweepMinute"] is not None:
                known.update({k: v for k, v in row.items() if k.startswith("steady")})
                known["steadyLoadavg"] = [row["loadavgBefore"], row["loadavgAfter"]]
    rows = [by_size[n] for n in sorted(by_size)]
    for row in rows:
        print(json.dumps(row))
    draw(rows, Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
