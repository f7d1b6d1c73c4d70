"""Full-state checkpoints for any train loop: model, optimizer, LR scheduler, every rank's RNG, epoch and data position.

`Checkpoint.from_directory()` only references the files you wrote (R7), so `save_state` writes all of it plus a
`_manifest.json` of sizes and hashes; `report_epoch` is the once-per-epoch call every rank makes (R8, R10).
State sharded across ranks (FSDP-style) goes through `report_sharded_epoch` / `load_shard`: one shard and one manifest
per rank in the same checkpoint, the world size recorded (R10).
Both upload synchronously by default; `upload="async"` hands the upload and the manifest's hashing to Ray's upload
thread (`async_upload`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from sweep_contracts import checkpoint_manifest, s3_layout

from . import async_upload

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


def world_size_now() -> int:
    """How many ranks the running world has (1 outside a distributed run)."""
    return dist.get_world_size() if _distributed() else 1


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
    world_size: int | None = None,
    files: list[str] | None = None,
    sharded: bool = False,
) -> dict[str, Any]:
    """Write the manifest (`sweep_contracts.checkpoint_manifest`) of `directory` into it and return the document.

    `files` (relative paths) defaults to every file in the directory except manifests; `world_size` defaults to the
    running world's. A sharded save (`sharded=True`: each rank writes its own files) gets a per-rank manifest name
    so ranks never collide, and records the world size so a missing rank is noticed (R10).
    """
    root = Path(directory)
    if files is None:
        files = sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file() and not s3_layout.is_manifest_name(p.name)
        )
    entries = [(rel, (root / rel).stat().st_size, _sha256(root / rel)) for rel in files]
    document = checkpoint_manifest.manifest_document(
        entries, rank=rank, epoch=epoch, world_size=world_size if world_size is not None else world_size_now()
    )
    name = s3_layout.rank_manifest_name(rank) if sharded else s3_layout.MANIFEST_FILE
    (root / name).write_bytes(checkpoint_manifest.encode(document))
    return document


def manifest_problems(directory: str | Path, *, ranks: Iterable[int] | None = None) -> list[str]:
    """What is wrong with a checkpoint directory against its manifest(s); empty when every file matches.

    Every rank below the recorded world size must have its manifest (R10). `ranks` limits the file checks to
    those ranks' manifests (a rank restoring its own shard needs to read no other rank's files)."""
    root = Path(directory)
    names = sorted(p.name for p in root.iterdir() if s3_layout.is_manifest_name(p.name))
    if not names:
        return [f"{root}: no {s3_layout.MANIFEST_FILE}"]
    parsed: dict[str, checkpoint_manifest.Manifest | checkpoint_manifest.FormatError] = {}
    for name in names:
        try:
            parsed[name] = checkpoint_manifest.parse_manifest((root / name).read_bytes(), name)
        except checkpoint_manifest.FormatError as exc:
            parsed[name] = exc
    problems = [f"{name}: {m}" for name, m in parsed.items() if isinstance(m, checkpoint_manifest.FormatError)]
    world_size, missing, disagreement = checkpoint_manifest.missing_rank_manifests(parsed)
    if disagreement:
        problems.append(disagreement)
    if missing:
        problems.append(f"no manifest of rank(s) {', '.join(map(str, missing))} of a world size of {world_size}")
    wanted = None if ranks is None else set(ranks)
    for name, manifest in parsed.items():
        if isinstance(manifest, checkpoint_manifest.FormatError):
            continue
        if wanted is not None and s3_layout.manifest_rank(name) not in wanted:
            continue
        for entry in manifest.files:
            path = root / entry.path
            if not path.is_file():
                problems.append(f"{entry.path}: missing")
            elif path.stat().st_size != entry.size:
                problems.append(f"{entry.path}: {path.stat().st_size} bytes, manifest says {entry.size}")
            elif _sha256(path) != entry.sha256:
                problems.append(f"{entry.path}: sha256 differs from the manifest")
    return problems


def state_dict_digest(state_dict: Mapping[str, torch.Tensor]) -> str:
    """sha256 over a state dict's names, dtypes, shapes and values: the same for a model's weights in memory and for
    the `model.pt` they were loaded from, so a restore can be shown to have loaded exactly the saved weights (R7)."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


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
    _write_state_files(
        Path(directory),
        epoch=epoch,
        model=model,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        step=step,
        rng_states=rng_states,
        extra=extra,
    )
    return write_manifest(directory, epoch=epoch)


