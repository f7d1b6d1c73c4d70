"""The spec's tune section as Ray Tune objects: search space, searchers and schedulers (R13)."""

from __future__ import annotations

import importlib.util

import pytest
from ray.tune.schedulers import (
    AsyncHyperBandScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
)
from ray.tune.search import BasicVariantGenerator
from ray.tune.search.sample import Categorical, Float, Integer

from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep
from training_entrypoints.search import EntrypointError, build_param_space, build_scheduler, build_searcher


def spec_with(changes: dict) -> object:
    return parse_sweep(changed(cpu_sweep(), changes)).spec


def test_param_space_maps_every_distribution_to_its_tune_domain() -> None:
    space = build_param_space(
        {
            "lr": {"loguniform": [1.0e-4, 1.0e-1]},
            "hidden": {"choice": [64, 128]},
            "x": {"grid": [1, 3]},
            "drop": {"uniform": [0.0, 0.5]},
            "seed": {"randint": [0, 100]},
            "batch": {"quniform": [16, 256, 16]},
            "epochs": 6,
            "optimizer": "sgd",
        }
    )
    assert isinstance(space["lr"], Float) and (space["lr"].lower, space["lr"].upper) == (1.0e-4, 1.0e-1)
    assert "LogUniform" in type(space["lr"].get_sampler()).__name__
    assert isinstance(space["hidden"], Categorical) and space["hidden"].categories == [64, 128]
    assert space["x"] == {"grid_search": [1, 3]}
    assert isinstance(space["drop"], Float) and (space["drop"].lower, space["drop"].upper) == (0.0, 0.5)
    assert isinstance(space["seed"], Integer) and (space["seed"].lower, space["seed"].upper) == (0, 100)
    assert isinstance(space["batch"], Float) and space["batch"].get_sampler().q == 16
    assert space["epochs"] == 6 and space["optimizer"] == "sgd"


def test_param_space_rejects_a_bad_value_naming_the_field() -> None:
    with pytest.raises(EntrypointError, match=r"spec\.paramSpace\.lr: .*loguniform"):
        build_param_space({"lr": {"loguniform": [0, 1]}})


@pytest.mark.parametrize("kind", ["random", "grid"])
def test_random_and_grid_use_the_non_adaptive_basic_variant_generator_R13(kind: str) -> None:
    """R13: random/grid do not adapt; the concurrency limit goes to the generator, which Tune would otherwise ignore."""
    changes = {"spec.tune.searcher": {"type": kind, "seed": 7}, "spec.tune.maxConcurrentTrials": 3}
    if kind == "grid":
        changes["spec.paramSpace"] = {"x": {"grid": [1, 3]}}
    searcher = build_searcher(spec_with(changes))
    assert isinstance(searcher, BasicVariantGenerator)
    assert searcher.max_concurrent == 3


@pytest.mark.skipif(importlib.util.find_spec("optuna") is not None, reason="optuna is installed here")
def test_optuna_without_the_package_is_a_clear_error_before_any_trial_R13() -> None:
    spec = spec_with({"spec.tune.searcher": {"type": "optuna"}})
    with pytest.raises(EntrypointError) as info:
        build_searcher(spec)
    message = str(info.value)
    assert message.startswith("spec.tune.searcher.type: 'optuna'")
    assert "optuna package" in message and "not installed" in message


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        ({"type": "fifo"}, FIFOScheduler),
        ({"type": "asha", "maxT": 6, "gracePeriod": 2, "reductionFactor": 3}, AsyncHyperBandScheduler),
        ({"type": "hyperband", "maxT": 9}, HyperBandScheduler),
        ({"type": "median", "gracePeriod": 2, "minSamplesRequired": 2}, MedianStoppingRule),
    ],
)
def test_each_scheduler_type_builds_its_tune_scheduler_R13(scheduler: dict, expected: type) -> None:
    spec = spec_with({"spec.tune.scheduler": scheduler})
    assert isinstance(build_scheduler(spec), expected)


def test_asha_receives_the_spec_values_R13() -> None:
    spec = spec_with({"spec.tune.scheduler": {"type": "asha", "maxT": 6, "gracePeriod": 2, "reductionFactor": 3}})
    asha = build_scheduler(spec)
    assert asha._max_t == 6 and asha._reduction_factor == 3
    assert asha._time_attr == "training_iteration"
    assert next(b._rungs for b in asha._brackets)[-1][0] == 2  # the lowest rung is the grace period


def test_pbt_mutates_the_named_param_space_parameters_within_their_bounds_R13() -> None:
    """pbt: a choice steps to a neighbour (Tune's list form), a continuous parameter is scaled or resampled from its
    domain and clamped back into its paramSpace bounds; every field reaches Tune's PopulationBasedTraining."""
    spec = spec_with(
        {
            "spec.paramSpace.seed": {"randint": [0, 10]},
            "spec.tune.numSamples": 4,
            "spec.tune.scheduler": {
                "type": "pbt",
                "perturbationInterval": 2,
                "hyperparamMutations": ["lr", "hidden", "seed"],
                "quantileFraction": 0.5,
                "resampleProbability": 0.1,
                "synch": True,
            },
        }
    )
    pbt = build_scheduler(spec)
    assert type(pbt).__name__ == "LineagePBT"
    assert pbt._perturbation_interval == 2 and pbt._quantile_fraction == 0.5 and pbt._resample_probability == 0.1
    assert pbt._synch is True and pbt._time_attr == "training_iteration"
    assert pbt._hyperparam_mutations["hidden"] == [64, 128]
    assert isinstance(pbt._hyperparam_mutations["lr"], Float) and isinstance(pbt._hyperparam_mutations["seed"], Integer)
    clamped = pbt._custom_explore_fn({"lr": 0.5, "seed": 12, "hidden": 64})
    assert clamped == {"lr": 1.0e-1, "seed": 9, "hidden": 64}  # randint's high is exclusive
    assert pbt._custom_explore_fn({"lr": 1.0e-5, "seed": -1, "hidden": 64}) == {"lr": 1.0e-4, "seed": 0, "hidden": 64}


def test_pbt_from_a_hand_made_run_spec_gets_the_validators_messages_R13() -> None:
    spec = spec_with({"spec.tune.scheduler": {"type": "median"}})
    scheduler = spec.tune.scheduler.model_copy(update={"type": "pbt"})
    spec = spec.model_copy(update={"tune": spec.tune.model_copy(update={"scheduler": scheduler})})
    with pytest.raises(EntrypointError, match=r"spec\.tune\.scheduler\.hyperparamMutations: required by pbt"):
        build_scheduler(spec)


def test_a_metric_scheduler_without_metric_fails_before_any_trial_R13() -> None:
    spec = spec_with({"spec.tune.scheduler": {"type": "fifo"}})
    asha_without_metric = spec.model_copy(
        update={
            "tune": spec.tune.model_copy(
                update={
                    "metric": None,
                    "mode": None,
                    "scheduler": spec.tune.scheduler.model_copy(update={"type": "asha"}),
                }
            )
        }
    )
    with pytest.raises(EntrypointError, match=r"spec\.tune\.metric: scheduler 'asha' needs tune\.metric"):
        build_scheduler(asha_without_metric)
