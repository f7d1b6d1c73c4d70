"""`sweepctl sandbox up|run`: the product on 127.0.0.1 without a cluster (Kubernetes emulator, S3, operator, local Ray).

sweepctl sandbox up --state-dir .sandbox           # foreground; Ctrl-C stops everything it started
sweepctl sandbox run --sweep examples/digits-cpu.yaml --then-delete
sweepctl sandbox up --code my-loop/                 # your train loop's package on every job's PYTHONPATH
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep_contracts.api import Phase

from .code_path import code_dir, train_loop_dirs
from .common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, load_documents


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sandbox", help="run the operator, KubeRay and S3 on this machine (no cluster needed)")
    sub = p.add_subparsers(dest="sandbox_command", metavar="SUBCOMMAND", required=True)
    up = sub.add_parser(
        "up",
        help="start the sandbox in the foreground and drive it with kubectl",
        description="Start the sandbox in the foreground and drive it with kubectl. Jobs import your train loop "
        "(spec.trainLoop) from --code DIR, or from a PYTHONPATH set in this shell (PYTHONPATH=DIR sweepctl sandbox "
        "up), besides the installed packages.",
    )
    up.add_argument("--state-dir", default=".sandbox", help="where kubeconfig, env and job logs go (default .sandbox)")
    up.add_argument(
        "--kueue",
        action="store_true",
        help="also start a Kueue stand-in (ClusterQueue sandbox-cq, LocalQueue sandbox) and queue sweeps in it (docs/kueue.md)",
    )
    _budget_arguments(up)
    up.add_argument(
        "--scripted-jobs",
        type=float,
        metavar="SECONDS",
        help="no local Ray: each RayJob's job succeeds after SECONDS, its GPU pods emulated (GPU sweeps and budgets "
        "on a laptop)",
    )
    up.add_argument(
        "--mlflow",
        action="store_true",
        help="also start an MLflow tracking server (SQLite under the state dir) for sweeps to name in "
        "spec.tracking.mlflow.trackingUri (docs/tracking.md)",
    )
    _code_argument(up)
    up.set_defaults(func=run_up)
    run = sub.add_parser(
        "run",
        help="start the sandbox, run one sweep to the end, report, stop",
        description="Start the sandbox, run one sweep to the end, report, stop. The sweep's train loop "
        "(spec.trainLoop) is imported from --code DIR, else from the installed packages and PYTHONPATH, else from "
        "the manifest's own directory; found nowhere, nothing starts (exit 2).",
    )
    run.add_argument("--sweep", required=True, metavar="FILE", help="TrainingSweep manifest")
    run.add_argument(
        "--then-delete", action="store_true", help="delete the sweep at the end and show the guard's decision"
    )
    run.add_argument("--state-dir", help="keep kubeconfig, env and job logs here (default: a temporary directory)")
    run.add_argument("--timeout", type=float, help="seconds to wait for the sweep (default: its deadlines + 2 min)")
    run.add_argument(
        "--kueue",
        action="store_true",
        help="also start a Kueue stand-in (ClusterQueue sandbox-cq, LocalQueue sandbox) and queue sweeps in it (docs/kueue.md)",
    )
    run.add_argument(
        "--track",
        action="store_true",
        help="track the trials in the sandbox's MLflow server (spec.tracking.mlflow added, experiment named after the "
        "sweep, when the manifest asks for no tracking; docs/tracking.md)",
    )
    _code_argument(run)
    run.set_defaults(func=run_sweep)


def _code_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--code",
        metavar="DIR",
        help="the directory holding your train loop's package: first on the PYTHONPATH of every job the sandbox "
        "runs, driver and Ray workers (the same as PYTHONPATH=DIR in this shell)",
    )


def _budget_arguments(parser: argparse.ArgumentParser) -> None:
    """The operator's GPU-hour budget settings, as the chart's `budgets.*` values set them (docs/budgets.md)."""
    parser.add_argument(
        "--namespace-gpu-hours", type=float, metavar="H", help="GPU-hours every namespace may use per window"
    )
    parser.add_argument(
        "--namespace-gpu-hour-budget",
        action="append",
        default=[],
        metavar="NAMESPACE=H",
        help="a namespace's own GPU-hour budget (repeatable; 0: none there)",
    )
    parser.add_argument("--gpu-hours-window-seconds", type=int, metavar="S", help="the rolling window (default 7 days)")


def budget_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Operator settings from the budget arguments; a bad value is a usage error naming the option."""
    overrides: dict[str, Any] = {}
    if args.namespace_gpu_hours is not None:
        overrides["namespace_gpu_hours"] = args.namespace_gpu_hours
    if args.namespace_gpu_hour_budget:
        overrides["namespace_gpu_hour_budgets"] = tuple(args.namespace_gpu_hour_budget)
    if args.gpu_hours_window_seconds is not None:
        overrides["gpu_hours_window_seconds"] = args.gpu_hours_window_seconds
    if overrides:
        import dataclasses

        from ..settings import Settings

        try:
            dataclasses.replace(Settings(), **overrides)  # the operator's own checks, before anything starts
        except ValueError as exc:
            raise UsageError(f"sweepctl sandbox up: {exc}") from None
    return overrides


