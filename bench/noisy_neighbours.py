"""Benchmark: a well-behaved namespace's stop and deletion latency beside hostile namespaces, against none, in one run.

    .venv/bin/python bench/noisy_neighbours.py [--rounds 5] [--hostile 8]

The operator runs as its own process (bench/routed_operator.py: `python -m sweep_operator` told the chart's 512 MiB
limit, the heads' names routed to loopback by namespace), against the Kubernetes API emulator and the scripted
KubeRay stand-in (with its heads' Jobs API) in this process and moto S3 in a child process, all on 127.0.0.1.
Quiet and hostile rounds alternate (Q H H Q Q H ...). Each round deletes a running sweep of the quiet namespace and
times (a) its stop: the delete -> its head's Jobs API receives the POST /stop, and (b) its deletion: the delete -> the
TrainingSweep is gone (the guard verified its checkpoints and removed its finalizer). In a hostile round each hostile
namespace has a running sweep whose head answers one byte a second, whose run root holds a 16 MiB status.json of
nested empty lists and 40 Tune experiment states of 4 MiB; those sweeps are deleted just before the quiet one.
Goal: hostile median <= 1.5 x quiet median + one Jobs API call deadline, and the operator's peak RSS within its
memory budget. Prints one JSON object; the operator's log goes to a temporary file named in it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support.* (the sweep factories)

from sweep_contracts import constants, s3_layout

log = logging.getLogger("noisy_neighbours")

MiB = 1 << 20
LIMIT_BYTES = 512 * MiB  # the chart's default resources.limits.memory
BUCKET = "bench-noisy-neighbours"
QUIET_NAMESPACE = "quiet-team"
HOSTILE_PREFIX = "noisy-team"
STOP_SECONDS = 0.5  # the quiet driver's graceful stop once asked (Ray keeps the job RUNNING that long)
OVERSIZED_STATUS_BYTES = 16 * MiB
EXPERIMENT_STATES = 40
EXPERIMENT_STATE_BYTES = 4 * MiB
TRICKLE_SECONDS = 120  # a hostile head's answer: one byte a second, far past any deadline
RSS_SAMPLE_SECONDS = 0.25
WAIT_S = 120.0  # bounds a hang only: every wait below is for a state
GOAL_FACTOR = 1.5
HOSTILE_KINDS = frozenset({"heads", "status", "states"})


# --------------------------------------------------------------------------------------------------------------------
# S3: moto in a child process (its own GIL), seeded straight through its backend on command


def nested_empty_lists(size: int) -> bytes:
    """A status.json whose counts parse, padded with empty lists (tests/integration/test_operator_memory_budget.py):
    parsed whole, 16 MiB of it took 360 MiB."""
    return b'{"trials": {"total": 1, "running": 1}, "junk": [' + b"[]," * ((size - 64) // 3) + b"[]]}"


def serve_s3() -> int:
    """Child process: start moto, print its endpoint, then run one JSON command per stdin line, answering each."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from sweep_sandbox.s3server import S3Server
    from tests.support.moto_direct import MotoDirectWriter
    from tests.support.sweep_factory import tune_experiment_state, write_sweep

    fat_state = tune_experiment_state({"t0": None})
    fat_state["stats"] = {"pad": "x" * EXPERIMENT_STATE_BYTES}
    fat = json.dumps(fat_state).encode()
    oversized = nested_empty_lists(OVERSIZED_STATUS_BYTES)
    with S3Server() as server:
        server.client().create_bucket(Bucket=BUCKET)
        writer = MotoDirectWriter()
        backend = writer._backend
        print(json.dumps({"endpoint": server.endpoint_url, "pid": os.getpid()}), flush=True)
        for line in sys.stdin:
            command = json.loads(line)
            prefix = command["prefix"]
            if command["op"] == "sweep":  # a verifiable run: one trial, one committed checkpoint
                write_sweep(writer, BUCKET, prefix, trials=1, checkpoints=1, files=1)
            elif command["op"] == "hostile":  # the same, then what the tenant's code wrote beside it
                write_sweep(writer, BUCKET, prefix, trials=1, checkpoints=1, files=1)
                if "status" in command["kinds"]:
                    writer.put_object(Bucket=BUCKET, Key=f"{prefix}/{s3_layout.STATUS_KEY}", Body=oversized)
                    etag(backend, f"{prefix}/{s3_layout.STATUS_KEY}")
                for i in range(EXPERIMENT_STATES if "states" in command["kinds"] else 0):
                    key = f"{prefix}/tune/experiment_state-2026-12-03_10-{i:02d}-00.json"
                    writer.put_object(Bucket=BUCKET, Key=key, Body=fat)
                    etag(backend, key)
            elif command["op"] == "clear":
                for item in writer.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")["Contents"]:
                    writer.delete_object(Bucket=BUCKET, Key=item["Key"])
            print(json.dumps({"ok": command["op"]}), flush=True)
    return 0


