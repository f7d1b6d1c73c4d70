"""The files `sweepctl init` writes: a train loop as Ray Train's docs teach it, a TrainingSweep that runs it on two
CPUs, a Dockerfile and a README.

The loop imports nothing of this project; the Dockerfile builds over the training image, and the README gives the next
commands.
"""

from __future__ import annotations

import re

# The training image docker/Dockerfile.train documents (`docker build ... -t trainingsweep-train:0.1.0 .`).
TRAIN_IMAGE = "trainingsweep-train:0.1.0"
# A scaffolded project's own image tag (`docker build -t NAME:0.1.0 NAME`).
IMAGE_VERSION = "0.1.0"

_PLACEHOLDER = re.compile(r"@[A-Z_]+@")


def render(template: str, **values: str) -> str:
    """`template` with each `@KEY@` replaced by values[key.lower()]; every placeholder must be given."""
    text = _PLACEHOLDER.sub(lambda m: values[m.group(0).strip("@").lower()], template)
    assert not _PLACEHOLDER.search(text), text
    return text


PACKAGE_INIT = '''"""@NAME@: a train loop for TrainingSweep (`@PACKAGE@.loop:train_loop`)."""
'''

# Written as Ray Train's docs teach a loop; it must import nothing of this project (a unit test parses it).
LOOP = '''"""A train loop written as Ray Train's docs teach: a small MLP on scikit-learn's bundled digits (no download).

Every Ray Train worker runs `train_loop(config)` with one trial's hyper-parameters. Replace the data, the model and
the metrics with yours; keep the shape: prepare the model and data loaders, resume from `ray.train.get_checkpoint()`,
aggregate metrics over all workers, and call `ray.train.report` on every worker once per epoch, rank 0 alone
passing the checkpoint.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

CHECKPOINT_FILE = "checkpoint.pt"
# 1797 digits: 357 held out leaves 1440 to train on, a multiple of 2, 3, 4, 5, 6 and 8, so splitting them between
# workers never repeats a sample.
VALIDATION_SAMPLES = 357


def load_data() -> tuple[TensorDataset, TensorDataset]:
    """(train, validation): the same split on every worker and every run."""
    # Imported where the data is built: Ray also imports this module where no data is loaded (the sweep's driver, each
    # trial's driver), and scikit-learn takes each of those processes about a second of CPU.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_val, y_train, y_val = train_test_split(
        digits.data / 16.0, digits.target, test_size=VALIDATION_SAMPLES, random_state=0, stratify=digits.target
    )

    def tensors(x: Any, y: Any) -> TensorDataset:
        return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long))

    return tensors(x_train, y_train), tensors(x_val, y_val)


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def unwrapped(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel (prepare_model wraps it when there are several workers)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def sum_over_workers(values: list[float]) -> list[float]:
    """Each value summed over every worker. Ray keeps rank 0's metrics only and never averages them: sum first,
    then divide, so every worker reports numbers of the whole dataset."""
    totals = torch.tensor(values, dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return totals.tolist()


def train_loop(config: dict[str, Any]) -> None:
    # Hyper-parameters come from the sweep's paramSpace; config["_sweep"] (the sweep's context) is not one of them.
    lr = float(config.get("lr", 0.01))
    hidden = int(config.get("hidden", 32))
    epochs = int(config.get("epochs", 3))
    batch_size = int(config.get("batch_size", 64))
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(int(config.get("seed", 0)))

    train_set, val_set = load_data()
    model = ray.train.torch.prepare_model(build_model(hidden))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    # prepare_data_loader gives each worker its own shard of the training data (a DistributedSampler).
    train_loader = ray.train.torch.prepare_data_loader(DataLoader(train_set, batch_size=batch_size, shuffle=True))
    # Each worker scores its own slice of the validation data, every sample exactly once.
    mine = Subset(val_set, range(rank, len(val_set), world_size))
    val_loader = ray.train.torch.prepare_data_loader(DataLoader(mine, batch_size=256), add_dist_sampler=False)

    # Resume where the last checkpoint left off (a retried worker, a resumed sweep); a fresh start has none.
    start_epoch = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            state = torch.load(os.path.join(checkpoint_dir, CHECKPOINT_FILE), map_location="cpu")
        unwrapped(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1

    for epoch in range(start_epoch, epochs):
        if world_size > 1:
            train_loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every worker
        model.train()
        train_loss = train_samples = 0.0
        for x, y in train_loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            train_loss += loss.item() * len(y)
            train_samples += len(y)
        model.eval()
        val_loss = val_correct = val_samples = 0.0
        with torch.no_grad():
            for x, y in val_loader:
                logits = model(x)
                val_loss += nn.functional.cross_entropy(logits, y, reduction="sum").item()
                val_correct += (logits.argmax(dim=1) == y).sum().item()
                val_samples += len(y)
        train_loss, train_samples, val_loss, val_correct, val_samples = sum_over_workers(
            [train_loss, train_samples, val_loss, val_correct, val_samples]
        )
        metrics = {
            "epoch": epoch,
            "train_loss": train_loss / train_samples,
            "val_loss": val_loss / val_samples,
            "val_accuracy": val_correct / val_samples,
        }
        # Every worker reports once per epoch (a report is a barrier); rank 0 alone saves and passes the checkpoint.
        with tempfile.TemporaryDirectory() as temp_dir:
            if rank == 0:
                state = {"epoch": epoch, "model": unwrapped(model).state_dict(), "optimizer": optimizer.state_dict()}
                torch.save(state, os.path.join(temp_dir, CHECKPOINT_FILE))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(temp_dir))
            else:
                ray.train.report(metrics)
'''

