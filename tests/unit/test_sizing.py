"""The chart's default resources and the memory budget are the sizing rule at the size the chart is set for."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sweep_operator import memory_budget, sizing

VALUES = Path(__file__).resolve().parents[2] / "charts" / "trainingsweep-operator" / "values.yaml"
MiB = 1 << 20


def test_the_charts_default_resources_are_the_sizing_rule_at_its_size() -> None:
    resources = yaml.safe_load(VALUES.read_text())["resources"]
    sweeps = sizing.SIZED_FOR_SWEEPS
    assert resources["requests"]["cpu"] == f"{sizing.cpu_request_millicores(sweeps)}m"
    assert resources["requests"]["memory"] == f"{sizing.memory_request_mib(sweeps)}Mi"
    assert resources["limits"]["memory"] == f"{sizing.memory_limit_mib(sweeps)}Mi"
    assert "cpu" not in resources["limits"], "no CPU limit: throttling only slows reconciles"


def test_the_memory_budget_keeps_the_rules_working_set_for_the_operator() -> None:
    sweeps = sizing.SIZED_FOR_SWEEPS
    assert sizing.memory_limit_mib(sweeps) * MiB == memory_budget.DEFAULT_MEMORY_LIMIT_BYTES
    assert sizing.own_mib(sweeps) * MiB == memory_budget.OWN_BYTES_AT_LEAST
    budget = memory_budget.MemoryBudget.from_limit(0, verifications=10, readers=18)
    assert budget.tenant_bytes == sizing.TENANT_MIB * MiB, "at the default limit, tenants' data has the rule's share"


@pytest.mark.parametrize(
    "sweeps,memory_request,limit,cpu",
    [
        (0, 128, 384, 50),
        (1000, 256, 512, 200),
        (3000, 448, 704, 500),
        (10000, 1088, 1344, 1550),
    ],
)
def test_the_rule_grows_linearly_with_the_sweeps(sweeps: int, memory_request: int, limit: int, cpu: int) -> None:
    """The table docs/benchmarks.md gives for larger installs."""
    assert (sizing.memory_request_mib(sweeps), sizing.memory_limit_mib(sweeps)) == (memory_request, limit)
    assert sizing.cpu_request_millicores(sweeps) == cpu
