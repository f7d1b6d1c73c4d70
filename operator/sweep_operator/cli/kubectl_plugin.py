"""`kubectl sweep list|status|logs|report|verify|suspend|unsuspend|resume|validate|render|release|guarded`: sweepctl
as a kubectl plugin (`kubectl-sweep`).

Honours kubectl's `-n/--namespace`, `--context` and `--kubeconfig` flags and `KUBECONFIG` (several files merged,
as kubectl does); each verb runs the sweepctl subcommand on the named TrainingSweep.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from .common import EXIT_FAILED, EXIT_USAGE, api_error_text

VERBS = (
    "list",
    "status",
    "logs",
    "report",
    "verify",
    "resume",
    "suspend",
    "unsuspend",
    "validate",
    "render",
    "release",
    "guarded",
)
USAGE = """usage: kubectl sweep VERB NAME [-n NAMESPACE] [--context CONTEXT] [--kubeconfig FILE] [OPTIONS]

verbs:
  list            the TrainingSweeps of a namespace (-A: all), as `kubectl get tsw` shows them
  status NAME     phase, trials, best trial, checkpoints and conditions of a TrainingSweep
  logs NAME       the driver's log (its RayJob's submitter pod; --tail N); --trial ID: a trial's results and
                  error from the run root; --out-dir DIR: the driver log and every trial's files, as kubectl ray log
  report NAME     learning curves, hyper-parameters and timeline: report.html + PNGs (--out DIR)
  verify NAME     verify the sweep's checkpoints in S3 (its run root, endpoint and region from its status)
  suspend NAME    set spec.suspend: the sweep stops gracefully and waits, Suspended (Kueue's "suspend")
  unsuspend NAME  clear spec.suspend: a Suspended sweep runs again (what Kueue calls "resume")
  resume NAME     continue an ENDED sweep (Succeeded, Failed, DeadlineExceeded, BudgetExhausted) from its
                  verified checkpoints (--active-seconds N, --num-samples N); not for a Suspended one
  validate NAME   check the live TrainingSweep (or -f FILE) offline: schema, semantics, caps, bundle fit
  render NAME     the RayJob the operator renders for the live TrainingSweep (or -f FILE)
  release NAME    release the sweep's objects the checkpoint guard holds, verifying first (--reason R)
  guarded         the objects the checkpoint guard holds (-A: every namespace)

Options after NAME go to the sweepctl subcommand (`sweepctl VERB --help`)."""


def _split_globals(args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """kubectl's connection flags (anywhere, `--flag value` or `--flag=value`) apart from the rest."""
    names = {"-n": "namespace", "--namespace": "namespace", "--context": "context", "--kubeconfig": "kubeconfig"}
    found: dict[str, str] = {}
    rest: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        item = items[i]
        flag, eq, value = item.partition("=")
        if flag in names and eq:
            found[names[flag]] = value
        elif item in names:
            if i + 1 >= len(items):
                raise SystemExit(_usage_error(f"{item} needs a value"))
            found[names[item]] = items[i + 1]
            i += 1
        elif item.startswith("-n") and len(item) > 2 and not item.startswith("--"):
            found["namespace"] = item[2:]
        else:
            rest.append(item)
        i += 1
    return found, rest


def _usage_error(message: str) -> int:
    print(f"kubectl sweep: {message}\n\n{USAGE}", file=sys.stderr)
    return EXIT_USAGE


def _connection_flags(found: dict[str, str], *, context: bool = True) -> list[str]:
    flags = []
    for key in ("namespace", "kubeconfig") + (("context",) if context else ()):
        if key in found:
            flags += [f"--{key}", found[key]]
    return flags


def _live_sweep(found: dict[str, str], name: str) -> dict[str, Any] | int:
    import kubernetes
    from kubernetes import config

    from sweep_contracts import constants

    from ..kube import custom_object

    try:
        contexts, active = config.list_kube_config_contexts(config_file=found.get("kubeconfig"))
        if found.get("context"):
            active = next((c for c in contexts if c.get("name") == found["context"]), None)
            if active is None:
                return _usage_error(f"--context {found['context']!r}: no such context in the kubeconfig")
        api_client = config.new_client_from_config(config_file=found.get("kubeconfig"), context=found.get("context"))
    except (config.ConfigException, OSError, TypeError) as exc:
        print(f"kubectl sweep: no usable kubeconfig: {exc}", file=sys.stderr)
        return EXIT_USAGE
    namespace = found.get("namespace") or (active or {}).get("context", {}).get("namespace") or "default"
    try:
        return custom_object(
            kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name
            )
        )
    except kubernetes.client.ApiException as exc:
        print(api_error_text(exc, name), file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:  # connection refused, DNS, TLS
        print(f"kubectl sweep: cannot reach the cluster: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _manifest_file(sweep: dict[str, Any]) -> str:
    """The live sweep as a manifest file for validate/render (status and server-set metadata dropped)."""
    import yaml

    meta = sweep.get("metadata") or {}
    doc = {
        "apiVersion": sweep.get("apiVersion"),
        "kind": sweep.get("kind"),
        "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if meta.get(k)},
        "spec": sweep.get("spec") or {},
    }
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="kubectl-sweep-", delete=False) as handle:
        yaml.safe_dump(doc, handle, sort_keys=False)
    return handle.name


def _list(found: dict[str, str], rest: list[str]) -> int:
    """`kubectl get trainingsweeps.sweeps.dev`: the same columns, printed by the kubectl that ran this plugin."""
    import shutil
    import subprocess

    from sweep_contracts import constants

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("kubectl sweep list: kubectl is not on PATH", file=sys.stderr)
        return EXIT_FAILED
    command = [kubectl, "get", f"{constants.PLURAL}.{constants.GROUP}", *_connection_flags(found), *rest]
    return subprocess.run(command, check=False).returncode


def _set_suspend(verb: str, found: dict[str, str], name: str, suspend: bool) -> int:
    """A merge patch of spec.suspend, as `kubectl patch tsw NAME --type merge -p '{"spec":{"suspend":...}}'`."""
    import kubernetes

    from sweep_contracts import constants

    sweep = _live_sweep(found, name)
    if isinstance(sweep, int):
        return sweep
    namespace = (sweep.get("metadata") or {}).get("namespace") or "default"
    from .common import kube_connection

    api_client, _ns, _user = kube_connection(found.get("kubeconfig"), found.get("context"), namespace)
    try:
        kubernetes.client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
            constants.GROUP,
            constants.VERSION,
            namespace,
            constants.PLURAL,
            name,
            {"spec": {"suspend": suspend}},
            _content_type="application/merge-patch+json",
        )
    except kubernetes.client.ApiException as exc:
        print(api_error_text(exc, name), file=sys.stderr)
        return EXIT_FAILED
    print(f"trainingsweep.{constants.GROUP}/{name} {verb}ed")
    return 0


