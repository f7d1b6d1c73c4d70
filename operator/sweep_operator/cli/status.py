"""`sweepctl status NAME [-n NAMESPACE] [--kubeconfig F] [--context C] [--json]`: a TrainingSweep's status, read from the cluster."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import EXIT_FAILED, EXIT_OK, api_error_text, kube_connection


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("status", help="show a TrainingSweep's phase, trials, best trial and checkpoints")
    p.add_argument("name")
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument("--json", action="store_true", help="print the status object as JSON")
    p.set_defaults(func=run)


def budget_lines(status: dict[str, Any], now: float, ledger: dict[str, Any] | None = None) -> list[str]:
    """Used and left of the sweep's GPU-hour budget and of its namespace's window, recomputed from the recorded pod
    intervals up to `now` (status.usage is written at most every usageRefreshSeconds while pods run). `ledger`: the
    namespace's GPUHourLedger, when the caller could read it (else the figure the sweep's status recorded)."""
    from ..gpu_time import UsageLedger, format_duration, format_hours

    usage = status.get("usage")
    if not isinstance(usage, dict):
        return []
    used = UsageLedger.from_status(usage).gpu_hours(now)
    held = usage.get("gpusHeld") or 0
    budget = usage.get("budgetGpuHours")
    line = f"  gpu-hours:   {format_hours(used)} used"
    if isinstance(budget, (int, float)):
        line += f" of {format_hours(budget)} ({format_hours(max(budget - used, 0.0))} left)"
    if held:
        line += f"; {format_hours(held)} GPUs held now"
    lines = [line]
    if ledger is not None:
        return lines + namespace_lines(ledger, now)
    ns = usage.get("namespace")
    if isinstance(ns, dict) and isinstance(ns.get("budgetGpuHours"), (int, float)):
        window_used = float(ns.get("gpuHours") or 0.0)
        ns_budget = float(ns["budgetGpuHours"])
        window = ns.get("windowSeconds")
        per = f" per {format_duration(float(window))}" if isinstance(window, (int, float)) else ""
        left = ns.get("leftGpuHours")
        left = float(left) if isinstance(left, (int, float)) else max(ns_budget - window_used, 0.0)
        lines.append(
            f"  namespace:   {format_hours(window_used)} used of {format_hours(ns_budget)}{per} "
            f"({format_hours(left)} left)"
        )
    return lines


LEDGER_ROWS = 10  # sweeps listed under the namespace's line, most used first


def namespace_lines(obj: dict[str, Any], now: float) -> list[str]:
    """The namespace's GPU-hour ledger up to `now`: used, reserved and left of its window, when budget frees up,
    and what each sweep (deleted ones too) used in the window and still reserves."""
    from ..gpu_time import NamespaceBudget, format_duration, format_hours
    from ..reconcile.hours_ledger import HoursLedger
    from ..status import rfc3339

    spec = obj.get("spec") or {}
    hours, window = spec.get("gpuHours"), spec.get("windowSeconds")
    if not isinstance(hours, (int, float)) or not isinstance(window, (int, float)) or window <= 0:
        return []
    ledger = HoursLedger.from_object(obj, NamespaceBudget(float(hours), float(window)))
    left = ledger.left(now)
    line = (
        f"  namespace:   {format_hours(ledger.used(now))} used, {format_hours(ledger.reserved(now))} reserved of "
        f"{format_hours(float(hours))} per {format_duration(float(window))} ({format_hours(max(left, 0.0))} left)"
    )
    if left < 1.0:
        frees = ledger.frees_at(now)
        line += f"; budget frees up at {rfc3339(frees)}" if frees is not None else "; frees up as admitted sweeps end"
    rows = sorted(ledger.entries, key=lambda e: -e.window_gpu_hours(now, float(window)))
    lines = [line]
    for entry in rows[:LEDGER_ROWS]:
        text = f"    {entry.name}{' (deleted)' if entry.deleted else ''}: "
        text += f"{format_hours(entry.window_gpu_hours(now, float(window)))} used"
        if entry.reservation is not None:
            text += f", {format_hours(entry.reserved_left(now))} reserved"
        lines.append(text)
    if len(rows) > LEDGER_ROWS:
        lines.append(f"    ... {len(rows) - LEDGER_ROWS} more (kubectl get gpuledger -o yaml)")
    return lines


def _trial_counts(trials: Any) -> str:
    """`(3 pending, 2 running, 3 terminated, 1 errored)`: the states with trials in them, in the order trials go."""
    if not isinstance(trials, dict):
        return ""
    states = ("pending", "running", "terminated", "errored")
    parts = [f"{trials[s]} {s}" for s in states if isinstance(trials.get(s), int) and trials[s] > 0]
    return f"({', '.join(parts)})" if parts else ""


def _trials_line(status: dict[str, Any]) -> str:
    """`3/8  (2 pending, 1 running, 3 terminated)`: trialsSummary says `3/8 (1 running)` itself, so its own count
    goes when the per-state counts follow (they say it once)."""
    summary = str(status.get("trialsSummary") or "-")
    counts = _trial_counts(status.get("trials"))
    if not counts:
        return summary
    return f"{summary.split(' (', 1)[0]}  {counts}"


def config_text(config: dict[str, Any]) -> str:
    """`lr=0.003162  hidden=64`: a trial's hyper-parameters as a user wrote them in paramSpace, not a Python dict."""

    def shown(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        if isinstance(value, (dict, list)):
            return json.dumps(value, separators=(",", ":"))
        return str(value).lower() if isinstance(value, bool) else str(value)

    return "  ".join(f"{key}={shown(value)}" for key, value in config.items())


def format_status(
    name: str,
    namespace: str,
    status: dict[str, Any],
    *,
    now: float | None = None,
    ledger: dict[str, Any] | None = None,
) -> str:
    import time

    best = status.get("bestTrial") or {}
    checkpoints = status.get("checkpoints") or {}
    lines = [
        f"TrainingSweep {namespace}/{name}",
        f"  phase:       {status.get('phase', 'Pending')}  {status.get('message', '')}".rstrip(),
        f"  run:         {status.get('runId', '-')}  RayJob {status.get('rayJobName', '-')}  RayCluster {status.get('rayClusterName', '-')}",
        f"  deadline:    {status.get('deadlineAt', '-')}  (started {status.get('startedAt', '-')})",
        f"  trials:      {_trials_line(status)}",
    ]
    if best:
        value = best.get("value")
        shown = f"{value:.6g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"
        lines.append(f"  best trial:  {best.get('id')}  {best.get('metric')}={shown}")
        if isinstance(best.get("config"), dict) and best["config"]:
            lines.append(f"  config:      {config_text(best['config'])}")
        lines.append(f"  checkpoint:  {best.get('checkpointUri', '-')}")
    lines += budget_lines(status, time.time() if now is None else now, ledger)
    idle = status.get("idleGpuSeconds") or {}
    if idle:  # GPU time held without training, by cause (docs/guard.md, "hold the data, not the GPUs")
        causes = {
            "heldDeletion": "held deletion",
            "preemption": "after a preemption",
            "stopping": "stopping",
            "unscheduledTrials": "no trial running",
        }
        parts = [f"{causes.get(k, k)} {float(v) / 3600:.3g} GPU-h" for k, v in sorted(idle.items()) if v]
        lines.append(f"  idle GPUs:   {', '.join(parts)}")
    if checkpoints:
        verdict = "verified" if checkpoints.get("verified") else "NOT verified"
        verdict += f" ({checkpoints['summary']})" if checkpoints.get("summary") else ""
        lines.append(
            f"  checkpoints: {verdict}, {checkpoints.get('checked')} checked, {checkpoints.get('bytes')} bytes at {checkpoints.get('verifiedAt')}"
        )
        lines += [f"    - {p.get('kind')} {p.get('key')}: {p.get('detail')}" for p in checkpoints.get("problems") or []]
    for condition in status.get("conditions") or []:
        lines.append(
            f"  {condition['type']:<20} {condition['status']:<6} {condition.get('reason', '')}: {condition.get('message', '')}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import kubernetes

    from sweep_contracts import constants

    from ..kube import custom_object

    api_client, namespace, _user = kube_connection(args.kubeconfig, args.context, args.namespace)
    api = kubernetes.client.CustomObjectsApi(api_client)
    try:
        obj = custom_object(
            api.get_namespaced_custom_object(constants.GROUP, constants.VERSION, namespace, constants.PLURAL, args.name)
        )
    except kubernetes.client.ApiException as exc:
        print(api_error_text(exc, args.name), file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:  # connection refused, DNS, TLS: say so without a traceback
        print(f"sweepctl status: cannot reach the cluster: {exc}", file=sys.stderr)
        return EXIT_FAILED
    status = obj.get("status") or {}
    print(
        json.dumps(status, indent=2)
        if args.json
        else format_status(args.name, namespace, status, ledger=_namespace_ledger(api, namespace, status))
    )
    return EXIT_OK


def _namespace_ledger(api: Any, namespace: str, status: dict[str, Any]) -> dict[str, Any] | None:
    """The namespace's GPUHourLedger (None: no namespace budget, or not allowed to read it)."""
    from sweep_contracts import constants

    if not (status.get("usage") or {}).get("namespace"):
        return None
    try:
        obj = api.get_namespaced_custom_object(
            constants.GROUP, constants.VERSION, namespace, constants.LEDGER_PLURAL, constants.LEDGER_NAME
        )
    except Exception:  # the figure the sweep's status recorded is shown instead
        return None
    return obj if isinstance(obj, dict) else None
