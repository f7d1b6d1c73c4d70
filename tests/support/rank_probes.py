"""Train loops that record per-rank facts for the R3 and R10 e2e tests (imported by Ray workers by module path).

`digits_with_rank_facts` runs the built-in digits loop unchanged, observing it from outside: which training
samples this rank drew each epoch (in order) and a digest of its parameters at every report. `sharded_state`
trains state that differs on every rank (FSDP-style) and checkpoints it through `report_sharded_epoch`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import ray.train
import torch
from torch.utils.data import TensorDataset

from training_entrypoints import checkpointing
from training_entrypoints.loops import digits_mlp


class RecordingDataset(TensorDataset):
    """The training set, noting each index it is asked for (a DataLoader with num_workers=0 fetches in-process)."""

    def __init__(self, base: TensorDataset):
        super().__init__(*base.tensors)
        self.seen: list[int] = []

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        self.seen.append(int(index))
        return super().__getitem__(index)


def parameters_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter's bytes, in state-dict order (DDP's wrapper unwrapped)."""
    digest = hashlib.sha256()
    for name, tensor in getattr(model, "module", model).state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def digits_with_rank_facts(config: dict[str, Any]) -> None:
    """The digits loop; writes `<facts_dir>/rank-N.json`: [{epoch, indices, params, metrics}] per report."""
    rank = ray.train.get_context().get_world_rank()
    out = Path(config["facts_dir"]) / f"rank-{rank}.json"
    load, report = digits_mlp.load_datasets, digits_mlp.report_epoch
    recorder: list[RecordingDataset] = []
    epochs: list[dict[str, Any]] = []

    def load_recording() -> tuple[TensorDataset, TensorDataset]:
        train, val = load()
        recorder.append(RecordingDataset(train))
        return recorder[0], val

    def report_recording(metrics: dict[str, Any], *, epoch: int, model: torch.nn.Module, **kwargs: Any) -> None:
        seen = recorder[0].seen
        epochs.append(
            {"epoch": epoch, "indices": list(seen), "params": parameters_digest(model), "metrics": dict(metrics)}
        )
        seen.clear()
        out.write_text(json.dumps(epochs))
        report(metrics, epoch=epoch, model=model, **kwargs)

    digits_mlp.load_datasets, digits_mlp.report_epoch = load_recording, report_recording
    try:
        digits_mlp.train_loop(config)
    finally:
        digits_mlp.load_datasets, digits_mlp.report_epoch = load, report


def _shard(rank: int) -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(1000 + rank)  # every rank owns different parameters, as under FSDP
    layer = torch.nn.Linear(6, 3)
    return layer, torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)


def sharded_state(config: dict[str, Any]) -> None:
    """Each rank trains its own shard for `epochs` epochs and reports it with `report_sharded_epoch`; every saved
    state is also written to `<facts_dir>/saved-rank-N-epoch-E.pt` for the test to compare. With `restore: true`
    each rank instead restores its shard from `ray.train.get_checkpoint()` into `<facts_dir>/restored-rank-N.pt`."""
    context = ray.train.get_context()
    rank = context.get_world_rank()
    facts = Path(config["facts_dir"])
    layer, optimizer = _shard(rank)
    if config.get("restore"):
        restored = checkpointing.load_shard()
        assert restored is not None, "no checkpoint to restore"
        state, train_state = restored
        layer.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        after = {"model": layer.state_dict(), "optimizer": optimizer.state_dict(), "epoch": train_state.epoch}
        torch.save(after, facts / f"restored-rank-{rank}.pt")
        ray.train.report({"restored_epoch": train_state.epoch})
        return
    generator = torch.Generator().manual_seed(rank)
    for epoch in range(config["epochs"]):
        x = torch.randn(8, 6, generator=generator)
        loss = layer(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state = {"model": layer.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save({**state, "epoch": epoch}, facts / f"saved-rank-{rank}-epoch-{epoch}.pt")
        checkpointing.report_sharded_epoch({"epoch": epoch, "loss": loss.item()}, epoch=epoch, state=state)
