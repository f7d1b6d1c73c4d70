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

    from training_entrypoints.checkpointing import write_manifest
    from sweep_operator import s3_layout

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
