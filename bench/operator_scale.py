"""Benchmark: N TrainingSweeps applied at once against the Kubernetes API emulator with the scripted KubeRay stand-in.

    .venv/bin/python bench/operator_scale.py [--sizes 100,500,1000] [--quick]

Per size: (a) seconds until every sweep's RayJob exists vs the floor (N RayJob-sized creates through the kubernetes
client against a fresh emulator), (b) p50/p99 apply -> RayJob latency, (c) the operator's peak RSS (it runs as its own
process, `python -m sweep_operator`), (d) duplicate/lost RayJobs. Prints one JSON object; logs go to stderr.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support.* (the sweep factory)
sys.path.insert(0, str(REPO / "operator"))  # sweep_operator, when run without the editable install

from sweep_contracts import constants
from sweep_sandbox import emulator as emu

log = logging.getLogger("operator_scale")

NAMESPACE = "bench"
WARMUP_NAMESPACE = "bench-warmup"
BUCKET = "bench-operator-scale"
BENCH_AGENT = "operator-scale-bench"
TARGETS = {"ratio": 2.0, "p99Seconds": 2.0, "rssMiB": 250.0}
TARGET_SIZE = 1000
WATCHED_PLURALS = (constants.PLURAL, constants.RAYJOB_PLURAL, constants.RAYCLUSTER_PLURAL)
RAYJOB_KEY = emu.resource_key(constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYJOB_PLURAL)


# --------------------------------------------------------------------------------------------------------------------
# The emulator, instrumented: when each RayJob was created (server side) and who sent what


class TimedChangeLog(emu.ChangeLog):
    """The emulator's change log, also noting when each RayJob was ADDED (monotonic clock, this process)."""

    def __init__(self) -> None:
        super().__init__()
        self.rayjobs_added: list[tuple[float, str, str, str]] = []  # (time, namespace, name, sweep label)
        self.mutations: Counter[str] = Counter()

    def append(self, change: emu.Change) -> None:
        if change.resource == RAYJOB_KEY and change.type == "ADDED":
            meta = change.obj["metadata"]
            label = (meta.get("labels") or {}).get(constants.LABEL_SWEEP, "")
            self.rayjobs_added.append((time.monotonic(), change.namespace or "", meta["name"], label))
        self.mutations[f"{change.resource.plural}:{change.type}"] += 1
        super().append(change)


@attrs.define(kw_only=True)
class CountingEmulator(emu.KubernetesApiEmulator):
    """Counts requests by client (user agent) and verb; they run in the server's loop, so no lock is needed."""

    requests: Counter[str] = attrs.field(factory=Counter)

    def _remember(self, raw: Any, body: bytes, target: Any, verb: str) -> Any:
        agent = raw.headers.get("User-Agent", "")
        who = (
            "kopf"
            if agent.startswith("kopf")
            else "kuberay-standin"
            if agent.startswith("kuberay")
            else "bench"
            if agent == BENCH_AGENT
            else "operator-controller"
        )
        self.requests[f"{who} {verb} {target.plural if target else 'discovery'}"] += 1
        return super()._remember(raw, body, target, verb)


def start_emulator() -> tuple[emu.EmulatorServer, CountingEmulator, TimedChangeLog]:
    changes = TimedChangeLog()
    emulator = CountingEmulator(request_log_limit=0, changes=changes)
    for crd in (emu.sweep_crd(), *emu.KUBERAY_CRDS, *emu.KOPF_PEERING_CRDS):
        emulator.install_crd(crd)
    for namespace in ("default", "kube-system"):
        emulator.ensure_namespace(namespace)
    server = emu.EmulatorServer(emulator)
    server.start()
    return server, emulator, changes


def bench_client(server: emu.EmulatorServer) -> Any:
    import kubernetes

    api_client = server.api_client()
    api_client.user_agent = BENCH_AGENT
    return kubernetes.client.CustomObjectsApi(api_client)


# --------------------------------------------------------------------------------------------------------------------
# Objects


# --gpu: each sweep one trial at a time on one GPU worker that stays up (minReplicas 1), so the stand-in's pods are
# GPU pods and the operator measures their GPU-hours as on EKS: a head pod and a g5.xlarge worker per sweep.
GPU_SWEEP = {
    "spec.trial.workers": 1,
    "spec.trial.resourcesPerWorker": {"cpu": "2", "gpu": 1, "memory": "8Gi"},
    "spec.tune.maxConcurrentTrials": 1,
    "spec.workerGroup.instanceType": "g5.xlarge",
    "spec.workerGroup.minReplicas": 1,
}


def sweep_doc(name: str, namespace: str, s3_endpoint: str, *, gpu: bool = False) -> dict[str, Any]:
    from tests.support.factories import changed, cpu_sweep

    return changed(
        cpu_sweep(name, namespace),
        {
            "spec.storage.uri": f"s3://{BUCKET}/sweeps",
            "spec.storage.endpointUrl": s3_endpoint,
            "spec.storage.region": "us-east-1",
            "spec.tune.numSamples": 2,
            **(GPU_SWEEP if gpu else {}),
        },
    )


