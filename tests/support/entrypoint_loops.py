"""Train loops for the entrypoint e2e tests (imported by Ray workers as `tests.support.entrypoint_loops:...`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray.train

from training_entrypoints.loops import digits_mlp


def digits_with_one_failure(config: dict[str, Any]) -> None:
    """The built-in digits loop, except that rank 1 raises at epoch `fail_at_epoch` the first time it gets there.

    A marker file under `marker_dir` records that the failure happened, so the retried worker group runs clean.
    `fail_at_epoch: -1` runs the plain loop (the uninterrupted twin of a failing trial).
    """
    fail_at = int(config.get("fail_at_epoch", -1))
    marker = Path(config["marker_dir"]) / f"{config['_sweep']['trialId']}.failed"
    if fail_at >= 0 and ray.train.get_context().get_world_rank() == 1 and not marker.exists():
        report = digits_mlp.report_epoch

        def report_or_fail(metrics: dict[str, Any], *, epoch: int, **kwargs: Any) -> None:
            if epoch == fail_at:
                marker.write_text(str(epoch))
                raise RuntimeError(f"injected failure at epoch {epoch}")
            report(metrics, epoch=epoch, **kwargs)

        digits_mlp.report_epoch = report_or_fail
    digits_mlp.train_loop(config)


def slow_scalar(config: dict[str, Any]) -> None:
    """Reports `score` with a checkpoint every `sleep_s` for `steps` steps: long enough for a deadline to stop it."""
    import tempfile
    import time

    from sweep_contracts import s3_layout
    from training_entrypoints.checkpointing import write_manifest

    checkpoint = ray.train.get_checkpoint()
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = int((Path(d) / "step").read_text()) + 1
    for step in range(start, config["steps"]):
        time.sleep(config["sleep_s"])
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "step").write_text(str(step))
            write_manifest(tmp, epoch=step)
            ray.train.report(
                {"score": float(step), "step": step, "resumed_from": start},
                checkpoint=ray.train.Checkpoint.from_directory(tmp),
                checkpoint_dir_name=s3_layout.checkpoint_dir_name(step),
            )


def digits_resume_probe(config: dict[str, Any]) -> None:
    """The built-in digits loop, reporting with every epoch what it restored: `restored_epoch` (-1 on a fresh start)
    and `restored_digest` (checkpointing.state_dict_digest of the weights right after load_state, "" when fresh), and
    `reported_at` (wall clock) for bench/entrypoint_overhead.py's resume row.

    While the file `hold_file` exists, the sweep's first trial (trial index 00000) started fresh holds after reporting
    epoch `hold_after_epoch`, its checkpoint committed: only the deadline's stop ends it, so the deadline always lands
    after that epoch however busy the machine is.
    """
    import time

    from training_entrypoints import checkpointing

    restored: dict[str, Any] = {"epoch": -1, "digest": ""}
    hold_file = Path(config["hold_file"]) if config.get("hold_file") else None
    holds = config["_sweep"]["trialId"].endswith("_00000")
    load, report = digits_mlp.load_state, digits_mlp.report_epoch

    def load_and_digest(model: Any, optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> Any:
        state = load(model, optimizer, lr_scheduler, **kwargs)
        if state is not None:
            weights = getattr(model, "module", model).state_dict()
            restored.update(epoch=state.epoch, digest=checkpointing.state_dict_digest(weights))
        return state

    def report_and_hold(metrics: dict[str, Any], *, epoch: int, **kwargs: Any) -> None:
        facts = {"restored_epoch": restored["epoch"], "restored_digest": restored["digest"], "reported_at": time.time()}
        report({**metrics, **facts}, epoch=epoch, **kwargs)
        if holds and restored["epoch"] < 0 and epoch == config.get("hold_after_epoch") and hold_file is not None:
            while hold_file.exists():
                time.sleep(0.2)

    digits_mlp.load_state, digits_mlp.report_epoch = load_and_digest, report_and_hold
    try:
        digits_mlp.train_loop(config)
    finally:
        digits_mlp.load_state, digits_mlp.report_epoch = load, report