def etag(backend: Any, key: str) -> None:
    """Compute an object's ETag now, as moto does for an HTTP PUT: the direct write leaves it to the first listing
    (an MD5 of every byte listed, which made a listing of the flood take seconds)."""
    _ = backend.get_object(BUCKET, key).etag


class S3Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-s3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        started = json.loads(self.proc.stdout.readline())
        self.endpoint: str = started["endpoint"]
        self.pid: int = started["pid"]
        self._lock = threading.Lock()

    def call(self, op: str, prefix: str, **more: Any) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(json.dumps({"op": op, "prefix": prefix, **more}) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        if json.loads(answer or "{}").get("ok") != op:
            raise RuntimeError(f"the S3 child did not do {op} {prefix}: {answer!r}")

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


# --------------------------------------------------------------------------------------------------------------------
# The hostile heads, and when each TrainingSweep was gone


class TricklingHead(http.server.BaseHTTPRequestHandler):
    """The hostile namespaces' heads: a status line and headers at once, then a JSON body one byte a second."""

    requests: ClassVar[list[tuple[str, str, float]]] = []  # (method, path, wall clock)

    def _answer(self) -> None:
        type(self).requests.append((self.command, self.path, time.time()))
        try:
            self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n")
            for _ in range(TRICKLE_SECONDS):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(1.0)
        except OSError:  # the operator hung up at its deadline
            return

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def start_trickling_heads() -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TricklingHead)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="trickling-heads", daemon=True).start()
    return server


def deletion_log() -> Any:
    """The emulator's change log, also noting when each TrainingSweep, RayJob and RayCluster was DELETED (wall clock,
    as the heads' Jobs API records its requests; a run's RayJob and RayCluster by their sweep label), so the bench
    waits for the state without polling the API it measures. `trace` keeps every change of one namespace."""
    from sweep_sandbox import emulator as emu

    plurals = {
        emu.resource_key(constants.GROUP, constants.VERSION, constants.PLURAL): constants.PLURAL,
        emu.resource_key(constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYJOB_PLURAL): "rayjobs",
        emu.resource_key(constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYCLUSTER_PLURAL): "rayclusters",
    }

    class DeletionLog(emu.ChangeLog):
        def __init__(self) -> None:
            super().__init__()
            self.gone: dict[tuple[str, str, str], float] = {}  # (plural, namespace, sweep) -> when
            self.changed = threading.Condition()
            self.trace_namespace = ""
            self.trace: list[tuple[float, str, str, str, list[str]]] = []

        def append(self, change: Any) -> None:
            plural = plurals.get(change.resource)
            if plural is not None:
                meta = change.obj["metadata"]
                sweep = (
                    meta["name"]
                    if plural == constants.PLURAL
                    else (meta.get("labels") or {}).get(constants.LABEL_SWEEP, "")
                )
                if change.namespace == self.trace_namespace:
                    self.trace.append(
                        (time.time(), change.type, plural, meta["name"], list(meta.get("finalizers") or []))
                    )
                if change.type == "DELETED":
                    with self.changed:
                        self.gone[(plural, change.namespace or "", sweep)] = time.time()
                        self.changed.notify_all()
            super().append(change)

        def wait_gone(self, namespace: str, name: str, timeout: float) -> float:
            key = (constants.PLURAL, namespace, name)
            with self.changed:
                if not self.changed.wait_for(lambda: key in self.gone, timeout):
                    raise TimeoutError(f"{namespace}/{name} was not released in {timeout:.0f} s")
                return self.gone[key]

    return DeletionLog()


# --------------------------------------------------------------------------------------------------------------------
# The operator's own process


