"""Run a rendered RayJob's entrypoint on a local Ray, as KubeRay would in a cluster (`sweepctl run-local`, the sandbox).

One local node stands in for the RayJob's cluster, with logical resources sized so nested Tune + Train fits (R15);
the entrypoint runs in a subprocess with the container env and the runtime env, like a submitted Ray job.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep_contracts import constants
from sweep_contracts.api import SweepSpec, parse_quantity
from sweep_contracts.runspec import RunSpec

from . import storage

OBJECT_STORE_BYTES = 256 * 1024**2
CLUSTER_START_TIMEOUT_S = 120.0
STOP_GRACE_S = 15.0
EXIT_TIMED_OUT = 124
# What Ray's job supervisor hands a submitted driver so that its runtime env reaches every worker.
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
_READY_LINE = "Ray runtime started"
# Even with --include-dashboard=false a minimal dashboard head starts, on 8265 unless told otherwise.
_COMPONENT_PORT_FLAGS = (
    "--dashboard-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
)
# A port chosen free can be taken before Ray binds it (another test, another cluster): that many fresh sets are tried.
PORT_CLASH_ATTEMPTS = 3
# What a local node spends on nobody's work, on a machine of a few cores (values given in the env win):
# - the raylet prestarts a worker per logical CPU (up to its startup concurrency) when the first driver connects, in the
#   default runtime env; every driver here has a job runtime env (the RayJob's env_vars), so none of its tasks or actors
#   can use them, and each idles on Ray's 10 ms signal-check loop for as long as the node lives;
# - the log monitor globs the logs folder for new files every 0.1 s while it forwards lines; above this many files it
#   globs every 0.5 s (LOG_NAME_UPDATE_INTERVAL_S) instead. Lines are read from where each file was left either way,
#   so what reaches the driver is the same, a new worker's first lines at most 0.5 s later.
IDLE_CPU_SETTINGS = {"RAY_prestart_worker_first_driver": "0", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"}


class LocalRunError(RuntimeError):
    """The RayJob cannot run locally (a request that never fits, a Ray that did not start); the message says why."""


# ------------------------------------------------------------------------------------------- sizing


@dataclass(frozen=True)
class LocalRaySize:
    """Logical resources of the one local node standing in for a RayJob's cluster."""

    num_cpus: int
    num_gpus: int
    resources: dict[str, float]
    object_store_bytes: int = OBJECT_STORE_BYTES

    def totals(self) -> dict[str, float]:
        return {"CPU": float(self.num_cpus), "GPU": float(self.num_gpus), **self.resources}

    def describe(self) -> str:
        return ", ".join(f"{k}: {v:g}" for k, v in self.totals().items())


def host_gpu_count() -> int:
    """NVIDIA GPUs visible on this machine (device nodes; no CUDA initialisation)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(glob.glob("/dev/nvidia[0-9]*"))


def plan_local_ray(
    spec: SweepSpec,
    *,
    max_workers: int | None = None,
    host_cpus: int | None = None,
    host_gpus: int | None = None,
) -> LocalRaySize:
    """Enough logical CPUs for `max_workers` (default workers x maxConcurrentTrials) train workers at once, at least
    the host's cores; the host's GPUs; and maxConcurrentTrials trial-driver slots like the rendered head (R5, R14)."""
    workers = spec.trial.workers * spec.tune.max_concurrent_trials if max_workers is None else max_workers
    cpu_per_worker = float(parse_quantity(spec.trial.resources_per_worker.cpu))
    cpus = max(host_cpus if host_cpus is not None else (os.cpu_count() or 1), math.ceil(workers * cpu_per_worker))
    return LocalRaySize(
        num_cpus=cpus,
        num_gpus=host_gpu_count() if host_gpus is None else host_gpus,
        resources={constants.TRIAL_DRIVER_RESOURCE: float(spec.tune.max_concurrent_trials)},
    )


def trial_demand(spec: SweepSpec) -> dict[str, float]:
    """What one trial holds at once: its workers' CPUs and GPUs and one trial-driver slot."""
    res = spec.trial.resources_per_worker
    return {
        "CPU": spec.trial.workers * float(parse_quantity(res.cpu)),
        "GPU": float(spec.trial.workers * res.gpu),
        constants.TRIAL_DRIVER_RESOURCE: 1.0,
    }