SWEEP = """# A sweep of @NAME@'s train loop, small enough for a laptop: 2 trials of 1 CPU worker each, 3 epochs.
#   sweepctl validate -f @DIR@/sweep.yaml
#   sweepctl run-local -f @DIR@/sweep.yaml --storage /tmp/@NAME@-runs
# On a cluster: build and push the image (@DIR@/README.md), set spec.image to it and spec.storage to your bucket.
apiVersion: @API_VERSION@
kind: TrainingSweep
metadata:
  name: @NAME@
  namespace: default
spec:
  image: @NAME@:@IMAGE_VERSION@   # what @DIR@/Dockerfile builds; on a cluster, the registry path you pushed it to
  rayVersion: "@RAY_VERSION@"
  trainLoop: @PACKAGE@.loop:train_loop
  paramSpace:
    lr: {loguniform: [1.0e-3, 1.0e-1]}
    hidden: {choice: [16, 32]}
    epochs: 3
    batch_size: 64
  tune:
    metric: val_loss
    mode: min
    numSamples: 2
    maxConcurrentTrials: @MAX_CONCURRENT@
    searcher: {type: random, seed: 7}
    scheduler: {type: fifo}
  trial:
    workers: 1
    resourcesPerWorker: {cpu: "1", gpu: 0, memory: 1Gi}
  head: {cpu: "1", memory: 2Gi}
  storage:
    uri: s3://sweeps-sandbox/sweeps
    region: us-east-1
  checkpoints: {numToKeep: 2}
  deadlines: {activeSeconds: 900, startupSeconds: 300, gracefulStopSeconds: 30}
  failurePolicy: {workerFailures: 1, controllerFailures: 3, preemptionFailures: 5, trialFailures: 0, jobRetries: 0}
"""

DOCKERFILE = """# syntax=docker/dockerfile:1
# @NAME@'s training image: the TrainingSweep training image (Ray @RAY_VERSION@, torch, the sweep's entrypoint) with
# @PACKAGE@/ added. Build from this directory, then push it where your cluster pulls from:
#   docker build -t @NAME@:@IMAGE_VERSION@ .
# TRAIN_IMAGE is the training image (docker/Dockerfile.train of the operator's repository, or your registry's copy),
# always an exact tag or a digest:
#   docker build --build-arg TRAIN_IMAGE=<registry>/@TRAIN_IMAGE@@sha256:<digest> -t @NAME@:@IMAGE_VERSION@ .
ARG TRAIN_IMAGE=@TRAIN_IMAGE@
FROM ${TRAIN_IMAGE}

# More packages your loop needs (ray and torch are the image's; leave them as they are):
# RUN python -m pip install --no-cache-dir "some-package==1.2.3"

# Your package, importable by the sweep's driver and every Ray worker.
COPY --chown=1000:100 @PACKAGE@/ /home/ray/app/@PACKAGE@/
ENV PYTHONPATH=/home/ray/app${PYTHONPATH:+:${PYTHONPATH}}
WORKDIR /home/ray
# Non-root and numeric, as the training image runs (Ray's user, uid 1000, group 100).
USER 1000:100
"""

DOCKERIGNORE = """# Only the package reaches the image.
*
!@PACKAGE@/
**/__pycache__
**/*.pyc
"""

README = """# @NAME@

A train loop for TrainingSweep, written as Ray Train's docs teach: `@PACKAGE@/loop.py` (`train_loop(config)`) and
the sweep that runs it, `sweep.yaml` (`spec.trainLoop: @PACKAGE@.loop:train_loop`). The loop imports nothing of
TrainingSweep; the contract it keeps is in the operator's `docs/your-training-loop.md`.

From the directory that holds `@DIR@/`:

```sh
sweepctl validate -f @DIR@/sweep.yaml                                    # the manifest, offline
sweepctl run-local -f @DIR@/sweep.yaml --storage /tmp/@NAME@-runs        # the sweep on a local Ray (CPU)
sweepctl run-local -f other.yaml --code @DIR@                            # another manifest, this code
sweepctl sandbox run --sweep @DIR@/sweep.yaml --code @DIR@               # operator, S3 and KubeRay on this machine
docker build -t @NAME@:@IMAGE_VERSION@ @DIR@                             # the training image + @PACKAGE@/
```

On a cluster: push the image to your registry, set `spec.image` to it and `spec.storage` to your bucket, size
`spec.trial` for your GPUs, then `kubectl apply -f @DIR@/sweep.yaml`.
"""
