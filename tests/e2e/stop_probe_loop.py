"""Train loop for test_entrypoints_trial_stop.py (imported by Ray workers as `tests.e2e.stop_probe_loop:train_loop`).

Rank 0 records Ray's placement-group table once its own worker group is up, then reports a tiny checkpoint per step:
`steps` times, except at x=3, which reports `steps_at_x_3` times (the sweep sets it to ASHA's maxT, so Tune stops that
trial on its last report, racing the run's own end, as examples/digits-gpu-eks.yaml's maxT 6 with 6 epochs does).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import ray.train
from ray.util import get_current_placement_group, placement_group_table

from sweep_contracts import s3_layout

PROBE_DIR_ENV = "SWEEP_TEST_PROBE_DIR"


def record_placement_groups(trial_id: str, probe_dir: Path) -> None:
    """`<probe_dir>/<trialId>.json`: this worker group's placement group id and every group's state right now."""
    own = get_current_placement_group()
    table = {
        pg_id: {"state": row["state"], "bundles": {str(k): v for k, v in (row.get("bundles") or {}).items()}}
        for pg_id, row in placement_group_table().items()
    }
    doc = {"trial": trial_id, "own": own.id.hex() if own else None, "table": table, "at": time.time()}
    tmp = probe_dir / f".{trial_id}.json"
    tmp.write_text(json.dumps(doc))
    tmp.replace(probe_dir / f"{trial_id}.json")


def train_loop(config: dict[str, Any]) -> None:
    rank = ray.train.get_context().get_world_rank()
    if rank == 0 and os.environ.get(PROBE_DIR_ENV):
        record_placement_groups(config["_sweep"]["trialId"], Path(os.environ[PROBE_DIR_ENV]))
    score = -((float(config["x"]) - 3.0) ** 2)
    steps = config["steps_at_x_3"] if float(config["x"]) == 3.0 else config["steps"]
    for step in range(int(steps)):
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "step").write_text(str(step))
            ray.train.report(
                {"score": score, "step": step},
                checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None,
                checkpoint_dir_name=s3_layout.checkpoint_dir_name(step) if rank == 0 else None,
            )
