"""The limits on what one sweep may ask for that neither Ray nor KubeRay sets: the trials (tune.numSamples, an
operator setting under a fixed CRD maximum), the node selector's labels, and what the API server answers a negative
GPU count or a bad storage URI with (the emulator's API-server validation, as `kubectl apply` prints it)."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_contracts import constants
from sweep_contracts.api import MAX_NUM_SAMPLES
from sweep_operator.crd import build_crd, openapi_schema
from sweep_operator.settings import OperatorLimits, Settings, SettingsError
from sweep_operator.validation import validate_sweep
from tests.support.factories import DELETE, changed, cpu_sweep, gpu_sweep
from tests.unit.test_chart import of_kind, render_values


def apiserver_errors(doc: dict[str, Any]) -> list[str]:
    """What the emulator's API server answers a create of `doc` with (decoded and defaulted as it stores it)."""
    from sweep_sandbox import emulator

    schema = emulator.compiled_schema("TrainingSweep", constants.GROUP, build_crd()["spec"]["versions"][0])
    schema.decode(doc)
    schema.apply_defaults(doc)
    return [str(e) for e in schema.errors(doc)]


def settings_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The operator's settings ConfigMap's data (the chart may hold other ConfigMaps)."""
    (config,) = [c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("-settings")]
    return dict(config["data"])


def problems(doc: dict[str, Any], limits: OperatorLimits | None = None) -> dict[str, str]:
    return {p.path: p.message for p in validate_sweep(doc, limits)}


def test_a_hundred_million_samples_are_refused_by_the_api_server_and_the_validator() -> None:
    doc = changed(cpu_sweep(), {"spec.tune.numSamples": 100_000_000})
    assert apiserver_errors(doc) == [
        "spec.tune.numSamples: Invalid value: 100000000: spec.tune.numSamples in body should be less than or equal "
        f"to {MAX_NUM_SAMPLES}"
    ]
    assert problems(doc) == {"spec.tune.numSamples": f"got 100000000; must be <= {MAX_NUM_SAMPLES}"}
    assert openapi_schema()["properties"]["spec"]["properties"]["tune"]["properties"]["numSamples"]["maximum"] == (
        MAX_NUM_SAMPLES
    )


def test_trials_over_the_operators_limit_are_refused_naming_the_field() -> None:
    assert problems(changed(cpu_sweep(), {"spec.tune.numSamples": 10_000})) == {}  # the default limit itself
    over = changed(cpu_sweep(), {"spec.tune.numSamples": 10_001})
    assert problems(over) == {
        "spec.tune.numSamples": "10001 trials exceed maxTrialsPerSweep 10000, the most one sweep may ask for on this "
        "operator"
    }
    grid = changed(
        cpu_sweep(),
        {
            "spec.tune.numSamples": 20,
            "spec.tune.searcher": {"type": "grid"},
            "spec.paramSpace": {"x": {"grid": [1, 2]}},
        },
    )
    assert problems(grid, OperatorLimits(max_trials_per_sweep=39)) == {
        "spec.tune.numSamples": "40 trials (20 samples x 2 grid points) exceed maxTrialsPerSweep 39, the most one "
        "sweep may ask for on this operator"
    }
    assert problems(grid, OperatorLimits(max_trials_per_sweep=40)) == {}


def test_max_trials_per_sweep_is_a_setting_under_the_crds_maximum_and_a_chart_value() -> None:
    assert OperatorLimits().max_trials_per_sweep == 10_000
    assert Settings.from_env({"SWEEP_MAX_TRIALS_PER_SWEEP": "250"}).limits.max_trials_per_sweep == 250
    with pytest.raises(SettingsError, match=r"maxTrialsPerSweep \(SWEEP_MAX_TRIALS_PER_SWEEP\).*at most 1000000"):
        OperatorLimits(max_trials_per_sweep=MAX_NUM_SAMPLES + 1)
    with pytest.raises(SettingsError, match="SWEEP_MAX_TRIALS_PER_SWEEP"):
        Settings.from_env({"SWEEP_MAX_TRIALS_PER_SWEEP": "0"})
    assert Settings.from_env(settings_env(render_values({}))).limits.max_trials_per_sweep == 10_000
    docs = render_values({"limits": {"maxTrialsPerSweep": 500}})
    assert Settings.from_env(settings_env(docs)).limits.max_trials_per_sweep == 500


def test_a_negative_gpu_count_is_answered_with_the_minimum_alone() -> None:
    """Not with the instanceType rule, which read -1 as a GPU sweep without an instance type."""
    cpu = changed(cpu_sweep(), {"spec.trial.resourcesPerWorker.gpu": -1})
    minimum = (
        "spec.trial.resourcesPerWorker.gpu: Invalid value: -1: spec.trial.resourcesPerWorker.gpu in body should be "
        "greater than or equal to 0"
    )
    assert apiserver_errors(cpu) == [minimum]
    assert problems(cpu) == {"spec.trial.resourcesPerWorker.gpu": "got -1; must be >= 0"}
    # A GPU sweep without an instance type still gets the rule's message.
    missing = changed(gpu_sweep(), {"spec.workerGroup.instanceType": DELETE})
    (error,) = apiserver_errors(missing)
    assert error.startswith('spec.workerGroup.instanceType: Invalid value: "object": workerGroup.instanceType is')


def test_a_bad_storage_uri_is_refused_quoting_the_value() -> None:
    """The API server prints a rule's failure as `Invalid value: "string"` (the type): the message names the value."""
    (error,) = apiserver_errors(changed(cpu_sweep(), {"spec.storage.uri": "gs://bucket/sweeps"}))
    assert error.startswith(
        "spec.storage.uri: Invalid value: \"string\": got 'gs://bucket/sweeps'; expected s3://bucket/prefix: a bucket"
    )


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"a" * 400 + "/zone": "a"}, 'spec.workerGroup.nodeSelector: Invalid value: "object": keys are at most 317'),
        ({"topology.kubernetes.io/zone": "z" * 64}, "Too long: may not be longer than 63"),
    ],
    ids=["key", "value"],
)
def test_node_selector_labels_are_bounded_as_kubernetes_bounds_labels(selector: dict[str, str], message: str) -> None:
    doc = changed(cpu_sweep(), {"spec.workerGroup.nodeSelector": selector})
    assert any(message in e for e in apiserver_errors(doc)), apiserver_errors(doc)
    assert any(path.startswith("spec.workerGroup.nodeSelector") for path in problems(doc))
    fine = changed(cpu_sweep(), {"spec.workerGroup.nodeSelector": {"a" * 253 + "/" + "b" * 63: "c" * 63}})
    assert apiserver_errors(fine) == []
