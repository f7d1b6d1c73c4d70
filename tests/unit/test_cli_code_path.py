"""A user's own code on the path of a local run: `run-local --code DIR`, the manifest's directory as the fallback,
the usage error before Ray when spec.trainLoop's module is nowhere, and `sandbox up|run --code DIR` reaching the
PYTHONPATH of every job's driver and Ray workers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from sweep_contracts import constants
from sweep_operator.cli import main
from sweep_operator.cli import sandbox as sandbox_cli
from sweep_operator.cli.code_path import module_location
from tests.support.factories import changed, cpu_sweep
from tests.unit.test_entrypoints_local import rendered
from training_entrypoints import local
from training_entrypoints.local import LocalRayCluster, LocalRaySize, LocalRunResult

TRAIN_LOOP = "own_loop.loop:train_loop"


def write_package(folder: Path, package: str = "own_loop") -> Path:
    (folder / package).mkdir(parents=True)
    (folder / package / "__init__.py").write_text("raise RuntimeError('imported: a lookup must not import')\n")
    (folder / package / "loop.py").write_text("def train_loop(config):\n    pass\n")
    return folder


def write_manifest(folder: Path, train_loop: str = TRAIN_LOOP) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(changed(cpu_sweep(), {"spec.trainLoop": train_loop})))
    return path


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """run-local's calls of run_rayjob, which returns at once with a success (no Ray)."""
    calls: list[dict[str, Any]] = []

    def run_rayjob(rayjob: Any, **kwargs: Any) -> LocalRunResult:
        calls.append(kwargs)
        return LocalRunResult(returncode=0, duration_s=0.0, run_root="r", log_path="l")

    monkeypatch.setattr(local, "run_rayjob", run_rayjob)
    return calls


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("Ray must not start")

    monkeypatch.setattr(LocalRayCluster, "start", refuse)
    monkeypatch.setattr(local, "run_rayjob", refuse)


# --- where the module is looked for ----------------------------------------------------------------------------


def test_a_module_is_located_without_being_imported(tmp_path: Path) -> None:
    write_package(tmp_path)
    assert module_location("own_loop.loop", [tmp_path]) == str(tmp_path / "own_loop" / "loop.py")
    assert "own_loop" not in sys.modules  # its __init__ raises when imported
    assert module_location("own_loop.missing", [tmp_path]) is None
    assert module_location("own_loop.loop", [tmp_path / "own_loop"]) is None
    (tmp_path / "spaced" / "inner").mkdir(parents=True)  # a namespace package (no __init__.py)
    (tmp_path / "spaced" / "inner" / "loop.py").write_text("")
    assert module_location("spaced.inner.loop", [tmp_path]) == str(tmp_path / "spaced" / "inner" / "loop.py")
    assert module_location("not a module", [tmp_path]) is None


def test_installed_modules_are_found_on_this_pythons_own_path() -> None:
    assert module_location("training_entrypoints.loops.scalar") is not None
    assert module_location("training_entrypoints.loops.nowhere") is None


# --- run-local ---------------------------------------------------------------------------------------------------


def test_run_local_code_dir_is_the_drivers_directory_on_its_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: list[dict[str, Any]]
) -> None:
    code = write_package(tmp_path / "code")
    manifest = write_manifest(tmp_path / "manifests")
    monkeypatch.chdir(write_manifest(tmp_path / "elsewhere").parent)
    assert main(["run-local", "-f", str(manifest), "--code", str(code), "--storage", str(tmp_path / "s")]) == 0
    (call,) = runs
    assert (call["workdir"], call["code_dirs"]) == (code, ())


def test_run_local_finds_the_loop_beside_the_manifest_when_not_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """`sweepctl init demo-loop && sweepctl run-local -f demo-loop/sweep.yaml` from where init ran."""
    project = write_package(tmp_path / "demo-loop")
    manifest = write_manifest(project)
    monkeypatch.chdir(tmp_path)
    assert main(["run-local", "-f", "demo-loop/sweep.yaml", "--storage", str(tmp_path / "s")]) == 0
    (call,) = runs
    assert (call["workdir"], call["code_dirs"]) == (None, (manifest.parent,))
    assert f"own_loop.loop found in {project} (the manifest's directory)" in capsys.readouterr().err


def test_run_local_keeps_the_current_directory_as_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: list[dict[str, Any]]
) -> None:
    monkeypatch.chdir(write_package(tmp_path / "here"))
    manifest = write_manifest(tmp_path / "manifests")
    assert main(["run-local", "-f", str(manifest), "--storage", str(tmp_path / "s")]) == 0
    (call,) = runs
    assert (call["workdir"], call["code_dirs"]) == (None, ())


def test_a_train_loop_found_nowhere_is_a_usage_error_before_ray_naming_what_was_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    write_package(tmp_path)  # in the current directory, which --code replaces
    code = (tmp_path / "code").resolve()
    code.mkdir()
    manifest = write_manifest(tmp_path / "manifests")
    monkeypatch.chdir(tmp_path)
    assert main(["run-local", "-f", str(manifest), "--code", str(code)]) == 2
    err = capsys.readouterr().err
    assert f"spec.trainLoop: {TRAIN_LOOP}: module own_loop.loop is not importable" in err
    assert f"{code} (--code)" in err and f"{manifest.parent.resolve()} (the manifest's directory)" in err
    assert "installed packages" in err and "--code DIR" in err


