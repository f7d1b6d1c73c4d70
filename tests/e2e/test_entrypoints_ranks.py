"""Real local Ray: per-rank facts of 2-worker CPU TorchTrainer runs (Train V2, gloo) for R3 on the digits loop and
R10 sharded saves; what Ray reports waiting for (R20).

One local Ray serves both; each run is one TorchTrainer.fit() shared by the assertions about it. The R3 facts are
recorded from outside the loop (tests.support.rank_probes), so removing `prepare_model`, `prepare_data_loader` or
`sampler.set_epoch` from training_entrypoints/loops/digits_mlp.py fails a test here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sweep_contracts import constants, s3_layout
from sweep_contracts.s3_layout import S3Uri
from sweep_operator import verification as v

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
WORLD = 2
EPOCHS = 2
TRAIN_SIZE = 1440  # digits_mlp: 1797 samples less 357 for validation


@pytest.fixture(scope="module")
def ray_local(s3_server: Any) -> Iterator[None]:
    """4 logical CPUs on the 2 cores (R15); workers reach moto through AWS_ENDPOINT_URL, as pyarrow does (R11)."""
    import ray

    env = {
        "PYTHONPATH": str(REPO),
        "AWS_ENDPOINT_URL": s3_server.endpoint_url,
        **{
            k: os.environ[k]
            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
            if k in os.environ
        },
        constants.ENV_WORKER_GROUP_START_TIMEOUT: "60",
    }
    saved = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = s3_server.endpoint_url  # the driver's pyarrow too
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        object_store_memory=100 * 1024 * 1024,
        runtime_env={"env_vars": env},
        # As local.IDLE_CPU_SETTINGS: workers prestarted in the default runtime env would serve nothing of this job's.
        _system_config={"prestart_worker_first_driver": False},
    )
    try:
        yield
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("AWS_ENDPOINT_URL", None)
        else:
            os.environ["AWS_ENDPOINT_URL"] = saved


def fit(loop: str, config: dict[str, Any], storage_path: str, name: str) -> Any:
    import ray.train
    from ray.train.torch import TorchTrainer

    from training_entrypoints.trainable import load_train_loop

    trainer = TorchTrainer(
        load_train_loop(loop),
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=WORLD, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage_path,
            # Finite retry classes (R12): a broken run fails here instead of retrying forever.
            failure_config=ray.train.FailureConfig(
                max_failures=0, controller_failure_limit=0, max_preemption_failures=0
            ),
        ),
    )
    return trainer.fit()


# ------------------------------------------------------------------------------------------ R3


@pytest.fixture(scope="module")
def digits_facts(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    """One 2-epoch run of the digits loop; per rank, per epoch: the sample indices drawn and a parameter digest."""
    facts = tmp_path_factory.mktemp("r3-facts")
    config = {"lr": 0.05, "hidden": 32, "epochs": EPOCHS, "batch_size": 64, "facts_dir": str(facts)}
    fit(
        "tests.support.rank_probes:digits_with_rank_facts",
        config,
        str(tmp_path_factory.mktemp("r3-store")),
        "digits-r3",
    )
    return [json.loads((facts / f"rank-{rank}.json").read_text()) for rank in range(WORLD)]


@pytest.mark.timeout(300)
def test_gradients_are_synchronised_parameters_equal_on_every_rank_R3(digits_facts: list[list[dict[str, Any]]]) -> None:
    """R3 (`prepare_model`, DDP): each rank seeds differently (seed + rank) and trains on its own shard, yet after
    every epoch's optimizer steps the parameters are bit-identical on every rank; and they moved."""
    for epoch in range(EPOCHS):
        digests = {facts[epoch]["params"] for facts in digits_facts}
        assert len(digests) == 1, f"epoch {epoch}: ranks hold different parameters (gradients not all-reduced)"
    assert digits_facts[0][0]["params"] != digits_facts[0][1]["params"]


