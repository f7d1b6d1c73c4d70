"""Distributed evaluation counts every sample once (R3, R9): no padding whatever the dataset and world sizes."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from training_entrypoints.evaluation import ShardSampler, evaluate, evaluation_loader
from training_entrypoints.loops import digits_mlp


@pytest.mark.parametrize(("size", "world_size"), [(357, 2), (357, 4), (357, 5), (10, 4), (3, 4)])
def test_every_sample_is_on_exactly_one_rank_when_the_size_does_not_divide_R3(size: int, world_size: int) -> None:
    shards = [list(ShardSampler(size, rank, world_size)) for rank in range(world_size)]
    assert sorted(i for shard in shards for i in shard) == list(range(size))
    # What the helper avoids: DistributedSampler pads the last ranks with repeats of the first samples.
    padded = [
        list(DistributedSampler(range(size), num_replicas=world_size, rank=r, shuffle=False)) for r in range(world_size)
    ]
    assert sum(len(p) for p in padded) > size


def test_summed_evaluation_over_ranks_equals_the_whole_set_on_an_uneven_split_R3_R9() -> None:
    """The digits validation set (357 samples) on 2 ranks: rank 0 has 179, rank 1 178; summing each rank's totals
    gives exactly the single-process numbers, with no sample counted twice."""
    _, val = digits_mlp.load_datasets()
    assert len(val) == 357
    torch.manual_seed(0)
    model = digits_mlp.build_model(16)
    whole = evaluate(
        model,
        evaluation_loader(val, batch_size=64, rank=0, world_size=1),
        digits_mlp.batch_totals,
        keys=digits_mlp.VAL_KEYS,
    )
    per_rank = [
        evaluate(
            model,
            evaluation_loader(val, batch_size=64, rank=r, world_size=2),
            digits_mlp.batch_totals,
            keys=digits_mlp.VAL_KEYS,
            reduce=False,
        )
        for r in range(2)
    ]
    assert [t["samples"] for t in per_rank] == [179, 178]
    assert sum(t["samples"] for t in per_rank) == whole["samples"] == 357
    assert sum(t["correct"] for t in per_rank) == whole["correct"]
    assert sum(t["loss"] for t in per_rank) == pytest.approx(whole["loss"], rel=1e-6)


def test_a_rank_without_samples_still_reports_every_key_and_the_module_keeps_its_mode() -> None:
    """More ranks than samples: the idle rank must still take part in the all-reduce with the same keys."""
    data = TensorDataset(torch.zeros(2, 64), torch.zeros(2, dtype=torch.long))
    model = digits_mlp.build_model(8)
    model.train()
    totals = evaluate(
        model,
        evaluation_loader(data, batch_size=4, rank=3, world_size=4),
        digits_mlp.batch_totals,
        keys=digits_mlp.VAL_KEYS,
    )
    assert totals == {"loss": 0.0, "correct": 0.0, "samples": 0.0}
    assert model.training


def test_shard_sampler_refuses_a_rank_outside_the_world() -> None:
    with pytest.raises(ValueError, match="rank 2 of world size 2"):
        ShardSampler(10, 2, 2)
