"""Running a rendered RayJob locally, without starting Ray: sizing (R5, R15), fit checks (R12, R14), the environment
the entrypoint gets, and `sweepctl run-local`'s own parts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep_contracts import constants
from sweep_operator.cli import main
from sweep_operator.cli.run_local import cpu_only, result_table
from sweep_operator.rendering import build_rayjob
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep, gpu_sweep
from training_entrypoints import local
from training_entrypoints.local import (
    LocalRayCluster,
    LocalRaySize,
    LocalRunError,
    container_env,
    fit_problem,
    max_workers,
    plan_local_ray,
    run_rayjob,
    runtime_env_vars,
)


def spec_of(doc: dict[str, Any]) -> Any:
    return parse_sweep(doc).spec


def test_two_cores_get_enough_logical_cpus_for_every_concurrent_worker_R15() -> None:
    """R15: logical CPUs are not OS limits; 2 trials x 2 workers x 1 CPU fit a 2-core machine as 4 logical CPUs."""
    size = plan_local_ray(spec_of(cpu_sweep()), host_cpus=2, host_gpus=0)
    assert (size.num_cpus, size.num_gpus) == (4, 0)
    assert fit_problem(spec_of(cpu_sweep()), size) is None


def test_the_head_like_trial_driver_slots_equal_max_concurrent_trials_R5() -> None:
    size = plan_local_ray(
        spec_of(changed(cpu_sweep(), {"spec.tune.maxConcurrentTrials": 3})), host_cpus=16, host_gpus=0
    )
    assert size.resources == {constants.TRIAL_DRIVER_RESOURCE: 3.0}
    assert size.num_cpus == 16  # never fewer than the host has


def test_fractional_worker_cpus_round_up_to_whole_logical_cpus() -> None:
    spec = spec_of(changed(cpu_sweep(), {"spec.trial": {"workers": 3, "resourcesPerWorker": {"cpu": "500m"}}}))
    assert plan_local_ray(spec, max_workers=3, host_cpus=1, host_gpus=0).num_cpus == 2


def test_a_gpu_sweep_on_a_machine_without_gpus_names_asked_and_available_R12_R14() -> None:
    spec = spec_of(gpu_sweep())
    problem = fit_problem(spec, plan_local_ray(spec, host_cpus=2, host_gpus=0))
    assert problem == (
        "each trial asks for 2 train worker(s) x {CPU: 4, GPU: 1} plus one sweep_trial_driver slot (GPU: 2 in all), "
        "but local Ray has {CPU: 16, GPU: 0, sweep_trial_driver: 2}; run with --cpu-only to train on CPUs"
    )


def test_a_trial_larger_than_a_shared_cluster_does_not_fit_R14() -> None:
    spec = spec_of(changed(cpu_sweep(), {"spec.trial.workers": 3, "spec.trial.resourcesPerWorker.cpu": "2"}))
    problem = fit_problem(spec, LocalRaySize(num_cpus=4, num_gpus=0, resources={constants.TRIAL_DRIVER_RESOURCE: 1.0}))
    assert problem is not None and "(CPU: 6 in all)" in problem and "{CPU: 4, GPU: 0, sweep_trial_driver: 1}" in problem


def rendered(doc: dict[str, Any], storage: str | None = None) -> dict[str, Any]:
    return build_rayjob(parse_sweep(doc), "abc123", deadline_at=1900000000, storage_uri=storage)


def test_the_entrypoint_gets_the_rendered_runtime_env_and_container_env() -> None:
    doc = changed(
        cpu_sweep(), {"spec.storage.endpointUrl": "http://127.0.0.1:9000", "spec.storage.region": "us-east-1"}
    )
    rayjob = rendered(doc)
    env_vars = runtime_env_vars(rayjob)
    assert env_vars[constants.ENV_TRAIN_V2] == "1" and env_vars[constants.ENV_DEADLINE_AT] == "1900000000"
    assert json.loads(env_vars[constants.ENV_RUN_SPEC])["runId"] == "abc123"
    assert (
        container_env(rayjob).items()
        >= {
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000",
        }.items()
    )
    assert max_workers(rayjob) == 4
    assert yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])["env_vars"] == env_vars


def test_run_rayjob_refuses_a_request_that_never_fits_before_starting_ray(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(local, "host_gpu_count", lambda: 0)
    monkeypatch.setattr(LocalRayCluster, "start", lambda self, *a, **k: pytest.fail("Ray must not start"))
    with pytest.raises(LocalRunError, match=r"GPU: 2 in all.*--cpu-only"):
        run_rayjob(rendered(gpu_sweep(), str(tmp_path)), log_dir=tmp_path)


def test_local_ray_keeps_to_loopback_its_own_ports_and_temp_dir() -> None:
    cluster = LocalRayCluster(LocalRaySize(num_cpus=4, num_gpus=0, resources={constants.TRIAL_DRIVER_RESOURCE: 2.0}))
    try:
        command = cluster.command()
        assert command[1:4] == ["start", "--head", "--block"]
        assert "--node-ip-address=127.0.0.1" in command and f"--port={cluster.port}" in command
        assert f"--temp-dir={cluster.temp_dir}" in command and "--num-cpus=4" in command
        assert '--resources={"sweep_trial_driver": 2.0}' in command
        assert "--min-worker-port=0" in command and "--max-worker-port=0" in command  # OS-chosen, never shared
        assert any(arg.startswith("--dashboard-port=") and arg != "--dashboard-port=8265" for arg in command)
        assert cluster.address == f"127.0.0.1:{cluster.port}"
    finally:
        cluster.stop()
    assert not Path(cluster.temp_dir).exists()


def test_every_port_given_to_local_ray_is_distinct() -> None:
    # CI once saw gcs_server and runtime_env_agent given one port (each chosen by its own bind-and-close), and Ray
    # refused to start: ray/_private/parameter.py, RayParams.update_pre_selected_port.
    cluster = LocalRayCluster(LocalRaySize(num_cpus=2, num_gpus=0, resources={}))
    try:
        ports = []
        for arg in cluster.command():
            flag, _, value = arg.partition("=")
            if flag.endswith("-port") and flag not in ("--min-worker-port", "--max-worker-port"):
                ports.append(int(value))
        assert cluster.port in ports and len(ports) == 6 and len(set(ports)) == 6, ports
    finally:
        cluster.stop()


@pytest.mark.parametrize(
    ("first_failure", "starts", "raised"),
    [
        (
            "Ray component runtime_env_agent is trying to use a port number 35661 that is used by other components",
            2,
            False,
        ),
        ("OSError: [Errno 98] Address already in use", 2, False),
        ("ModuleNotFoundError: No module named 'torch'", 1, True),
    ],
)
def test_a_start_that_loses_a_port_race_is_tried_again_on_fresh_ports(
    monkeypatch: pytest.MonkeyPatch, first_failure: str, starts: int, raised: bool
) -> None:
    cluster = LocalRayCluster(LocalRaySize(num_cpus=2, num_gpus=0, resources={}))
    seen: list[tuple[int, str]] = []

    def start_once(self: LocalRayCluster, timeout_s: float) -> LocalRayCluster:
        seen.append((self.port, self.temp_dir))
        if len(seen) == 1:
            raise LocalRunError(f"local Ray exited:\n{first_failure}")
        return self

    monkeypatch.setattr(LocalRayCluster, "_start_once", start_once)
    try:
        if raised:
            with pytest.raises(LocalRunError, match="torch"):
                cluster.start()
        else:
            assert cluster.start() is cluster
        assert len(seen) == starts
        if starts == 2:
            assert seen[0][0] != seen[1][0] and seen[0][1] != seen[1][1]  # fresh ports, fresh temp dir
            assert cluster.log_path.parent == Path(cluster.temp_dir)
    finally:
        cluster.stop()


def test_a_retried_start_runs_a_fresh_process_and_reports_only_its_own_log_lines(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Stand-ins for `ray start`: the first loses its port, the second fails for another reason.
    scripts = iter(
        [
            "print('ValueError: Ray component gcs_server is trying to use a port number 1 that is used'); exit(1)",
            "print('the second try: no such module'); exit(1)",
        ]
    )
    commands: list[list[str]] = []

    def command(self: LocalRayCluster) -> list[str]:
        if not commands or commands[-1][-1] != f"--port={self.port}":  # one script per start (per port choice)
            commands.append([sys.executable, "-c", next(scripts), f"--port={self.port}"])
        return commands[-1]

    monkeypatch.setattr(LocalRayCluster, "command", command)
    cluster = LocalRayCluster(LocalRaySize(num_cpus=2, num_gpus=0, resources={}), log_path=tmp_path / "ray.log")
    with pytest.raises(LocalRunError, match="the second try") as failed:
        cluster.start(timeout_s=30)
    assert len(commands) == 2 and commands[0][-1] != commands[1][-1]  # fresh ports for the second process
    assert "gcs_server" not in str(failed.value)  # the first try's lines stay in the log, not in this error
    assert "gcs_server" in (tmp_path / "ray.log").read_text()


def test_a_port_race_lost_every_time_ends_after_the_last_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = LocalRayCluster(LocalRaySize(num_cpus=2, num_gpus=0, resources={}))
    starts: list[int] = []

    def start_once(self: LocalRayCluster, timeout_s: float) -> LocalRayCluster:
        starts.append(self.port)
        raise LocalRunError("local Ray exited:\nAddress already in use")

    monkeypatch.setattr(LocalRayCluster, "_start_once", start_once)
    with pytest.raises(LocalRunError, match="Address already in use"):
        cluster.start()
    cluster.stop()
    assert len(starts) == local.PORT_CLASH_ATTEMPTS


def test_cpu_only_renders_the_same_sweep_without_gpus() -> None:
    sweep = cpu_only(parse_sweep(gpu_sweep()))
    assert sweep.spec.trial.resources_per_worker.gpu == 0
    assert sweep.spec.trial.resources_per_worker.cpu == "4" and sweep.spec.trial.workers == 2
    limits = build_rayjob(sweep, "abc123")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert constants.GPU_RESOURCE not in limits["containers"][0]["resources"]["limits"]


def test_result_table_lists_every_trial_and_marks_the_best() -> None:
    table = result_table(
        {
            "bestTrial": {"id": "t1", "metric": "score"},
            "trialResults": [
                {"id": "t0", "status": "TERMINATED", "config": {"x": 1}, "value": -4.0, "checkpointUri": None},
                {
                    "id": "t1",
                    "status": "TERMINATED",
                    "config": {"x": 3, "lr": 0.012345},
                    "value": 0.0,
                    "checkpointUri": "/r/c",
                },
            ],
        }
    )
    lines = table.splitlines()
    assert lines[0].split() == ["trial", "status", "config", "score", "checkpoint"]
    assert lines[1].split() == ["t0", "TERMINATED", "x=1", "-4", "-"]
    assert lines[2].split() == ["*", "t1", "TERMINATED", "x=3,", "lr=0.01235", "0", "/r/c"]


def test_run_local_without_gpus_fails_with_the_reason_and_no_ray(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(yaml.safe_dump(gpu_sweep()))
    monkeypatch.setattr(local, "host_gpu_count", lambda: 0)
    monkeypatch.setattr(LocalRayCluster, "start", lambda self, *a, **k: pytest.fail("Ray must not start"))
    assert main(["run-local", "-f", str(manifest), "--storage", str(tmp_path / "store")]) == 1
    assert "--cpu-only" in capsys.readouterr().err


def test_run_local_rejects_an_invalid_manifest_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(yaml.safe_dump(changed(cpu_sweep(), {"spec.tune.mode": "sideways"})))
    assert main(["run-local", "-f", str(manifest)]) == 2
    assert "spec.tune.mode" in capsys.readouterr().err


def test_local_ray_prestarts_no_workers_and_globs_its_logs_less_often_unless_the_env_says_otherwise() -> None:
    import ray._private.log_monitor as log_monitor

    cluster = LocalRayCluster(LocalRaySize(num_cpus=2, num_gpus=0, resources={}), env={})
    given = LocalRayCluster(
        LocalRaySize(num_cpus=2, num_gpus=0, resources={}), env={"RAY_prestart_worker_first_driver": "1"}
    )
    try:
        assert cluster.env["RAY_prestart_worker_first_driver"] == "0"
        assert cluster.env["RAY_LOG_MONITOR_MANY_FILES_THRESHOLD"] == "0"
        assert given.env["RAY_prestart_worker_first_driver"] == "1"
    finally:
        cluster.stop()
        given.stop()
    # The names Ray 2.58 reads: the raylet's config (RAY_<name>) and the log monitor's module constants.
    raylet = Path(log_monitor.__file__).parents[1] / "core/src/ray/raylet/raylet"
    assert b"prestart_worker_first_driver" in raylet.read_bytes()
    assert "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD" in Path(log_monitor.__file__).read_text()
    assert log_monitor.LOG_NAME_UPDATE_INTERVAL_S == 0.5