def fit_problem(spec: SweepSpec, size: LocalRaySize) -> str | None:
    """Why one trial can never start on `size`, naming what it asks and what exists (R12, R14); None when it fits."""
    demand = trial_demand(spec)
    totals = size.totals()
    short = [k for k, v in demand.items() if v > totals.get(k, 0.0) + 1e-9]
    if not short:
        return None
    res = spec.trial.resources_per_worker
    asked = f"CPU: {float(parse_quantity(res.cpu)):g}" + (f", GPU: {res.gpu}" if res.gpu else "")
    hint = "; run with --cpu-only to train on CPUs" if "GPU" in short else ""
    return (
        f"each trial asks for {spec.trial.workers} train worker(s) x {{{asked}}} plus one "
        f"{constants.TRIAL_DRIVER_RESOURCE} slot ({', '.join(f'{k}: {demand[k]:g}' for k in short)} in all), but local "
        f"Ray has {{{size.describe()}}}{hint}"
    )


# ------------------------------------------------------------------------------------- the RayJob


def runtime_env_vars(rayjob: Mapping[str, Any]) -> dict[str, str]:
    """`spec.runtimeEnvYAML.env_vars` of a rendered RayJob."""
    from sweep_contracts.runtime_env import env_vars_of

    return env_vars_of(rayjob)


def container_env(rayjob: Mapping[str, Any]) -> dict[str, str]:
    """The head container's plain env (AWS region, S3 endpoint): what every Ray process of the cluster inherits."""
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return {e["name"]: str(e["value"]) for e in head.get("env", []) if "value" in e}


def max_workers(rayjob: Mapping[str, Any]) -> int:
    groups = rayjob["spec"]["rayClusterSpec"].get("workerGroupSpecs") or []
    return sum(int(g.get("maxReplicas", 0)) for g in groups)


def s3_endpoint(env: Mapping[str, str]) -> str | None:
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def stop_wait_s(env_vars: Mapping[str, str]) -> float:
    """How long a stopped driver has between SIGTERM and SIGKILL: the job's `RAY_JOB_STOP_WAIT_TIME_S`, as Ray's job
    supervisor reads it (JobSupervisor.run: an int, default 3 s); STOP_GRACE_S for a RayJob rendered without it."""
    raw = env_vars.get(constants.ENV_JOB_STOP_WAIT)
    if raw is None:
        return STOP_GRACE_S
    try:
        return float(int(raw))
    except ValueError:
        return 3.0


def _free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports.

    Every socket stays bound until all are chosen: one bound and closed at a time, the OS may hand out the same port
    twice, and Ray refuses to start when two of its components are given one port.
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


# Ray's own words when a port it was given is taken; the ports were free when chosen, so a fresh set is tried.
_PORT_CLASH = ("is trying to use a port number", "Address already in use", "Failed to bind")


# ------------------------------------------------------------------------------------ local cluster


