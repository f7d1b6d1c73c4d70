"""A Lightning loop written as Ray Train's docs teach: `RayDDPStrategy`, `RayLightningEnvironment`, Ray's
`RayTrainReportCallback` (a checkpoint and the logged metrics reported at the end of every training epoch) and
`prepare_trainer`; a resumed trial continues from `ray.train.get_checkpoint()` through `trainer.fit(ckpt_path=...)`.

Replace the module and the data (model.py) with yours; keep the shape: Ray's strategy, environment and callback on
the Trainer, validation every epoch (its metrics are the ones reported), and `ckpt_path` from Ray's checkpoint.
"""

from __future__ import annotations

import os
from typing import Any

import ray.train


def train_loop(config: dict[str, Any]) -> None:
    # Lightning takes seconds to import: inside the loop, so only Ray's Train workers pay it, not the sweep's driver
    # that imports this module to find the function.
    import lightning.pytorch as pl
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer
    from torch.utils.data import DataLoader

    from .model import TinyClassifier, synthetic_dataset

    # Hyper-parameters come from the sweep's paramSpace; config["_sweep"] (the sweep's context) is not one of them.
    seed = int(config.get("seed", 0))
    pl.seed_everything(seed, workers=True)
    batch_size = int(config.get("batch_size", 32))
    train_loader = DataLoader(
        synthetic_dataset(int(config.get("train_samples", 512)), seed), batch_size=batch_size, shuffle=True
    )
    val_loader = DataLoader(synthetic_dataset(int(config.get("val_samples", 256)), seed + 1), batch_size=256)
    model = TinyClassifier(hidden=int(config.get("hidden", 16)), lr=float(config.get("lr", 0.05)))

    trainer = pl.Trainer(
        max_epochs=int(config.get("epochs", 3)),
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),  # the process group Ray Train set up; a DistributedSampler per worker
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        # Ray's callback writes and reports the checkpoints; Lightning's own would only fill the local disk.
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer = prepare_trainer(trainer)

    # Resume where the last committed checkpoint left off (a retried worker, a resumed sweep): Lightning restores
    # the module, the optimizer and the loops, and continues at the next epoch.
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            path = os.path.join(checkpoint_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=val_loader, ckpt_path=path)
    else:
        trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=val_loader)
