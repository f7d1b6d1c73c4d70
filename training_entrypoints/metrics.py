"""Aggregate metrics across ranks before reporting: Ray Train keeps only rank 0's dict, unaveraged (R9)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist


def all_reduce_sum(values: Mapping[str, float]) -> dict[str, float]:
    """The sum of each value over every rank (the values themselves outside a distributed run).

    Sum numerators and counts, then divide: a mean of per-rank means is wrong when shards differ in size.
    A collective: every rank must call it with the same keys.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return {k: float(v) for k, v in values.items()}
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor([float(v) for v in values.values()], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return dict(zip(values, tensor.tolist(), strict=True))
