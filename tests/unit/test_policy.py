"""Admission policy: per-sweep caps reject, the namespace budget queues, and every bundle must fit a node (R14, R21)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sweep_contracts.spec_checks import parse_spec
from sweep_operator import instance_types
from sweep_operator.policy import (
    Admit,
    Demand,
    Queue,
    Reject,
    bundle_fit_problems,
    decide_admission,
    demand_of,
)
from sweep_operator.settings import OperatorLimits, Settings, SettingsError
from tests.support.factories import changed, cpu_sweep, gpu_sweep


def spec_with(changes: dict | None = None, base: dict | None = None):
    doc = changed(base or gpu_sweep(), changes or {})
    return parse_spec(doc["spec"])


def test_demand_is_workers_times_concurrent_trials() -> None:
    spec = spec_with({"spec.trial.workers": 3, "spec.tune.maxConcurrentTrials": 2})
    assert demand_of(spec) == Demand(workers=6, gpus=6)


def test_admits_within_caps_and_budget() -> None:
    decision = decide_admission(spec_with(), OperatorLimits(), Demand())
    assert decision == Admit(Demand(workers=4, gpus=4))


def test_over_per_sweep_gpu_cap_is_rejected_naming_cap_and_demand() -> None:
    decision = decide_admission(spec_with(), OperatorLimits(max_gpus_per_sweep=3), Demand())
    assert isinstance(decision, Reject)
    assert "demand of 4 GPUs" in decision.reason and "maxGpusPerSweep 3" in decision.reason
    assert decision.problems[0].path == "spec.trial.resourcesPerWorker.gpu"


def test_over_per_sweep_worker_cap_is_rejected_naming_cap_and_demand() -> None:
    spec = spec_with({"spec.trial.workers": 5, "spec.tune.maxConcurrentTrials": 2})
    decision = decide_admission(spec, OperatorLimits(max_workers_per_sweep=8, max_gpus_per_sweep=64), Demand())
    assert isinstance(decision, Reject)
    assert "demand of 10 worker pods (5 workers x 2 concurrent trials)" in decision.reason
    assert "maxWorkersPerSweep 8" in decision.reason


def test_demand_above_the_whole_namespace_budget_is_rejected_not_queued_forever() -> None:
    limits = OperatorLimits(max_gpus_per_sweep=64, max_gpus_per_namespace=2)
    decision = decide_admission(spec_with(), limits, Demand())
    assert isinstance(decision, Reject) and "could never be admitted" in decision.reason


def test_over_namespace_budget_is_queued_with_the_free_capacity() -> None:
    limits = OperatorLimits(max_gpus_per_namespace=6)
    decision = decide_admission(spec_with(), limits, Demand(workers=4, gpus=4))
    assert isinstance(decision, Queue)
    assert decision.demand == Demand(4, 4)
    assert "needs 4 GPUs" in decision.reason and "2 free" in decision.reason


def test_exactly_filling_the_budget_is_admitted() -> None:
    limits = OperatorLimits(max_gpus_per_namespace=8)
    assert isinstance(decide_admission(spec_with(), limits, Demand(workers=4, gpus=4)), Admit)


def test_cpu_only_sweeps_do_not_use_the_gpu_budget() -> None:
    spec = spec_with(base=cpu_sweep())
    limits = OperatorLimits(max_gpus_per_namespace=1)
    assert isinstance(decide_admission(spec, limits, Demand(workers=0, gpus=1)), Admit)


def test_active_seconds_above_operator_max_is_rejected() -> None:
    spec = spec_with({"spec.deadlines.activeSeconds": 7200})
    decision = decide_admission(spec, OperatorLimits(max_active_seconds=3600, default_active_seconds=1800), Demand())
    assert isinstance(decision, Reject) and "maxActiveSeconds 3600" in decision.reason


def test_operator_default_active_seconds_is_checked_against_startup() -> None:
    spec = spec_with({"spec.deadlines": {"startupSeconds": 1800}})
    decision = decide_admission(spec, OperatorLimits(default_active_seconds=900), Demand())
    assert isinstance(decision, Reject)
    assert "defaultActiveSeconds = 900s" in decision.reason


@pytest.mark.parametrize(
    ("instance_type", "resources", "field", "text"),
    [
        (
            "g5.2xlarge",
            {"cpu": "4", "gpu": 2, "memory": "24Gi"},
            "gpu",
            "2 GPUs per worker do not fit a g5.2xlarge (1 GPU)",
        ),
        ("g4dn.xlarge", {"cpu": "4", "gpu": 1, "memory": "8Gi"}, "cpu", "4 vCPUs"),
        ("g5.xlarge", {"cpu": "2", "gpu": 1, "memory": "16Gi"}, "memory", "16Gi per worker does not fit a g5.xlarge"),
        ("g6.12xlarge", {"cpu": "8", "gpu": 8, "memory": "64Gi"}, "gpu", "g6.12xlarge (4 GPUs)"),
        ("p3.2xlarge", {"cpu": "8", "gpu": 1, "memory": "32Gi"}, "cpu", "p3.2xlarge"),
        ("p5.48xlarge", {"cpu": "16", "gpu": 9, "memory": "64Gi"}, "gpu", "(8 GPUs)"),
        ("g6e.xlarge", {"cpu": "2", "gpu": 1, "memory": "40Gi"}, "memory", "g6e.xlarge: 32Gi"),
    ],
)
def test_bundle_that_cannot_fit_one_node_is_invalid(instance_type: str, resources: dict, field: str, text: str) -> None:
    """R14: CPU/GPU totals prove nothing; one worker's bundle must fit one node of the instance type."""
    spec = spec_with({"spec.workerGroup.instanceType": instance_type, "spec.trial.resourcesPerWorker": resources})
    problems = bundle_fit_problems(spec)
    matching = [p for p in problems if p.path == f"spec.trial.resourcesPerWorker.{field}"]
    assert matching and text in matching[0].message, problems
    assert isinstance(
        decide_admission(spec, OperatorLimits(max_gpus_per_sweep=64, max_gpus_per_namespace=64), Demand()), Reject
    )