def _quiet_logs(state_dir: Path) -> Path:
    """Operator, kopf and server logs go to state_dir/sandbox.log; the console shows the sweep."""
    import logging

    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "sandbox.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return path


class _Stop:
    """SIGINT/SIGTERM -> an event the foreground loop waits on (everything is then stopped in order)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum: int, frame: Any) -> None:
        self.event.set()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _kubectl() -> str:
    local = Path(sys.executable).with_name("kubectl")
    return str(local) if local.exists() else (shutil.which("kubectl") or "kubectl")


def _sandbox_class() -> type:
    """The sandbox lives in its own distribution (`trainingsweep-sandbox`): imported only when asked for."""
    try:
        from sweep_sandbox.stack import Sandbox
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "sweep_sandbox":
            raise  # the sandbox is there but one of its own dependencies is not: show which
        raise UsageError("the sandbox is not installed: pip install 'trainingsweep-operator[sandbox]'") from None
    return Sandbox


def _kueue_line(sandbox: Any) -> str:
    if not getattr(sandbox, "kueue", False):
        return ""
    return (
        f"  Kueue           LocalQueue {sandbox.settings.kueue_default_queue} -> ClusterQueue sandbox-cq "
        f"(kubectl get workloads,clusterqueues,localqueues)\n"
    )


def _code_line(code: Path | None) -> str:
    return f"  your code       {code}   (first on every job's PYTHONPATH)\n" if code else ""


def _admission_line(sandbox: Any) -> str:
    """What the API server enforces here as on EKS: the chart's guard policy and the operator's webhooks,
    per user (one kubeconfig context each)."""
    identities = getattr(sandbox, "identities", None) or {}
    if not identities:
        return ""
    contexts = ", ".join(sorted(identities))
    return (
        "  admission       the chart's guard policy and the operator's webhooks, as on EKS: a bad sweep is refused "
        "at apply\n"
        f"                  (kubeconfig contexts: sandbox = the platform team (default), {contexts}; "
        "e.g. kubectl --context tenant ...)\n"
    )


def run_up(args: argparse.Namespace) -> int:
    Sandbox = _sandbox_class()

    stop = _Stop()
    code = code_dir(args.code)
    sandbox = Sandbox(
        Path(args.state_dir),
        kueue=args.kueue,
        overrides=budget_overrides(args),
        scripted_seconds=args.scripted_jobs,
        code_dirs=(code,) if code else (),
    )
    log_path = _quiet_logs(sandbox.state_dir)
    try:
        print(
            "sandbox: starting S3 (moto), the Kubernetes API emulator, KubeRay stand-in and the operator ...",
            flush=True,
        )
        sandbox.start()
        env = sandbox.environment()
        tracking = (
            f"  MLflow          {sandbox.tracking_url()}   (spec.tracking.mlflow.trackingUri)\n"
            if getattr(args, "mlflow", False)
            else ""
        )
        print(
            f"sandbox: ready.\n"
            f"  Kubernetes API  {sandbox.server.url}   (kubeconfig: {sandbox.kubeconfig})\n"
            f"  S3              {sandbox.s3.endpoint_url}   (bucket: {sandbox.bucket})\n"
            f"  job logs        {sandbox.state_dir / 'runs'}   (operator log: {log_path})\n"
            f"{tracking}"
            f"{_code_line(code)}"
            f"{_kueue_line(sandbox)}\n"
            f"{_admission_line(sandbox)}"
            f"In another shell:\n"
            f"  source {sandbox.env_file}\n"
            f"  kubectl apply -f examples/digits-cpu.yaml\n"
            f"  kubectl get tsw -w\n"
            f"  kubectl describe tsw digits-cpu\n"
            f"  kubectl delete tsw digits-cpu\n\n"
            f"(kubectl: {_kubectl()}; SWEEP_SANDBOX_BUCKET={env['SWEEP_SANDBOX_BUCKET']}). Ctrl-C stops the sandbox.",
            flush=True,
        )
        stop.event.wait()
        print("sandbox: stopping ...", flush=True)
        return EXIT_OK
    finally:
        sandbox.stop()
        stop.restore()
        print("sandbox: stopped.", flush=True)


# ----------------------------------------------------------------------------------------- run


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / total) if total else 0
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _finished_of(status: dict[str, Any]) -> tuple[int, int]:
    """(finished, asked for) from trialsSummary, the TRIALS column (`3/8 (2 running)`): the bar's whole is the
    sweep's trials, not those Ray has started so far."""
    import re

    match = re.match(r"(\d+)/(\d+)", str(status.get("trialsSummary") or ""))
    return (int(match[1]), int(match[2])) if match else (0, 0)


