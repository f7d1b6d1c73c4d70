"""Distributed evaluation that counts every sample exactly once, whatever the dataset size and the world size.

`DistributedSampler` pads: with 357 samples on 2 ranks it hands rank 1 sample 0 again so both ranks get 179, and
summed metrics count it twice (the review's warning on evaluation, R3). `ShardSampler` splits without padding;
ranks may then see different numbers of batches, so `evaluate` runs the unwrapped module (no collective per batch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

from .metrics import all_reduce_sum


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ShardSampler(Sampler[int]):
    """Indices `rank, rank + world_size, ...` of a dataset: disjoint across ranks, their union every index once."""

    def __init__(self, size: int, rank: int, world_size: int):
        if world_size < 1 or not 0 <= rank < world_size or size < 0:
            raise ValueError(f"rank {rank} of world size {world_size} over {size} samples: need 0 <= rank < world size")
        self.indices = range(rank, size, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def evaluation_loader(
    dataset: Dataset[Any],
    *,
    batch_size: int,
    rank: int | None = None,
    world_size: int | None = None,
    **loader_kwargs: Any,
) -> DataLoader[Any]:
    """A DataLoader over this rank's unpadded share of `dataset` (rank and world size default to the running world).

    Inside a Ray Train worker pass it through `ray.train.torch.prepare_data_loader(loader, add_dist_sampler=False)`
    for the device move: letting Ray add its DistributedSampler would bring the padding back."""
    current_rank, current_world = _world()
    if not isinstance(dataset, Sized):
        raise TypeError("evaluation_loader needs a dataset with a length")
    sampler = ShardSampler(
        len(dataset), current_rank if rank is None else rank, current_world if world_size is None else world_size
    )
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=False, **loader_kwargs)


def evaluate(
    model: torch.nn.Module,
    loader: DataLoader[Any],
    batch_totals: Callable[[torch.nn.Module, Any], Mapping[str, float]],
    *,
    keys: Sequence[str],
    reduce: bool = True,
) -> dict[str, float]:
    """Sum `batch_totals(module, batch)` (sums, never means: e.g. loss sum, correct, samples) over this rank's
    batches, then over every rank (`reduce`, a collective every rank must call). Every rank reports every one of
    `keys`, also a rank with no batch at all (more ranks than samples), so the all-reduce always matches. Runs the
    module inside DistributedDataParallel, so ranks holding one batch more than the others need no collective per
    batch."""
    module = getattr(model, "module", model)
    was_training = module.training
    module.eval()
    totals = {key: 0.0 for key in keys}
    try:
        with torch.no_grad():
            for batch in loader:
                values = batch_totals(module, batch)
                for key in keys:
                    totals[key] += float(values[key])
    finally:
        module.train(was_training)
    return all_reduce_sum(totals) if reduce else totals
