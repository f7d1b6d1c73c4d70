"""`sweepctl resume NAME [-n NS] [--active-seconds N] [--num-samples N] [--wait S]`: continue an ended sweep.

It makes the same spec change a user makes with `kubectl apply` of an edited manifest: `spec.resume.generation`
one up, `spec.resume.activeSeconds` set (or removed: the new attempt then gets what was left of the last one's
budget) and, with `--num-samples`, `spec.tune.numSamples` raised. One JSON merge patch, guarded by the
resourceVersion it was computed from. The operator then verifies the run root and starts the next attempt on it,
or refuses naming what is missing (`status.lastResume`); `--wait` waits for that answer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from sweep_contracts.api import RESUMABLE_PHASES, Phase

from .common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, api_error_text, kube_connection

MIN_ACTIVE_SECONDS = 30  # api.ResumeSpec.active_seconds' minimum
# The phases reconcile.resume can resume from (kept here so the CLI imports nothing heavy).


class Refused(Exception):
    """The sweep cannot be resumed as asked; `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("resume", help="continue an ended sweep from its verified checkpoints (same run root)")
    p.add_argument("name")
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument(
        "--active-seconds",
        type=int,
        default=None,
        metavar="N",
        help="the resumed attempt's deadline in seconds (spec.resume.activeSeconds); default: what was "
        "left of the last attempt's budget",
    )
    p.add_argument(
        "--num-samples",
        type=int,
        default=None,
        metavar="N",
        help="raise spec.tune.numSamples, the total number of trials over all attempts",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for the operator's answer (started, or refused with what is missing)",
    )
    p.set_defaults(func=run)


def resume_patch(sweep: Mapping[str, Any], *, active_seconds: int | None, num_samples: int | None) -> dict[str, Any]:
    """The merge patch that asks for one more resume of `sweep` (a TrainingSweep object as read); Refused when
    the sweep is not ended or the flags ask for something a resume cannot do (the message names the field)."""
    meta, spec, status = sweep.get("metadata") or {}, sweep.get("spec") or {}, sweep.get("status") or {}
    name = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
    phase = status.get("phase")
    if active_seconds is not None and active_seconds < MIN_ACTIVE_SECONDS:
        raise Refused(
            f"--active-seconds {active_seconds}: spec.resume.activeSeconds must be >= {MIN_ACTIVE_SECONDS}", EXIT_USAGE
        )
    current = int((spec.get("tune") or {}).get("numSamples") or 1)
    if num_samples is not None and num_samples < current:
        raise Refused(
            f"--num-samples {num_samples}: spec.tune.numSamples is {current}; a resume may only raise it "
            "(the trials that ran are kept)",
            EXIT_USAGE,
        )
    if meta.get("deletionTimestamp"):
        raise Refused(f"TrainingSweep {name} is being deleted: nothing to resume")
    if phase == Phase.SUSPENDED:
        raise Refused(
            f"TrainingSweep {name} is Suspended (spec.suspend: true), not ended: `kubectl sweep unsuspend "
            f"{meta.get('name')}` lets it run again; resume continues an ended sweep from its checkpoints"
        )
    if phase not in RESUMABLE_PHASES:
        raise Refused(
            f"TrainingSweep {name} is {phase or 'Pending'}, not ended: only a "
            f"{', '.join(RESUMABLE_PHASES[:-1])} or {RESUMABLE_PHASES[-1]} sweep can be resumed"
        )
    if not status.get("runId"):
        raise Refused(f"TrainingSweep {name} has no run (status.runId is unset): nothing to resume")
    if phase == Phase.SUCCEEDED and (num_samples is None or num_samples <= current):
        raise Refused(
            f"TrainingSweep {name} Succeeded: all {current} trials of spec.tune.numSamples finished; "
            f"pass --num-samples above {current} to run more",
            EXIT_USAGE,
        )
    generation = int((spec.get("resume") or {}).get("generation") or 0) + 1
    patch: dict[str, Any] = {
        "metadata": {"resourceVersion": meta.get("resourceVersion")},
        # None removes activeSeconds: the attempt then gets the remainder (what `kubectl apply` of a manifest
        # without it does too).
        "spec": {"resume": {"generation": generation, "activeSeconds": active_seconds}},
    }
    if num_samples is not None and num_samples != current:
        patch["spec"]["tune"] = {"numSamples": num_samples}
    return patch


