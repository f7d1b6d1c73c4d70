"""Train loops for the asynchronous-upload e2e test (`tests.e2e.async_report_loops:train_loop`): `style: helpers` is
the built-in digits loop reporting through `report_epoch(upload="async")`; `style: plain` is a loop written as Ray's
docs teach an asynchronous upload (`tempfile.mkdtemp`, `CheckpointUploadMode.ASYNC`, Ray deletes the directory).
Both write their local checkpoints under `local_dir`, so the test can see that none is left behind."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import ray.train
import torch
from ray.train import Checkpoint, CheckpointUploadMode

from training_entrypoints import async_upload, checkpointing
from training_entrypoints.loops import digits_mlp


def train_loop(config: dict[str, Any]) -> None:
    tempfile.tempdir = config["local_dir"]  # this worker process's temporary files
    if config["style"] == "plain":
        plain_loop(config)
        return
    report = digits_mlp.report_epoch

    def report_async(metrics: dict[str, Any], **kwargs: Any) -> None:
        # What this worker's earlier reports left: they went through the asynchronous path.
        uploaded_async = async_upload._worker_uploads is not None
        checkpointing.report_epoch({**metrics, "uploaded_async": uploaded_async}, upload="async", **kwargs)

    digits_mlp.report_epoch = report_async
    try:
        digits_mlp.train_loop(config)
    finally:
        digits_mlp.report_epoch = report


def plain_loop(config: dict[str, Any]) -> None:
    model = torch.nn.Linear(8, 2)
    rank = ray.train.get_context().get_world_rank()
    for epoch in range(int(config["epochs"])):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        checkpoint = None
        if rank == 0:
            folder = tempfile.mkdtemp()  # outlives the report: Ray deletes it once uploaded
            torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
            checkpoint = Checkpoint.from_directory(folder)
        ray.train.report(
            {"epoch": epoch, "val_loss": loss.item()},
            checkpoint=checkpoint,
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
        )
