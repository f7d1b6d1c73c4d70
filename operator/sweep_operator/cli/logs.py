"""`sweepctl logs NAME [--trial ID] [--out-dir DIR]`: a sweep's driver log and its trials' logs.

The driver log is the RayJob's submitter pod's log (K8sJobMode: `ray job submit` follows the driver's output), as
`kubectl logs job/<rayJob>` shows it. A trial's log is what its run root keeps of it: each result it reported
(Tune's result.json), its hyper-parameters and, if it failed, its error (error.txt). `--out-dir` writes them all to
a directory, as `kubectl ray log` downloads a cluster's logs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .common import EXIT_FAILED, EXIT_OK, UsageError, api_error_text, kube_connection

# Tune's bookkeeping in every result row; what remains is what the loop reported.
TUNE_KEYS = frozenset(
    {
        "timestamp",
        "checkpoint_dir_name",
        "checkpoint_path",
        "done",
        "training_iteration",
        "trial_id",
        "date",
        "time_this_iter_s",
        "time_total_s",
        "pid",
        "hostname",
        "node_ip",
        "config",
        "time_since_restore",
        "iterations_since_restore",
        "ranks_reported",
    }
)
TRIAL_FILES = ("result.json", "params.json", "progress.csv", "error.txt")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "logs",
        help="print a sweep's driver log, or a trial's log (--trial); --out-dir writes them all",
        description="Print the driver's log of a TrainingSweep's run (its RayJob's submitter pod, as kubectl logs "
        "job/<rayJob> shows it), or with --trial ID what the run root keeps of that trial: each result it reported, "
        "its hyper-parameters and its error. --out-dir DIR writes the driver log and every trial's files to DIR, as "
        "kubectl ray log does.",
    )
    p.add_argument("name")
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument("--trial", metavar="ID", help="a trial's log from the run root (its id, as status shows it)")
    p.add_argument("--tail", type=int, default=None, metavar="N", help="the driver log's last N lines only")
    p.add_argument(
        "--out-dir",
        metavar="DIR",
        help="write driver.log and trials/<id>/ (result.json, params.json, progress.csv, error.txt) to DIR",
    )
    p.add_argument("--endpoint-url", default=None, metavar="URL", help="S3 endpoint (default: the sweep's)")
    p.add_argument("--region", default=None, metavar="R", help="S3 region (default: the sweep's)")
    p.set_defaults(func=run)


class LogsError(Exception):
    """Why a log cannot be shown: printed as it is, exit 1."""


# ------------------------------------------------------------------------------------------- the trials


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value).lower() if isinstance(value, bool) else str(value)


def result_line(row: Mapping[str, Any]) -> str:
    """One reported result: `2026-12-03 11:47:38  iteration 1 (21.2 s)  epoch=0 val_loss=1.297  checkpoint_epoch-..`."""
    when = row.get("timestamp")
    stamp = (
        datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M:%S")
        if isinstance(when, (int, float)) and not isinstance(when, bool)
        else "-"
    )
    took = row.get("time_this_iter_s")
    duration = f" ({took:.1f} s)" if isinstance(took, (int, float)) and not isinstance(took, bool) else ""
    metrics = "  ".join(
        f"{k}={_shown(v)}" for k, v in row.items() if k not in TUNE_KEYS and not k.endswith("_rank_spread")
    )
    line = f"{stamp}  iteration {row.get('training_iteration', '?')}{duration}  {metrics}".rstrip()
    checkpoint = row.get("checkpoint_path")
    if isinstance(checkpoint, str) and checkpoint:
        line += f"  checkpoint {checkpoint.rstrip('/').rsplit('/', 1)[-1]}"
    return line


def trial_log(trial: str, root: str, rows: Sequence[Mapping[str, Any]], params: Any, error: str | None) -> str:
    """What `sweepctl logs NAME --trial ID` prints."""
    from .status import config_text

    lines = [f"trial {trial}  ({root.rstrip('/')}/tune/{trial})"]
    if isinstance(params, dict):
        shown = {k: v for k, v in params.items() if not str(k).startswith("_")}
        lines.append(f"config: {config_text(shown) or '-'}")
    lines.append(f"{len(rows)} result(s) reported" + (":" if rows else ""))
    lines += [f"  {result_line(row)}" for row in rows]
    if error:
        lines.append("error (error.txt):")
        lines += [f"  {line}" for line in error.rstrip().splitlines()]
    else:
        lines.append("no error recorded")
    return "\n".join(lines)


def _json_lines(data: bytes | None) -> list[dict[str, Any]]:
    rows = []
    for text in (data or b"").decode(errors="replace").splitlines():
        try:
            row = json.loads(text)
        except ValueError:
            continue  # a line a running trial is still writing
        if isinstance(row, dict):
            rows.append(row)
    return rows


@dataclass(frozen=True)
class RunRoot:
    uri: str
    store: Any  # report_records.RunStore

    def trials(self) -> list[str]:
        try:
            return self.store.trial_dirs()
        except Exception as exc:  # S3 refused or unreachable
            raise LogsError(f"cannot list the trials under {self.uri}: {exc}") from None

    def read(self, trial: str, name: str) -> bytes | None:
        from sweep_contracts import s3_layout

        try:
            return self.store.read(f"{s3_layout.TUNE_EXPERIMENT_NAME}/{trial}/{name}")
        except Exception as exc:
            raise LogsError(f"cannot read {trial}/{name} under {self.uri}: {exc}") from None

    def trial(self, trial: str) -> str:
        known = self.trials()
        if trial not in known:
            listed = ", ".join(known) if known else "none yet"
            raise LogsError(f'trial "{trial}" not found under {self.uri}/tune (its trials: {listed})')
        params_data = self.read(trial, "params.json")
        try:
            params = json.loads(params_data) if params_data else None
        except ValueError:
            params = None
        error = self.read(trial, "error.txt")
        rows = _json_lines(self.read(trial, "result.json"))
        return trial_log(trial, self.uri, rows, params, error.decode(errors="replace") if error else None)


def _run_root(sweep: Mapping[str, Any], name: str, endpoint: str | None, region: str | None) -> RunRoot:
    from sweep_contracts import s3_layout

    from .report import _run_root_of
    from .report_records import LocalStore, S3Store

    root, sweep_endpoint, sweep_region = _run_root_of(sweep)
    if not root:
        phase = (sweep.get("status") or {}).get("phase", "Pending")
        raise LogsError(f"TrainingSweep {name} has no run yet (phase {phase}): no trial has a log")
    if not s3_layout.is_s3_uri(root):
        return RunRoot(root, LocalStore(root))
    from ..s3 import S3ClientConfig, make_s3_client

    config = S3ClientConfig(endpoint_url=endpoint or sweep_endpoint, region=region or sweep_region)
    return RunRoot(root, S3Store(make_s3_client(config), root))


# ------------------------------------------------------------------------------------------- the driver


def newest_pod(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The submitter's latest pod (a retried submitter has several): the newest by creation time, then name."""
    if not pods:
        return None
    return max(pods, key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp") or "", p["metadata"]["name"]))


def _as_dict(obj: Any, api_client: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else api_client.sanitize_for_serialization(obj)


def driver_log(api_client: Any, namespace: str, sweep: Mapping[str, Any], name: str, tail: int | None) -> bytes:
    """The submitter pod's log of the sweep's RayJob; LogsError saying why there is none."""
    import kubernetes

    status = sweep.get("status") or {}
    rayjob = status.get("rayJobName")
    if not rayjob:
        raise LogsError(f"TrainingSweep {name} has no run yet (phase {status.get('phase', 'Pending')}): no driver log")
    batch, core = kubernetes.client.BatchV1Api(api_client), kubernetes.client.CoreV1Api(api_client)
    try:
        job = _as_dict(batch.read_namespaced_job(rayjob, namespace), api_client)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            raise LogsError(
                f"no driver log: the submitter Job {namespace}/{rayjob} of RayJob {rayjob} is gone (deleted with its "
                f"RayJob); the trials' logs remain in the run root: sweepctl logs {name} --trial ID"
            ) from None
        raise LogsError(api_error_text(exc, rayjob, "jobs.batch")) from None
    match = ((job.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
    try:
        pods = _as_dict(core.list_namespaced_pod(namespace, label_selector=selector), api_client).get("items") or []
    except kubernetes.client.ApiException as exc:
        raise LogsError(api_error_text(exc, rayjob, "pods")) from None
    pod = newest_pod(pods)
    if pod is None:
        raise LogsError(
            f"no driver log yet: the submitter Job {namespace}/{rayjob} has no pod (phase {status.get('phase')})"
        )
    containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    from ..rendering import SUBMITTER_CONTAINER

    container = SUBMITTER_CONTAINER if SUBMITTER_CONTAINER in containers else (containers[0] if containers else None)
    pod_name = pod["metadata"]["name"]
    options: dict[str, Any] = {"_preload_content": False}
    if container:
        options["container"] = container
    if tail is not None:
        options["tail_lines"] = tail
    try:
        response = core.read_namespaced_pod_log(pod_name, namespace, **options)
    except kubernetes.client.ApiException as exc:
        raise LogsError(api_error_text(exc, pod_name, "pods")) from None
    # _preload_content=False: the raw response, whose bytes are the log as the container wrote it
    return bytes(getattr(response, "data", b""))


# ------------------------------------------------------------------------------------------- the command


def _write_all(out: Path, api_client: Any, namespace: str, sweep: Mapping[str, Any], args: argparse.Namespace) -> int:
    """`--out-dir`: driver.log and trials/<id>/<file> for every trial; says what it wrote and what it could not."""
    out.mkdir(parents=True, exist_ok=True)
    problems = 0
    try:
        (out / "driver.log").write_bytes(driver_log(api_client, namespace, sweep, args.name, args.tail))
        print(f"sweepctl logs: wrote {out / 'driver.log'}")
    except LogsError as exc:
        print(f"sweepctl logs: {exc}", file=sys.stderr)
        problems += 1
    try:
        root = _run_root(sweep, args.name, args.endpoint_url, args.region)
        trials = root.trials()
        for trial in trials:
            folder = out / "trials" / trial
            folder.mkdir(parents=True, exist_ok=True)
            for file_name in TRIAL_FILES:
                data = root.read(trial, file_name)
                if data is not None:
                    (folder / file_name).write_bytes(data)
        print(f"sweepctl logs: wrote {len(trials)} trial(s) under {out / 'trials'} from {root.uri}")
    except LogsError as exc:
        print(f"sweepctl logs: {exc}", file=sys.stderr)
        problems += 1
    return EXIT_FAILED if problems == 2 else EXIT_OK


def run(args: argparse.Namespace) -> int:
    import kubernetes

    from sweep_contracts import constants

    from ..kube import custom_object

    if args.tail is not None and args.tail < 0:
        raise UsageError(f"--tail {args.tail}: must be 0 or more")
    api_client, namespace, _user = kube_connection(args.kubeconfig, args.context, args.namespace)
    try:
        sweep = custom_object(
            kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.PLURAL, args.name
            )
        )
    except kubernetes.client.ApiException as exc:
        print(api_error_text(exc, args.name), file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:  # connection refused, DNS, TLS
        print(f"sweepctl logs: cannot reach the cluster: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.out_dir:
        return _write_all(Path(args.out_dir), api_client, namespace, sweep, args)
    try:
        if args.trial:
            print(_run_root(sweep, args.name, args.endpoint_url, args.region).trial(args.trial))
        else:
            data = driver_log(api_client, namespace, sweep, args.name, args.tail)
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
    except LogsError as exc:
        print(f"sweepctl logs: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
