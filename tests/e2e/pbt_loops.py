"""A plain Ray loop for test_pbt.py (imported by Ray workers as `tests.e2e.pbt_loops:plain_loop`), written as Ray's
docs teach (`ray.train.get_checkpoint`, `torch.save`, `Checkpoint.from_directory`): its loss is 1/x, x being the
parameter PBT mutates; it reports each epoch, the checksum of its weights, and on its first epoch after a restore
the checksum of what it loaded. Rank 0 records Ray's placement groups at each Train run's start (the paused trials'
worker groups must be gone)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import ray.train
import torch

from tests.e2e.stop_probe_loop import PROBE_DIR_ENV, record_placement_groups


def checksum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum().item() for p in model.parameters()))


def plain_loop(config: dict[str, Any]) -> None:
    rank = ray.train.get_context().get_world_rank()
    if rank == 0 and os.environ.get(PROBE_DIR_ENV):
        run = ray.train.get_context().get_experiment_name()
        record_placement_groups(run, Path(os.environ[PROBE_DIR_ENV]))
    torch.manual_seed(int(config.get("seed", 0)))
    model = torch.nn.Linear(8, 1)
    start, loaded = 0, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"))
        model.load_state_dict(state["model"])
        start, loaded = state["epoch"] + 1, checksum(model)
    x = float(config["x"])
    for epoch in range(start, int(config["epochs"])):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(x)  # "training": every epoch moves the weights, so each checkpoint has its own checksum
        metrics = {"epoch": epoch, "loss": 1.0 / x, "weights_checksum": checksum(model)}
        if loaded is not None:
            metrics["loaded_weights_checksum"], loaded = loaded, None
        with tempfile.TemporaryDirectory() as tmp:
            torch.save({"model": model.state_dict(), "epoch": epoch}, os.path.join(tmp, "state.pt"))
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None,
                checkpoint_dir_name=f"checkpoint_epoch-{epoch:06d}" if rank == 0 else None,
            )
