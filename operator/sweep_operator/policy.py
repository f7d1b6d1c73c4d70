"""Admission policy (pure): caps per sweep and per namespace, bundle fit, and the resulting decision.

    decide_admission(spec, limits, admitted) -> Admit | Queue | Reject

Demand is `trial.workers x tune.maxConcurrentTrials` worker pods and that many times the GPUs per
worker (R14, R21). A per-sweep cap or a bundle that fits no node is a Reject (the sweep is Invalid);
a namespace budget already in use is a Queue (admitted FIFO when capacity frees).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from sweep_contracts.api import SweepSpec, parse_quantity
from sweep_contracts.problems import Problem

from . import instance_types
from .settings import OperatorLimits, TenancyPolicy


@dataclass(frozen=True)
class Demand:
    """What a sweep may hold at once: worker pods and GPUs."""

    workers: int = 0
    gpus: int = 0

    def __add__(self, other: Demand) -> Demand:
        return Demand(self.workers + other.workers, self.gpus + other.gpus)


def demand_of(spec: SweepSpec) -> Demand:
    workers = spec.trial.workers * spec.tune.max_concurrent_trials
    return Demand(workers=workers, gpus=workers * spec.trial.resources_per_worker.gpu)


def effective_active_seconds(spec: SweepSpec, limits: OperatorLimits) -> int:
    """spec.deadlines.activeSeconds, or the operator's default when unset."""
    return spec.deadlines.active_seconds or limits.default_active_seconds


# The one admission vocabulary: the namespace's GPU caps, Kueue's rules and the GPU-hour checks all answer with these.
@dataclass(frozen=True)
class Admit:
    demand: Demand = Demand()
    gpu_hours: float = 0.0  # a GPU-hour check: the hours granted (the worst case, or the room a runUntilExhausted got)


@dataclass(frozen=True)
class Queue:
    demand: Demand = Demand()
    reason: str = ""
    frees_at: float | None = None  # a GPU-hour window: when it has room again (None: as running sweeps end)
    # Why, when it is no budget's ordinary wait but something an administrator must fix: the condition's reason and
    # a Warning Event's (empty: Queued, no Event)
    cause: str = ""


@dataclass(frozen=True)
class Reject:
    problems: tuple[Problem, ...]

    @property
    def reason(self) -> str:
        return "; ".join(str(p) for p in self.problems)


AdmissionDecision = Admit | Queue | Reject


def bundle_fit_problems(spec: SweepSpec) -> list[Problem]:
    """One worker (one placement-group bundle) must fit one node of workerGroup.instanceType (R14)."""
    res = spec.trial.resources_per_worker
    type_name = spec.worker_group.instance_type
    base = "spec.trial.resourcesPerWorker"
    if not type_name:
        if res.gpu > 0:
            return [
                Problem(
                    "spec.workerGroup.instanceType",
                    f"required when {base}.gpu > 0 (got {res.gpu} GPU per worker); "
                    f"one of: {', '.join(sorted(instance_types.INSTANCE_TYPES))}",
                )
            ]
        return []
    node = instance_types.lookup(type_name)
    if node is None:
        if res.gpu == 0:
            return []  # a CPU node type outside the GPU table: nothing to check against
        return [
            Problem(
                "spec.workerGroup.instanceType",
                f"{type_name!r} is not a known EKS GPU instance type; "
                f"one of: {', '.join(sorted(instance_types.INSTANCE_TYPES))}",
            )
        ]
    problems = []
    if res.gpu > node.gpus:
        problems.append(
            Problem(
                f"{base}.gpu",
                f"{res.gpu} GPUs per worker do not fit a {node.name} ({node.gpus} GPU{'s' if node.gpus > 1 else ''})",
            )
        )
    cpu = parse_quantity(res.cpu)
    if cpu > node.allocatable_cpu:
        problems.append(
            Problem(
                f"{base}.cpu",
                f"{res.cpu} CPU per worker does not fit a {node.name}: {node.vcpus} vCPUs, "
                f"{instance_types.fmt_cores(node.allocatable_cpu)} allocatable after the system allowance",
            )
        )
    memory = parse_quantity(res.memory)
    if memory > Decimal(node.allocatable_memory):
        problems.append(
            Problem(
                f"{base}.memory",
                f"{res.memory} per worker does not fit a {node.name}: {node.memory_gib}Gi, "
                f"{instance_types.fmt_gib(node.allocatable_memory)} allocatable after the system allowance",
            )
        )
    return problems


