"""Full-state checkpoints for any train loop: model, optimizer, LR scheduler, every rank's RNG, epoch and data position.

`Checkpoint.from_directory()` only references the files you wrote (R7), so `save_state` writes all of it plus a
`_manifest.json` of sizes and hashes; `report_epoch` is the once-per-epoch call every rank makes (R8, R10).
"""

from __future__ import annotations

import hashlib
import json
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
import torch.distributed as dist

from sweep_operator import s3_layout

MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
LR_SCHEDULER_FILE = "lr_scheduler.pt"
RNG_FILE = "rng.pt"
TRAIN_STATE_FILE = "train_state.json"
_HASH_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be restored exactly (missing or damaged files): retrying cannot help (R12)."""


@dataclass(frozen=True)
class TrainState:
    """Where training stood when the checkpoint was written: the last finished epoch and the data position."""

    epoch: int
    step: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------- RNG


def seed_all(seed: int) -> None:
    """Seed python, numpy and torch (and CUDA when present) in this process."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states in a form `torch.load(weights_only=True)` accepts (no numpy arrays)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Undo `capture_rng_state`: the next random draw is the one the saved process would have made."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_rank() -> int:
    """This worker's rank (0 outside a distributed run)."""
    return dist.get_rank() if _distributed() else 0


def gather_rng_states() -> list[dict[str, Any]]:
    """Every rank's RNG state, in rank order. A collective: every rank must call it."""
    mine = capture_rng_state()
    if not _distributed():
        return [mine]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, mine)
    return states


# ------------------------------------------------------------------------------------------ manifest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(
    directory: str | Path,
    *,
    epoch: int,
    rank: int = 0,
    files: list[str] | None = None,
    sharded: bool = False,
) -> dict[str, Any]:
    """Write `{"files": [{"path", "size", "sha256"}], "rank", "epoch"}` into `directory` and return it.

    `files` (relative paths) defaults to every file in the directory except manifests. A sharded save
    (`sharded=True`: each rank writes its own files) gets a per-rank manifest name so ranks never collide (R10).
    """
    root = Path(directory)
    if files is None:
        files = sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file() and not s3_layout.is_manifest_name(p.name)
        )
    entries = [{"path": rel, "size": (root / rel).stat().st_size, "sha256": _sha256(root / rel)} for rel in files]
    manifest = {"files": entries, "rank": rank, "epoch": epoch}
    name = s3_layout.rank_manifest_name(rank) if sharded else s3_layout.MANIFEST_FILE
    (root / name).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def manifest_problems(directory: str | Path) -> list[str]:
    """What is wrong with a checkpoint directory against its manifest(s); empty when every file matches."""
    root = Path(directory)
    manifests = sorted(p for p in root.iterdir() if s3_layout.is_manifest_name(p.name))
    if not manifests:
        return [f"{root}: no {s3_layout.MANIFEST_FILE}"]
    problems = []
    for manifest_path in manifests:
        for entry in json.loads(manifest_path.read_text())["files"]:
            path = root / entry["path"]
            if not path.is_file():
                problems.append(f"{entry['path']}: missing")
            elif path.stat().st_size != entry["size"]:
                problems.append(f"{entry['path']}: {path.stat().st_size} bytes, manifest says {entry['size']}")
            elif _sha256(path) != entry["sha256"]:
                problems.append(f"{entry['path']}: sha256 differs from the manifest")
    return problems


# -------------------------------------------------------------------------------------- save / load


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DistributedDataParallel/DataParallel, so checkpoints load with or without DDP."""
    return getattr(model, "module", model)


def save_state(
    directory: str | Path,
    *,
    epoch: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler: Any | None = None,
    step: int = 0,
    rng_states: list[dict[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write everything needed to continue training exactly into `directory`; returns the manifest.

    `epoch` is the last finished epoch and `step` the data position inside the next one (0 at epoch ends).
    `rng_states` is one state per rank (`gather_rng_states()`); default: this process's only.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    torch.save(_unwrap(model).state_dict(), root / MODEL_FILE)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), root / OPTIMIZER_FILE)
    if lr_scheduler is not None:
        torch.save(lr_scheduler.state_dict(), root / LR_SCHEDULER_FILE)
    torch.save({"ranks": rng_states or [capture_rng_state()]}, root / RNG_FILE)
    (root / TRAIN_STATE_FILE).write_text(json.dumps({"epoch": epoch, "step": step, "extra": dict(extra or {})}))
    return write_manifest(root, epoch=epoch)


def _load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def load_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler: Any | None = None,
    *,
    checkpoint: Any | None = None,
    rank: int | None = None,
    verify: bool = True,
) -> TrainState | None:
    """Restore model, optimizer, scheduler and this rank's RNG from `checkpoint` (default: `ray.train.get_checkpoint()`).

    Returns None when there is nothing to restore (a fresh start). Call it after building the model, optimizer,
    scheduler and data loaders and before the first epoch, inside the worker (R7). `verify` checks the files
    against the manifest first: a damaged checkpoint fails loudly instead of resuming from wrong state.
    """
    if checkpoint is None:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
    with checkpoint.as_directory() as directory:
        root = Path(directory)
        if verify and (problems := manifest_problems(root)):
            raise CheckpointError(f"checkpoint {checkpoint.path} cannot be restored: {'; '.join(problems)}")
        _unwrap(model).load_state_dict(_load(root / MODEL_FILE))
        if optimizer is not None:
            optimizer.load_state_dict(_load(root / OPTIMIZER_FILE))
        if lr_scheduler is not None:
            lr_scheduler.load_state_dict(_load(root / LR_SCHEDULER_FILE))
        rng = _load(root / RNG_FILE)["ranks"]
        rank = world_rank() if rank is None else rank
        if rank < len(rng):
            restore_rng_state(rng[rank])
        state = json.loads((root / TRAIN_STATE_FILE).read_text())
    return TrainState(epoch=state["epoch"], step=state.get("step", 0), extra=state.get("extra", {}))


def report_epoch(
    metrics: Mapping[str, Any],
    *,
    epoch: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler: Any | None = None,
    step: int = 0,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Report `metrics` and a full-state checkpoint for `epoch`. Every rank calls this once per epoch (R8).

    Every rank's RNG state is gathered to rank 0, which alone writes the files and reports them under
    `checkpoint_epoch-NNNNNN`; other ranks report `checkpoint=None`. The upload is synchronous (Ray's default),
    so the temporary directory may be removed as soon as `report` returns (R10).
    """
    import ray.train

    rng_states = gather_rng_states()
    if world_rank() != 0:
        ray.train.report(dict(metrics), checkpoint=None)
        return
    with tempfile.TemporaryDirectory(prefix="sweep-ckpt-") as tmp:
        save_state(
            tmp,
            epoch=epoch,
            model=model,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            step=step,
            rng_states=rng_states,
            extra=extra,
        )
        ray.train.report(
            dict(metrics),
            checkpoint=ray.train.Checkpoint.from_directory(tmp),
            checkpoint_dir_name=s3_layout.checkpoint_dir_name(epoch),
        )
