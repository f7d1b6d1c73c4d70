"""`python -m training_entrypoints.sweep` with bad input: it exits 2 with the reason before Ray or any trial starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_contracts.runspec import build_run_spec
from sweep_contracts.s3_layout import RunLayout
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def driver(
    tmp_path: Path, spec_patch: dict[str, Any], extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    run_spec = build_run_spec(
        parse_sweep(changed(cpu_sweep(), {"spec.tune.searcher.type": "random"})), "bad1", str(tmp_path)
    )
    body = json.loads(run_spec.to_json())
    for path, value in spec_patch.items():
        *parents, leaf = path.split(".")
        node = body["spec"]
        for part in parents:
            node = node[part]
        node[leaf] = value
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({constants.ENV_RUN_SPEC: json.dumps(body), constants.ENV_DEADLINE_AT: str(int(time.time()) + 600)})
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", constants.ENTRYPOINT_MODULE],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("case", "spec_patch", "extra_env", "expected"),
    [
        ("unknown scheduler", {"tune.scheduler.type": "bogus"}, {}, "spec.tune.scheduler.type: got 'bogus'"),
        (
            "missing metric",
            {"tune.scheduler.type": "asha", "tune.metric": None, "tune.mode": None},
            {},
            "spec.tune.metric: required by scheduler 'asha'",
        ),
        (
            "optuna not installed",
            {"tune.searcher.type": "optuna"},
            {},
            "needs the optuna package in the training image",
        ),
        ("train loop missing", {"trainLoop": "nowhere.loops:train_loop"}, {}, "spec.trainLoop: cannot import module"),
        ("Train V1 (R2)", {}, {constants.ENV_TRAIN_V2: "0"}, "needs Ray Train V2"),
    ],
)
def test_bad_values_fail_before_any_trial_R2_R13(
    tmp_path: Path, case: str, spec_patch: dict[str, Any], extra_env: dict[str, str], expected: str
) -> None:
    started = time.monotonic()
    done = driver(tmp_path, spec_patch, extra_env)
    assert done.returncode == 2, done.stderr[-3000:]
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
    assert "Started a local Ray instance" not in done.stdout + done.stderr
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    if case == "train loop missing":
        # The run's status is written before user code is imported (issue 12, defect 5): the guard reads from it
        # that no checkpoint was ever reported, and releases the cluster (audited) instead of holding it.
        layout = RunLayout(str(tmp_path / "default" / "digits-cpu-bad1"))
        status = json.loads(Path(layout.status_path).read_text())
        assert status["phase"] == "Failed" and expected in status["message"] and status["trials"]["total"] == 0
        assert written == [str(Path(layout.status_path).relative_to(tmp_path))], written
    else:
        assert not written, "nothing may be written before the input is known to be good"
    assert time.monotonic() - started < 60


@pytest.mark.timeout(180)
def test_a_finished_run_is_not_overwritten_R16(tmp_path: Path) -> None:
    """R16: reusing a run root is a decision; a root with a result file is a finished run, never trained over."""
    layout = RunLayout(str(tmp_path / "default" / "digits-cpu-bad1"))
    Path(layout.result_path).parent.mkdir(parents=True)
    Path(layout.result_path).write_text('{"bestTrial": null}')
    done = driver(tmp_path, {})
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        "already finished" in done.stderr
        and "a new run needs a new run id" in done.stderr
        and "(R16)" not in done.stderr
    )
    assert not Path(layout.tune_dir).exists()
