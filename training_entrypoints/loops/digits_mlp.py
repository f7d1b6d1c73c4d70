"""Example train loop to copy: a small MLP on scikit-learn's bundled digits (no download), data-parallel on Train V2.

It builds its own data, model, optimizer and sampling (R3), resumes exactly (R7), aggregates metrics over ranks (R9)
and reports once per epoch on every rank (R8). Config: lr, hidden, epochs; optional batch_size, dropout, seed."""

from __future__ import annotations

from typing import Any

import ray.train
import ray.train.torch
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ..checkpointing import load_state, report_epoch, seed_all
from ..evaluation import evaluate, evaluation_loader
from ..metrics import all_reduce_sum

# 1797 digits: 357 for validation leaves 1440 for training, a multiple of 2, 3, 4, 5, 6 and 8, so the
# DistributedSampler pads no rank with repeated samples. 357 itself divides by none of 2, 4, 5, 6, 8: validation
# goes through evaluation.evaluation_loader, which never pads.
VAL_SIZE = 357
VAL_KEYS = ("loss", "correct", "samples")


def load_datasets() -> tuple[TensorDataset, TensorDataset]:
    """(train, validation): the same stratified split on every rank and every run."""
    # Imported here, where the data is built: Ray imports this module in processes that never build it (the sweep
    # driver checks the loop exists, each trial's driver passes it to Train), and scikit-learn costs each a CPU second.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_val, y_train, y_val = train_test_split(
        digits.data / 16.0, digits.target, test_size=VAL_SIZE, random_state=0, stratify=digits.target
    )

    def tensors(x: Any, y: Any) -> TensorDataset:
        return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long))

    return tensors(x_train, y_train), tensors(x_val, y_val)


def build_model(hidden: int, dropout: float = 0.1) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 10))


def batch_totals(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """Sums over one validation batch (summed over ranks and divided only at the end, R9)."""
    x, y = batch
    logits = model(x)
    return {
        "loss": nn.functional.cross_entropy(logits, y, reduction="sum").item(),
        "correct": (logits.argmax(dim=1) == y).sum().item(),
        "samples": len(y),
    }


def run_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer | None) -> dict[str, float]:
    """Train (with an optimizer) or evaluate over this rank's batches; returns sums, not means."""
    model.train(optimizer is not None)
    loss_sum, correct, samples = 0.0, 0, 0
    with torch.set_grad_enabled(optimizer is not None):
        for x, y in loader:
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y, reduction="sum")
            if optimizer is not None:
                optimizer.zero_grad()
                (loss / len(y)).backward()  # DDP all-reduces the gradients here (R3)
                optimizer.step()
            loss_sum += loss.item()
            correct += (logits.argmax(dim=1) == y).sum().item()
            samples += len(y)
    return {"loss": loss_sum, "correct": correct, "samples": samples}


def weights_checksum(model: nn.Module) -> float:
    """The sum of every weight in float64: equal on both sides of a save and load of the same state."""
    return float(sum(p.detach().double().sum().item() for p in model.parameters()))


def follow_config_lr(optimizer: torch.optim.Optimizer, lr_scheduler: Any, lr: float) -> None:
    """The optimizer state came from a checkpoint trained with another lr (population-based training hands a trial
    another trial's state with a mutated lr): the schedule goes on from the new base lr. A resume with the same lr
    keeps the restored state exactly."""
    if all(group.get("initial_lr") == lr for group in optimizer.param_groups):
        return
    lr_scheduler.base_lrs = [lr] * len(optimizer.param_groups)
    for group, value in zip(optimizer.param_groups, lr_scheduler._get_closed_form_lr(), strict=True):
        group["initial_lr"], group["lr"] = lr, value


def train_loop(config: dict[str, Any]) -> None:
    context = ray.train.get_context()
    rank = context.get_world_rank()
    seed_all(config.get("seed", 0) + rank)  # each rank its own dropout masks; restored exactly on resume (R7)

    train_set, val_set = load_datasets()
    model = ray.train.torch.prepare_model(build_model(config["hidden"], config.get("dropout", 0.1)))  # DDP (R3)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config["epochs"])
    # prepare_data_loader adds a DistributedSampler: each rank trains on its own shard (R3).
    train_loader = ray.train.torch.prepare_data_loader(
        DataLoader(train_set, batch_size=config.get("batch_size", 64), shuffle=True)
    )
    # Every validation sample on exactly one rank: a DistributedSampler would pad 357 samples with repeats.
    val_loader = ray.train.torch.prepare_data_loader(evaluation_loader(val_set, batch_size=256), add_dist_sampler=False)

    state = load_state(model, optimizer, lr_scheduler)  # None on a fresh start (R7)
    loaded = weights_checksum(model) if state else None
    if state is not None:
        follow_config_lr(optimizer, lr_scheduler, config["lr"])
    for epoch in range(state.epoch + 1 if state else 0, config["epochs"]):
        if isinstance(train_loader.sampler, DistributedSampler):
            train_loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank (R3)
        train = run_epoch(model, train_loader, optimizer)
        lr_scheduler.step()
        val = evaluate(model, val_loader, batch_totals, keys=VAL_KEYS, reduce=False)
        # Sum over ranks, then divide: every rank reports the same, whole-dataset numbers (R9).
        totals = all_reduce_sum(
            {
                "train_loss": train["loss"],
                "train_samples": train["samples"],
                "val_loss": val["loss"],
                "val_correct": val["correct"],
                "val_samples": val["samples"],
            }
        )
        metrics = {
            "epoch": epoch,
            "train_loss": totals["train_loss"] / totals["train_samples"],
            "train_samples": int(totals["train_samples"]),
            "val_loss": totals["val_loss"] / totals["val_samples"],
            "val_accuracy": totals["val_correct"] / totals["val_samples"],
            "val_samples": int(totals["val_samples"]),
            "lr": lr_scheduler.get_last_lr()[0],
            "weights_checksum": weights_checksum(model),
        }
        if loaded is not None:  # the first epoch after a restore: what was loaded (PBT's exploit, a resume)
            metrics["loaded_weights_checksum"], loaded = loaded, None
        # Every rank, once per epoch; rank 0 alone writes the checkpoint (R8, R10).
        report_epoch(metrics, epoch=epoch, model=model, optimizer=optimizer, lr_scheduler=lr_scheduler)