def _line(elapsed: float, name: str, status: dict[str, Any]) -> str:
    best = status.get("bestTrial") or {}
    best_text = f" best {best.get('metric')}={best['value']:.4g}" if isinstance(best.get("value"), (int, float)) else ""
    return (
        f"[{elapsed:6.1f}s] {name}  {status.get('phase', 'Pending'):<16} trials {status.get('trialsSummary', '-'):<17}"
        f"{best_text}  {status.get('message', '')}"
    )


def run_sweep(args: argparse.Namespace) -> int:
    import kubernetes

    from sweep_contracts import constants

    from ..validation import validate_sweep

    Sandbox = _sandbox_class()

    docs = load_documents(args.sweep)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise UsageError(f"{args.sweep}: expected one TrainingSweep")
    manifest = docs[0]
    problems = validate_sweep(manifest)
    if problems:
        for problem in problems:
            print(f"{args.sweep}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    code = code_dir(args.code)
    found = train_loop_dirs(manifest["spec"]["trainLoop"], first=code, first_label="--code", manifest=args.sweep)
    if found.note:
        print(f"sandbox: {found.note}", flush=True)
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"].get("namespace") or "default"
    deadlines = manifest.get("spec", {}).get("deadlines", {})
    timeout = (
        args.timeout
        or float(deadlines.get("activeSeconds") or 3600) + float(deadlines.get("startupSeconds") or 0) + 120
    )

    state_dir = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="sweep-sandbox-"))
    stop = _Stop()
    code_dirs = ((code,) if code else ()) + found.dirs
    sandbox = Sandbox(state_dir, kueue=getattr(args, "kueue", False), code_dirs=code_dirs)
    _quiet_logs(state_dir)
    started = time.monotonic()
    kept: Kept | None = None
    try:
        print(
            "sandbox: starting S3 (moto), the Kubernetes API emulator, KubeRay stand-in and the operator ...",
            flush=True,
        )
        sandbox.start()
        print(
            f"sandbox: ready in {time.monotonic() - started:.1f}s (state: {state_dir}; kubeconfig: {sandbox.kubeconfig})",
            flush=True,
        )
        note = sandbox.rewrite_storage(manifest)
        if note:
            print(f"sandbox: {note}", flush=True)
        spec = manifest.setdefault("spec", {})
        added = bool(getattr(args, "track", False)) and not spec.get("tracking")
        if added:  # the server's URI is the sandbox's, set just below
            spec["tracking"] = {"mlflow": {"trackingUri": "http://127.0.0.1", "experimentName": name}}
        tracking_note = sandbox.rewrite_tracking(manifest)
        if added:
            print(f"sandbox: tracking the trials in MLflow at {sandbox.mlflow.url} (experiment {name})", flush=True)
        elif tracking_note:
            print(f"sandbox: {tracking_note}; MLflow tracking server at {sandbox.mlflow.url}", flush=True)
        api = kubernetes.client.CustomObjectsApi(sandbox.server.api_client())
        api.create_namespaced_custom_object(constants.GROUP, constants.VERSION, namespace, constants.PLURAL, manifest)
        print(f"sandbox: applied TrainingSweep {namespace}/{name}", flush=True)

        status = _watch(api, namespace, name, timeout, stop.event, started)
        print()
        _print_table(sandbox, namespace)
        ok = _report(status)
        if not stop.event.is_set():
            kept = _keep(sandbox, api, namespace, name, state_dir)
            ok = kept is not None and ok
        if args.then_delete and not stop.event.is_set():
            ok = _delete_and_report(api, sandbox, namespace, name, status, stop.event) and ok
        return EXIT_OK if ok else EXIT_FAILED
    finally:
        print("sandbox: stopping ...", flush=True)
        sandbox.stop()
        stop.restore()
        print("sandbox: stopped.", flush=True)
        if kept is not None:
            print("\n".join(next_steps(kept, name)), flush=True)