def rayjob_like(name: str) -> dict[str, Any]:
    """A RayJob as the operator renders it (same size), without the ownerReference (no owner exists here)."""
    from sweep_operator.rendering import build_rayjob, new_run_id
    from sweep_operator.validation import parse_sweep

    rayjob = build_rayjob(
        parse_sweep(sweep_doc("floor", NAMESPACE, "http://127.0.0.1:1")),
        new_run_id(),
        deadline_at=int(time.time()) + 3600,
    )
    rayjob["metadata"].pop("ownerReferences", None)
    rayjob["metadata"]["name"] = name
    labels = rayjob["metadata"]["labels"]
    labels[constants.LABEL_SWEEP] = name
    return rayjob


# --------------------------------------------------------------------------------------------------------------------
# Measurements


def measure_floor(n: int) -> dict[str, Any]:
    """N RayJob-sized creates, one after another, through the kubernetes client against a fresh emulator."""
    server, emulator, _ = start_emulator()
    try:
        custom = bench_client(server)
        template = rayjob_like("floor-template")
        bodies = []
        for i in range(n):
            body = copy.deepcopy(template)
            body["metadata"]["name"] = body["metadata"]["labels"][constants.LABEL_SWEEP] = f"floor-{i:05d}"
            bodies.append(body)
        started = time.monotonic()
        for body in bodies:
            custom.create_namespaced_custom_object(
                constants.RAY_GROUP, constants.RAY_VERSION_API, NAMESPACE, constants.RAYJOB_PLURAL, body
            )
        seconds = time.monotonic() - started
        size = len(json.dumps(template))
    finally:
        server.stop()
    return {"seconds": round(seconds, 3), "createsPerSecond": round(n / seconds, 1), "rayjobBytes": size}


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM/VmRSS (KiB) of a live process."""
    values = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0])
    except OSError:
        pass
    return values


def proc_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


class OperatorProcess:
    """`python -m sweep_operator --kubeconfig K` as its own process (so its RSS is its own); log to a file."""

    COMMANDS = {
        "sweep": [sys.executable, "-m", "sweep_operator"],
        "bare": [sys.executable, str(REPO / "bench" / "bare_kopf_operator.py")],  # the yardstick (see its docstring)
        # The requests the promises need and nothing else (see its docstring): the yardstick the operator is read against.
        "same-writes": [sys.executable, str(REPO / "bench" / "same_writes_operator.py")],
    }

    def __init__(self, kubeconfig: Path, log_path: Path, env: dict[str, str], kind: str = "sweep") -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [*self.COMMANDS[kind], "--kubeconfig", str(kubeconfig)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # kopf stops gracefully on SIGTERM
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()

    def log_summary(self) -> dict[str, Any]:
        lines = self.log_path.read_text(errors="replace").splitlines()
        errors = [line for line in lines if " ERROR " in line]
        warnings = [line for line in lines if " WARNING " in line]
        return {
            "lines": len(lines),
            "errors": len(errors),
            "warnings": len(warnings),
            "lastErrors": [line[:300] for line in errors[-3:]],
            "tail": [line[:300] for line in lines[-8:]] if not self.alive() else [],  # how a dead one ended
        }


class Profiler:
    """py-spy (pinned in the dev extra) sampling the operator from the warm-up's end until every RayJob exists,
    with `--gil` (what holds the interpreter: the operator's CPU, not its waits); a speedscope/flamegraph file."""

    def __init__(self, pid: int, path: str) -> None:
        py_spy = Path(sys.executable).with_name("py-spy")
        fmt = "speedscope" if path.endswith(".json") else "raw" if path.endswith(".txt") else "flamegraph"
        self.proc = subprocess.Popen(
            [str(py_spy), "record", "--pid", str(pid), "--gil", "--rate", "200", "--format", fmt, "-o", path],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.5)  # attached before the apply starts

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def stop_child(proc: subprocess.Popen[str]) -> None:
    """A child serving until its stdin closes: close it, wait, kill if it lingers."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class S3Child:
    """moto in a child process (its own GIL): the operator's progress reads get quick 404s, never hangs."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-s3"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.endpoint = json.loads(self.proc.stdout.readline())["endpoint"]

    def counts(self) -> Counter[str]:
        """Requests answered so far, by method and status ("GET 200", "GET 304", "PUT 200", ...)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("counts\n")
        self.proc.stdin.flush()
        return Counter(json.loads(self.proc.stdout.readline()))

    def stop(self) -> None:
        stop_child(self.proc)


class StandInChild:
    """The scripted KubeRay stand-in in its own process, as KubeRay is its own process in a cluster: its work
    then competes with the apply for the machine's cores, not for the emulator's interpreter lock."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve-standin",
                url,
                "--run-seconds",
                str(args.run_seconds),
                "--startup-seconds",
                str(args.startup_seconds),
                *(["--gpu"] if args.gpu else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the KubeRay stand-in did not start")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop_child(self.proc)


def serve_standin(url: str, args: argparse.Namespace) -> int:
    from sweep_sandbox.emulator import make_api_client
    from sweep_sandbox.kuberay import KubeRayStandIn, Outcome, ScriptedRunner

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    runner = ScriptedRunner(default=Outcome.succeed(args.run_seconds, startup=args.startup_seconds))
    standin = KubeRayStandIn(make_api_client(url), runner, poll_interval=0.5, emulate_pods=args.gpu).start()
    try:
        print("ready", flush=True)
        sys.stdin.read()  # until the parent closes our stdin
    finally:
        standin.stop()
    return 0


class CountingS3:
    """moto's WSGI app, counting requests by method and answer (GET 200: downloaded; GET 304: not modified)."""

    def __init__(self, app: Any) -> None:
        self.app, self.counts = app, Counter[str]()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        method = environ.get("REQUEST_METHOD", "?")

        def counted(status: str, headers: Any, *rest: Any) -> Any:
            self.counts[f"{method} {status.split()[0]}"] += 1
            return start_response(status, headers, *rest)

        return self.app(environ, counted)


def serve_s3() -> int:
    from sweep_sandbox.s3server import SANDBOX_CREDENTIALS, S3Server

    for key, value in SANDBOX_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    server = S3Server().start()
    wsgi = server._server._server  # ThreadedMotoServer's werkzeug server: count what it answers
    counting = CountingS3(wsgi.app)
    wsgi.app = counting
    try:
        server.client().create_bucket(Bucket=BUCKET)
        print(json.dumps({"endpoint": server.endpoint_url}), flush=True)
        for line in sys.stdin:  # "counts": what was answered so far; the parent closing stdin stops the server
            if line.strip() == "counts":
                print(json.dumps(dict(counting.counts)), flush=True)
    finally:
        server.stop()
    return 0


def operator_paths(args: argparse.Namespace) -> tuple[str, ...]:
    """Where the operator process imports sweep_operator (and, from another checkout, its sweep_contracts) from."""
    tree = getattr(args, "operator_tree", None)
    if tree is None:
        return (str(REPO / "operator"),)
    return (str(tree.resolve() / "operator"), str(tree.resolve() / "contracts"))


def operator_env(s3_endpoint: str, args: argparse.Namespace) -> dict[str, str]:
    from sweep_sandbox.s3server import SANDBOX_CREDENTIALS

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWEEP_", "KUBECONFIG", "AWS_"))}
    env.update(SANDBOX_CREDENTIALS)
    env.update(
        {
            "SWEEP_METRICS_PORT": "0",
            "SWEEP_LIVENESS_PORT": "0",
            "SWEEP_S3_ENDPOINT_URL": s3_endpoint,
            "SWEEP_S3_REGION": "us-east-1",
            "SWEEP_RECONCILE_SECONDS": str(args.reconcile_seconds),
            "PYTHONPATH": os.pathsep.join(p for p in (*operator_paths(args), env.get("PYTHONPATH", "")) if p),
        }
    )
    if args.kopf_untuned:  # the caller's SWEEP_* are dropped above, so the switch is passed on here
        env["SWEEP_KOPF_UNTUNED"] = "1"
    if args.gc_untuned:
        env["SWEEP_GC_UNTUNED"] = "1"
    if getattr(args, "gpu", False):  # every sweep admitted at once: the namespace's GPU cap is not what is measured
        env["SWEEP_MAX_GPUS_PER_NAMESPACE"] = str(1_000_000)
    return env


# The chart's webhooks as the API server calls them (bench --webhooks): the settings the chart's ConfigMap gives the
# operator for them, and the kinds installed. The guard's ValidatingAdmissionPolicy stays out: it is the API server's
# CEL, not the operator's work, and the emulator's CEL would only slow the emulator.
WEBHOOK_SETTINGS = (
    "SWEEP_OPERATOR_NAMESPACE",
    "SWEEP_WEBHOOK_CERT_SECRET",
    "SWEEP_WEBHOOK_SERVICE",
    "SWEEP_WEBHOOK_CONFIGURATIONS",
)
WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")


def install_webhooks(server: emu.EmulatorServer, tmp: Path) -> dict[str, str]:
    """The chart's webhook configurations (validation, the guard's finalizer) and certificate Secret in the emulator,
    its webhook Service routed to a port of this machine; returns the operator's environment to serve them there
    (the certificate made and injected by the operator itself, certProvider operator)."""
    from sweep_sandbox import chart_admission

    docs = [
        d
        for d in chart_admission.render()
        if d["kind"] not in chart_admission.ADMISSION_KINDS or d["kind"] in WEBHOOK_KINDS
    ]
    port = chart_admission.free_port()
    chart_admission.install(server, docs, port)
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and "SWEEP_WEBHOOK_SERVICE" in (d.get("data") or {})]
    env = {key: config["data"][key] for key in WEBHOOK_SETTINGS}
    env.update(
        SWEEP_WEBHOOK_PORT=str(port),
        SWEEP_WEBHOOK_CERT_DIR=str(tmp / "webhook-tls"),
        SWEEP_WEBHOOK_CERT_CHECK_SECONDS="1",
    )
    return env


def wait_rayjobs(
    changes: TimedChangeLog, namespace: str, names: set[str], timeout: float, operator: OperatorProcess
) -> float | None:
    """Monotonic time at which every sweep in `names` had a RayJob; None on timeout or operator exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = {label for _, ns, _, label in list(changes.rayjobs_added) if ns == namespace}
        if names <= seen:
            return max(t for t, ns, _, label in list(changes.rayjobs_added) if ns == namespace and label in names)
        if not operator.alive():
            return None
        time.sleep(0.05)
    return None


# What one running sweep may cost per minute once every RayJob runs (`--steady`). A running sweep needs its progress
# read and its pods listed once per statusPollSeconds (15 s by default): 4 Kubernetes requests a minute (the pod
# lists; a status write only when something changed), and its ticks (every reconcileSeconds) cost nothing when
# nothing is due. CPU: 4 polls of at most 5 ms each (a pass, a pod list, the S3 reads) is 20 ms a minute, so
# 1,000 running sweeps take a third of one core at most.
STEADY_BUDGET = {"requestsPerSweepMinute": 4.0, "cpuMsPerSweepMinute": 20.0}


REPORTS_BEFORE_WINDOW = 3


class ProgressWriter:
    """Writes each running sweep's `_sweep/status.json` as its driver does: a document that changes when a trial
    reports (every `every_s` seconds per sweep, the sweeps spread over that interval), never rewritten unchanged."""

    def __init__(self, endpoint: str, roots: list[str], every_s: float) -> None:
        import boto3

        from sweep_contracts.s3_layout import RunLayout, S3Uri
        from sweep_sandbox.s3server import SANDBOX_CREDENTIALS

        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=SANDBOX_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=SANDBOX_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        self.roots = roots
        self.targets = [S3Uri.parse(RunLayout(root).status_path) for root in roots]
        self.every_s, self.writes = every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress-writer", daemon=True)

    def document(self, index: int, reports: int) -> bytes:
        from training_entrypoints.progress import TrialSummary, status_document

        def checkpoint(trial: str) -> str:  # each report checkpoints, as a loop the operator need not warn about
            return f"{self.roots[index]}/train/{trial}/checkpoint_epoch-{reports:06d}"

        names = [f"t{index:05d}_{k}" for k in range(2)]
        trials = [
            TrialSummary(
                name, "RUNNING", {"lr": 0.01 * (k + 1)}, 1.0 / (reports + 1), checkpoint(name), None, reports + 1
            )
            for k, name in enumerate(names)
        ]
        return json.dumps(status_document(trials, "val_loss", "min")).encode()

    def write_all(self, reports: int) -> None:
        for index, uri in enumerate(self.targets):
            self.client.put_object(Bucket=uri.bucket, Key=uri.key, Body=self.document(index, reports))
            self.writes += 1

    def start(self) -> ProgressWriter:
        # Every run has reported a few times before the window (past the checkpoint-coverage threshold, whose
        # condition is set once): the window sees a steady run's documents, not its first reports.
        self.write_all(REPORTS_BEFORE_WINDOW)
        self._thread.start()
        return self

    def _run(self) -> None:
        reports, gap = REPORTS_BEFORE_WINDOW + 1, self.every_s / max(1, len(self.targets))
        while not self._stop.is_set():
            for index, uri in enumerate(self.targets):
                if self._stop.wait(gap):
                    return
                self.client.put_object(Bucket=uri.bucket, Key=uri.key, Body=self.document(index, reports))
                self.writes += 1
            reports += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def run_roots(server: emu.EmulatorServer) -> list[str]:
    """Each sweep's run root as the operator recorded it (status.guard.runRoot)."""
    items = bench_client(server).list_namespaced_custom_object(
        constants.GROUP, constants.VERSION, NAMESPACE, constants.PLURAL
    )["items"]
    return [r for o in items if (r := ((o.get("status") or {}).get("guard") or {}).get("runRoot"))]


def mirrored(custom: Any) -> int:
    """Sweeps whose status shows a best trial (their progress document was read and mirrored)."""
    items = custom.list_namespaced_custom_object(constants.GROUP, constants.VERSION, NAMESPACE, constants.PLURAL)
    return sum(1 for o in items["items"] if (o.get("status") or {}).get("bestTrial"))


def measure_steady(
    server: emu.EmulatorServer,
    emulator: CountingEmulator,
    changes: TimedChangeLog,
    operator: OperatorProcess,
    n: int,
    args: argparse.Namespace,
    s3: S3Child | None = None,
) -> dict[str, Any]:
    """The operator's cost with N running sweeps: CPU and requests over `args.steady` seconds once every sweep's
    RayJob is Running (the stand-in keeps their jobs running for --run-seconds)."""
    custom = bench_client(server)

    def running() -> int:  # RayJobs the stand-in runs (the bare operator writes no sweep status to count)
        items = custom.list_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, NAMESPACE, constants.RAYJOB_PLURAL
        )
        return sum(
            1
            for o in items["items"]
            if (o.get("status") or {}).get("jobDeploymentStatus") == "Running"
            and (o.get("status") or {}).get("jobStatus") == "RUNNING"  # the job's own first transition is in too
        )

    def sweep_changes() -> int:
        return server.call(lambda: changes.mutations[f"{constants.PLURAL}:MODIFIED"])

    # The stand-in makes each cluster's pods too with --gpu (a head and a worker each): it needs longer.
    deadline = time.monotonic() + max(120.0, n * (0.6 if args.gpu else 0.2))
    said = time.monotonic()
    while (count := running()) < n and time.monotonic() < deadline and operator.alive():
        if time.monotonic() - said >= 30:
            log.info("steady state: %d of %d RayJobs Running", count, n)
            said = time.monotonic()
        time.sleep(1.0)
    # Then until the operator has mirrored those transitions: no sweep written for two seconds (bounded), so the
    # window measures a steady state, not the tail of the burst.
    quiet_by = time.monotonic() + 60.0
    last = sweep_changes()
    while time.monotonic() < quiet_by and operator.alive():
        time.sleep(2.0)
        now = sweep_changes()
        if now == last:
            break
        last = now
    writer = None
    if args.progress_every and s3 is not None and (roots := run_roots(server)):
        writer = ProgressWriter(s3.endpoint, roots, args.progress_every).start()
        # Every sweep's first document mirrored (its best trial shows) before the window: the window measures the
        # rhythm of the documents' changes, not the first reads of documents that did not exist before.
        mirrored_by = time.monotonic() + max(120.0, n * 0.2)
        while (seen := mirrored(custom)) < n and time.monotonic() < mirrored_by and operator.alive():
            time.sleep(2.0)
        log.info("steady state: the first progress of %d of %d sweeps mirrored", seen, n)
        time.sleep(min(args.progress_every, 30.0))
    log.info("steady state: %d of %d RayJobs Running; measuring %.0f s", count, n, args.steady)
    s3_before = s3.counts() if s3 is not None else Counter()
    cpu_before = proc_cpu_seconds(operator.pid)
    requests_before = server.call(lambda: Counter(emulator.requests))
    mutations_before = server.call(lambda: Counter(changes.mutations))
    profiler = Profiler(operator.pid, args.profile_steady) if args.profile_steady else None
    started = time.monotonic()
    time.sleep(args.steady)
    seconds = time.monotonic() - started
    cpu = proc_cpu_seconds(operator.pid) - cpu_before
    s3_requests = (s3.counts() if s3 is not None else Counter()) - s3_before
    if writer is not None:
        writer.stop()
    if profiler is not None:
        profiler.stop()
    requests = server.call(lambda: Counter(emulator.requests)) - requests_before
    ours = Counter({k: v for k, v in requests.items() if k.startswith(("kopf ", "operator-controller "))})
    mutations = server.call(lambda: Counter(changes.mutations)) - mutations_before
    minutes = seconds / 60
    per_sweep_minute = {
        "requestsPerSweepMinute": round(sum(ours.values()) / n / minutes, 3),
        "cpuMsPerSweepMinute": round(cpu * 1000 / n / minutes, 3),
    }
    gets = sum(v for k, v in s3_requests.items() if k.startswith("GET "))
    s3_figures = {
        "s3Requests": dict(s3_requests.most_common()),
        "progressDocumentsWritten": writer is not None,
        "s3GetsPerSweepMinute": round(gets / n / minutes, 3),
        "s3DownloadsPerSweepMinute": round(s3_requests.get("GET 200", 0) / n / minutes, 3),
        "progressWritesPerSweepMinute": round(
            sum(v for k, v in s3_requests.items() if k.startswith("PUT ")) / n / minutes, 3
        ),
    }
    return {
        "rayJobsRunning": count,
        "seconds": round(seconds, 1),
        "operatorCpuSecondsPerMinute": round(cpu / minutes, 3),
        "operatorRequestsPerMinute": round(sum(ours.values()) / minutes, 1),
        "operatorRequests": dict(ours.most_common()),
        "changesPerMinute": {k: round(v / minutes, 1) for k, v in mutations.most_common()},
        **per_sweep_minute,
        **s3_figures,
        "budget": STEADY_BUDGET,
        "withinBudget": all(per_sweep_minute[k] <= STEADY_BUDGET[k] for k in STEADY_BUDGET),
        "reconcileSeconds": args.reconcile_seconds,
    }


