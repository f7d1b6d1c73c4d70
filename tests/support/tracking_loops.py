"""A train loop for the tracking e2e test (imported by Ray workers as `tests.support.tracking_loops:gated_scalar`)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import ray.train

from sweep_contracts import s3_layout
from training_entrypoints.checkpointing import write_manifest


def gated_scalar(config: dict[str, Any]) -> None:
    """Reports `score` with a checkpoint for `steps` steps, from its checkpoint's next step; from step `gate_at` on
    it waits while the file `gate` exists, so the test decides when the rest of the trial runs."""
    checkpoint = ray.train.get_checkpoint()
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = int((Path(d) / "step").read_text()) + 1
    gate = Path(config["gate"])
    for step in range(start, config["steps"]):
        while step >= config["gate_at"] and gate.exists():
            time.sleep(0.2)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "step").write_text(str(step))
            write_manifest(tmp, epoch=step)
            ray.train.report(
                {"score": float(config["x"] * 10 + step), "step": step},
                checkpoint=ray.train.Checkpoint.from_directory(tmp),
                checkpoint_dir_name=s3_layout.checkpoint_dir_name(step),
            )
