"""Names shared by every part of the product: API group, labels, finalizer, annotations, env vars.

One source for each name (STYLE habit 4); nothing here reads the environment.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "sweeps.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "TrainingSweep"
PLURAL: Final = "trainingsweeps"
SINGULAR: Final = "trainingsweep"
SHORT_NAME: Final = "tsw"
CATEGORY: Final = "ml"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
CRD_FILENAME: Final = f"{CRD_NAME}.yaml"
# The namespace's GPU-hour ledger (docs/budgets.md): one object per namespace with a GPU-hour budget, written only
# by the operator, readable by the namespace's users (kubectl get gpuhourledgers).
LEDGER_KIND: Final = "GPUHourLedger"
LEDGER_PLURAL: Final = "gpuhourledgers"
LEDGER_SINGULAR: Final = "gpuhourledger"
LEDGER_SHORT_NAME: Final = "gpuledger"
LEDGER_NAME: Final = "gpu-hours"  # the one ledger object of a namespace
LEDGER_CRD_NAME: Final = f"{LEDGER_PLURAL}.{GROUP}"
LEDGER_CRD_FILENAME: Final = f"{LEDGER_CRD_NAME}.yaml"
# The operator's record of the ledgers it created (ConfigMap in its own namespace, a key per namespace): a ledger that
# vanished is refused, not re-created (docs/budgets.md). The chart creates it; the operator may get and update it.
LEDGER_RECORD_NAME: Final = "trainingsweep-gpu-ledgers"
LEDGER_RECORD_FALLBACK_NAMESPACE: Final = "kube-system"  # without SWEEP_OPERATOR_NAMESPACE (no chart)

FINALIZER: Final = "sweeps.dev/checkpoint-guard"
LABEL_SWEEP: Final = "sweeps.dev/sweep"
LABEL_RUN_ID: Final = "sweeps.dev/run-id"
ANNOTATION_SKIP_VERIFICATION: Final = "sweeps.dev/skip-checkpoint-verification"
# On each RayJob from its creation (KubeRay copies it to the RayCluster): what the guard verifies (JSON).
ANNOTATION_GUARD: Final = "sweeps.dev/guard"
# Set by `sweepctl release --force`: who released a held object without verification, and why (JSON).
ANNOTATION_FORCE_RELEASED: Final = "sweeps.dev/force-released"
# On each RayJob from its creation (KubeRay copies it too): the worker groups as rendered, each group's replica cap
# and GPUs per worker (JSON). Drift correction and the ledger's rebuild read it, never the editable runtime env.
ANNOTATION_BOUNDS: Final = "sweeps.dev/bounds"
# On each RayJob from its creation: the sha256 of the run spec its runtimeEnvYAML carries (SWEEP_RUN_SPEC, as the
# operator wrote it). Anyone who may edit the RayJob may rewrite that field; its deadlines and budget are enforced
# only while they still match.
ANNOTATION_RUN_SPEC: Final = "sweeps.dev/run-spec-sha256"

# Every annotation key under this prefix is the operator's alone (kopf's handler progress records included:
# `AnnotationsProgressStorage(prefix=GROUP)`); the chart's ValidatingAdmissionPolicy guards them.
OPERATOR_ANNOTATION_PREFIX: Final = f"{GROUP}/"
# The marks that make a RayJob or RayCluster the operator's, besides an annotation under the prefix: the one list
# the admission policy's protected set comes from (tests/unit/test_security_guard_policy.py compares).
PROTECTED_LABELS: Final = (LABEL_SWEEP, LABEL_RUN_ID)
PROTECTED_FINALIZERS: Final = (FINALIZER,)

# KubeRay (v1.7.0) names we read or write.
RAY_GROUP: Final = "ray.io"
RAY_VERSION_API: Final = "v1"
RAY_API_VERSION: Final = f"{RAY_GROUP}/{RAY_VERSION_API}"
RAYJOB_KIND: Final = "RayJob"
RAYJOB_PLURAL: Final = "rayjobs"
RAYCLUSTER_KIND: Final = "RayCluster"
RAYCLUSTER_PLURAL: Final = "rayclusters"
RAY_LABEL_ORIGINATED_FROM_CRD: Final = "ray.io/originated-from-crd"
RAY_LABEL_ORIGINATED_FROM_CR_NAME: Final = "ray.io/originated-from-cr-name"
# On every pod of a RayCluster (ray-operator/controllers/ray/utils/constant.go RayClusterLabelKey, RayNodeTypeLabelKey).
RAY_LABEL_CLUSTER: Final = "ray.io/cluster"
RAY_LABEL_NODE_TYPE: Final = "ray.io/node-type"
RAYJOB_NAME_MAX_LEN: Final = 47  # KubeRay derives cluster/pod names from it

# The only Ray version this product is built and tested for (R1).
SUPPORTED_RAY_VERSION: Final = "2.58.0"

# Custom Ray resource on the head that admits exactly maxConcurrentTrials Tune trial drivers (R5, R14).
TRIAL_DRIVER_RESOURCE: Final = "sweep_trial_driver"

# Environment variables the RayJob hands to the entrypoint (runtimeEnvYAML.env_vars).
ENV_RUN_SPEC: Final = "SWEEP_RUN_SPEC"
ENV_DEADLINE_AT: Final = "SWEEP_DEADLINE_AT"
# On the head container: lets the guard find a RayCluster's run root when its RayJob and sweep are gone.
ENV_RUN_ROOT: Final = "SWEEP_RUN_ROOT"
ENV_TRAIN_V2: Final = "RAY_TRAIN_V2_ENABLED"
ENV_WORKER_GROUP_START_TIMEOUT: Final = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
# Ray's job supervisor (job_supervisor.py, JobSupervisor.run) reads it from the job's runtime env: how long a stopped
# job's driver has after SIGTERM before SIGKILL (Ray's default 3 s). Rendered from deadlines.gracefulStopSeconds.
ENV_JOB_STOP_WAIT: Final = "RAY_JOB_STOP_WAIT_TIME_S"
# The head's dashboard (Ray's Jobs API: KubeRay's StopJob posts /api/jobs/<id>/stop there).
DASHBOARD_PORT: Final = 8265

ENTRYPOINT_MODULE: Final = "training_entrypoints.sweep"
ENTRYPOINT_COMMAND: Final = f"python -m {ENTRYPOINT_MODULE}"

GPU_RESOURCE: Final = "nvidia.com/gpu"