def _write_state_files(
    root: Path,
    *,
    epoch: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr_scheduler: Any | None,
    step: int,
    rng_states: list[dict[str, Any]] | None,
    extra: Mapping[str, Any] | None,
) -> None:
    root.mkdir(parents=True, exist_ok=True)
    torch.save(_unwrap(model).state_dict(), root / MODEL_FILE)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), root / OPTIMIZER_FILE)
    if lr_scheduler is not None:
        torch.save(lr_scheduler.state_dict(), root / LR_SCHEDULER_FILE)
    torch.save({"ranks": rng_states or [capture_rng_state()]}, root / RNG_FILE)
    (root / TRAIN_STATE_FILE).write_text(json.dumps({"epoch": epoch, "step": step, "extra": dict(extra or {})}))


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
    upload: str = async_upload.UPLOAD_SYNC,
    max_pending: int | None = None,
) -> None:
    """Report `metrics` and a full-state checkpoint for `epoch`. Every rank calls this once per epoch (R8).

    Every rank's RNG state is gathered to rank 0, which alone writes the files and reports them under
    `checkpoint_epoch-NNNNNN`; other ranks report `checkpoint=None`. By default the upload is synchronous (Ray's
    default), so the temporary directory may be removed as soon as `report` returns (R10).

    `upload="async"`: the loop goes on once the files are on local disk; the manifest is hashed and the files
    uploaded on Ray's upload thread, and the local directory is removed when that upload ended. At most
    `max_pending` checkpoints (default `SWEEP_MAX_PENDING_UPLOADS`, else 2) wait locally: the next report waits for
    the oldest. A failed upload fails the trial with its error (and is raised at the next report).
    """
    import ray.train

    async_upload.check_upload_mode(upload)
    rng_states = gather_rng_states()
    if world_rank() != 0:
        ray.train.report(dict(metrics), checkpoint=None)
        return
    write = functools.partial(
        _write_state_files,
        epoch=epoch,
        model=model,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        step=step,
        rng_states=rng_states,
        extra=extra,
    )
    if upload == async_upload.UPLOAD_ASYNC:
        world_size = world_size_now()
        async_upload.report_async(
            metrics,
            name=s3_layout.checkpoint_dir_name(epoch),
            write=write,
            manifest=functools.partial(write_manifest, epoch=epoch, world_size=world_size),
            max_pending=max_pending,
        )
        return
    with tempfile.TemporaryDirectory(prefix="sweep-ckpt-") as tmp:
        write(Path(tmp))
        write_manifest(tmp, epoch=epoch)
        ray.train.report(
            dict(metrics),
            checkpoint=ray.train.Checkpoint.from_directory(tmp),
            checkpoint_dir_name=s3_layout.checkpoint_dir_name(epoch),
        )


# ------------------------------------------------------------------------------------ sharded saves

SHARD_STATE_FILE = "state.pt"


