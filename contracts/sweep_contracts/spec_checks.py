"""The spec's own rules (pure): pydantic problems named by field path and the cross-field rules the schema cannot
express, run by the operator and the entrypoint alike."""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from .api import SweepSpec
from .paramspace import distributions
from .problems import Problem, SpecError

_PARAM_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_ENDPOINT_RE = re.compile(r"^https?://[^\s/]+(:\d+)?/?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_KEY_RE = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_RESERVED_PARAM_PREFIX = "_sweep"
METRIC_SCHEDULERS = ("asha", "hyperband", "median", "pbt")
# Distributions PBT can resample or perturb (Tune's `_explore`: a list steps to a neighbour, a Domain is perturbed by
# a factor or resampled); a grid is enumerated by the searcher, never mutated.
PBT_MUTABLE = ("choice", "uniform", "loguniform", "randint", "quniform")


def brief(value: Any) -> str:
    """`value` as a message shows it: repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _loc_path(loc: tuple[Any, ...]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the field at `loc` (for listing allowed fields)."""
    model: Any = SweepSpec
    for part in loc:
        if isinstance(part, int):
            continue
        fields = {f.alias or name: f for name, f in model.model_fields.items()}
        info = fields.get(part)
        if info is None:
            return None
        annotation = info.annotation
        args = getattr(annotation, "__args__", ())
        candidates = [annotation, *args]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model


def _allowed_fields(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _pydantic_problem(err: ErrorDetails) -> Problem:
    loc = tuple(err["loc"])
    path = _loc_path(loc)
    kind = err["type"]
    given: Any = err.get("input")  # whatever the user wrote there
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        owner = _model_at(loc[:-1])
        allowed = _allowed_fields(owner) if owner else []
        hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        return Problem(path, f"unknown field{did_you_mean}; allowed here: {', '.join(allowed)}")
    if kind == "missing":
        return Problem(path, "required field is missing")
    if kind == "literal_error":
        return Problem(path, f"got {brief(given)}; allowed: {ctx.get('expected')}")
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        return Problem(path, f"got {brief(given)}; must be {op} {bound}")
    if kind.startswith("int_"):
        return Problem(path, f"got {brief(given)}; must be an integer")
    if kind.startswith("float_"):
        return Problem(path, f"got {brief(given)}; must be a number")
    if kind.startswith("bool_"):
        return Problem(path, f"got {brief(given)}; must be true or false")
    if kind == "string_too_long":
        return Problem(path, f"got {len(given)} characters; at most {ctx.get('max_length')} allowed")
    if kind == "too_long":
        what = "entries" if isinstance(given, dict) else "characters" if isinstance(given, str) else "items"
        return Problem(path, f"got {len(given)} {what}; at most {ctx.get('max_length')} allowed")
    if kind.startswith("string_"):
        if kind == "string_too_short":
            return Problem(path, f"got {brief(given)}; must not be empty")
        return Problem(path, f"got {brief(given)}; must be a string")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return Problem(path, f"got {brief(given)}; must be an object (a mapping of fields)")
    if kind == "list_type":
        return Problem(path, f"got {brief(given)}; must be a list")
    if kind == "value_error":
        message = str(ctx.get("error", err["msg"]))
        return Problem(path, message)
    return Problem(path, f"got {brief(given)}; {err['msg']}")


def _worker_group_problems(spec: SweepSpec) -> list[Problem]:
    """The worker group's own rules: its minimum within the trials' workers, valid labels and tolerations."""
    problems: list[Problem] = []
    group = spec.worker_group
    max_workers = spec.trial.workers * spec.tune.max_concurrent_trials
    if group.min_replicas > max_workers:
        problems.append(
            Problem(
                "spec.workerGroup.minReplicas",
                f"got {group.min_replicas}; must be <= trial.workers x tune.maxConcurrentTrials ({max_workers})",
            )
        )
    for key, value in group.node_selector.items():
        if not _LABEL_KEY_RE.match(key) or not _LABEL_VALUE_RE.match(value):
            problems.append(
                Problem(f"spec.workerGroup.nodeSelector.{key}", f"{key}={value!r} is not a valid label key/value")
            )
    for i, tol in enumerate(group.tolerations):
        if tol.operator == "Exists" and tol.value:
            problems.append(
                Problem(f"spec.workerGroup.tolerations[{i}].value", "must be empty when operator is Exists")
            )
        if tol.toleration_seconds is not None and tol.effect != "NoExecute":
            problems.append(
                Problem(f"spec.workerGroup.tolerations[{i}].tolerationSeconds", "only valid with effect NoExecute")
            )
    return problems


def _storage_and_deletion_problems(spec: SweepSpec) -> list[Problem]:
    """Where the run writes (region, endpoint, service account), the image reference and the guard's backoff."""
    problems: list[Problem] = []
    storage = spec.storage
    if storage.region and not _REGION_RE.match(storage.region):
        problems.append(
            Problem("spec.storage.region", f"got {storage.region!r}; expected an AWS region like us-west-2")
        )
    if storage.endpoint_url and not _ENDPOINT_RE.match(storage.endpoint_url):
        problems.append(
            Problem("spec.storage.endpointUrl", f"got {storage.endpoint_url!r}; expected http(s)://host[:port]")
        )
    if not _DNS_SUBDOMAIN_RE.match(storage.service_account_name):
        problems.append(
            Problem("spec.storage.serviceAccountName", f"got {storage.service_account_name!r}; must be a DNS-1123 name")
        )
    if any(ch.isspace() for ch in spec.image):
        problems.append(Problem("spec.image", f"got {spec.image!r}; an image reference has no whitespace"))

    deletion = spec.deletion
    if deletion.max_retry_backoff_seconds < deletion.retry_backoff_seconds:
        problems.append(
            Problem(
                "spec.deletion.maxRetryBackoffSeconds",
                f"got {deletion.max_retry_backoff_seconds}; must be >= retryBackoffSeconds ({deletion.retry_backoff_seconds})",
            )
        )
    return problems


def semantic_problems(spec: SweepSpec) -> list[Problem]:
    """Rules across fields that the schema cannot express (a parsed spec; no operator limits)."""
    problems: list[Problem] = []
    tune = spec.tune
    dists = distributions(spec.param_space)

    for name in spec.param_space:
        if not _PARAM_NAME_RE.match(name):
            problems.append(
                Problem(f"spec.paramSpace.{name}", "parameter names must be identifiers (letters, digits, _)")
            )
        elif name.startswith(_RESERVED_PARAM_PREFIX):
            problems.append(
                Problem(f"spec.paramSpace.{name}", f"names starting with {_RESERVED_PARAM_PREFIX!r} are reserved")
            )

    # metric and mode go together, and adaptive schedulers/searchers need both (R13).
    if (tune.metric is None) != (tune.mode is None):
        missing = "spec.tune.mode" if tune.mode is None else "spec.tune.metric"
        given = f"metric={tune.metric!r}" if tune.metric else f"mode={tune.mode!r}"
        problems.append(Problem(missing, f"required together with {given}; set both tune.metric and tune.mode"))
    needs_metric = []
    if tune.scheduler.type in METRIC_SCHEDULERS:
        needs_metric.append(f"scheduler {tune.scheduler.type!r}")
    if tune.searcher.type == "optuna":
        needs_metric.append("searcher 'optuna'")
    if needs_metric and tune.metric is None and tune.mode is None:
        problems.append(
            Problem("spec.tune.metric", f"required by {' and '.join(needs_metric)}; set tune.metric and tune.mode")
        )

    grid_params = [n for n, d in dists.items() if d.kind == "grid"]
    sampled = [n for n, d in dists.items() if d.kind != "grid"]
    if tune.searcher.type == "grid":
        if sampled:
            problems.append(
                Problem(
                    "spec.tune.searcher.type",
                    f"'grid' enumerates {{grid: [..]}} values only, but {', '.join(sampled)} are sampled; "
                    "use searcher 'random' or make them grid values",
                )
            )
        elif not grid_params:
            problems.append(Problem("spec.tune.searcher.type", "'grid' needs at least one {grid: [..]} parameter"))
    if tune.searcher.type == "optuna" and grid_params:
        problems.append(
            Problem(
                f"spec.paramSpace.{grid_params[0]}",
                "{grid: [..]} cannot be used with searcher 'optuna'; use {choice: [..]}",
            )
        )
    if tune.scheduler.type == "asha" and tune.scheduler.grace_period > tune.scheduler.max_t:
        problems.append(
            Problem(
                "spec.tune.scheduler.gracePeriod",
                f"got {tune.scheduler.grace_period}; must be <= maxT ({tune.scheduler.max_t})",
            )
        )
    if tune.scheduler.type == "pbt":
        problems.extend(pbt_problems(spec))

    ckpt = spec.checkpoints
    if ckpt.score_attribute and not (ckpt.score_order or tune.mode):
        problems.append(
            Problem(
                "spec.checkpoints.scoreOrder",
                f"required with scoreAttribute {ckpt.score_attribute!r} when tune.mode is unset",
            )
        )
    if ckpt.score_order and not (ckpt.score_attribute or tune.metric):
        problems.append(
            Problem("spec.checkpoints.scoreAttribute", "required with scoreOrder when tune.metric is unset")
        )

    problems.extend(_tracking_problems(spec))

    problems.extend(_worker_group_problems(spec))
    problems.extend(_storage_and_deletion_problems(spec))
    return problems


def pbt_problems(spec: SweepSpec) -> list[Problem]:
    """Population-based training: what it mutates comes from the paramSpace, and a population that can exploit."""
    tune, scheduler = spec.tune, spec.tune.scheduler
    path = "spec.tune.scheduler"
    problems: list[Problem] = []
    dists = distributions(spec.param_space)
    if not scheduler.hyperparam_mutations:
        mutable = [n for n, d in dists.items() if d.kind in PBT_MUTABLE]
        hint = f" (sampled here: {', '.join(mutable)})" if mutable else ""
        problems.append(
            Problem(f"{path}.hyperparamMutations", f"required by pbt: name the paramSpace parameters to mutate{hint}")
        )
    seen: set[str] = set()
    for i, name in enumerate(scheduler.hyperparam_mutations):
        where = f"{path}.hyperparamMutations[{i}]"
        if name in seen:
            problems.append(Problem(where, f"{name!r} is named twice"))
            continue
        seen.add(name)
        if name not in spec.param_space:
            close = difflib.get_close_matches(name, list(spec.param_space), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                Problem(where, f"{name!r} is not in spec.paramSpace{hint}; mutations are drawn from the paramSpace")
            )
        elif name not in dists:
            problems.append(
                Problem(where, f"{name!r} is a constant in spec.paramSpace; pbt mutates sampled parameters only")
            )
        elif dists[name].kind not in PBT_MUTABLE:
            problems.append(
                Problem(
                    where,
                    f"{name!r} is a {{{dists[name].kind}: [..]}} parameter; pbt mutates "
                    f"{', '.join(PBT_MUTABLE)}: use {{choice: [..]}}",
                )
            )
    population = tune.num_samples * math.prod(len(d.args) for d in dists.values() if d.kind == "grid")
    if population < 2:
        problems.append(
            Problem("spec.tune.numSamples", f"got {tune.num_samples}; pbt needs a population of at least 2 trials")
        )
    if tune.searcher.type == "optuna":
        problems.append(
            Problem(
                "spec.tune.searcher.type",
                "'optuna' cannot be used with pbt (Tune refuses a searcher beside it); use 'random' or 'grid'",
            )
        )
    return problems


def parse_spec(data: Any) -> SweepSpec:
    """Parse and default a `spec` mapping; SpecError with every problem."""
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError([_pydantic_problem(e) for e in exc.errors()]) from None
    problems = semantic_problems(spec)
    if problems:
        raise SpecError(problems)
    return spec


def _tracking_problems(spec: SweepSpec) -> list[Problem]:
    """spec.tracking.mlflow.credentialsSecret names a token key, or a user name and a password key (not both)."""
    mlflow = spec.tracking.mlflow if spec.tracking is not None else None
    secret = mlflow.credentials_secret if mlflow is not None else None
    if secret is None:
        return []
    path = "spec.tracking.mlflow.credentialsSecret"
    basic = (secret.username_key, secret.password_key)
    if secret.token_key and any(basic):
        return [Problem(path, "set tokenKey, or usernameKey and passwordKey, not both kinds")]
    if not secret.token_key and not any(basic):
        return [Problem(path, f"Secret {secret.name!r}: set tokenKey, or usernameKey and passwordKey")]
    if not secret.token_key and not all(basic):
        missing = "passwordKey" if secret.username_key else "usernameKey"
        return [Problem(f"{path}.{missing}", "usernameKey and passwordKey go together")]
    if secret.name and not _DNS_SUBDOMAIN_RE.match(secret.name):
        return [Problem(f"{path}.name", f"got {brief(secret.name)}; must be a Secret name (lowercase DNS subdomain)")]
    return []