def memory(pid: int, field: str) -> int:
    """VmHWM (the peak resident set) or VmRSS of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (/proc/<pid>/stat utime, stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class OperatorProcess:
    def __init__(
        self, kubeconfig: Path, log_path: Path, s3_endpoint: str, routes: dict[str, str], verbose: bool = False
    ) -> None:
        from sweep_sandbox.s3server import SANDBOX_CREDENTIALS
        from tests.support.ports import free_port
        from tests.support.waiting import wait_for

        self.liveness = free_port()
        env = {
            **os.environ,
            **SANDBOX_CREDENTIALS,
            "SWEEP_LIVENESS_PORT": str(self.liveness),
            "SWEEP_METRICS_PORT": "0",
            "SWEEP_RECONCILE_SECONDS": "1",
            "SWEEP_STATUS_POLL_SECONDS": "0.5",
            "SWEEP_S3_ENDPOINT_URL": s3_endpoint,
            "SWEEP_S3_REGION": "us-east-1",
            "SWEEP_MEMORY_LIMIT_BYTES": str(LIMIT_BYTES),
            "BENCH_HEAD_ROUTES": json.dumps(routes),
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "bench" / "routed_operator.py"),
                "--kubeconfig",
                str(kubeconfig),
                *(["--verbose"] if verbose else []),
            ],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        wait_for(lambda: self.proc.poll() is not None or healthy(self.liveness), 60, 0.2, what="the operator is up")
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.proc.returncode}; see {log_path}")

    def memory(self, field: str) -> int:
        return memory(self.proc.pid, field)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


class RssSampler:
    """The operator's VmRSS every RSS_SAMPLE_SECONDS, the highest seen while each condition's rounds ran."""

    def __init__(self, operator: OperatorProcess) -> None:
        self.operator, self.condition = operator, ""
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_SECONDS):
            if self.condition:
                try:
                    rss = self.operator.memory("VmRSS")
                except (OSError, RuntimeError):
                    return
                self.peaks[self.condition] = max(self.peaks.get(self.condition, 0), rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------------------------------------------------
# One round


class Bench:
    def __init__(
        self,
        server: Any,
        standin: Any,
        s3: S3Child,
        deletions: Any,
        hostile_namespaces: list[str],
        kinds: set[str],
        trace: bool,
        processes: dict[str, int],
    ) -> None:
        import kubernetes

        api_client = server.api_client()
        self.custom: Any = kubernetes.client.CustomObjectsApi(api_client)
        self.core: Any = kubernetes.client.CoreV1Api(api_client)
        self.standin, self.s3, self.deletions = standin, s3, deletions
        self.hostile_namespaces, self.kinds, self.trace = hostile_namespaces, kinds, trace
        self.processes = processes  # whose CPU each round counts: the operator, the S3 server, this process
        deletions.trace_namespace = QUIET_NAMESPACE if trace else ""

    def sweep_doc(self, name: str, namespace: str) -> dict[str, Any]:
        from tests.support.factories import changed, cpu_sweep

        return changed(
            cpu_sweep(name, namespace),
            {
                "spec.storage.uri": f"s3://{BUCKET}/sweeps",
                "spec.storage.endpointUrl": self.s3.endpoint,
                "spec.storage.region": "us-east-1",
                "spec.deletion": {
                    "verifyCheckpoints": True,
                    "verificationTimeoutSeconds": 20,
                    "retryBackoffSeconds": 1,
                    "maxRetryBackoffSeconds": 2,
                },
                "spec.tune.numSamples": 2,
            },
        )

    def sweep(self, namespace: str, name: str) -> dict[str, Any] | None:
        import kubernetes

        try:
            return self.custom.get_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def running_job(self, namespace: str, name: str) -> tuple[str, str] | None:
        """(run root prefix, Ray job id) once the sweep is Running and its RayJob names its Ray job."""
        from sweep_operator import ray_jobs

        status = (self.sweep(namespace, name) or {}).get("status") or {}
        if status.get("phase") != "Running" or not status.get("rayJobName"):
            return None
        rayjob = self.custom.get_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, constants.RAYJOB_PLURAL, status["rayJobName"]
        )
        job = ray_jobs.job_of(rayjob)
        return (f"sweeps/{namespace}/{name}-{status['runId']}", job[1]) if job else None

    def reasons(self, namespace: str, name: str) -> list[str]:
        return [e.reason for e in self.core.list_namespaced_event(namespace).items if e.involved_object.name == name]

    def told(self, key: tuple[str, str], reason: str) -> bool:
        return reason in self.reasons(*key)

    def verification_problems(self, key: tuple[str, str]) -> list[dict[str, Any]]:
        return list((((self.sweep(*key) or {}).get("status") or {}).get("checkpoints") or {}).get("problems") or [])

    def leftovers(self, namespace: str) -> int:
        """TrainingSweeps, RayJobs and RayClusters still in `namespace` (held by the guard or not yet gone)."""
        count = len(
            self.custom.list_namespaced_custom_object(constants.GROUP, constants.VERSION, namespace, constants.PLURAL)[
                "items"
            ]
        )
        for plural in (constants.RAYJOB_PLURAL, constants.RAYCLUSTER_PLURAL):
            count += len(
                self.custom.list_namespaced_custom_object(
                    constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural
                )["items"]
            )
        return count

    def run(self, index: int, hostile: bool) -> dict[str, Any]:
        from tests.support.waiting import wait_for

        quiet = (QUIET_NAMESPACE, f"quiet-{index}")
        noisy = [(ns, f"noisy-{index}") for ns in self.hostile_namespaces] if hostile else []
        for namespace, name in (*noisy, quiet):
            self.custom.create_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.PLURAL, self.sweep_doc(name, namespace)
            )
        jobs: dict[tuple[str, str], tuple[str, str]] = {}
        for key in (*noisy, quiet):
            jobs[key] = wait_for(functools.partial(self.running_job, *key), WAIT_S, 0.1, what=f"{key} Running")
        self.s3.call("sweep", jobs[quiet][0])
        for key in noisy:
            self.s3.call("hostile", jobs[key][0], kinds=sorted(self.kinds))
        # Each hostile sweep's progress polls have met its oversized status.json before anything is deleted.
        for key in noisy if "status" in self.kinds else ():
            wait_for(
                functools.partial(self.told, key, "RunDocumentTooLarge"),
                WAIT_S,
                0.2,
                what=f"{key}: told its status.json is too large",
            )
        trickled = len(TricklingHead.requests)
        load = os.getloadavg()[0]

        for namespace, name in noisy:  # the hostile deletes first: their stops and guard checks are queued ahead
            self.custom.delete_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name
            )
        self.deletions.trace.clear()
        head_requests = len(TricklingHead.requests)
        cpu = {who: cpu_seconds(pid) for who, pid in self.processes.items()}
        deleted_at = time.time()
        self.custom.delete_namespaced_custom_object(
            constants.GROUP, constants.VERSION, quiet[0], constants.PLURAL, quiet[1]
        )
        jobs_api = self.standin.jobs_api
        stop_path = f"/api/jobs/{jobs[quiet][1]}/stop"
        asked_at = wait_for(
            lambda: next((at for method, path, at in list(jobs_api.requests) if path == stop_path), None),
            WAIT_S,
            0.01,
            what="the quiet head asked to stop",
        )
        gone_at = self.deletions.wait_gone(*quiet, WAIT_S)
        cpu = {who: round(cpu_seconds(pid) - cpu[who], 2) for who, pid in self.processes.items()}
        wait_for(lambda: self.leftovers(QUIET_NAMESPACE) == 0, WAIT_S, 0.2, what="the quiet run's objects gone")
        if self.trace:
            for at, kind, plural, name, finalizers in self.deletions.trace:
                log.info("quiet %+.3f s %s %s %s %s", at - deleted_at, kind, plural, name, finalizers)
            for method, path, at in TricklingHead.requests[head_requests:]:
                log.info("hostile head %+.3f s %s %s", at - deleted_at, method, path)
        result: dict[str, Any] = {
            "round": index,
            "condition": "hostile" if hostile else "quiet",
            "stopSeconds": round(asked_at - deleted_at, 3),
            "deletionSeconds": round(gone_at - deleted_at, 3),
            "loadAverage": round(load, 2),
            "cpuSecondsUntilReleased": cpu,
        }
        if noisy:
            result["hostile"] = self.hostile_findings(noisy, trickled)
            self.clean_up(noisy, {key: jobs[key][0] for key in noisy})
        return result

    def hostile_findings(self, noisy: list[tuple[str, str]], trickled: int) -> dict[str, Any]:
        """What the hostile sweeps met, once each got there: its stop's deadline (a GracefulStopFailed Event) and its
        verification's finding on the flood of experiment states (read within the memory budget's bounds)."""
        from tests.support.waiting import wait_for

        for key in noisy if "heads" in self.kinds else ():
            wait_for(functools.partial(self.told, key, "GracefulStopFailed"), WAIT_S, 0.2, what=f"{key}'s stop")
        problems: list[str] = []
        for key in noisy if "states" in self.kinds else ():
            found = wait_for(
                functools.partial(self.verification_problems, key),
                WAIT_S,
                0.2,
                what=f"{key}: its verification's finding",
            )
            problems += [p.get("kind", "") for p in found]
        reasons = [r for key in noisy for r in self.reasons(*key)]
        return {
            "headRequests": len(TricklingHead.requests) - trickled,
            "verificationProblems": {kind: problems.count(kind) for kind in sorted(set(problems))},
            "gracefulStopFailed": reasons.count("GracefulStopFailed"),
            "runDocumentTooLarge": reasons.count("RunDocumentTooLarge"),
        }

    def clean_up(self, noisy: list[tuple[str, str]], roots: dict[tuple[str, str], str]) -> None:
        """The hostile runs' documents go (their guard's next check then verifies them) so the next round starts with
        nothing left in the hostile namespaces."""
        from tests.support.waiting import wait_for

        for key in noisy:
            self.s3.call("clear", roots[key])
            self.s3.call("sweep", roots[key])
        wait_for(
            lambda: sum(self.leftovers(ns) for ns in self.hostile_namespaces) == 0,
            WAIT_S,
            0.5,
            what="the hostile namespaces emptied",
        )
        for key in noisy:
            self.s3.call("clear", roots[key])


# --------------------------------------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import kubernetes

    from sweep_sandbox.emulator import EmulatorServer, build_emulator
    from sweep_sandbox.kuberay import KubeRayStandIn, Outcome, ScriptedRunner

    kinds = set(args.hostile_kinds.split(","))
    if not kinds <= HOSTILE_KINDS:
        raise SystemExit(f"--hostile-kinds: {args.hostile_kinds!r}; choose from {','.join(sorted(HOSTILE_KINDS))}")
    started, load_at_start = time.monotonic(), os.getloadavg()
    hostile_namespaces = [f"{HOSTILE_PREFIX}-{i}" for i in range(args.hostile)]
    workdir = Path(tempfile.mkdtemp(prefix="noisy-neighbours-"))
    deletions = deletion_log()
    with contextlib.ExitStack() as stack:
        server = EmulatorServer(build_emulator(auto_create_namespaces=False, request_log_limit=0, changes=deletions))
        server.start()
        stack.callback(server.stop)
        core: Any = kubernetes.client.CoreV1Api(server.api_client())
        for namespace in (QUIET_NAMESPACE, *hostile_namespaces):
            core.create_namespace({"metadata": {"name": namespace}})
        s3 = S3Child()
        stack.callback(s3.stop)
        heads = start_trickling_heads()
        stack.callback(heads.server_close)
        stack.callback(heads.shutdown)
        runner = ScriptedRunner(default=Outcome.hang(stop_seconds=STOP_SECONDS))
        standin = KubeRayStandIn(server.api_client(), runner, poll_interval=0.2, dashboard=True).start()
        stack.callback(standin.stop)
        assert standin.jobs_api is not None
        hostile_head = f"127.0.0.1:{heads.server_address[1]}"
        routes = {  # without hostile heads, the hostile namespaces' heads are the stand-in's well-behaved ones
            QUIET_NAMESPACE: standin.jobs_api.address,
            **dict.fromkeys(hostile_namespaces, hostile_head if "heads" in kinds else standin.jobs_api.address),
        }
        operator = OperatorProcess(
            server.write_kubeconfig(workdir / "kubeconfig"),
            workdir / "operator.log",
            s3.endpoint,
            routes,
            verbose=args.operator_verbose,
        )
        stack.callback(operator.stop)
        processes = {"operator": operator.proc.pid, "s3": s3.pid, "emulatorAndStandIn": os.getpid()}
        bench = Bench(server, standin, s3, deletions, hostile_namespaces, kinds, args.trace, processes)
        bench.run(0, hostile=False)  # warm-up: first-time imports and connections, not counted
        baseline = operator.memory("VmRSS")
        sampler = RssSampler(operator)
        stack.callback(sampler.stop)
        # Alternating, each condition first in turn (Q H, H Q, ...), so a drift of the machine's load touches both.
        order = [c for pair in range(args.rounds) for c in ((False, True) if pair % 2 == 0 else (True, False))]
        rounds: list[dict[str, Any]] = []
        for index, hostile in enumerate(order, start=1):
            sampler.condition = "hostile" if hostile else "quiet"
            rounds.append(bench.run(index, hostile))
            sampler.condition = ""
            log.info("%s", json.dumps(rounds[-1]))
        peak = operator.memory("VmHWM")
    return summarise(args, kinds, rounds, baseline, peak, sampler.peaks) | {
        "machine": {
            "cpus": os.cpu_count(),
            "loadAverageAtStart": [round(x, 2) for x in load_at_start],
            "loadAverageAtEnd": [round(x, 2) for x in os.getloadavg()],
        },
        "seconds": round(time.monotonic() - started, 1),
        "operatorLog": str(workdir / "operator.log"),
    }


def summarise(
    args: argparse.Namespace,
    kinds: set[str],
    rounds: list[dict[str, Any]],
    baseline: int,
    peak: int,
    sampled: dict[str, int],
) -> dict[str, Any]:
    from sweep_operator import ray_jobs
    from sweep_operator.memory_budget import MemoryBudget

    def of(condition: str, what: str) -> list[float]:
        return [r[what] for r in rounds if r["condition"] == condition]

    deadline = ray_jobs.TIMEOUT_S
    budget = MemoryBudget.from_limit(LIMIT_BYTES, verifications=10, readers=18)  # as the memory-budget test sizes it
    summary: dict[str, Any] = {}
    goal: dict[str, Any] = {"rule": f"hostile median <= {GOAL_FACTOR} x quiet median + {deadline:g} s"}
    for what, key in (("stop", "stopSeconds"), ("deletion", "deletionSeconds")):
        quiet, hostile = median(of("quiet", key)), median(of("hostile", key))
        limit = round(GOAL_FACTOR * quiet + deadline, 3)
        summary[what] = {
            "quietMedianSeconds": quiet,
            "hostileMedianSeconds": hostile,
            "ratio": round(hostile / quiet, 2) if quiet else None,
            "goalSeconds": limit,
            "hostileBeyondOneDeadlineSeconds": round(hostile - deadline, 3),
            "quietSamples": of("quiet", key),
            "hostileSamples": of("hostile", key),
        }
        goal[f"{what}Met"] = hostile <= limit
    growth = peak - baseline
    memory_report = {
        "limitMiB": LIMIT_BYTES // MiB,
        "tenantBudgetMiB": budget.tenant_bytes // MiB,
        "baselineRssMiB": round(baseline / MiB, 1),
        "peakRssMiB": round(peak / MiB, 1),
        "growthMiB": round(growth / MiB, 1),
        "peakSampledRssMiB": {k: round(v / MiB, 1) for k, v in sampled.items()},
    }
    goal["memoryMet"] = growth < budget.tenant_bytes and peak < LIMIT_BYTES
    goal["met"] = goal["stopMet"] and goal["deletionMet"] and goal["memoryMet"]
    hostile_rounds = [r["hostile"] for r in rounds if "hostile" in r]
    evidence = {
        k: sum(h[k] for h in hostile_rounds) for k in ("headRequests", "gracefulStopFailed", "runDocumentTooLarge")
    }
    for h in hostile_rounds:
        for kind, count in h["verificationProblems"].items():
            evidence[f"verificationProblems.{kind}"] = evidence.get(f"verificationProblems.{kind}", 0) + count
    return {
        "bench": "noisy_neighbours",
        "roundsPerCondition": args.rounds,
        "hostileNamespaces": args.hostile,
        "hostileKinds": sorted(kinds),
        "callDeadlineSeconds": deadline,
        **summary,
        "goal": goal,
        "memory": memory_report,
        "hostileEvidence": evidence,
        "rounds": rounds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="quiet-namespace sweeps per condition")
    parser.add_argument("--hostile", type=int, default=8, help="hostile namespaces in a hostile round")
    parser.add_argument(
        "--hostile-kinds",
        default=",".join(sorted(HOSTILE_KINDS)),
        help="what the hostile namespaces do (heads: trickling Jobs API replies; status: 16 MiB status.json; "
        "states: 40 x 4 MiB Tune experiment states)",
    )
    parser.add_argument("--operator-verbose", action="store_true", help="the operator logs at DEBUG")
    parser.add_argument("--trace", action="store_true", help="log each round's changes of the quiet namespace")
    parser.add_argument("--serve-s3", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_s3:
        return serve_s3()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("aiohttp.access", "kubernetes", "urllib3"):  # a line per request would slow the emulator down
        logging.getLogger(noisy).setLevel(logging.WARNING)
    print(json.dumps(measure(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
