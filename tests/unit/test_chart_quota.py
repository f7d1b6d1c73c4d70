"""The namespace GPU boundary as Kubernetes enforces it (issue 25, defect 6): a ResourceQuota on
requests.nvidia.com/gpu in each runner namespace, from limits.maxGpusPerNamespace."""

from __future__ import annotations

import pytest

from tests.unit.test_chart import NAMESPACE, of_kind, render_values


def _quotas(values: dict) -> dict[str, str]:
    return {
        q["metadata"]["namespace"]: q["spec"]["hard"]["requests.nvidia.com/gpu"]
        for q in of_kind(render_values(values), "ResourceQuota")
    }


def test_each_runner_namespace_gets_a_gpu_quota_of_the_namespace_budget() -> None:
    values = {"runner": {"serviceAccount": {"namespaces": ["team-a", "team-b"]}}, "limits": {"maxGpusPerNamespace": 24}}
    assert _quotas(values) == {"team-a": "24", "team-b": "24"}


def test_the_quota_defaults_to_the_release_namespace_and_can_be_sized_or_turned_off() -> None:
    assert _quotas({}) == {NAMESPACE: "32"}
    assert _quotas({"runner": {"gpuQuota": {"gpus": 8}}}) == {NAMESPACE: "8"}
    assert _quotas({"runner": {"gpuQuota": {"enabled": False}}}) == {}


def test_a_bad_quota_value_is_refused_naming_the_field() -> None:
    with pytest.raises(Exception, match="gpus"):
        render_values({"runner": {"gpuQuota": {"gpus": -1}}})
