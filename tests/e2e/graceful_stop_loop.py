"""Train loop for the graceful-stop e2e tests (`tests.e2e.graceful_stop_loop:train_loop`): rank 0 reports a tiny
checkpoint, with the manifest the guard verifies, every `step_s` seconds, `steps` times, so a sweep is mid-run
whenever a test stops it."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import ray.train

from sweep_contracts import s3_layout
from training_entrypoints.checkpointing import write_manifest


def train_loop(config: dict[str, Any]) -> None:
    rank = ray.train.get_context().get_world_rank()
    checkpoint = ray.train.get_checkpoint()
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            start = int((Path(folder) / "step").read_text()) + 1
    for step in range(start, int(config["steps"])):
        time.sleep(float(config["step_s"]))
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "step").write_text(str(step))
            if rank == 0:
                write_manifest(tmp, epoch=step)
            ray.train.report(
                # The score grows with the step, so checkpoint retention (numToKeep, by score) keeps the newest.
                {"score": -abs(float(config["x"])) + step, "step": step},
                checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None,
                checkpoint_dir_name=s3_layout.checkpoint_dir_name(step) if rank == 0 else None,
            )