class LocalRayCluster:
    """`ray start --head --block` on loopback with its own ports and temp dir, so it never meets another Ray here.

    Stopping it ends only the processes it started (its own process group).
    """

    def __init__(self, size: LocalRaySize, *, env: Mapping[str, str] | None = None, log_path: str | Path | None = None):
        self.size = size
        self.env = dict(os.environ if env is None else env)
        self.env.pop("RAY_ADDRESS", None)
        # On SIGTERM a node drains first (up to 30 s, reported as a preemption); a throwaway local node has nothing to
        # hand over, so it stops at once.
        self.env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
        for name, value in IDLE_CPU_SETTINGS.items():
            self.env.setdefault(name, value)
        self._choose_ports()
        self.temp_dir = tempfile.mkdtemp(prefix="sray-")
        self._log_in_temp_dir = not log_path
        self.log_path = Path(log_path) if log_path else Path(self.temp_dir) / "ray-start.log"
        self._process: subprocess.Popen[str] | None = None
        self._ready = threading.Event()

    def _choose_ports(self) -> None:
        self.port, *self._component_ports = _free_ports(1 + len(_COMPONENT_PORT_FLAGS))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        ray = str(Path(sys.executable).with_name("ray"))
        return [
            ray, "start", "--head", "--block", "--disable-usage-stats", "--include-dashboard=false",
            "--node-ip-address=127.0.0.1", f"--port={self.port}", f"--temp-dir={self.temp_dir}",
            f"--num-cpus={self.size.num_cpus}", f"--num-gpus={self.size.num_gpus}",
            f"--resources={json.dumps(self.size.resources)}", f"--object-store-memory={self.size.object_store_bytes}",
            *(f"{flag}={port}" for flag, port in zip(_COMPONENT_PORT_FLAGS, self._component_ports, strict=True)),
            # `ray start` defaults every cluster to worker ports 10002-19999; two local clusters then collide.
            "--min-worker-port=0", "--max-worker-port=0",
        ]  # fmt: skip

    def start(self, timeout_s: float = CLUSTER_START_TIMEOUT_S) -> LocalRayCluster:
        attempt = 1
        while True:
            try:
                return self._start_once(timeout_s)
            except LocalRunError as e:
                if attempt >= PORT_CLASH_ATTEMPTS or not any(words in str(e) for words in _PORT_CLASH):
                    raise
            except BaseException:
                self.stop()  # interrupted while Ray starts (a signal): `ray start` is in its own session, stop it here
                raise
            attempt += 1
            self._choose_ports()
            self.temp_dir = tempfile.mkdtemp(prefix="sray-")  # stop() removed the last one
            if self._log_in_temp_dir:
                self.log_path = Path(self.temp_dir) / "ray-start.log"

    def _start_once(self, timeout_s: float) -> LocalRayCluster:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._ready.clear()
        self._process = subprocess.Popen(
            self.command(),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._drain, args=(self._process,), daemon=True, name="ray-start-log").start()
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.2):
            exited = self._process.poll() is not None
            if exited or time.monotonic() > deadline:
                time.sleep(0.5)  # let the log thread write the last lines
                # This start's lines only (the log may hold an earlier try's); the offset counts bytes.
                log = self.log_path.read_bytes()[offset:] if self.log_path.exists() else b""
                tail = log.decode(errors="replace")[-2000:]
                self.stop()
                why = "exited" if exited else f"did not start within {timeout_s:g} s"
                raise LocalRunError(f"local Ray ({' '.join(self.command()[:3])}) {why}:\n{tail}")
        return self

    def _drain(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        with self.log_path.open("a") as log:
            for line in process.stdout:
                log.write(line)
                log.flush()
                if _READY_LINE in line:
                    self._ready.set()

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            _stop_group(process, STOP_GRACE_S)
        subprocess.run(["rm", "-rf", self.temp_dir], check=False)

    def __enter__(self) -> LocalRayCluster:
        return self.start() if self._process is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _stop_group(process: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM the process group we started, then SIGKILL what is left."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait_s)
            # The leader is gone; its group (raylet, workers) may still be ending.
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and _group_alive(process.pid):
                time.sleep(0.2)
            if not _group_alive(process.pid):
                break
        except subprocess.TimeoutExpired:
            continue


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# ------------------------------------------------------------------------------------------ running


@dataclass
class LocalRunResult:
    """What a local run of a RayJob's entrypoint produced."""

    returncode: int
    duration_s: float
    run_root: str
    log_path: str
    result: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    messages: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def message(self) -> str:
        """The driver's own `sweep:` lines (its reason when it failed)."""
        return "\n".join(self.messages)


def _driver_messages(log_path: Path, limit: int = 50) -> list[str]:
    if not log_path.exists():
        return []
    lines = [line.rstrip() for line in log_path.read_text(errors="replace").splitlines()]
    return [line for line in lines if line.startswith("sweep: ")][-limit:]


def _poll_progress(
    location: str,
    endpoint: str | None,
    on_progress: Callable[[dict[str, Any]], None],
    stop: threading.Event,
    every_s: float,
) -> None:
    last = None
    while not stop.wait(every_s):
        try:
            doc = storage.read_json(location, endpoint_url=endpoint)
        except (OSError, ValueError):
            continue
        if doc and doc != last:
            last = doc
            on_progress(doc)


def _base_env(rayjob: Mapping[str, Any], workdir: Path, code_dirs: Sequence[str | Path]) -> dict[str, str]:
    """This process's env with the container's, the user's code and `workdir` first on PYTHONPATH (no RAY_ADDRESS)."""
    base_env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    base_env.update(container_env(rayjob))
    code_path = [str(Path(d).resolve()) for d in code_dirs]
    base_env["PYTHONPATH"] = os.pathsep.join(p for p in (*code_path, str(workdir), base_env.get("PYTHONPATH", "")) if p)
    return base_env


def _driver_env(
    rayjob: Mapping[str, Any], base_env: Mapping[str, str], env_vars: Mapping[str, str], address: str
) -> dict[str, str]:
    # The job's runtime env also carries the container env, so workers on a shared cluster see it as pods would.
    job_env = {**container_env(rayjob), "PYTHONPATH": base_env["PYTHONPATH"], **env_vars}
    return {
        **base_env,
        **env_vars,
        "RAY_ADDRESS": address,
        RAY_JOB_CONFIG_ENV: json.dumps({"runtime_env": {"env_vars": job_env}, "metadata": {}}),
        "PYTHONUNBUFFERED": "1",
    }


def _run_driver(
    argv: list[str],
    driver_env: Mapping[str, str],
    workdir: Path,
    log_path: Path,
    limit: float | None,
    stop_event: threading.Event | None,
    grace_s: float,
) -> int:
    """The driver's exit code; EXIT_TIMED_OUT once it ran past `limit` (its process group then stopped)."""
    with log_path.open("w") as log:
        process = subprocess.Popen(
            argv, env=driver_env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return _wait(process, limit, stop_event, grace_s)
        except subprocess.TimeoutExpired:
            _stop_group(process, STOP_GRACE_S)
            return EXIT_TIMED_OUT
        except BaseException:
            _stop_group(process, grace_s)  # run-local's own SIGTERM or Ctrl-C: the driver stops gracefully too
            raise


def run_rayjob(
    rayjob: Mapping[str, Any],
    *,
    cluster: LocalRayCluster | None = None,
    env_overrides: Mapping[str, str] | None = None,
    workdir: str | Path | None = None,
    code_dirs: Sequence[str | Path] = (),
    log_dir: str | Path | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    poll_interval_s: float = 2.0,
    timeout_s: float | None = None,
    check_fit: bool = True,
    stop_event: threading.Event | None = None,
) -> LocalRunResult:
    """Run `rayjob`'s entrypoint on `cluster` (default: a local Ray started and stopped for this run).

    The driver gets the container env and the runtime env exactly as rendered, plus `env_overrides` (which reach
    every Ray worker too, like runtime env vars). `workdir` (default: the current directory) is the driver's cwd and
    is put on PYTHONPATH, standing in for the image's code; `code_dirs` (a user's own code: `--code`) go on
    PYTHONPATH before it, for the driver and every Ray worker. The run is killed after `timeout_s` (default: the
    RayJob's activeDeadlineSeconds, KubeRay's hard stop); setting `stop_event` stops the driver early as Ray's Jobs
    API stop does (SIGTERM, then SIGKILL after the job's `RAY_JOB_STOP_WAIT_TIME_S`: the driver's graceful stop). LocalRunError when it can never fit (`check_fit=False` leaves that to the driver's own
    bounded failure) or Ray does not start.
    """
    workdir = Path(workdir or os.getcwd()).resolve()
    env_vars = {**runtime_env_vars(rayjob), **(env_overrides or {})}
    run_spec = RunSpec.from_json(env_vars[constants.ENV_RUN_SPEC])
    spec = run_spec.spec

    base_env = _base_env(rayjob, workdir, code_dirs)
    size = cluster.size if cluster else plan_local_ray(spec, max_workers=max_workers(rayjob))
    problem = fit_problem(spec, size) if check_fit else None
    if problem:
        raise LocalRunError(problem)
    log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="sweep-run-local-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    owned = cluster is None
    if cluster is None:
        cluster = LocalRayCluster(size, env=base_env, log_path=log_dir / "ray.log").start()
    driver_env = _driver_env(rayjob, base_env, env_vars, cluster.address)
    argv = shlex.split(rayjob["spec"]["entrypoint"])
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    limit = timeout_s if timeout_s is not None else float(rayjob["spec"].get("activeDeadlineSeconds") or 0) or None
    log_path = log_dir / "driver.log"
    endpoint = s3_endpoint(driver_env)
    grace_s = stop_wait_s(env_vars)
    stop_polling = threading.Event()
    started = time.monotonic()
    try:
        if on_progress is not None:
            threading.Thread(
                target=_poll_progress,
                args=(run_spec.layout.status_path, endpoint, on_progress, stop_polling, poll_interval_s),
                daemon=True,
                name="sweep-progress",
            ).start()
        returncode = _run_driver(argv, driver_env, workdir, log_path, limit, stop_event, grace_s)
    finally:
        stop_polling.set()
        if owned:
            cluster.stop()
    messages = _driver_messages(log_path)
    if stop_event is not None and stop_event.is_set():
        messages.append("sweep: stopped on request (the RayJob was stopped)")
    if returncode == EXIT_TIMED_OUT:
        messages.append(f"sweep: killed after {limit:g} s (the RayJob's activeDeadlineSeconds)")
    return LocalRunResult(
        returncode=returncode,
        duration_s=time.monotonic() - started,
        run_root=run_spec.run_root,
        log_path=str(log_path),
        result=_read_optional(run_spec.layout.result_path, endpoint),
        status=_read_optional(run_spec.layout.status_path, endpoint),
        messages=messages,
    )


def _wait(
    process: subprocess.Popen[Any],
    limit: float | None,
    stop_event: threading.Event | None,
    grace_s: float = STOP_GRACE_S,
) -> int:
    """The driver's exit code; TimeoutExpired after `limit`; a set `stop_event` stops it (Ray's Jobs API stop: SIGTERM,
    SIGKILL after `grace_s`)."""
    if stop_event is None:
        return process.wait(timeout=limit)
    deadline = None if limit is None else time.monotonic() + limit
    while True:
        try:
            return process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            if stop_event.is_set():
                _stop_group(process, grace_s)
                return process.wait()


def _read_optional(location: str, endpoint: str | None) -> dict[str, Any] | None:
    try:
        return storage.read_json(location, endpoint_url=endpoint)
    except (OSError, ValueError):
        return None