def api_error_lines(exc: Any) -> list[str]:
    """What the API server (or the admission webhook) said, one line per refused field when it names them."""
    try:
        doc = json.loads(getattr(exc, "body", "") or "")
    except (TypeError, ValueError):
        return [f"HTTP {getattr(exc, 'status', '?')} {getattr(exc, 'reason', '')}".strip()]
    causes = ((doc.get("details") or {}).get("causes") or []) if isinstance(doc, dict) else []
    lines = [f"{c.get('field')}: {c.get('message')}" if c.get("field") else str(c.get("message")) for c in causes]
    return lines or [str(doc.get("message") or doc)]


def outcome_of(sweep: Mapping[str, Any], generation: int) -> tuple[str, str] | None:
    """(outcome, message) of the operator's answer to resume `generation` (None: not answered yet)."""
    status = sweep.get("status") or {}
    last = status.get("lastResume") or {}
    if last.get("generation") != generation:
        return None
    text = str(last.get("message") or "")
    for item in last.get("missing") or []:
        text += f"\n  missing: {item}"
    return str(last.get("outcome") or ""), text


def run(args: argparse.Namespace) -> int:
    import kubernetes

    from sweep_contracts import constants

    from ..kube import custom_object

    api_client, namespace, _user = kube_connection(args.kubeconfig, args.context, args.namespace)
    api = kubernetes.client.CustomObjectsApi(api_client)
    where = (constants.GROUP, constants.VERSION, namespace, constants.PLURAL, args.name)
    try:
        sweep = custom_object(api.get_namespaced_custom_object(*where))
    except kubernetes.client.ApiException as exc:
        print(api_error_text(exc, args.name), file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:  # connection refused, DNS, TLS
        print(f"sweepctl resume: cannot reach the cluster: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        patch = resume_patch(sweep, active_seconds=args.active_seconds, num_samples=args.num_samples)
    except Refused as exc:
        if exc.code == EXIT_USAGE:
            raise UsageError(str(exc)) from None
        print(f"sweepctl resume: {exc}", file=sys.stderr)
        return exc.code
    generation = patch["spec"]["resume"]["generation"]
    try:
        api.patch_namespaced_custom_object(*where, patch, _content_type="application/merge-patch+json")
    except kubernetes.client.ApiException as exc:
        if exc.status == 409:
            print(
                f"sweepctl resume: TrainingSweep {namespace}/{args.name} changed since it was read (resourceVersion "
                f"{patch['metadata']['resourceVersion']}); nothing was changed: run sweepctl resume again",
                file=sys.stderr,
            )
            return EXIT_FAILED
        print(f"sweepctl resume: the API refused the resume of {namespace}/{args.name}:", file=sys.stderr)
        for line in api_error_lines(exc):
            print(f"  {line}", file=sys.stderr)
        return EXIT_USAGE if exc.status in (400, 422) else EXIT_FAILED
    asked = [f"spec.resume.generation={generation}"]
    asked.append(
        f"activeSeconds={args.active_seconds}" if args.active_seconds is not None else "activeSeconds: the remainder"
    )
    if "tune" in patch["spec"]:
        asked.append(f"spec.tune.numSamples={args.num_samples}")
    print(
        f"TrainingSweep {namespace}/{args.name}: resume requested ({', '.join(asked)}); the operator verifies the "
        "run root before it starts the next attempt"
    )
    if args.wait <= 0:
        return EXIT_OK
    deadline = time.monotonic() + args.wait
    while True:
        try:
            answer = outcome_of(custom_object(api.get_namespaced_custom_object(*where)), generation)
        except kubernetes.client.ApiException as exc:
            print(
                f"sweepctl resume: reading TrainingSweep {namespace}/{args.name}: {exc.reason} ({exc.status})",
                file=sys.stderr,
            )
            return EXIT_FAILED
        if answer is not None:
            outcome, message = answer
            print(f"{outcome}: {message}")
            return EXIT_OK if outcome == "Started" else EXIT_FAILED
        if time.monotonic() >= deadline:
            print(
                f"sweepctl resume: no answer from the operator within {args.wait:g}s "
                f"(sweepctl status {args.name} shows it when it comes)",
                file=sys.stderr,
            )
            return EXIT_FAILED
        time.sleep(0.5)
