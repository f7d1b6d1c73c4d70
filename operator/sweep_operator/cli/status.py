"""`sweepctl status NAME [-n NAMESPACE] [--kubeconfig F] [--context C] [--json]`: a TrainingSweep's status, read from the cluster."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import EXIT_FAILED, EXIT_OK, kube_connection


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("status", help="show a TrainingSweep's phase, trials, best trial and checkpoints")
    p.add_argument("name")
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument("--json", action="store_true", help="print the status object as JSON")
    p.set_defaults(func=run)


def format_status(name: str, namespace: str, status: dict[str, Any]) -> str:
    best = status.get("bestTrial") or {}
    checkpoints = status.get("checkpoints") or {}
    lines = [
        f"TrainingSweep {namespace}/{name}",
        f"  phase:       {status.get('phase', 'Pending')}  {status.get('message', '')}".rstrip(),
        f"  run:         {status.get('runId', '-')}  RayJob {status.get('rayJobName', '-')}  RayCluster {status.get('rayClusterName', '-')}",
        f"  deadline:    {status.get('deadlineAt', '-')}  (started {status.get('startedAt', '-')})",
        f"  trials:      {status.get('trialsSummary', '0/0')}  {status.get('trials') or ''}".rstrip(),
    ]
    if best:
        lines.append(f"  best trial:  {best.get('id')}  {best.get('metric')}={best.get('value')}  {best.get('config') or ''}".rstrip())
        lines.append(f"  checkpoint:  {best.get('checkpointUri', '-')}")
    if checkpoints:
        verdict = "verified" if checkpoints.get("verified") else "NOT verified"
        lines.append(f"  checkpoints: {verdict}, {checkpoints.get('checked')} checked, {checkpoints.get('bytes')} bytes at {checkpoints.get('verifiedAt')}")
        lines += [f"    - {p.get('kind')} {p.get('key')}: {p.get('detail')}" for p in checkpoints.get("problems") or []]
    for condition in status.get("conditions") or []:
        lines.append(f"  {condition['type']:<20} {condition['status']:<6} {condition.get('reason', '')}: {condition.get('message', '')}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import kubernetes

    from .. import constants

    api_client, namespace, _user = kube_connection(args.kubeconfig, args.context, args.namespace)
    api = kubernetes.client.CustomObjectsApi(api_client)
    try:
        obj = api.get_namespaced_custom_object(constants.GROUP, constants.VERSION, namespace, constants.PLURAL, args.name)
    except kubernetes.client.ApiException as exc:
        print(f"sweepctl status: TrainingSweep {namespace}/{args.name}: {exc.reason} ({exc.status})", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:  # connection refused, DNS, TLS: say so without a traceback
        print(f"sweepctl status: cannot reach the cluster: {exc}", file=sys.stderr)
        return EXIT_FAILED
    status = obj.get("status") or {}
    print(json.dumps(status, indent=2) if args.json else format_status(args.name, namespace, status))
    return EXIT_OK
