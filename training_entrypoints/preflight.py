"""Pre-flight checks the driver runs before the first trial, so a run that cannot work fails in seconds, not at its
first checkpoint after the GPUs were paid for (R20: checkpoint permissions and framework init delay the start).

1. The run root takes this job's own writes, reads, listings and deletes (the same pyarrow filesystem and
   credentials Ray and the status writer use); a refusal names the S3 action the job's role lacks.
2. On GPU workers: torch sees the GPUs each worker asked for, and NCCL initialises across the worker group.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any

from sweep_contracts import s3_layout
from sweep_contracts.runspec import RunSpec

from . import storage
from .search import EntrypointError

logger = logging.getLogger(__name__)

# The IAM action each storage step needs on S3 (https://docs.aws.amazon.com/service-authorization/latest/reference/
# list_amazons3.html): HEAD and GET of an object are s3:GetObject, a listing is s3:ListBucket on the bucket.
S3_ACTIONS = {"write": "s3:PutObject", "read": "s3:GetObject", "list": "s3:ListBucket", "delete": "s3:DeleteObject"}


@dataclass(frozen=True)
class PreflightFailure:
    """One refused check: `check` (write/read/list/delete/gpu/nccl), the action it needs, where, and why."""

    check: str
    action: str
    location: str
    detail: str

    @property
    def message(self) -> str:
        return f"pre-flight {self.check} check failed: {self.action} on {self.location}: {self.detail}"

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "action": self.action, "location": self.location, "detail": self.detail}


class PreflightError(EntrypointError):
    def __init__(self, failure: PreflightFailure):
        super().__init__(failure.message)
        self.failure = failure


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500] or type(exc).__name__


def check_run_root(run_root: str, *, token: str | None = None) -> None:
    """Write, read back, list and delete `_sweep/preflight-<token>.json` under `run_root`; PreflightError naming the
    first refused action (`s3:PutObject`, `s3:GetObject`, `s3:ListBucket`, `s3:DeleteObject`) otherwise."""
    layout = s3_layout.RunLayout(run_root)
    location = layout.preflight_path(token or uuid.uuid4().hex[:12])
    on_s3 = s3_layout.is_s3_uri(run_root)

    def fail(check: str, detail: str) -> PreflightError:
        action = S3_ACTIONS[check] if on_s3 else f"{check} on the local disk"
        return PreflightError(PreflightFailure(check, action, location, detail))

    fs, path = storage.filesystem(location)
    body = json.dumps({"preflight": os.path.basename(location), "pid": os.getpid()}).encode()
    try:
        if not on_s3:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with fs.open_output_stream(path) as stream:
            stream.write(body)
    except OSError as exc:
        raise fail("write", _one_line(exc)) from None
    try:
        try:
            with fs.open_input_stream(path) as stream:
                read = stream.read()
        except OSError as exc:
            raise fail("read", _one_line(exc)) from None
        if read != body:
            raise fail("read", f"read back {len(read)} bytes that differ from the {len(body)} written")
        import pyarrow.fs as pafs

        try:
            listed = {info.path for info in fs.get_file_info(pafs.FileSelector(os.path.dirname(path)))}
        except OSError as exc:
            raise fail("list", _one_line(exc)) from None
        if path not in listed:
            raise fail("list", f"the listing of {os.path.dirname(location)}/ does not show the object just written")
    except PreflightError:
        _delete_quietly(fs, path)
        raise
    try:
        fs.delete_file(path)
    except OSError as exc:
        raise fail("delete", f"{_one_line(exc)} (the probe object stays behind)") from None


def _delete_quietly(fs: Any, path: str) -> None:
    with contextlib.suppress(OSError):
        fs.delete_file(path)


def record_failure(run_root: str, failure: PreflightFailure) -> bool:
    """Put the refusal into `_sweep/status.json` for the operator when the run root takes writes; True if written."""
    from .progress import utc_now

    document = {
        "phase": "Failed",
        "trials": {"total": 0, "pending": 0, "running": 0, "terminated": 0, "errored": 0},
        "bestTrial": None,
        "trialResults": [],
        "preflight": {"ok": False, **failure.to_dict()},
        "message": failure.message,
        "updatedAt": utc_now(),
    }
    try:
        storage.write_json(s3_layout.RunLayout(run_root).status_path, document)
    except OSError as exc:
        logger.warning(
            "could not record the pre-flight failure in %s: %s", s3_layout.RunLayout(run_root).status_path, exc
        )
        return False
    return True


# ------------------------------------------------------------------------------------------- GPUs


def gpu_problems(rank: int, gpus_requested: float, cuda_available: bool, devices_visible: int) -> str | None:
    """Why a worker cannot use the GPUs it asked for (pure), or None."""
    if gpus_requested <= 0:
        return None
    if not cuda_available:
        return f"rank {rank}: torch.cuda.is_available() is False though the worker asked for {gpus_requested:g} GPU(s) (driver, CUDA build of torch, device plugin)"
    if devices_visible < gpus_requested:
        return f"rank {rank}: torch sees {devices_visible} GPU(s), the worker asked for {gpus_requested:g}"
    return None


def gpu_worker_check(config: dict[str, Any]) -> None:
    """Train loop of the GPU pre-flight: every rank checks its GPUs, then one NCCL all-reduce across the group."""
    import ray.train
    import torch
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    problem = gpu_problems(rank, float(config["gpus"]), torch.cuda.is_available(), torch.cuda.device_count())
    if problem:
        raise RuntimeError(problem)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if dist.is_initialized():
        backend = dist.get_backend()
        value = torch.ones(1, device=torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(value)
        if int(value.item()) != world:
            raise RuntimeError(f"rank {rank}: {backend} all-reduce over {world} ranks gave {value.item():g}")
    ray.train.report({"rank_ok": 1.0, "world": world})


def check_gpu_workers(run_spec: RunSpec) -> None:
    """On a GPU sweep, one short worker group shaped like a trial's runs `gpu_worker_check` (NCCL, as TorchTrainer
    chooses for GPUs); PreflightError when a rank cannot see its GPUs or NCCL does not come up. A CPU sweep has
    nothing to check."""
    spec = run_spec.spec
    gpus = spec.trial.resources_per_worker.gpu
    if gpus <= 0:
        logger.info("pre-flight: no GPUs requested; GPU and NCCL checks skipped")
        return
    import ray.train
    from ray.train.torch import TorchTrainer

    from .trainable import scaling_config

    layout = run_spec.layout
    trainer = TorchTrainer(
        gpu_worker_check,
        train_loop_config={"gpus": gpus},
        scaling_config=scaling_config(spec),
        # Outside train/: the verifier and the trials never mistake it for a trial.
        run_config=ray.train.RunConfig(
            name="gpu-preflight",
            storage_path=layout.meta_dir,
            failure_config=ray.train.FailureConfig(
                max_failures=0, controller_failure_limit=0, max_preemption_failures=0
            ),
        ),
    )
    try:
        trainer.fit()
    except Exception as exc:  # TrainingFailedError wraps the worker's own message
        raise PreflightError(
            PreflightFailure(
                "gpu", f"{spec.trial.workers} worker(s) x {gpus:g} GPU, NCCL", layout.meta_dir, _one_line(exc)
            )
        ) from None
