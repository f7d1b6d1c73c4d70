"""What each trial of a sweep ended with: its summary from Tune's ResultGrid, its checkpoint from Ray's committed
snapshot."""

from __future__ import annotations

import os
from typing import Any

from sweep_contracts.runspec import RunSpec

from . import storage
from .pbt import RESULT_TRAIN_RUN_KEY
from .progress import TrialSummary, public_config


def trial_dirname(trial: Any) -> str:
    """`tune/<trialId>` mirrors `train/<trialId>`."""
    return str(trial.trial_id)


def _best_committed_checkpoint(trial_dir: str, attribute: str | None, order: str | None) -> str | None:
    """The trial's best checkpoint among those Ray's snapshot commits (the latest without a score)."""
    import ray.train

    try:
        result = ray.train.Result.from_path(trial_dir)
    except (RuntimeError, OSError, FileNotFoundError):
        return None
    candidates = [(ckpt, m) for ckpt, m in (result.best_checkpoints or []) if attribute and attribute in m]
    if candidates:
        pick = min if order == "min" else max
        return pick(candidates, key=lambda c: c[1][attribute])[0].path
    return result.checkpoint.path if result.checkpoint else None


def _last_train_run(result: Any, trial_id: str) -> str:
    """The Train run a trial ended in: `train/<trialId>`, or under pbt the run its last result names (a trial that
    continued from another trial's checkpoint trains on in a run of its own, seeded from that checkpoint)."""
    last = (result.metrics or {}).get(RESULT_TRAIN_RUN_KEY)
    return last if isinstance(last, str) and last and "/" not in last else trial_id


def final_summaries(results: Any, run_spec: RunSpec) -> list[TrialSummary]:
    """One summary per trial from Tune's ResultGrid; checkpoint URIs come from each trial's committed snapshot."""
    spec = run_spec.spec
    metric, mode = spec.tune.metric, spec.tune.mode
    attribute = spec.checkpoints.score_attribute or metric
    order = spec.checkpoints.score_order or mode
    summaries = []
    for result in results:
        trial_id = os.path.basename(result.path.rstrip("/"))
        value = None
        if metric and mode:
            frame = result.metrics_dataframe
            if frame is not None and metric in frame:
                series = frame[metric].dropna()
                value = float(series.min() if mode == "min" else series.max()) if len(series) else None
        path = _best_committed_checkpoint(
            run_spec.layout.trial_dir(_last_train_run(result, trial_id)), attribute, order
        )
        iteration = (result.metrics or {}).get("training_iteration")
        summaries.append(
            TrialSummary(
                id=trial_id,
                status="ERROR" if result.error else "TERMINATED",
                config=public_config(dict(result.config or {})),
                value=value,
                checkpoint_uri=storage.to_uri(path, run_spec.run_root) if path else None,
                error=one_line(result.error) if result.error else None,
                reports=iteration if isinstance(iteration, int) and not isinstance(iteration, bool) else 0,
            )
        )
    return summaries


def one_line(error: BaseException, limit: int = 2000) -> str:
    """The error on one line; a long one keeps its start and its end, where a traceback names the exception."""
    text = " ".join(str(error).split())
    half = (limit - 5) // 2
    return text if len(text) <= limit else f"{text[:half]} ... {text[-half:]}"
