"""Full-state checkpoints (R7), manifests and per-rank names (R10), the once-per-epoch report (R8) — without Ray."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ray.train import Checkpoint

from sweep_contracts import s3_layout
from training_entrypoints import checkpointing
from training_entrypoints.checkpointing import (
    CheckpointError,
    load_state,
    manifest_problems,
    report_epoch,
    save_state,
    seed_all,
    write_manifest,
)
from training_entrypoints.metrics import all_reduce_sum


def make_training(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return model, optimizer, scheduler


def train_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, steps: int) -> None:
    """Consumes every RNG: torch (data, dropout), numpy and python (augmentation-like draws)."""
    model.train()
    for _ in range(steps):
        x = torch.randn(16, 4) + float(np.random.rand()) + random.random()
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_resume_from_saved_state_continues_exactly_like_an_uninterrupted_run_R7(tmp_path: Path) -> None:
    """R7: model, optimizer, LR scheduler and python/numpy/torch RNG are saved explicitly and restored exactly."""
    seed_all(3)
    model, optimizer, scheduler = make_training(3)
    train_steps(model, optimizer, scheduler, 3)
    save_state(tmp_path, epoch=2, step=0, model=model, optimizer=optimizer, lr_scheduler=scheduler, extra={"note": "x"})
    train_steps(model, optimizer, scheduler, 3)
    uninterrupted = state_of(model, optimizer, scheduler)
    draws = (torch.rand(3), np.random.rand(3), random.random())

    seed_all(99)  # a new process: other seeds, other initial weights
    model, optimizer, scheduler = make_training(99)
    state = load_state(model, optimizer, scheduler, checkpoint=Checkpoint.from_directory(str(tmp_path)), rank=0)
    assert state is not None and (state.epoch, state.step, state.extra) == (2, 0, {"note": "x"})
    train_steps(model, optimizer, scheduler, 3)

    assert_same(state_of(model, optimizer, scheduler), uninterrupted)
    assert torch.equal(torch.rand(3), draws[0])
    assert np.array_equal(np.random.rand(3), draws[1])
    assert random.random() == draws[2]


def test_each_rank_restores_its_own_rng_state_R7(tmp_path: Path) -> None:
    seed_all(1)
    rank0 = checkpointing.capture_rng_state()
    seed_all(2)
    rank1 = checkpointing.capture_rng_state()
    model, _optimizer, _scheduler = make_training(0)
    save_state(tmp_path, epoch=0, model=model, rng_states=[rank0, rank1])

    load_state(make_training(5)[0], checkpoint=Checkpoint.from_directory(str(tmp_path)), rank=1)
    after_rank1 = torch.rand(2)
    seed_all(2)
    assert torch.equal(after_rank1, torch.rand(2))


def test_load_state_without_a_checkpoint_is_a_fresh_start(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray.train

    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)
    assert load_state(make_training(0)[0]) is None


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"weights" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "extra.bin").write_bytes(b"\x00\x01")
    manifest = write_manifest(tmp_path, epoch=4, rank=0)

    assert manifest == json.loads((tmp_path / s3_layout.MANIFEST_FILE).read_text())
    assert manifest["epoch"] == 4 and manifest["rank"] == 0
    assert manifest["files"] == [
        {"path": "model.pt", "size": 700, "sha256": hashlib.sha256(b"weights" * 100).hexdigest()},
        {"path": "sub/extra.bin", "size": 2, "sha256": hashlib.sha256(b"\x00\x01").hexdigest()},
    ]
    assert manifest_problems(tmp_path) == []


def test_sharded_saves_write_one_manifest_per_rank_without_collisions_R10(tmp_path: Path) -> None:
    """R10: when several ranks write into one checkpoint directory, file and manifest names are per rank."""
    for rank in (0, 1):
        name = f"shard.rank-{rank:04d}.pt"
        (tmp_path / name).write_bytes(bytes([rank]) * 10)
        write_manifest(tmp_path, epoch=1, rank=rank, world_size=2, files=[name], sharded=True)

    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["_manifest.rank-0000.json", "_manifest.rank-0001.json", "shard.rank-0000.pt", "shard.rank-0001.pt"]
    assert all(s3_layout.is_manifest_name(n) for n in names[:2])
    assert json.loads((tmp_path / "_manifest.rank-0001.json").read_text())["files"][0]["path"] == "shard.rank-0001.pt"
    assert manifest_problems(tmp_path) == []
    (tmp_path / "_manifest.rank-0001.json").unlink()
    assert manifest_problems(tmp_path) == ["no manifest of rank(s) 1 of a world size of 2"]


def _shard_state(rank: int) -> dict[str, Any]:
    """FSDP-style: each rank owns a different slice of the parameters and of the optimizer state."""
    generator = torch.Generator().manual_seed(100 + rank)
    weight = torch.randn(3, 4, generator=generator)
    return {"model": {"0.weight": weight}, "optimizer": {"momentum": weight * 0.5, "step": torch.tensor(7 + rank)}}


def test_sharded_checkpoint_each_rank_restores_its_own_shard_bit_identical_R10_R7(tmp_path: Path) -> None:
    """R10: every rank writes its shard and its manifest into one directory (no collisions, world size recorded);
    each rank restores exactly its own tensors and RNG stream (R7)."""
    draws = {}
    for rank in (0, 1):
        seed_all(rank)
        checkpointing.save_shard(tmp_path, epoch=4, state=_shard_state(rank), rank=rank, world_size=2, step=3)
        draws[rank] = (torch.rand(2), random.random())
    names = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert names == [
        "_manifest.rank-0000.json", "_manifest.rank-0001.json",
        "shard-0000/rng.pt", "shard-0000/state.pt", "shard-0000/train_state.json",
        "shard-0001/rng.pt", "shard-0001/state.pt", "shard-0001/train_state.json",
    ]  # fmt: skip
    assert json.loads((tmp_path / "_manifest.rank-0001.json").read_text())["worldSize"] == 2
    assert manifest_problems(tmp_path) == []

    for rank in (1, 0):
        seed_all(999)
        restored = checkpointing.load_shard(
            checkpoint=Checkpoint.from_directory(str(tmp_path)), rank=rank, world_size=2
        )
        assert restored is not None
        state, train_state = restored
        assert (train_state.epoch, train_state.step) == (4, 3)
        expected = _shard_state(rank)
        assert torch.equal(state["model"]["0.weight"], expected["model"]["0.weight"])
        assert torch.equal(state["optimizer"]["momentum"], expected["optimizer"]["momentum"])
        assert torch.equal(state["optimizer"]["step"], expected["optimizer"]["step"])
        assert torch.equal(torch.rand(2), draws[rank][0]) and random.random() == draws[rank][1]


def test_a_sharded_checkpoint_missing_a_rank_or_from_another_world_size_is_refused_R10(tmp_path: Path) -> None:
    for rank in (0, 1):
        checkpointing.save_shard(tmp_path, epoch=0, state=_shard_state(rank), rank=rank, world_size=2)
    checkpoint = Checkpoint.from_directory(str(tmp_path))
    with pytest.raises(CheckpointError, match="written by 2 ranks; this run has 4"):
        checkpointing.load_shard(checkpoint=checkpoint, rank=0, world_size=4)
    (tmp_path / "_manifest.rank-0001.json").unlink()  # the highest rank's manifest
    with pytest.raises(CheckpointError, match="no manifest of rank\\(s\\) 1 of a world size of 2"):
        checkpointing.load_shard(checkpoint=checkpoint, rank=0, world_size=2)


def test_a_damaged_checkpoint_fails_loudly_instead_of_resuming_from_wrong_state_R12(tmp_path: Path) -> None:
    """R12: retries cannot recover from an incomplete checkpoint; restoring one must fail, not train on."""
    model = make_training(0)[0]
    save_state(tmp_path, epoch=0, model=model)
    with (tmp_path / checkpointing.MODEL_FILE).open("ab") as f:
        f.write(b"garbage")
    (tmp_path / checkpointing.RNG_FILE).unlink()

    problems = manifest_problems(tmp_path)
    assert any("model.pt" in p and "bytes" in p for p in problems)
    assert any("rng.pt: missing" in p for p in problems)
    with pytest.raises(CheckpointError, match="cannot be restored"):
        load_state(model, checkpoint=Checkpoint.from_directory(str(tmp_path)), rank=0)


class ReportRecorder:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, metrics: dict[str, Any], checkpoint: Any = None, **kwargs: Any) -> None:
        files = sorted(os.listdir(checkpoint.path)) if checkpoint is not None else None
        self.calls.append({"metrics": metrics, "checkpoint": checkpoint, "files": files, "kwargs": kwargs})


def test_rank_zero_reports_a_full_checkpoint_named_by_epoch_synchronously_R8_R10(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R8: one report per epoch; R10: synchronous upload (no async mode), so the temp dir may go after report."""
    import ray.train

    recorder = ReportRecorder()
    monkeypatch.setattr(ray.train, "report", recorder)
    model, optimizer, scheduler = make_training(0)
    report_epoch({"val_loss": 0.5}, epoch=3, model=model, optimizer=optimizer, lr_scheduler=scheduler)

    (call,) = recorder.calls
    assert call["metrics"] == {"val_loss": 0.5}
    assert call["kwargs"] == {"checkpoint_dir_name": "checkpoint_epoch-000003"}  # Ray's default SYNC upload mode
    assert call["files"] == sorted(
        [s3_layout.MANIFEST_FILE, "lr_scheduler.pt", "model.pt", "optimizer.pt", "rng.pt", "train_state.json"]
    )
    assert not os.path.exists(call["checkpoint"].path)  # removed once the synchronous upload returned


def test_other_ranks_report_the_same_number_of_times_with_no_checkpoint_R8(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray.train

    recorder = ReportRecorder()
    monkeypatch.setattr(ray.train, "report", recorder)
    monkeypatch.setattr(checkpointing, "world_rank", lambda: 1)
    model, optimizer, _ = make_training(0)
    for epoch in range(3):
        report_epoch({"val_loss": 0.5, "epoch": epoch}, epoch=epoch, model=model, optimizer=optimizer)
    assert [c["checkpoint"] for c in recorder.calls] == [None, None, None]
    assert [c["metrics"]["epoch"] for c in recorder.calls] == [0, 1, 2]


def test_all_reduce_sum_is_the_identity_on_a_single_process_R9() -> None:
    assert all_reduce_sum({"loss": 3.0, "samples": 4}) == {"loss": 3.0, "samples": 4.0}