def save_shard(
    directory: str | Path,
    *,
    epoch: int,
    state: Mapping[str, Any],
    rank: int | None = None,
    world_size: int | None = None,
    step: int = 0,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write this rank's part of a sharded checkpoint (FSDP-style state: every rank holds a different shard).

    Everything goes under `shard-NNNN/` (the rank's `state`, its RNG and the train state) with the manifest
    `_manifest.rank-NNNN.json` beside it, so ranks writing into one checkpoint directory never collide and the
    manifests record the world size (R10). Returns the manifest.
    """
    rank = world_rank() if rank is None else rank
    world_size = world_size_now() if world_size is None else world_size
    root = Path(directory)
    files = _write_shard_files(root, epoch=epoch, state=state, rank=rank, step=step, extra=extra)
    return write_manifest(root, epoch=epoch, rank=rank, world_size=world_size, files=files, sharded=True)


def _write_shard_files(
    root: Path, *, epoch: int, state: Mapping[str, Any], rank: int, step: int, extra: Mapping[str, Any] | None
) -> list[str]:
    """This rank's shard files under `shard-NNNN/`; their paths relative to `root`."""
    shard = root / s3_layout.rank_shard_dir(rank)
    shard.mkdir(parents=True, exist_ok=True)
    torch.save(dict(state), shard / SHARD_STATE_FILE)
    torch.save({"ranks": [capture_rng_state()]}, shard / RNG_FILE)
    (shard / TRAIN_STATE_FILE).write_text(json.dumps({"epoch": epoch, "step": step, "extra": dict(extra or {})}))
    return sorted(p.relative_to(root).as_posix() for p in shard.rglob("*") if p.is_file())


def _fetch_shard(checkpoint: Any, rank: int, into: Path) -> None:
    """Copy every manifest and this rank's shard directory only: a rank never downloads the other ranks' state."""
    import pyarrow.fs as pafs

    fs, base = checkpoint.filesystem, checkpoint.path.rstrip("/")
    local = pafs.LocalFileSystem()
    for info in fs.get_file_info(pafs.FileSelector(base, recursive=False)):
        if info.type == pafs.FileType.File and s3_layout.is_manifest_name(info.base_name):
            pafs.copy_files(info.path, str(into / info.base_name), source_filesystem=fs, destination_filesystem=local)
    shard = f"{base}/{s3_layout.rank_shard_dir(rank)}"
    if fs.get_file_info(shard).type != pafs.FileType.Directory:
        return
    for info in fs.get_file_info(pafs.FileSelector(shard, recursive=True)):
        if info.type == pafs.FileType.File:
            target = into / s3_layout.rank_shard_dir(rank) / info.path[len(shard) + 1 :]
            target.parent.mkdir(parents=True, exist_ok=True)
            pafs.copy_files(info.path, str(target), source_filesystem=fs, destination_filesystem=local)


def load_shard(
    *, checkpoint: Any | None = None, rank: int | None = None, world_size: int | None = None, verify: bool = True
) -> tuple[dict[str, Any], TrainState] | None:
    """This rank's `state` and train state from a sharded checkpoint (default: `ray.train.get_checkpoint()`), its RNG
    restored; None on a fresh start. Call it inside the worker before the first epoch (R7).

    Every rank's manifest must be there, the recorded world size must be this world's (a different number of
    ranks cannot take over these shards), and this rank's files must match its manifest: else CheckpointError.
    """
    if checkpoint is None:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
    rank = world_rank() if rank is None else rank
    world_size = world_size_now() if world_size is None else world_size
    with tempfile.TemporaryDirectory(prefix="sweep-shard-") as tmp:
        root = Path(tmp)
        _fetch_shard(checkpoint, rank, root)
        if verify and (problems := manifest_problems(root, ranks=[rank])):
            raise CheckpointError(
                f"checkpoint {checkpoint.path} cannot be restored on rank {rank}: {'; '.join(problems)}"
            )
        manifest_path = root / s3_layout.rank_manifest_name(rank)
        if not manifest_path.is_file():
            raise CheckpointError(
                f"checkpoint {checkpoint.path} has no {manifest_path.name}: not a sharded save of rank {rank}"
            )
        recorded = checkpoint_manifest.parse_manifest(manifest_path.read_bytes(), manifest_path.name).world_size
        if recorded != world_size:
            raise CheckpointError(
                f"checkpoint {checkpoint.path} was written by {recorded} ranks; this run has {world_size} "
                "(restore sharded state with the world size that wrote it)"
            )
        shard = root / s3_layout.rank_shard_dir(rank)
        state = _load(shard / SHARD_STATE_FILE)
        restore_rng_state(_load(shard / RNG_FILE)["ranks"][0])
        train_state = json.loads((shard / TRAIN_STATE_FILE).read_text())
    return state, TrainState(
        epoch=train_state["epoch"], step=train_state.get("step", 0), extra=train_state.get("extra", {})
    )


def report_sharded_epoch(
    metrics: Mapping[str, Any],
    *,
    epoch: int,
    state: Mapping[str, Any],
    step: int = 0,
    extra: Mapping[str, Any] | None = None,
    upload: str = async_upload.UPLOAD_SYNC,
    max_pending: int | None = None,
) -> None:
    """Report `metrics` and this rank's shard for `epoch`; every rank calls it once per epoch (R8) and every rank
    reports a checkpoint: Ray Train V2 uploads each rank's directory into the same `checkpoint_epoch-NNNNNN`
    (the name is synchronised across ranks) before the report barrier completes, synchronously (R10).

    `upload="async"`: as for `report_epoch`, per rank (each rank's shard is written locally, its manifest hashed and
    the shard uploaded on that rank's upload thread); Ray commits the checkpoint once every rank's upload ended."""
    import ray.train

    async_upload.check_upload_mode(upload)
    if upload == async_upload.UPLOAD_ASYNC:
        rank, world_size = world_rank(), world_size_now()

        def write(root: Path) -> None:
            files.extend(_write_shard_files(root, epoch=epoch, state=state, rank=rank, step=step, extra=extra))

        def manifest(root: Path) -> None:
            write_manifest(root, epoch=epoch, rank=rank, world_size=world_size, files=files, sharded=True)

        files: list[str] = []
        async_upload.report_async(
            metrics, name=s3_layout.checkpoint_dir_name(epoch), write=write, manifest=manifest, max_pending=max_pending
        )
        return
    with tempfile.TemporaryDirectory(prefix="sweep-shard-") as tmp:
        save_shard(tmp, epoch=epoch, state=state, step=step, extra=extra)
        ray.train.report(
            dict(metrics),
            checkpoint=ray.train.Checkpoint.from_directory(tmp),
            checkpoint_dir_name=s3_layout.checkpoint_dir_name(epoch),
        )
