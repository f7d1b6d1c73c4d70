"""The paramSpace grammar: constants and the six distributions a TrainingSweep may sample from.

    lr:      {loguniform: [1.0e-4, 1.0e-1]}     hidden: {choice: [64, 128]}     epochs: 6
    x:       {grid: [1, 3]}                      drop:   {uniform: [0.0, 0.5]}   seed: {randint: [0, 100]}
    batch:   {quniform: [16, 256, 16]}

Validation here is pure; the entrypoint turns a parsed value into `ray.tune` sampling objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Final

from pydantic import AfterValidator

DISTRIBUTIONS: Final = ("choice", "grid", "uniform", "loguniform", "randint", "quniform")
_SCALARS = (str, int, float, bool)
_ALLOWED = (
    "a constant (number, string, boolean) or one of {choice: [..]}, {grid: [..]}, {uniform: [lo, hi]}, "
    "{loguniform: [lo, hi]}, {randint: [lo, hi]}, {quniform: [lo, hi, q]}"
)


@dataclass(frozen=True)
class Distribution:
    """A parsed distribution: `kind` is one of DISTRIBUTIONS, `args` its validated arguments."""

    kind: str
    args: tuple[Any, ...]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(kind: str, args: Any, count: int, names: str) -> tuple[float, ...]:
    if not isinstance(args, list) or len(args) != count or not all(_is_number(a) for a in args):
        raise ValueError(f"{{{kind}: {args!r}}} needs [{names}] ({count} finite numbers)")
    return tuple(args)


def parse_distribution(value: Any) -> Distribution | None:
    """The distribution `value` describes, None for a constant; ValueError naming what is allowed."""
    if value is None or isinstance(value, _SCALARS):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number")
        return None
    if isinstance(value, list):
        raise ValueError(
            f"a bare list {value!r} is ambiguous: write {{choice: [..]}} to sample from it or {{grid: [..]}} "
            "to try every value"
        )
    if not isinstance(value, dict):
        raise ValueError(f"{value!r} is not {_ALLOWED}")
    if len(value) != 1:
        raise ValueError(f"{value!r} must have exactly one key, the distribution; allowed: {', '.join(DISTRIBUTIONS)}")
    ((kind, args),) = value.items()
    if kind not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {kind!r}; allowed: {', '.join(DISTRIBUTIONS)}")
    if kind in ("choice", "grid"):
        if not isinstance(args, list) or not args:
            raise ValueError(f"{{{kind}: {args!r}}} needs a non-empty list of values")
        if any(isinstance(a, dict) for a in args):
            raise ValueError(f"{{{kind}: {args!r}}}: values must be constants, not objects")
        return Distribution(kind, tuple(args))
    if kind == "randint":
        low, high = _numbers(kind, args, 2, "low, high")
        if not all(isinstance(a, int) for a in args):
            raise ValueError(f"{{randint: {args!r}}} needs integer bounds")
        if low >= high:
            raise ValueError(f"{{randint: {args!r}}}: low must be < high (high is exclusive)")
        return Distribution(kind, (low, high))
    if kind == "quniform":
        low, high, q = _numbers(kind, args, 3, "low, high, q")
        if q <= 0:
            raise ValueError(f"{{quniform: {args!r}}}: q must be > 0")
    else:
        low, high = _numbers(kind, args, 2, "low, high")
    if low >= high:
        raise ValueError(f"{{{kind}: {args!r}}}: low must be < high")
    if kind == "loguniform" and low <= 0:
        raise ValueError(f"{{loguniform: {args!r}}}: bounds must be > 0")
    return Distribution(kind, tuple(args))


def _validate(value: Any) -> Any:
    parse_distribution(value)
    return value


# A paramSpace value in its wire form, checked against the grammar.
ParamValue = Annotated[Any, AfterValidator(_validate)]


def distributions(param_space: dict[str, Any]) -> dict[str, Distribution]:
    """The non-constant parameters of an already validated paramSpace."""
    out = {}
    for name, value in param_space.items():
        dist = parse_distribution(value)
        if dist is not None:
            out[name] = dist
    return out


def grid_size(param_space: dict[str, Any]) -> int:
    """Points in the grid (1 without grid parameters): Tune runs numSamples x this many trials."""
    size = 1
    for dist in distributions(param_space).values():
        if dist.kind == "grid":
            size *= len(dist.args)
    return size
