"""The spec's tune section as Ray Tune objects: search space, searcher and scheduler (R13).

Searchers pick candidates (random and grid do not adapt; optuna does); schedulers stop or pause trials on
intermediate results. Everything here is built before Ray starts, so a bad value fails before any trial.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ray import tune
from ray.tune.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    TrialScheduler,
)
from ray.tune.search import BasicVariantGenerator, SearchAlgorithm, Searcher

from sweep_contracts.api import SweepSpec
from sweep_contracts.paramspace import Distribution, distributions, parse_distribution
from sweep_contracts.spec_checks import pbt_problems

from .pbt import ClampToParamSpace, LineagePBT


class EntrypointError(ValueError):
    """A value the entrypoint cannot run with; the message names the field and what is allowed."""


def to_tune_domain(dist: Distribution) -> Any:
    """One paramSpace distribution as a `ray.tune` sampling object (randint's high is exclusive in both)."""
    args = dist.args
    if dist.kind == "choice":
        return tune.choice(list(args))
    if dist.kind == "grid":
        return tune.grid_search(list(args))
    if dist.kind == "uniform":
        return tune.uniform(*args)
    if dist.kind == "loguniform":
        return tune.loguniform(*args)
    if dist.kind == "randint":
        return tune.randint(*args)
    if dist.kind == "quniform":
        return tune.quniform(*args)
    raise EntrypointError(f"spec.paramSpace: unknown distribution {dist.kind!r}")


def build_param_space(param_space: dict[str, Any]) -> dict[str, Any]:
    """The Tuner's `param_space`: constants as they are, distributions as Tune domains."""
    out = {}
    for name, value in param_space.items():
        try:
            dist = parse_distribution(value)
        except ValueError as exc:
            raise EntrypointError(f"spec.paramSpace.{name}: {exc}") from None
        out[name] = value if dist is None else to_tune_domain(dist)
    return out


def build_searcher(spec: SweepSpec) -> Searcher | SearchAlgorithm:
    """random and grid: Tune's BasicVariantGenerator (no adaptation); optuna: OptunaSearch when installed.

    Tune ignores TuneConfig.max_concurrent_trials for a BasicVariantGenerator (a SearchGenerator, not a Searcher),
    so the limit is given to it directly; a Searcher gets it through TuneConfig (a ConcurrencyLimiter).
    """
    searcher = spec.tune.searcher
    if searcher.type in ("random", "grid"):
        # pbt: the whole population exists from the start (PBT ranks and synchronises the trials Tune knows; a
        # generator that adds trials two at a time would make populations of two); the trial-driver slots keep
        # maxConcurrentTrials running.
        limit = 0 if spec.tune.scheduler.type == "pbt" else spec.tune.max_concurrent_trials
        return BasicVariantGenerator(max_concurrent=limit, random_state=searcher.seed)
    if searcher.type == "optuna":
        if importlib.util.find_spec("optuna") is None:
            raise EntrypointError(
                "spec.tune.searcher.type: 'optuna' needs the optuna package in the training image, and it is not "
                "installed; add optuna to the image or use searcher 'random'"
            )
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(seed=searcher.seed)
    raise EntrypointError(f"spec.tune.searcher.type: got {searcher.type!r}; allowed: random, grid, optuna")


def build_scheduler(spec: SweepSpec) -> TrialScheduler:
    """The trial scheduler; metric and mode reach it through TuneConfig."""
    s = spec.tune.scheduler
    if s.type != "fifo" and not (spec.tune.metric and spec.tune.mode):
        raise EntrypointError(f"spec.tune.metric: scheduler {s.type!r} needs tune.metric and tune.mode")
    if s.type == "fifo":
        return FIFOScheduler()
    if s.type == "asha":
        return ASHAScheduler(
            time_attr=s.time_attr,
            max_t=s.max_t,
            grace_period=s.grace_period,
            reduction_factor=s.reduction_factor,
            brackets=s.brackets,
        )
    if s.type == "hyperband":
        return HyperBandScheduler(time_attr=s.time_attr, max_t=s.max_t, reduction_factor=s.reduction_factor)
    if s.type == "median":
        return MedianStoppingRule(
            time_attr=s.time_attr, grace_period=s.grace_period, min_samples_required=s.min_samples_required
        )
    if s.type == "pbt":
        return build_pbt(spec)
    raise EntrypointError(f"spec.tune.scheduler.type: got {s.type!r}; allowed: fifo, asha, hyperband, median, pbt")


def build_pbt(spec: SweepSpec) -> LineagePBT:
    """Tune's PBT (recording its exploits) mutating the named paramSpace parameters: a choice steps to a neighbour
    or is resampled; a continuous or integer one is scaled by 0.8 or 1.2 or resampled, and kept within its bounds."""
    problems = pbt_problems(spec)  # the validator's own rules: a hand-made run spec gets the same messages
    if problems:
        raise EntrypointError("\n".join(str(p) for p in problems))
    s = spec.tune.scheduler
    dists = distributions(spec.param_space)
    mutations: dict[str, Any] = {}
    bounds: dict[str, tuple[float, float]] = {}
    for name in s.hyperparam_mutations:
        dist = dists[name]
        if dist.kind == "choice":
            mutations[name] = list(dist.args)
        else:
            mutations[name] = to_tune_domain(dist)
            low, high = float(dist.args[0]), float(dist.args[1])
            bounds[name] = (low, high - 1 if dist.kind == "randint" else high)
    return LineagePBT(
        time_attr=s.time_attr,
        perturbation_interval=s.perturbation_interval,
        hyperparam_mutations=mutations,
        quantile_fraction=s.quantile_fraction,
        resample_probability=s.resample_probability,
        custom_explore_fn=ClampToParamSpace(bounds) if bounds else None,
        synch=s.synch,
    )
