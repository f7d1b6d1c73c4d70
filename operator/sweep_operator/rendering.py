"""Render a TrainingSweep run as a KubeRay v1 RayJob (pure: a dict in, a dict out, no client).

Resources are placed on purpose (R5, R14, R15): the head runs the Tune driver and exactly
maxConcurrentTrials trial drivers (custom resource `sweep_trial_driver`) but no train worker
(`num-cpus: "0"`, no GPUs); one worker group holds the train workers, requests = limits.
Every retry class and deadline is rendered explicitly (R12).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from sweep_contracts import constants, runtime_env
from sweep_contracts.api import SweepSpec
from sweep_contracts.runspec import build_run_spec

from .policy import demand_of, effective_active_seconds
from .run_metadata import PRIORITY_CLASS_LABEL, QUEUE_LABEL, GuardTarget, queue_name_for, rendered_bounds, worker_cap
from .settings import OperatorLimits, Settings, kueue_queue_for
from .validation import Sweep

RUN_ID_ALPHABET = string.ascii_lowercase + string.digits
RUN_ID_LENGTH = 6
MANAGED_BY = "trainingsweep-operator"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
SUBMITTER_CONTAINER = "ray-job-submitter"
WORKER_GROUP = "gpu-workers"
# The submitter Job only runs `ray job submit`; a couple of retries cover a head that is not ready yet.
SUBMITTER_BACKOFF_LIMIT = 2
SUBMITTER_RESOURCES = {"cpu": "200m", "memory": "512Mi"}
DEFAULT_TTL_SECONDS_AFTER_FINISHED = Settings().ttl_seconds_after_finished
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
GPU_TAINT_TOLERATION = {"key": constants.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}

_RUN_ID_RE = re.compile(r"^[a-z0-9]{1,16}$")


def new_run_id() -> str:
    """A fresh run id: 6 lowercase letters/digits (a new run gets a new S3 prefix, R16)."""
    return "".join(secrets.choice(RUN_ID_ALPHABET) for _ in range(RUN_ID_LENGTH))


def run_id_for(uid: str) -> str:
    """The run id of the sweep whose metadata.uid is `uid`: 6 lowercase letters/digits derived from it.

    A sweep has one run. Deriving its id from the uid gives every operator instance (a restart, an HA peer)
    the same RayJob name for it, so creating the RayJob is its own idempotency check: AlreadyExists means a
    previous attempt got that far, and the RayJob is adopted. No list is needed first. A sweep deleted and
    re-created under the same name has a new uid, so it gets a new run id and a new S3 prefix (R16).
    """
    number = int.from_bytes(hashlib.sha256(f"sweeps.dev/run:{uid}".encode()).digest()[:8], "big")
    chars = []
    for _ in range(RUN_ID_LENGTH):
        number, index = divmod(number, len(RUN_ID_ALPHABET))
        chars.append(RUN_ID_ALPHABET[index])
    return "".join(chars)


def check_run_id(run_id: str) -> str:
    if not _RUN_ID_RE.match(run_id):
        raise ValueError(f"run id {run_id!r}: expected 1-16 lowercase letters or digits")
    return run_id


def rayjob_name(sweep_name: str, run_id: str, suffix: str = "") -> str:
    """`<sweep>-<runId><suffix>` as a DNS-1035 label of at most 47 characters (KubeRay derives names from it);
    `suffix` names a later attempt (resume: `-a<N>`).

    Names that are too long or not DNS-1035 (dots, a leading digit) are shortened with a hash of the
    original name, so two sweeps never collide.
    """
    check_run_id(run_id)
    plain = f"{sweep_name}-{run_id}{suffix}"
    if len(plain) <= constants.RAYJOB_NAME_MAX_LEN and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", plain):
        return plain
    digest = hashlib.sha256(sweep_name.encode()).hexdigest()[:5]
    base = re.sub(r"[^a-z0-9-]", "-", sweep_name.lower())
    if not base[:1].isalpha():
        base = "s" + base
    room = constants.RAYJOB_NAME_MAX_LEN - len(run_id) - len(digest) - len(suffix) - 2
    base = base[:room].rstrip("-") or "s"
    return f"{base}-{digest}-{run_id}{suffix}"


def sweep_labels(sweep_name: str, run_id: str) -> dict[str, str]:
    return {
        constants.LABEL_SWEEP: sweep_name,
        constants.LABEL_RUN_ID: run_id,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def _s3_env(spec: SweepSpec, settings_region: str = "", settings_endpoint: str = "") -> list[dict[str, str]]:
    env = []
    region = spec.storage.region or settings_region
    if region:
        env += [{"name": "AWS_REGION", "value": region}, {"name": "AWS_DEFAULT_REGION", "value": region}]
    endpoint = spec.storage.endpoint_url or settings_endpoint
    if endpoint:
        env.append({"name": "AWS_ENDPOINT_URL_S3", "value": endpoint})
    return env


def tracking_credentials_env(spec: SweepSpec) -> list[dict[str, Any]]:
    """The MLflow client's credentials for the head container (the Tune driver logs from there): references to the
    keys of spec.tracking.mlflow.credentialsSecret, which the kubelet resolves; no credential is ever rendered."""
    mlflow = spec.tracking.mlflow if spec.tracking is not None else None
    secret = mlflow.credentials_secret if mlflow is not None else None
    if secret is None:
        return []
    keys = (
        ("MLFLOW_TRACKING_TOKEN", secret.token_key),
        ("MLFLOW_TRACKING_USERNAME", secret.username_key),
        ("MLFLOW_TRACKING_PASSWORD", secret.password_key),
    )
    return [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": key}}} for name, key in keys if key
    ]


def _resources(cpu: str, memory: str, gpu: int = 0) -> dict[str, Any]:
    limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpu:
        limits[constants.GPU_RESOURCE] = gpu
    return {"requests": dict(limits), "limits": limits}  # requests = limits (R15)


runtime_env_yaml = runtime_env.encode  # the codec lives in runtime_env, beside its decoder


@dataclass(frozen=True)
class RenderContext:
    """What rendering needs besides the sweep: caps and operator-wide S3 defaults."""

    limits: OperatorLimits = OperatorLimits()
    ttl_seconds_after_finished: int = DEFAULT_TTL_SECONDS_AFTER_FINISHED
    s3_region: str = ""
    s3_endpoint_url: str = ""
    # Kueue mode: the LocalQueue of sweeps that name none (Settings.kueue_default_queue / kueue_namespace_queues)
    kueue_default_queue: str = ""
    kueue_namespace_queues: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> RenderContext:
        return cls(
            settings.limits,
            settings.ttl_seconds_after_finished,
            settings.s3_region,
            settings.s3_endpoint_url,
            settings.kueue_default_queue,
            settings.kueue_namespace_queues,
        )

    def queue_name(self, spec: SweepSpec, namespace: str) -> str:
        """The Kueue LocalQueue of a sweep in `namespace` ("": not Kueue mode)."""
        return queue_name_for(
            spec.queue_name, kueue_queue_for(self.kueue_default_queue, self.kueue_namespace_queues, namespace)
        )


def build_rayjob(
    sweep: Sweep,
    run_id: str,
    limits: OperatorLimits | RenderContext = RenderContext(),
    *,
    deadline_at: int | None = None,
    storage_uri: str | None = None,
) -> dict[str, Any]:
    """The RayJob (ray.io/v1) that runs `sweep` as run `run_id`.

    `deadline_at` (epoch seconds) is the sweep-wide deadline the operator fixed at admission; it reaches
    the driver as SWEEP_DEADLINE_AT. `storage_uri` replaces spec.storage.uri as the base of the run root
    (run-local into a directory, the sandbox's bucket).
    """
    ctx = limits if isinstance(limits, RenderContext) else RenderContext(limits=limits)
    spec = sweep.spec
    labels = sweep_labels(sweep.name, run_id)
    run_spec = build_run_spec(sweep, run_id, storage_uri)
    env = _s3_env(spec, ctx.s3_region, ctx.s3_endpoint_url)
    rayjob: dict[str, Any] = {
        "apiVersion": constants.RAY_API_VERSION,
        "kind": constants.RAYJOB_KIND,
        "metadata": {
            "name": rayjob_name(sweep.name, run_id),
            "namespace": sweep.namespace,
            "labels": dict(labels),
            "annotations": {
                constants.ANNOTATION_GUARD: guard_target(sweep, run_spec.run_root, run_id, ctx).to_annotation(),
                constants.ANNOTATION_RUN_SPEC: runtime_env.run_spec_digest(run_spec),
            },
            "finalizers": [constants.FINALIZER],
        },
        "spec": {
            "entrypoint": constants.ENTRYPOINT_COMMAND,
            "runtimeEnvYAML": runtime_env_yaml(run_spec, deadline_at),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": ctx.ttl_seconds_after_finished,
            "activeDeadlineSeconds": effective_active_seconds(spec, ctx.limits) + spec.deadlines.graceful_stop_seconds,
            "preRunningDeadlineSeconds": spec.deadlines.startup_seconds,
            "backoffLimit": spec.failure_policy.job_retries,
            "submissionMode": "K8sJobMode",
            "submitterConfig": {"backoffLimit": SUBMITTER_BACKOFF_LIMIT},
            "submitterPodTemplate": _submitter_template(spec, labels, env),
            "rayClusterSpec": _ray_cluster_spec(spec, ctx, labels, env, run_spec.run_root),
        },
    }
    if sweep.uid:
        rayjob["metadata"]["ownerReferences"] = [
            {
                "apiVersion": constants.API_VERSION,
                "kind": constants.KIND,
                "name": sweep.name,
                "uid": sweep.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    if spec.suspend:
        rayjob["spec"]["suspend"] = True
    queue = ctx.queue_name(spec, sweep.namespace)
    if queue:
        for_kueue(rayjob, queue, spec.priority_class_name)
    demand = demand_of(spec)
    bounds = rendered_bounds(rayjob, demand.workers, demand.gpus)
    rayjob["metadata"]["annotations"][constants.ANNOTATION_BOUNDS] = bounds.to_annotation()
    return rayjob


def _submitter_template(spec: SweepSpec, labels: Mapping[str, str], env: list[dict[str, str]]) -> dict[str, Any]:
    """The K8sJobMode submitter's pod: it submits the driver and follows it, with the sweep's S3 environment."""
    return {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "serviceAccountName": spec.storage.service_account_name,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": SUBMITTER_CONTAINER,
                    "image": spec.image,
                    "resources": {"requests": dict(SUBMITTER_RESOURCES), "limits": dict(SUBMITTER_RESOURCES)},
                    "env": list(env),
                }
            ],
        },
    }


def _ray_cluster_spec(
    spec: SweepSpec, ctx: RenderContext, labels: Mapping[str, str], env: list[dict[str, str]], run_root: str
) -> dict[str, Any]:
    """The RayCluster: a head that holds exactly maxConcurrentTrials trial drivers and no train worker (R5, R14),
    one autoscaled worker group capped by the operator's limits."""
    head_container = {
        "name": HEAD_CONTAINER,
        "image": spec.image,
        "resources": _resources(spec.head.cpu, spec.head.memory),
        "env": [*env, {"name": constants.ENV_RUN_ROOT, "value": run_root}, *tracking_credentials_env(spec)],
    }
    return {
        "rayVersion": spec.ray_version,
        "enableInTreeAutoscaling": True,
        "headGroupSpec": {
            "rayStartParams": {
                "num-cpus": "0",  # no train worker lands on the head (R5)
                "num-gpus": "0",
                # exactly maxConcurrentTrials trial drivers fit on the head (R5, R14)
                "resources": json.dumps(json.dumps({constants.TRIAL_DRIVER_RESOURCE: spec.tune.max_concurrent_trials})),
            },
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {"serviceAccountName": spec.storage.service_account_name, "containers": [head_container]},
            },
        },
        "workerGroupSpecs": [
            {
                "groupName": WORKER_GROUP,
                "replicas": spec.worker_group.min_replicas,
                "minReplicas": spec.worker_group.min_replicas,
                "maxReplicas": worker_cap(spec, ctx.limits),
                "rayStartParams": {},
                "template": {"metadata": {"labels": dict(labels)}, "spec": _worker_pod_spec(spec, env)},
            }
        ],
    }


