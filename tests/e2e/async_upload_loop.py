"""Train loop for the graceful stop's upload wait (`tests.e2e.async_upload_loop:train_loop`), written as Ray's docs
teach an asynchronous upload (nothing of ours but the manifest): each report uploads its checkpoint on Train's
upload thread through a `checkpoint_upload_fn` that holds the upload until the test releases it, so a test decides
when an upload is in flight; after its last report the loop trains on until it is stopped."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import ray.train
from ray.train import Checkpoint, CheckpointUploadMode

from sweep_contracts import s3_layout
from training_entrypoints.checkpointing import write_manifest

HOLD_S = 300.0  # bounds a hang only: each wait ends on a file the test writes


def started_marker(gate: Path, name: str) -> Path:
    return gate / f"started-{name}"


def release_marker(gate: Path, name: str) -> Path:
    return gate / f"release-{name}"


def _wait_for(path: Path) -> None:
    end = time.monotonic() + HOLD_S
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.05)


def gated_upload(gate: Path) -> Any:
    def upload(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
        started_marker(gate, checkpoint_dir_name).touch()
        _wait_for(release_marker(gate, checkpoint_dir_name))
        return ray.train.get_context().get_storage().persist_current_checkpoint(checkpoint, checkpoint_dir_name)

    return upload


def train_loop(config: dict[str, Any]) -> None:
    gate = Path(config["gate_dir"])
    for step in range(int(config["steps"])):
        folder = tempfile.mkdtemp()  # outlives the report: Ray deletes it after the upload
        (Path(folder) / "step").write_text(str(step))
        write_manifest(folder, epoch=step)
        ray.train.report(
            {"score": float(step), "step": step},
            checkpoint=Checkpoint.from_directory(folder),
            checkpoint_dir_name=s3_layout.checkpoint_dir_name(step),
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
            checkpoint_upload_fn=gated_upload(gate),
            delete_local_checkpoint_after_upload=True,
        )
    _wait_for(gate / "never")  # training on: only the stop ends this trial