def sweepctl_argv(verb: str, found: dict[str, str], rest: list[str]) -> list[str] | int:
    """The sweepctl command line a plugin verb runs (an exit code when it needs no sweepctl run)."""
    if verb == "list":
        return _list(found, rest)
    if verb == "guarded":
        return ["guarded", *_connection_flags(found), *rest]
    if not rest:
        return _usage_error(f"{verb}: name a TrainingSweep")
    name, options = rest[0], rest[1:]
    if verb in ("status", "logs", "resume", "release"):  # the same code as `sweepctl VERB` (cli/resume.py, release.py)
        return [verb, name, *_connection_flags(found), *options]
    if verb in ("suspend", "unsuspend"):
        return _set_suspend(verb, found, name, verb == "suspend")
    if verb == "status":
        return ["status", name, *_connection_flags(found), *options]
    if verb == "report":
        return ["report", name, *_connection_flags(found), *options]
    if verb in ("validate", "render") and (name in ("-f", "--filename") or name.startswith("--filename=")):
        return [verb, *rest]
    sweep = _live_sweep(found, name)
    if isinstance(sweep, int):
        return sweep
    status = sweep.get("status") or {}
    if verb == "verify":
        from .report import _run_root_of

        root, endpoint, region = _run_root_of(sweep)
        if not root:
            print(
                f"kubectl sweep verify: TrainingSweep {name} has no run yet (phase {status.get('phase', 'Pending')})",
                file=sys.stderr,
            )
            return EXIT_FAILED
        extra = (["--endpoint-url", endpoint] if endpoint and "--endpoint-url" not in options else []) + (
            ["--region", region] if region and "--region" not in options else []
        )
        return ["verify", root, *extra, *options]
    manifest = _manifest_file(sweep)
    if verb == "render" and status.get("runId") and "--run-id" not in options:
        options = ["--run-id", status["runId"], *options]
    if verb == "validate":  # the lines name the live object, not the temporary file it was written to
        namespace = (sweep.get("metadata") or {}).get("namespace") or "default"
        options = ["--source-name", f"{namespace}/{name}", *options]
    return [verb, "-f", manifest, *options]


def main(argv: Sequence[str] | None = None) -> int:
    from . import main as sweepctl

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else EXIT_USAGE
    if args[0] == "--version":
        from . import distribution_version

        print(f"kubectl-sweep {distribution_version()}")
        return 0
    verb, tail = args[0], args[1:]
    if verb not in VERBS:
        return _usage_error(f"unknown verb {verb!r} (one of {', '.join(VERBS)})")
    found, rest = _split_globals(tail)
    command = sweepctl_argv(verb, found, rest)
    if isinstance(command, int):
        return command
    try:
        return sweepctl(command)
    finally:
        if verb in ("validate", "render") and "-f" in command:
            path = command[command.index("-f") + 1]
            if os.path.basename(path).startswith("kubectl-sweep-"):
                os.unlink(path)


if __name__ == "__main__":
    sys.exit(main())