def cap_problems(spec: SweepSpec, limits: OperatorLimits) -> list[Problem]:
    """Per-sweep caps (the sweep alone can never be admitted past these)."""
    demand = demand_of(spec)
    workers, trials = spec.trial.workers, spec.tune.max_concurrent_trials
    shape = f"{workers} worker{'s' * (workers != 1)} x {trials} concurrent trial{'s' * (trials != 1)}"
    problems = []
    if demand.workers > limits.max_workers_per_sweep:
        problems.append(
            Problem(
                "spec.trial.workers",
                f"demand of {demand.workers} worker pods ({shape}) exceeds maxWorkersPerSweep "
                f"{limits.max_workers_per_sweep}",
            )
        )
    if demand.gpus > limits.max_gpus_per_sweep:
        problems.append(
            Problem(
                "spec.trial.resourcesPerWorker.gpu",
                f"demand of {demand.gpus} GPUs ({shape} x {spec.trial.resources_per_worker.gpu} GPU) exceeds "
                f"maxGpusPerSweep {limits.max_gpus_per_sweep}",
            )
        )
    if demand.gpus > limits.max_gpus_per_namespace:
        problems.append(
            Problem(
                "spec.trial.resourcesPerWorker.gpu",
                f"demand of {demand.gpus} GPUs exceeds maxGpusPerNamespace {limits.max_gpus_per_namespace}: "
                "it could never be admitted",
            )
        )
    active = effective_active_seconds(spec, limits)
    source = "spec.deadlines.activeSeconds" if spec.deadlines.active_seconds else "defaultActiveSeconds"
    if active > limits.max_active_seconds:
        problems.append(
            Problem(
                "spec.deadlines.activeSeconds",
                f"{active}s exceeds maxActiveSeconds {limits.max_active_seconds}s",
            )
        )
    if spec.deadlines.startup_seconds >= active:
        problems.append(
            Problem(
                "spec.deadlines.startupSeconds",
                f"{spec.deadlines.startup_seconds}s must be less than the active deadline ({source} = {active}s)",
            )
        )
    timeout = spec.deletion.verification_timeout_seconds
    if timeout > limits.max_verification_timeout_seconds:
        problems.append(
            Problem(
                "spec.deletion.verificationTimeoutSeconds",
                f"{timeout}s exceeds maxVerificationTimeoutSeconds {limits.max_verification_timeout_seconds}s",
            )
        )
    if spec.deadlines.graceful_stop_seconds >= active:
        problems.append(
            Problem(
                "spec.deadlines.gracefulStopSeconds",
                f"{spec.deadlines.graceful_stop_seconds}s must be less than the active deadline ({source} = {active}s)",
            )
        )
    return problems


def tenancy_problems(spec: SweepSpec, namespace: str, tenancy: TenancyPolicy) -> list[Problem]:
    """The operator's allowlists: the service account the sweep's pods run as, and the S3 endpoint the operator
    itself will call with its own credentials for this sweep (an unchecked one is a request-forgery path)."""
    problems = []
    account = spec.storage.service_account_name
    if not tenancy.service_account_allowed(namespace, account):
        allowed = tenancy.service_accounts_for(namespace)
        problems.append(
            Problem(
                "spec.storage.serviceAccountName",
                f"got {account!r}; not allowed in namespace {namespace!r}; allowed: "
                + (", ".join(allowed) if allowed else "none (no service account is allowed in this namespace)"),
            )
        )
    endpoint = spec.storage.endpoint_url
    if not tenancy.endpoint_allowed(endpoint):
        problems.append(
            Problem(
                "spec.storage.endpointUrl",
                f"got {endpoint!r}; its host is not an allowed S3 endpoint; allowed hosts: "
                f"{', '.join(tenancy.allowed_endpoint_hosts)} (or leave it empty for the operator's default)",
            )
        )
    return problems


def decide_admission(spec: SweepSpec, limits: OperatorLimits, admitted: Demand) -> AdmissionDecision:
    """Admit, Queue or Reject a valid spec, given the demand already admitted in its namespace."""
    problems = cap_problems(spec, limits) + bundle_fit_problems(spec)
    if problems:
        return Reject(tuple(problems))
    demand = demand_of(spec)
    if demand.gpus and admitted.gpus + demand.gpus > limits.max_gpus_per_namespace:
        free = max(limits.max_gpus_per_namespace - admitted.gpus, 0)
        return Queue(
            demand,
            f"needs {demand.gpus} GPUs; namespace budget maxGpusPerNamespace {limits.max_gpus_per_namespace} "
            f"has {free} free ({admitted.gpus} held by admitted sweeps)",
        )
    return Admit(demand)
