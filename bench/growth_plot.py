"""The operator's growth curves from `operator_scale.py --gpu --steady S` reports: per-sweep figures against sweeps.

    .venv/bin/python bench/growth_plot.py OUT.png REPORT.json [REPORT.json ...]

Prints one JSON line per size (the figures docs/benchmarks.md tabulates) and draws them, small, into OUT.png
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
    fig.suptitle("trainingsweep-operator: growth with GPU sweeps (2-core machine, shared)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    rows = []
    for path in argv[1:]:
        report = json.loads(Path(path).read_text())
        rows.extend(growth_row(report, size) for size in report["sizes"])
    rows.sort(key=lambda r: r["sweeps"])
    for row in rows:
        print(json.dumps(row))
    draw(rows, Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
