"""Train loop for the framework e2e test (`tests.e2e.framework_loops:train_loop`): runs the Transformers or the
Lightning example loop of examples/loops (`config["framework"]`), unchanged, and paces it through `ray.train.report`,
which both frameworks' Ray callbacks call once per epoch:

- a fresh trial holds after its `HOLD_AFTER_REPORTS`-th report (its checkpoint committed once Ray registers it) while
  `hold_file` exists, then fails, so the test ends the first attempt at a known checkpoint;
- a resumed trial (`ray.train.get_checkpoint()` set) sleeps `step_s` after each report, so it is mid-run whenever the
  test stops it.

Every report also carries `framework` and `val_loss` (the Trainer logs `eval_loss`): one sweep metric for both.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

import ray.train

LOOPS = {"hf_trainer": "hf_trainer_loop.loop", "lightning": "lightning_loop.loop"}
HOLD_AFTER_REPORTS = 2


class EndedByTheTest(RuntimeError):
    """The first attempt's planned end: the trial fails after a known committed checkpoint."""


def train_loop(config: dict[str, Any]) -> None:
    framework = str(config["framework"])
    loop = importlib.import_module(LOOPS[framework])
    resumed = ray.train.get_checkpoint() is not None
    hold_file = Path(config["hold_file"])
    step_s = float(config.get("step_s", 2.0))
    report = ray.train.report
    reports = 0

    def report_and_pace(metrics: dict[str, Any], checkpoint: Any = None, **kwargs: Any) -> None:
        nonlocal reports
        metrics = {**metrics, "framework": framework}
        metrics.setdefault("val_loss", metrics.get("eval_loss"))
        report(metrics, checkpoint=checkpoint, **kwargs)
        reports += 1
        if resumed:
            time.sleep(step_s)
        elif reports == HOLD_AFTER_REPORTS:
            while hold_file.exists():
                time.sleep(0.2)
            raise EndedByTheTest(f"{framework}: the test ended the first attempt after {reports} reports")

    ray.train.report = report_and_pace
    try:
        loop.train_loop(config)
    finally:
        ray.train.report = report