def _worker_pod_spec(spec: SweepSpec, env: list[dict[str, str]]) -> dict[str, Any]:
    """A train worker's pod: the trial's resources, /dev/shm in memory, the instance type and GPU taint honoured."""
    res = spec.trial.resources_per_worker
    worker_container = {
        "name": WORKER_CONTAINER,
        "image": spec.image,
        "resources": _resources(res.cpu, res.memory, res.gpu),
        "env": list(env),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    node_selector = dict(spec.worker_group.node_selector)
    if spec.worker_group.instance_type:
        node_selector.setdefault(INSTANCE_TYPE_LABEL, spec.worker_group.instance_type)
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.worker_group.tolerations]
    tolerations = [{k: v for k, v in t.items() if v != ""} for t in tolerations]
    if res.gpu and GPU_TAINT_TOLERATION not in tolerations:
        tolerations.append(dict(GPU_TAINT_TOLERATION))
    worker_pod_spec: dict[str, Any] = {
        "serviceAccountName": spec.storage.service_account_name,
        "restartPolicy": "Never",  # KubeRay's autoscaler replaces failed workers itself
        "containers": [worker_container],
        # NCCL and DataLoader workers need more shared memory than the container default.
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    if node_selector:
        worker_pod_spec["nodeSelector"] = node_selector
    if tolerations:
        worker_pod_spec["tolerations"] = tolerations
    return worker_pod_spec


def for_kueue(rayjob: dict[str, Any], queue: str, priority_class: str = "") -> None:
    """Make the RayJob Kueue's (in place), as its RayJob integration requires (kubernetes-sigs/kueue
    site/content/en/docs/tasks/run/rayjobs.md; pkg/controller/jobs/rayjob/rayjob_webhook.go validateCreate and
    raycluster ValidateCreate):

    - the queue-name label (and the WorkloadPriorityClass label), copied by KubeRay onto the RayCluster too;
    - created suspended: Kueue admits it by setting spec.suspend false ("Kueue controls the spec.suspend field");
    - shutdownAfterJobFinishes true and no clusterSelector (both already so: the cluster must go when the job
      ends, or it keeps the queue's quota);
    - no in-tree autoscaling (refused unless elastic workload slices are on): Kueue reserves quota for the worker
      group's `replicas`, so the group is fixed at the sweep's whole (capped) demand.
    """
    meta, spec = rayjob["metadata"], rayjob["spec"]
    meta["labels"][QUEUE_LABEL] = queue
    if priority_class:
        meta["labels"][PRIORITY_CLASS_LABEL] = priority_class
    spec["suspend"] = True
    spec["shutdownAfterJobFinishes"] = True
    spec.pop("clusterSelector", None)
    cluster = spec["rayClusterSpec"]
    cluster["enableInTreeAutoscaling"] = False
    for group in cluster["workerGroupSpecs"]:
        size = int(group["maxReplicas"])
        group.update(replicas=size, minReplicas=size, maxReplicas=size)


def guard_target(sweep: Sweep, run_root: str, run_id: str, ctx: RenderContext = RenderContext()) -> GuardTarget:
    """What the guard will verify for this run: the storage the job writes to (operator defaults fill what the
    spec leaves empty, as they do for the job's own environment)."""
    spec = sweep.spec
    return GuardTarget(
        run_root=run_root,
        endpoint_url=spec.storage.endpoint_url or ctx.s3_endpoint_url,
        region=spec.storage.region or ctx.s3_region,
        verify=spec.deletion.verify_checkpoints,
        timeout_seconds=spec.deletion.verification_timeout_seconds,
        sweep=sweep.name,
        run_id=run_id,
    )


class _ManifestDumper(yaml.SafeDumper):
    """No anchors/aliases (kubectl users read these) and multi-line strings as `|` blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _str_representer)


def to_yaml(obj: dict[str, Any]) -> str:
    return yaml.dump(obj, Dumper=_ManifestDumper, sort_keys=False, width=1_000_000)