def _get(api: Any, namespace: str, name: str) -> dict[str, Any] | None:
    import kubernetes

    from sweep_contracts import constants

    try:
        return api.get_namespaced_custom_object(constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _watch(
    api: Any, namespace: str, name: str, timeout: float, stop: threading.Event, started: float
) -> dict[str, Any]:
    """A line per change and a progress bar of trials, until the sweep is terminal and verified (or timeout)."""
    from sweep_contracts.api import TERMINAL_PHASES

    deadline = time.monotonic() + timeout
    last_line, last_bar = "", ""
    status: dict[str, Any] = {}
    while not stop.is_set() and time.monotonic() < deadline:
        status = ((_get(api, namespace, name) or {}).get("status")) or {}
        line = _line(time.monotonic() - started, name, status)
        if line.split("]", 1)[1] != last_line.split("]", 1)[-1]:
            print(line, flush=True)
            last_line = line
        done, total = _finished_of(status)
        bar = f"  trials {_bar(done, total)} {done}/{total}"
        if total and bar != last_bar:
            print(bar, flush=True)
            last_bar = bar
        if status.get("phase") in TERMINAL_PHASES and (status.get("checkpoints") or {}).get("verifiedAt"):
            return status
        stop.wait(0.5)
    if not stop.is_set():
        print(f"sandbox: gave up waiting after {timeout:.0f}s (phase {status.get('phase')})", file=sys.stderr)
    return status


def _print_table(sandbox: Any, namespace: str) -> None:
    got = subprocess.run(
        [_kubectl(), "--kubeconfig", str(sandbox.kubeconfig), "get", "tsw", "-n", namespace],
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(f"$ kubectl get tsw -n {namespace}")
    print(got.stdout.rstrip() or got.stderr.rstrip())
    print()


def _report(status: dict[str, Any]) -> bool:
    best = status.get("bestTrial") or {}
    if best:
        from .status import config_text

        value = best.get("value")
        shown = f"{value:.6g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"
        print(f"best trial:  {best.get('id')}  {best.get('metric')}={shown}")
        if isinstance(best.get("config"), dict) and best["config"]:
            print(f"config:      {config_text(best['config'])}")
        print(f"checkpoint:  {best.get('checkpointUri')}")
    checkpoints = status.get("checkpoints") or {}
    if checkpoints.get("verified"):
        level = f" ({checkpoints['summary']})" if checkpoints.get("summary") else ""
        print(
            f"checkpoints: verified {checkpoints.get('checked')} checkpoints{level}, {checkpoints.get('bytes')} bytes "
            "in S3"
        )
    else:
        problems = "; ".join(f"{p.get('kind')} {p.get('key')}" for p in checkpoints.get("problems") or [])
        print(f"checkpoints: NOT verified {problems}".rstrip())
    tracked = status.get("tracking") or {}
    if tracked.get("url"):
        print(f"tracking:    {tracked['url']} (MLflow parent run; the trials are its child runs)")
    ok = status.get("phase") == Phase.SUCCEEDED and bool(checkpoints.get("verified"))
    print(f"result:      {status.get('phase')} — {status.get('message', '')}")
    return ok


@dataclass(frozen=True)
class Kept:
    """What a sandbox run leaves behind once its servers stop: the run root copied out of S3 and the report."""

    run_root: Path
    report: Path


def _shown_path(path: Path) -> str:
    """A path as a user types it here: relative to the current directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _copy_run_root(client: Any, root: str, dest: Path) -> int:
    """Every object under the run root `root` (s3://bucket/prefix) into `dest`, keyed as under the prefix; how many."""
    from sweep_contracts.s3_layout import S3Uri

    uri = S3Uri.parse(root)
    prefix = uri.prefix
    copied = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix) :].lstrip("/")
            if not relative:
                continue
            target = dest / relative
            if relative.endswith("/"):  # a directory marker (pyarrow's create_dir): a folder here
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(client.get_object(Bucket=uri.bucket, Key=item["Key"])["Body"].read())
            copied += 1
    # The driver's own records name checkpoints by their S3 URIs; in the copy they name the copy, as a local run
    # root's do (run-local --storage DIR), so `sweepctl verify` and `report --storage` read it as one.
    from sweep_contracts.s3_layout import RESULT_KEY, STATUS_KEY

    here = str(dest.resolve())
    for record in (dest / STATUS_KEY, dest / RESULT_KEY):
        if record.is_file():
            text = record.read_text()
            record.write_text(text.replace(str(uri), here).replace(uri.path, here))
    return copied


def _keep(sandbox: Any, api: Any, namespace: str, name: str, state_dir: Path) -> Kept | None:
    """Before the sandbox's S3 (in memory) stops: the run root copied to state_dir/run-root/<namespace>/<run>, and
    `sweepctl report` written to state_dir/report from the sweep and S3. None (said why) when either fails."""
    from . import main as sweepctl
    from .report import _run_root_of

    sweep = _get(api, namespace, name) or {}
    root, _endpoint, _region = _run_root_of(sweep)
    if not root:
        print(f"sandbox: TrainingSweep {namespace}/{name} has no run root: nothing to keep", flush=True)
        return None
    local = state_dir / "run-root" / namespace / root.rstrip("/").rsplit("/", 1)[-1]
    out = state_dir / "report"
    for folder in (local, out):
        shutil.rmtree(folder, ignore_errors=True)
    try:
        copied = _copy_run_root(sandbox.s3.client(), root, local)
    except Exception as exc:  # S3 refused: the demo says so and fails
        print(f"sandbox: could not copy {root}: {exc}", flush=True)
        return None
    print(f"sandbox: kept the run root: {copied} objects of {root} in {_shown_path(local)}", flush=True)
    code = sweepctl(["report", name, "-n", namespace, "--kubeconfig", str(sandbox.kubeconfig), "--out", str(out)])
    sys.stdout.flush()
    if code != EXIT_OK or not (out / "report.html").is_file():
        print(f"sandbox: sweepctl report failed (exit {code})", flush=True)
        return None
    return Kept(local, out / "report.html")


def next_steps(kept: Kept, name: str) -> list[str]:
    """What to look at and try once the demo is over (its servers are gone; the run root and report stay)."""
    sweepctl = _shown_path(Path(sys.executable).with_name("sweepctl"))
    root = _shown_path(kept.run_root)
    return [
        "",
        f"report: {_shown_path(kept.report)}   (open it in a browser)",
        "next:",
        f"  {sweepctl} report --storage {root} --out report-{name}   # the report again, from the kept run root",
        f"  {sweepctl} verify {root}   # the checkpoint guard's check, on the local copy",
        f"  {sweepctl} sandbox up   # the sandbox in the foreground: kubectl apply, then kubectl sweep status|logs|report",
    ]


def _delete_and_report(
    api: Any, sandbox: Any, namespace: str, name: str, status: dict[str, Any], stop: threading.Event
) -> bool:
    import kubernetes

    from sweep_contracts import constants

    print(f"\n$ kubectl delete tsw {name}   (the checkpoint guard verifies S3 first)")
    started = time.monotonic()
    api.delete_namespaced_custom_object(constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name)
    core = kubernetes.client.CoreV1Api(sandbox.server.api_client())
    deadline = started + 120
    while not stop.is_set() and time.monotonic() < deadline:
        if _get(api, namespace, name) is None:
            break
        stop.wait(0.5)
    reasons = [
        f"{e.involved_object.kind} {e.involved_object.name}: {e.reason}: {e.message}"
        for e in core.list_namespaced_event(namespace).items
        if e.reason in ("CheckpointGuardReleased", "CheckpointGuardBypassed", "CheckpointsNotVerified")
        and (e.involved_object.name or "").startswith(name)
    ]
    for reason in reasons:
        print(f"guard: {reason}")
    gone = _get(api, namespace, name) is None
    print(f"guard: {'released' if gone else 'HOLDING'} the sweep after {time.monotonic() - started:.1f}s")
    return gone