@pytest.mark.timeout(300)
def test_each_rank_trains_on_a_disjoint_shard_whose_union_is_the_training_set_R3(
    digits_facts: list[list[dict[str, Any]]],
) -> None:
    """R3 (`prepare_data_loader` adds the DistributedSampler): no sample twice in an epoch, none left out."""
    for epoch in range(EPOCHS):
        shards = [facts[epoch]["indices"] for facts in digits_facts]
        assert all(len(shard) == TRAIN_SIZE // WORLD for shard in shards), [len(s) for s in shards]
        assert all(len(set(shard)) == len(shard) for shard in shards)
        assert set(shards[0]).isdisjoint(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(TRAIN_SIZE))
        assert all(facts[epoch]["metrics"]["train_samples"] == TRAIN_SIZE for facts in digits_facts)


@pytest.mark.timeout(300)
def test_the_shuffle_changes_every_epoch_and_is_the_same_on_every_rank_R3(
    digits_facts: list[list[dict[str, Any]]],
) -> None:
    """R3 (`sampler.set_epoch`): a new order each epoch on each rank; one permutation shared by all ranks (which is
    why their shards stay disjoint): rank r draws positions r, r + 2, ... of it."""
    for facts in digits_facts:
        assert facts[0]["indices"] != facts[1]["indices"], "the same order every epoch: set_epoch was not called"
        assert set(facts[0]["indices"]) != set(facts[1]["indices"])  # a new split too, not only a new order
    for epoch in range(EPOCHS):
        interleaved = [
            i for pair in zip(*(facts[epoch]["indices"] for facts in digits_facts), strict=True) for i in pair
        ]
        assert sorted(interleaved) == list(range(TRAIN_SIZE))


@pytest.mark.timeout(300)
def test_validation_counts_each_sample_once_on_an_uneven_split_R3_R9(digits_facts: list[list[dict[str, Any]]]) -> None:
    """357 validation samples on 2 ranks (179 + 178): the reported total is 357, not the padded 358."""
    for facts in digits_facts:
        assert all(epoch["metrics"]["val_samples"] == 357 for epoch in facts)


# ----------------------------------------------------------------------------------------- R10


class ShardedRun:
    def __init__(self, client: Any, root: S3Uri, facts: Path, result: Any):
        self.client, self.root, self.facts, self.result = client, root, facts, result


@pytest.fixture(scope="module")
def sharded_run(ray_local: None, s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> ShardedRun:
    client = s3_server.client()
    client.create_bucket(Bucket="e2e-sharded")
    root = S3Uri.parse("s3://e2e-sharded/sweeps/default/sharded-e2e1")
    facts = tmp_path_factory.mktemp("r10-facts")
    result = fit(
        "tests.support.rank_probes:sharded_state",
        {"epochs": EPOCHS, "facts_dir": str(facts)},
        str(root.join(s3_layout.TRAIN_DIR)),
        "trial-0",
    )
    return ShardedRun(client, root, facts, result)


@pytest.mark.timeout(300)
def test_every_rank_writes_its_shard_and_its_manifest_and_the_verifier_requires_all_R10(
    sharded_run: ShardedRun,
) -> None:
    """R10: one checkpoint directory per epoch holding shard-0000/, shard-0001/ and a manifest per rank (world size
    recorded); the operator's verifier verifies the run (deep: sha256) and refuses it once the highest rank's
    manifest is gone."""
    client, root = sharded_run.client, sharded_run.root
    prefix = root.join("train", "trial-0").prefix
    keys = [
        o["Key"][len(prefix) :]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=root.bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    ]
    for epoch in range(EPOCHS):
        name = s3_layout.checkpoint_dir_name(epoch)
        files = sorted(k[len(name) + 1 :] for k in keys if k.startswith(name + "/") and not k.endswith("/"))
        assert files == [
            "_manifest.rank-0000.json", "_manifest.rank-0001.json",
            "shard-0000/rng.pt", "shard-0000/state.pt", "shard-0000/train_state.json",
            "shard-0001/rng.pt", "shard-0001/state.pt", "shard-0001/train_state.json",
        ]  # fmt: skip
        for rank in range(WORLD):
            body = client.get_object(Bucket=root.bucket, Key=f"{prefix}{name}/{s3_layout.rank_manifest_name(rank)}")[
                "Body"
            ].read()
            manifest = json.loads(body)
            assert (manifest["rank"], manifest["worldSize"], manifest["epoch"]) == (rank, WORLD, epoch)
            assert {f["path"] for f in manifest["files"]} == {
                f"shard-{rank:04d}/{n}" for n in ("rng.pt", "state.pt", "train_state.json")
            }

    verdict = v.verify_sweep_checkpoints(client, root, deep=True, min_retention_days=0)
    assert verdict.verified, verdict.reason
    assert verdict.checked == EPOCHS and verdict.files == EPOCHS * WORLD * 3

    last = s3_layout.checkpoint_dir_name(EPOCHS - 1)
    key = f"{prefix}{last}/{s3_layout.rank_manifest_name(WORLD - 1)}"
    saved = client.get_object(Bucket=root.bucket, Key=key)["Body"].read()
    client.delete_object(Bucket=root.bucket, Key=key)
    try:
        verdict = v.verify_sweep_checkpoints(client, root, min_retention_days=0)
        assert not verdict.verified
        assert (v.MISSING_MANIFEST, key) in [(p.kind, p.key) for p in verdict.problems]
    finally:
        client.put_object(Bucket=root.bucket, Key=key, Body=saved)


@pytest.mark.timeout(300)
def test_a_sharded_checkpoint_restores_bit_identical_on_every_rank_R10_R7(sharded_run: ShardedRun) -> None:
    """R10/R7: the run started again under its own name resumes from its latest checkpoint (as a retry would);
    each rank reads only its shard and gets back exactly the parameters and optimizer state it saved."""
    fit(
        "tests.support.rank_probes:sharded_state",
        {"epochs": EPOCHS, "facts_dir": str(sharded_run.facts), "restore": True},
        str(sharded_run.root.join(s3_layout.TRAIN_DIR)),
        "trial-0",
    )
    for rank in range(WORLD):
        saved = torch.load(sharded_run.facts / f"saved-rank-{rank}-epoch-{EPOCHS - 1}.pt", weights_only=True)
        restored = torch.load(sharded_run.facts / f"restored-rank-{rank}.pt", weights_only=True)
        assert restored["epoch"] == EPOCHS - 1
        for name, tensor in saved["model"].items():
            assert torch.equal(restored["model"][name], tensor), f"rank {rank} {name}"
        for index, buffers in saved["optimizer"]["state"].items():
            assert torch.equal(restored["optimizer"]["state"][index]["momentum_buffer"], buffers["momentum_buffer"])
    other = torch.load(sharded_run.facts / "saved-rank-1-epoch-1.pt", weights_only=True)["model"]["weight"]
    assert not torch.equal(
        torch.load(sharded_run.facts / "restored-rank-0.pt", weights_only=True)["model"]["weight"], other
    )


# ----------------------------------------------------------------------------------------- R20


@pytest.mark.timeout(120)
def test_a_placement_group_no_node_can_hold_is_reported_with_what_ray_waits_for_R20(ray_local: None) -> None:
    """A real local Ray asked for a bundle beyond any node: the driver's reader finds it pending in the GCS, the
    pending block marks it infeasible, and the operator's status line names it."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from sweep_operator.status import progress_patch
    from training_entrypoints.progress import read_ray_demand, summarize_pending

    group = placement_group([{"CPU": 1.0}, {"CPU": 64.0}], strategy="PACK")
    try:
        groups, nodes, demand, launching, failed = read_ray_demand()
        assert group.id.hex() in groups and groups[group.id.hex()]["state"] == "PENDING"
        first_seen = {group.id.hex(): 0.0}
        block = summarize_pending(
            {"t1": 42.0}, groups, nodes, demand, first_seen, 5.0, pending_launches=launching, failed_launches=failed
        )
        (mine,) = [w for w in block["waitingFor"] if w.get("bundles") == [{"CPU": 1.0}, {"CPU": 64.0}]]
        assert mine["infeasible"] is True and mine["pendingSeconds"] == 5.0 and mine["strategy"] == "PACK"
        assert block["clusterResources"]["CPU"] == 4.0
        text = progress_patch({"trials": {"pending": 1, "total": 1}, "pending": block})["waitingFor"]
        assert "1 trial(s) pending (oldest for 42s)" in text
        assert "placement group PACK of {CPU: 1} + {CPU: 64} pending 5s; no node can hold it" in text
    finally:
        remove_placement_group(group)
    assert ray.util.placement_group_table(group)["state"] == "REMOVED"
