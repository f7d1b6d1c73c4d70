"""The LightningModule and its data: a small classifier on two synthetic Gaussian blobs (nothing is downloaded).
Kept apart from loop.py so the sweep's driver, which imports loop.py to find `train_loop`, never imports Lightning."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import TensorDataset

FEATURES = 8


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    """Two classes whose means differ in every feature; the same samples for a seed on every worker and run."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (samples,), generator=generator)
    features = torch.randn(samples, FEATURES, generator=generator) + labels[:, None].float() * 1.5
    return TensorDataset(features, labels)


class TinyClassifier(pl.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]  # nn.Sequential's __call__ is untyped

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        # sync_dist averages over the workers: Ray keeps rank 0's metrics only.
        self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_accuracy", (logits.argmax(dim=1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