@pytest.mark.parametrize(
    ("instance_type", "resources"),
    [
        ("g5.2xlarge", {"cpu": "6", "gpu": 1, "memory": "24Gi"}),
        ("g5.12xlarge", {"cpu": "40", "gpu": 4, "memory": "160Gi"}),
        ("p4d.24xlarge", {"cpu": "90", "gpu": 8, "memory": "1000Gi"}),
        ("p5en.48xlarge", {"cpu": "180", "gpu": 8, "memory": "1800Gi"}),
        ("g4dn.12xlarge", {"cpu": "11", "gpu": 1, "memory": "40Gi"}),
    ],
)
def test_bundles_that_fit_pass(instance_type: str, resources: dict) -> None:
    spec = spec_with({"spec.workerGroup.instanceType": instance_type, "spec.trial.resourcesPerWorker": resources})
    assert bundle_fit_problems(spec) == []


def test_cpu_only_sweep_may_omit_the_instance_type() -> None:
    assert bundle_fit_problems(spec_with(base=cpu_sweep())) == []


def test_gpu_sweep_needs_a_known_instance_type() -> None:
    spec = spec_with({"spec.workerGroup.instanceType": "m5.large"})
    (problem,) = bundle_fit_problems(spec)
    assert problem.path == "spec.workerGroup.instanceType" and "'m5.large'" in problem.message


def test_instance_table_covers_the_families_and_reserves_for_the_system() -> None:
    families = {name.split(".")[0] for name in instance_types.INSTANCE_TYPES}
    assert {"g4dn", "g5", "g6", "g6e", "p3", "p4d", "p4de", "p5", "p5e", "p5en"} <= families
    for node in instance_types.INSTANCE_TYPES.values():
        assert 0 < node.allocatable_cpu < node.vcpus
        assert 0 < node.allocatable_memory < node.memory_gib * instance_types.GIB
    g5 = instance_types.lookup("g5.2xlarge")
    assert g5 is not None and (g5.gpus, g5.vcpus, g5.memory_gib) == (1, 8, 32)
    # EKS kube-reserved CPU on 8 vCPUs: 60m + 10m + 2x5m + 4x2.5m = 90m
    assert instance_types.kube_reserved_cpu(8) == Decimal("0.09")


def test_limits_reject_nonsense_naming_the_setting() -> None:
    with pytest.raises(SettingsError, match="maxGpusPerSweep"):
        OperatorLimits(max_gpus_per_sweep=0)
    with pytest.raises(SettingsError, match="defaultActiveSeconds"):
        OperatorLimits(max_active_seconds=100, default_active_seconds=200)


def test_settings_from_env_read_once_with_named_errors() -> None:
    settings = Settings.from_env(
        {
            "SWEEP_MAX_GPUS_PER_NAMESPACE": "12",
            "SWEEP_WATCH_NAMESPACES": "ml, research",
            "SWEEP_STATUS_POLL_SECONDS": "2.5",
        }
    )
    assert settings.limits.max_gpus_per_namespace == 12
    assert settings.namespaces == ("ml", "research")
    assert settings.status_poll_seconds == 2.5
    with pytest.raises(SettingsError, match="SWEEP_MAX_GPUS_PER_SWEEP"):
        Settings.from_env({"SWEEP_MAX_GPUS_PER_SWEEP": "many"})
