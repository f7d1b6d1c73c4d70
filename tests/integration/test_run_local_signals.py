"""`sweepctl run-local` stopped by a signal stops what it started (issue 28): local Ray and the driver run in
sessions of their own, so SIGTERM or Ctrl-C reaches neither. Stand-ins for `ray start` and the driver (each records
its pid and sleeps) keep this to seconds; the CLI, the rendering and training_entrypoints.local are the real ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]

# Runs `sweepctl run-local` in-process with `ray start` and the RayJob's entrypoint replaced by sleepers.
HARNESS = """
import sys
from training_entrypoints import local
from sweep_operator import rendering
from sweep_operator.cli import main

pids, ready, storage, logs = sys.argv[1], sys.argv[2] == "ready", sys.argv[3], sys.argv[4]
SLEEPER = (
    "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid()));"
    "print('Ray runtime started' if sys.argv[2] == 'ready' else 'starting', flush=True); time.sleep(600)"
)
local.LocalRayCluster.command = lambda self: [sys.executable, "-c", SLEEPER, f"{pids}/ray.pid", sys.argv[2]]
build_rayjob = rendering.build_rayjob

def with_sleeping_driver(*args, **kwargs):
    rayjob = build_rayjob(*args, **kwargs)
    rayjob["spec"]["entrypoint"] = f'python -c "{SLEEPER}" {pids}/driver.pid driver'
    return rayjob

rendering.build_rayjob = with_sleeping_driver
sys.exit(main(["run-local", "-f", "examples/digits-cpu.yaml", "--storage", storage, "--log-dir", logs]))
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for_pids(folder: Path, names: list[str], run: subprocess.Popen[str]) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        files = [folder / name for name in names]
        if all(f.exists() and f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        assert run.poll() is None, run.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{names} did not start")


@pytest.mark.parametrize(
    ("sig", "phase", "started"),
    [
        (signal.SIGTERM, "ready", ["ray.pid", "driver.pid"]),  # the driver training on a started Ray
        (signal.SIGINT, "starting", ["ray.pid"]),  # Ctrl-C while Ray is still starting
    ],
    ids=["SIGTERM-while-training", "SIGINT-while-ray-starts"],
)
def test_a_signal_stops_local_ray_and_the_driver(
    sig: signal.Signals, phase: str, started: list[str], tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    args = [sys.executable, str(script), str(pids), phase, str(tmp_path / "store"), str(tmp_path / "logs")]
    run = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        children = wait_for_pids(pids, started, run)
        run.send_signal(sig)
        out, err = run.communicate(timeout=60)
        left = [pid for pid in children if alive(pid)]
    finally:
        if run.poll() is None:
            run.kill()
        for pid_file in pids.glob("*.pid"):  # a failing run must not leave its sleepers behind
            if pid_file.read_text() and alive(pid := int(pid_file.read_text())):
                os.kill(pid, signal.SIGKILL)
    assert run.returncode == 128 + sig, out + err
    assert f"run-local: stopped by {sig.name}; local Ray and the driver are stopped" in err
    assert "Traceback" not in err
    assert left == []
