"""`sweepctl release NAME --reason TEXT [--force]` and `sweepctl guarded`: the way out of a stuck guard finalizer when
no operator can release it (docs/runbook.md).

No operator can when its Role went with the namespace or the chart was uninstalled.

`release` runs the guard's own decision (guard.decide_*) with the caller's S3 credentials and removes the finalizer
only from objects already being deleted; `--force` skips verification and records who and why (Event, annotation).
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..status import rfc3339
from .common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, kube_connection

RELEASER = "sweepctl-release"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("release", help="release a sweep's objects held by the checkpoint guard (verifies first)")
    p.add_argument("name", help="the TrainingSweep (its RayJobs and RayClusters are found by label and annotation)")
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--reason", required=True, help="why (recorded in the Events; required with --force)")
    p.add_argument("--force", action="store_true", help="release WITHOUT verification; who and why are recorded")
    p.add_argument(
        "--endpoint-url", default=None, help="S3 endpoint to verify against (default: the run's recorded one)"
    )
    p.add_argument(
        "--run-id", default=None, help="the run to release when objects of several runs of this name are held"
    )
    p.set_defaults(func=run)
    g = subparsers.add_parser(
        "guarded", help="list objects the checkpoint guard's finalizer still holds (exit 1 if any)"
    )
    g.add_argument("-n", "--namespace", action="append", default=None, help="a namespace to check (repeatable)")
    g.add_argument("-A", "--all-namespaces", action="store_true")
    g.add_argument("--kubeconfig")
    g.add_argument("--context")
    g.set_defaults(func=run_guarded)


@dataclass
class Held:
    kind: str
    plural: str
    group: str
    version: str
    obj: dict[str, Any]

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    @property
    def deleting(self) -> bool:
        return bool(self.obj["metadata"].get("deletionTimestamp"))

    @property
    def target(self) -> Any:
        """The guard record the operator wrote for this object (its protected annotation; a sweep's status.guard),
        if it names this object's own run prefix; None otherwise. Never a label or a name."""
        from ..reconcile.guard import trusted_target
        from ..reconcile.verdicts import status_target, target_of

        record = target_of(self.obj) or (status_target(self.obj) if self.kind == "TrainingSweep" else None)
        return trusted_target(record, self.obj["metadata"].get("namespace") or "default")[0]


def _clients(args: argparse.Namespace) -> tuple[Any, Any, str, str]:
    import kubernetes

    namespace = getattr(args, "namespace", None)
    api_client, namespace, user = kube_connection(
        args.kubeconfig, args.context, namespace[0] if isinstance(namespace, list) else namespace
    )
    return kubernetes.client.CustomObjectsApi(api_client), kubernetes.client.CoreV1Api(api_client), namespace, user


def _kinds() -> list[tuple[str, str, str, str]]:
    from sweep_contracts import constants

    return [
        (constants.KIND, constants.GROUP, constants.VERSION, constants.PLURAL),
        (constants.RAYJOB_KIND, constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYJOB_PLURAL),
        (constants.RAYCLUSTER_KIND, constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYCLUSTER_PLURAL),
    ]


def held_objects(custom: Any, namespace: str | None, sweep: str | None = None) -> list[Held]:
    """Objects carrying the guard's finalizer (of one sweep: the sweep by name, RayJobs and RayClusters by the sweep
    their guard record or label names; which run each belongs to is decided by its record alone, `runs_of`)."""
    from sweep_contracts import constants

    from ..reconcile.verdicts import target_of

    held = []
    for kind, group, version, plural in _kinds():
        if namespace is None:
            items = custom.list_cluster_custom_object(group, version, plural).get("items") or []
        else:
            items = custom.list_namespaced_custom_object(group, version, namespace, plural).get("items") or []
        for obj in items:
            meta = obj.get("metadata") or {}
            if constants.FINALIZER not in (meta.get("finalizers") or []):
                continue
            if sweep is not None:
                target = target_of(obj)
                belongs = (
                    meta.get("name") == sweep
                    if kind == constants.KIND
                    else (meta.get("labels") or {}).get(constants.LABEL_SWEEP) == sweep
                    or (target and target.sweep == sweep)
                )
                if not belongs:
                    continue
            held.append(Held(kind, plural, group, version, obj))
    return held


def runs_of(held: list[Held]) -> tuple[dict[str, list[Held]], list[Held]]:
    """The held objects by the run id in their guard record, and those without a record the operator wrote (made
    by an earlier version, or by hand: only `--force` releases them)."""
    runs: dict[str, list[Held]] = {}
    unrecorded = []
    for item in held:
        target = item.target
        if target is None:
            unrecorded.append(item)
        else:
            runs.setdefault(target.run_id, []).append(item)
    return runs, unrecorded


def _who(core: Any, kube_user: str) -> str:
    """The API's name for the caller (SelfSubjectReview) when it tells, else the kubeconfig user and login."""
    try:
        from kubernetes import client

        review = client.AuthenticationV1Api(core.api_client).create_self_subject_review(
            client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
        )
        user = review.status.user_info if review.status else None
        name = user.username if user else None
        if name:
            return str(name)
    except Exception:  # older servers and the sandbox's emulator have no SelfSubjectReview
        pass
    login = getpass.getuser()
    return f"{kube_user or 'unknown kubeconfig user'} (login {login})"


def _event(core: Any, item: Held, type_: str, reason: str, message: str) -> None:
    meta = item.obj["metadata"]
    now = rfc3339(datetime.now(UTC))
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace") or "default"},
        "involvedObject": {
            "apiVersion": item.obj.get("apiVersion"),
            "kind": item.kind,
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": RELEASER},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": RELEASER,
    }
    core.create_namespaced_event(meta.get("namespace") or "default", body)


def _remove_finalizer(custom: Any, item: Held) -> None:
    from sweep_contracts import constants

    meta = item.obj["metadata"]
    finalizers = meta.get("finalizers") or []
    index = finalizers.index(constants.FINALIZER)
    patch = [
        {"op": "test", "path": f"/metadata/finalizers/{index}", "value": constants.FINALIZER},
        {"op": "remove", "path": f"/metadata/finalizers/{index}"},
    ]
    custom.api_client.set_default_header("Content-Type", "application/json-patch+json")
    try:
        custom.patch_namespaced_custom_object(
            item.group, item.version, meta.get("namespace") or "default", item.plural, meta["name"], patch
        )
    finally:
        custom.api_client.default_headers.pop("Content-Type", None)


def run(args: argparse.Namespace) -> int:
    from sweep_contracts import constants

    from ..reconcile.verdicts import Release

    if not args.reason.strip():
        raise UsageError("--reason: say why (it is recorded)")
    custom, core, namespace, kube_user = _clients(args)
    try:
        held = held_objects(custom, namespace, args.name)
    except Exception as exc:
        print(f"sweepctl release: cannot read the cluster: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if not held:
        print(f"sweepctl release: nothing of sweep {namespace}/{args.name} carries {constants.FINALIZER}")
        return EXIT_OK
    deleting = [h for h in held if h.deleting]
    for item in held:
        if not item.deleting:
            print(f"  {item.kind} {item.name}: not being deleted; left guarded (delete it, and the guard verifies)")
    if not deleting:
        print("sweepctl release: nothing is being deleted; nothing to release", file=sys.stderr)
        return EXIT_USAGE
    if args.force:
        who = _who(core, kube_user)
        record = json.dumps({"by": who, "reason": args.reason, "at": datetime.now(UTC).isoformat(timespec="seconds")})
        for item in deleting:
            meta = item.obj["metadata"]
            custom.patch_namespaced_custom_object(
                item.group,
                item.version,
                meta.get("namespace") or "default",
                item.plural,
                meta["name"],
                {"metadata": {"annotations": {constants.ANNOTATION_FORCE_RELEASED: record}}},
            )
            _event(
                core,
                item,
                "Warning",
                "CheckpointGuardForceReleased",
                f"{item.kind} {item.name} released WITHOUT checkpoint verification by {who}: {args.reason}",
            )
            _remove_finalizer(custom, item)
            print(f"  {item.kind} {item.name}: released WITHOUT verification (recorded: {who}: {args.reason})")
        return EXIT_OK
    runs, unrecorded = runs_of(deleting)
    for item in unrecorded:
        print(f"  {item.kind} {item.name}: no guard record the operator wrote; left held (release it with --force)")
    if args.run_id is not None:
        runs = {k: v for k, v in runs.items() if k == args.run_id}
    if len(runs) > 1:
        print("sweepctl release: objects of several runs are held; choose one with --run-id:", file=sys.stderr)
        for run_id, items in sorted(runs.items()):
            print(f"  run {run_id}: {', '.join(f'{i.kind} {i.name}' for i in items)}", file=sys.stderr)
        return EXIT_USAGE
    if not runs:
        which = f"run {args.run_id}" if args.run_id is not None else "any run"
        print(f"sweepctl release: no held object of {which} has a guard record to verify", file=sys.stderr)
        return EXIT_FAILED
    ((run_id, items),) = runs.items()
    verdict, detail = _decide(items[0].target, args.endpoint_url)
    if not isinstance(verdict, Release):
        print(f"sweepctl release: not released (run {run_id}): {detail}", file=sys.stderr)
        return EXIT_FAILED
    for item in items:
        reason = "CheckpointGuardBypassed" if verdict.audit else "CheckpointGuardReleased"
        _event(
            core,
            item,
            "Warning" if verdict.audit else "Normal",
            reason,
            f"{item.kind} {item.name} released by sweepctl release ({args.reason}): {verdict.reason}",
        )
        _remove_finalizer(custom, item)
        print(f"  {item.kind} {item.name}: released (run {run_id}): {verdict.reason}")
    return EXIT_OK


def _decide(target: Any, endpoint_override: str | None) -> tuple[Any, str]:
    """The guard's own decision (guard_pipeline.verify_and_decide) over the run root, read with the caller's
    credentials; (the decision, a line saying why)."""
    from dataclasses import replace

    from ..reconcile.guard import Backoff, GuardFacts
    from ..reconcile.guard_pipeline import verify_and_decide
    from ..reconcile.reads import run_documents
    from ..reconcile.verdicts import problems_message
    from ..s3 import S3ClientConfig, make_s3_client
    from ..verification import verify_sweep_checkpoints

    if endpoint_override:
        target = replace(target, endpoint_url=endpoint_override)
    client = make_s3_client(S3ClientConfig(endpoint_url=target.endpoint_url, region=target.region))
    facts = GuardFacts("TrainingSweep", target.sweep, target=target)
    decision, result = verify_and_decide(
        facts,
        Backoff(attempt=0, base=0, most=0),
        lambda t: verify_sweep_checkpoints(client, t.run_root, timeout_seconds=t.timeout_seconds),
        lambda t: run_documents(client, t),
    )
    return decision, decision.reason or (problems_message(result.problems) if result is not None else "")


def run_guarded(args: argparse.Namespace) -> int:
    custom, _core, namespace, _user = _clients(args)
    if args.all_namespaces:
        held = held_objects(custom, None)
    else:
        held = [h for ns in (args.namespace or [namespace]) for h in held_objects(custom, ns)]
    if not held:
        print("no object carries the checkpoint guard's finalizer")
        return EXIT_OK
    for item in held:
        meta = item.obj["metadata"]
        state = "being deleted" if item.deleting else "guarded"
        print(f"{meta.get('namespace')}/{item.kind}/{item.name}: {state}")
    print(
        f"{len(held)} object(s) still guarded: delete the TrainingSweeps first and let the operator verify them "
        "(docs/runbook.md)",
        file=sys.stderr,
    )
    return EXIT_FAILED