def test_run_local_code_that_is_not_a_directory_is_a_usage_error(
    tmp_path: Path, no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = write_manifest(tmp_path)
    assert main(["run-local", "-f", str(manifest), "--code", str(tmp_path / "missing")]) == 2
    assert f"--code {tmp_path / 'missing'}: not a directory" in capsys.readouterr().err


# --- what the driver and the Ray workers get ---------------------------------------------------------------------


class FakeDriver:
    """The driver's process: records how it was started and exits 0."""

    started: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        FakeDriver.started.append({"argv": argv, **kwargs})
        self.pid = -1

    def wait(self, timeout: float | None = None) -> int:
        return 0


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    FakeDriver.started = []
    monkeypatch.setattr(local.subprocess, "Popen", FakeDriver)
    monkeypatch.setattr(LocalRayCluster, "start", lambda self, *a, **k: self)
    monkeypatch.setattr(LocalRayCluster, "stop", lambda self: shutil.rmtree(self.temp_dir, ignore_errors=True))
    yield FakeDriver.started


def pythonpaths(started: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(the driver's PYTHONPATH, the one the job's runtime env gives every Ray worker)."""
    env = started["env"]
    job = json.loads(env[local.RAY_JOB_CONFIG_ENV])["runtime_env"]["env_vars"]
    return env["PYTHONPATH"].split(os.pathsep), job["PYTHONPATH"].split(os.pathsep)


def test_code_dirs_lead_the_pythonpath_of_the_driver_and_of_every_ray_worker(
    tmp_path: Path, driver: list[dict[str, Any]]
) -> None:
    code, work = tmp_path / "code", tmp_path / "work"
    cluster = LocalRayCluster(LocalRaySize(num_cpus=8, num_gpus=0, resources={constants.TRIAL_DRIVER_RESOURCE: 2.0}))
    rayjob = rendered(cpu_sweep(), str(tmp_path / "store"))
    try:
        local.run_rayjob(rayjob, cluster=cluster, workdir=work, code_dirs=[code], log_dir=tmp_path / "logs")
    finally:
        cluster.stop()
    (started,) = driver
    for path in pythonpaths(started):
        assert path[:2] == [str(code), str(work)]
    assert started["cwd"] == work


def test_without_code_dirs_the_working_directory_alone_stands_in_for_the_image(
    tmp_path: Path, driver: list[dict[str, Any]]
) -> None:
    cluster = LocalRayCluster(LocalRaySize(num_cpus=8, num_gpus=0, resources={constants.TRIAL_DRIVER_RESOURCE: 2.0}))
    rayjob = rendered(cpu_sweep(), str(tmp_path / "store"))
    try:
        local.run_rayjob(rayjob, cluster=cluster, workdir=tmp_path, log_dir=tmp_path / "logs")
    finally:
        cluster.stop()
    (started,) = driver
    for path in pythonpaths(started):
        assert path[0] == str(tmp_path)


# --- the sandbox -------------------------------------------------------------------------------------------------


def test_sandbox_jobs_get_the_code_dir_first_on_the_pythonpath_of_driver_and_workers(
    tmp_path: Path, driver: list[dict[str, Any]]
) -> None:
    from sweep_sandbox.realrunner import LocalRayRunner

    code = tmp_path / "code"
    runner = LocalRayRunner(tmp_path / "state", code_dirs=(code,))
    run = runner.start(rendered(cpu_sweep(), str(tmp_path / "store")), "c1")
    run.wait(60)
    assert run.poll().phase.name == "SUCCEEDED"
    (started,) = driver
    for path in pythonpaths(started):
        assert path[:2] == [str(code), str(tmp_path / "state" / "runs" / "c1")]


class SandboxStarted(Exception):
    """Raised by the stand-in Sandbox once it has recorded how it was made: nothing is started."""


@pytest.fixture
def sandboxes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    made: list[dict[str, Any]] = []

    def sandbox_class(state_dir: Path, **kwargs: Any) -> Any:
        made.append(kwargs)
        raise SandboxStarted

    monkeypatch.setattr(sandbox_cli, "_sandbox_class", lambda: sandbox_class)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield made
    if threading.current_thread() is threading.main_thread():
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_sandbox_up_code_reaches_the_sandbox_and_its_help_says_how(
    tmp_path: Path, sandboxes: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    with pytest.raises(SandboxStarted):
        main(["sandbox", "up", "--state-dir", str(tmp_path / "state"), "--code", str(code)])
    assert sandboxes[0]["code_dirs"] == (code,)
    with pytest.raises(SystemExit):
        main(["sandbox", "up", "--help"])
    assert "--code DIR" in capsys.readouterr().out


def test_sandbox_up_code_that_is_not_a_directory_is_a_usage_error(
    tmp_path: Path, sandboxes: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sandbox", "up", "--code", str(tmp_path / "missing")]) == 2
    assert "--code" in capsys.readouterr().err and sandboxes == []


def test_sandbox_run_code_and_the_manifest_directory_reach_the_sandbox(
    tmp_path: Path, sandboxes: list[dict[str, Any]]
) -> None:
    code = write_package(tmp_path / "code")
    with pytest.raises(SandboxStarted):
        main(["sandbox", "run", "--sweep", str(write_manifest(tmp_path / "manifests")), "--code", str(code)])
    project = write_package(tmp_path / "project")
    with pytest.raises(SandboxStarted):
        main(["sandbox", "run", "--sweep", str(write_manifest(project))])
    assert [made["code_dirs"] for made in sandboxes] == [(code,), (project,)]


def test_sandbox_run_of_a_train_loop_found_nowhere_starts_nothing(
    tmp_path: Path, sandboxes: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sandbox", "run", "--sweep", str(write_manifest(tmp_path))]) == 2
    assert "spec.trainLoop" in capsys.readouterr().err and sandboxes == []