def measure_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    from sweep_sandbox.kuberay import KubeRayStandIn, Outcome, ScriptedRunner

    log.info("size %d: floor (%d RayJob-sized creates on a fresh emulator)", n, n)
    floor = measure_floor(n)
    log.info("size %d: floor %.2fs (%.0f creates/s)", n, floor["seconds"], floor["createsPerSecond"])
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as tmp, ExitStack() as stack:  # processes stop first
        s3 = S3Child()
        stack.callback(s3.stop)
        server, emulator, changes = start_emulator()
        stack.callback(server.stop)
        standin: StandInChild | None = None
        if args.standin == "process":
            standin = StandInChild(server.url, args)
            stack.callback(standin.stop)
        elif args.standin == "thread":
            runner = ScriptedRunner(default=Outcome.succeed(args.run_seconds, startup=args.startup_seconds))
            standin_thread = KubeRayStandIn(server.api_client(), runner, poll_interval=0.5, emulate_pods=args.gpu)
            stack.callback(standin_thread.start().stop)
        kubeconfig = server.write_kubeconfig(Path(tmp) / "kubeconfig", namespace=NAMESPACE)
        env = operator_env(s3.endpoint, args)
        if args.webhooks:
            env.update(install_webhooks(server, Path(tmp)))
        operator = OperatorProcess(kubeconfig, Path(tmp) / "operator.log", env, args.operator)
        if args.keep_log:
            stack.callback(shutil.copyfile, operator.log_path, args.keep_log)
        stack.callback(operator.stop)
        if args.webhooks:
            from sweep_sandbox.chart_admission import wait_for_webhook

            wait_for_webhook(server, timeout=120)
        custom = bench_client(server)

        # Warm-up: one sweep elsewhere proves the operator watches and acts (imports, login, watch streams done).
        custom.create_namespaced_custom_object(
            constants.GROUP,
            constants.VERSION,
            WARMUP_NAMESPACE,
            constants.PLURAL,
            sweep_doc("warmup", WARMUP_NAMESPACE, s3.endpoint, gpu=args.gpu),
        )
        if wait_rayjobs(changes, WARMUP_NAMESPACE, {"warmup"}, 120, operator) is None:
            raise RuntimeError(f"the operator did not create the warm-up RayJob; log: {operator.log_summary()}")
        rss_before = proc_status(operator.pid)
        cpu_before = proc_cpu_seconds(operator.pid)
        bench_cpu_before = proc_cpu_seconds(os.getpid())
        standin_cpu_before = proc_cpu_seconds(standin.pid) if standin else 0.0
        requests_before = server.call(lambda: Counter(emulator.requests))
        mutations_before = server.call(lambda: Counter(changes.mutations))
        profiler = Profiler(operator.pid, args.profile) if args.profile else None

        docs = [sweep_doc(f"s{i:05d}", NAMESPACE, s3.endpoint, gpu=args.gpu) for i in range(n)]
        applied: dict[str, float] = {}
        log.info("size %d: applying %d sweeps", n, n)
        started = time.monotonic()
        for doc in docs:
            custom.create_namespaced_custom_object(constants.GROUP, constants.VERSION, NAMESPACE, constants.PLURAL, doc)
            applied[doc["metadata"]["name"]] = time.monotonic()
        apply_seconds = time.monotonic() - started
        log.info("size %d: applied in %.2fs; waiting for RayJobs", n, apply_seconds)
        timeout = args.timeout or max(120.0, n * 0.5)
        all_exist_at = wait_rayjobs(changes, NAMESPACE, set(applied), timeout, operator)
        total = (all_exist_at - started) if all_exist_at is not None else None
        cpu_at_all = proc_cpu_seconds(operator.pid)
        bench_cpu_at_all = proc_cpu_seconds(os.getpid())
        standin_cpu_at_all = proc_cpu_seconds(standin.pid) if standin else 0.0
        waited_until = time.monotonic()
        created_by_then = len({label for _, ns, _, label in list(changes.rayjobs_added) if ns == NAMESPACE})
        if profiler is not None:
            profiler.stop()
        requests_to_all = server.call(lambda: Counter(emulator.requests)) - requests_before
        events_to_all = server.call(lambda: Counter(changes.mutations)) - mutations_before
        log.info(
            "size %d: every RayJob exists after %s s; settling %.0fs (timers, stand-in transitions)",
            n,
            f"{total:.2f}" if total is not None else "-",
            args.settle,
        )
        time.sleep(args.settle)  # a duplicate would come from a later event or timer, so give them time
        steady = measure_steady(server, emulator, changes, operator, n, args, s3) if args.steady else None

        rss = proc_status(operator.pid)
        cpu_total = proc_cpu_seconds(operator.pid)
        operator_alive = operator.alive()
        listed = custom.list_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, NAMESPACE, constants.RAYJOB_PLURAL
        )["items"]
        live_per_sweep = Counter((o["metadata"].get("labels") or {}).get(constants.LABEL_SWEEP, "") for o in listed)
        created_per_sweep: dict[str, list[float]] = defaultdict(list)
        for t, ns, _, label in list(changes.rayjobs_added):
            if ns == NAMESPACE:
                created_per_sweep[label].append(t)
        latencies = [min(created_per_sweep[name]) - at for name, at in applied.items() if created_per_sweep.get(name)]
        duplicates = sorted(
            name for name in applied if len(created_per_sweep.get(name, [])) > 1 or live_per_sweep.get(name, 0) > 1
        )
        lost = sorted(name for name in applied if live_per_sweep.get(name, 0) == 0)
        never_created = sorted(name for name in applied if not created_per_sweep.get(name))
        operator_log = operator.log_summary()
        if args.operator_log:
            Path(args.operator_log).write_bytes(operator.log_path.read_bytes())

    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    watched = (constants.PLURAL,) if args.operator == "bare" else WATCHED_PLURALS  # the bare one watches sweeps only
    ratio = total / floor["seconds"] if total is not None else None
    peak_mib = rss.get("VmHWM", 0) / 1024
    met = {
        "ratio": ratio is not None and ratio <= TARGETS["ratio"],
        "p99": bool(latencies) and len(latencies) == n and p99 <= TARGETS["p99Seconds"],
        "rss": peak_mib <= TARGETS["rssMiB"],
        "noDuplicateOrLost": not duplicates and not lost and not never_created,
    }
    return {
        "sweeps": n,
        "floorSeconds": floor["seconds"],
        "floor": floor,
        "applySeconds": round(apply_seconds, 3),
        "allRayJobsSeconds": round(total, 3) if total is not None else None,
        "ratio": round(ratio, 2) if ratio is not None else None,
        "latencySeconds": {
            "p50": round(p50, 3),
            "p99": round(p99, 3),
            "max": round(max(latencies), 3) if latencies else None,
            "mean": round(sum(latencies) / len(latencies), 3) if latencies else None,
            "count": len(latencies),
        },
        "operator": {
            "peakRssMiB": round(peak_mib, 1),
            "rssMiB": round(rss.get("VmRSS", 0) / 1024, 1),
            "rssBeforeMiB": round(rss_before.get("VmRSS", 0) / 1024, 1),
            "cpuSecondsUntilAllRayJobs": round(cpu_at_all - cpu_before, 2),
            "cpuSecondsPerSweep": round((cpu_at_all - cpu_before) / n, 4),
            "cpuSecondsTotal": round(cpu_total - cpu_before, 2),
            "alive": operator_alive,
            "log": operator_log,
        },
        "rayjobs": {
            "live": sum(live_per_sweep[name] for name in applied),
            "duplicates": len(duplicates),
            "lost": len(lost),
            "neverCreated": len(never_created),
            "examples": (duplicates + lost)[:5],
        },
        "benchProcessCpuSecondsUntilAllRayJobs": round(
            bench_cpu_at_all - bench_cpu_before, 2
        ),  # emulator + applies (+ stand-in in a thread)
        "standInProcessCpuSecondsUntilAllRayJobs": round(standin_cpu_at_all - standin_cpu_before, 2),
        "waitedSeconds": round(waited_until - started, 2),
        "sweepsWithRayJobWhenWaitEnded": created_by_then,
        "requestsUntilAllRayJobs": dict(requests_to_all.most_common()),
        "requestsPerSweep": round(sum(requests_to_all.values()) / n, 2),
        "operatorRequestsPerSweep": round(
            sum(v for k, v in requests_to_all.items() if k.startswith(("kopf ", "operator-controller "))) / n, 2
        ),
        # Watch events into the operator: changes of the kinds it watches (sweeps, RayJobs, RayClusters).
        "watchedChangesUntilAllRayJobs": dict(events_to_all.most_common()),
        "watchedEventsPerSweep": round(sum(v for k, v in events_to_all.items() if k.split(":")[0] in watched) / n, 2),
        "met": met,
        **({"steady": steady} if steady is not None else {}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,500,1000", help="comma-separated sweep counts (default 100,500,1000)")
    parser.add_argument("--quick", action="store_true", help="one 50-sweep smoke run")
    parser.add_argument(
        "--reconcile-seconds", type=float, default=10.0, help="SWEEP_RECONCILE_SECONDS (operator default 10)"
    )
    parser.add_argument(
        "--run-seconds",
        type=float,
        default=3600.0,
        help="how long each scripted Ray job runs (default: longer than the benchmark, as real sweeps)",
    )
    parser.add_argument("--startup-seconds", type=float, default=0.5, help="scripted cluster startup time")
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="GPU sweeps (one g5.xlarge worker each, kept up) and the stand-in creating every cluster's pods: the "
        "operator reads them for GPU-hours as on a cluster",
    )
    parser.add_argument("--settle", type=float, default=12.0, help="seconds to keep watching for duplicates afterwards")
    parser.add_argument(
        "--timeout", type=float, default=0.0, help="seconds to wait for every RayJob (default max(120, N/2))"
    )
    parser.add_argument(
        "--steady",
        type=float,
        default=0.0,
        help="after the burst, seconds of steady state to measure with every sweep Running (CPU and requests per "
        "minute, against STEADY_BUDGET); 0: none",
    )
    parser.add_argument(
        "--progress-every",
        type=float,
        default=60.0,
        help="with --steady: each running sweep's status.json changes every this many seconds, written as a driver "
        "does (a trial's report); 0: no progress documents (the operator's reads find none)",
    )
    parser.add_argument("--operator-log", default="", help="copy the (last size's) operator log here")
    parser.add_argument(
        "--operator",
        choices=sorted(OperatorProcess.COMMANDS),
        default="sweep",
        help="sweep: the operator (default); bare: bench/bare_kopf_operator.py, kopf creating one RayJob per sweep and "
        "nothing else; same-writes: bench/same_writes_operator.py, kopf making per sweep the requests the operator's "
        "promises need, in its order, and nothing else",
    )
    parser.add_argument(
        "--profile",
        default="",
        help="py-spy --gil profile of the operator from the apply until every RayJob exists, written here "
        "(.txt: collapsed stacks, .json: speedscope, else an SVG flamegraph)",
    )
    parser.add_argument("--profile-steady", default="", help="as --profile, over the --steady window")
    parser.add_argument("--keep-log", default="", help="copy the operator's log here when it stops")
    parser.add_argument(
        "--kopf-untuned",
        action="store_true",
        help="run the operator with SWEEP_KOPF_UNTUNED=1: kopf's scheduler as it ships (to measure kopf_tuning)",
    )
    parser.add_argument(
        "--gc-untuned",
        action="store_true",
        help="run the operator with SWEEP_GC_UNTUNED=1: CPython's garbage collector as it ships (kopf_tuning.tune_gc)",
    )
    parser.add_argument(
        "--operator-tree",
        type=Path,
        help="run the operator (its operator/ and contracts/) from another checkout, e.g. a `git worktree` of an older "
        "commit, against this harness: a before/after pair with one emulator and stand-in",
    )
    parser.add_argument(
        "--webhooks",
        action="store_true",
        help="install the chart's webhook configurations in the emulator and have the operator serve them, as the "
        "chart deploys it: every sweep's create is validated and given the guard's finalizer by the operator's "
        "admission server (its CPU counts); not with --operator bare, which serves none",
    )
    parser.add_argument(
        "--standin",
        choices=("process", "thread", "none"),
        default="process",
        help="the scripted KubeRay stand-in in its own process (default, as KubeRay runs), in the "
        "benchmark's process (sharing the emulator's interpreter), or none (RayJobs stay as created)",
    )
    parser.add_argument("--serve-standin", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--serve-s3", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_s3:
        return serve_s3()
    if args.serve_standin:
        return serve_standin(args.serve_standin, args)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("kubernetes", "aiohttp.access", "urllib3"):  # a line per request would slow the emulator down
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.webhooks and args.operator != "sweep":
        parser.error(f"--webhooks: the {args.operator} operator serves no webhook (its creates would be refused)")
    sizes = [50] if args.quick else [int(s) for s in args.sizes.split(",") if s.strip()]
    load_before = os.getloadavg()
    results = [measure_size(n, args) for n in sizes]
    at_target = next((r for r in results if r["sweeps"] == TARGET_SIZE), None)
    report = {
        "benchmark": "operator_scale",
        "targets": {
            "atSweeps": TARGET_SIZE,
            "ratioMax": TARGETS["ratio"],
            "p99SecondsMax": TARGETS["p99Seconds"],
            "peakRssMiBMax": TARGETS["rssMiB"],
            "duplicatesOrLost": 0,
        },
        "settings": {
            "operator": args.operator,
            "operatorTree": str(args.operator_tree) if args.operator_tree else None,
            "kuberayStandIn": args.standin,
            "kopfTuned": not args.kopf_untuned,
            "webhooks": args.webhooks,
            "gcTuned": not args.gc_untuned,
            "reconcileSeconds": args.reconcile_seconds,
            "runSeconds": args.run_seconds,
            "startupSeconds": args.startup_seconds,
            "gpuWorkers": args.gpu,
            "settleSeconds": args.settle,
            "floor": "sequential creates of rendered RayJobs, one kubernetes client, fresh emulator",
        },
        "machine": {
            "cpus": os.cpu_count(),
            "loadavgBefore": [round(x, 2) for x in load_before],
            "loadavgAfter": [round(x, 2) for x in os.getloadavg()],
        },
        "summary": [
            {
                "sweeps": r["sweeps"],
                "ratio": r["ratio"],
                "p50": r["latencySeconds"]["p50"],
                "p99": r["latencySeconds"]["p99"],
                "peakRssMiB": r["operator"]["peakRssMiB"],
                "duplicates": r["rayjobs"]["duplicates"],
                "lost": r["rayjobs"]["lost"],
                "met": r["met"],
            }
            for r in results
        ],
        "sizes": results,
        "overall": {
            "targetSizeRun": at_target is not None,
            "targetsMet": at_target["met"] if at_target else None,
            "allTargetsMet": all(at_target["met"].values()) if at_target else None,
            "everySizeCorrect": all(r["met"]["noDuplicateOrLost"] for r in results),
        },
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
