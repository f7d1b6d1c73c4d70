"""What the tracker sends MLflow: where and as what a sweep is tracked (its runs found again by their tags), and one
result's metrics and one config's params within MLflow's bounds."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sweep_contracts import tracking as contract
from sweep_contracts.runspec import RunSpec

# MLflow's key and param value bounds (mlflow/utils/validation.py).
_KEY_MAX = 250
_PARAM_VALUE_MAX = 6000
_KEY_RE = re.compile(r"^[\w\-./ :]+$")
# Tune's and Train's own result keys: not the loop's metrics.
_BOOKKEEPING = frozenset(
    {
        "config",
        "checkpoint_dir_name",
        "checkpoint_path",
        "date",
        "done",
        "experiment_tag",
        "hostname",
        "iterations_since_restore",
        "node_ip",
        "pid",
        "should_checkpoint",
        "time_since_restore",
        "time_this_iter_s",
        "time_total_s",
        "timestamp",
        "timesteps_since_restore",
        "training_iteration",
        "trial_id",
        "warmup_time",
    }
)


class TrackingClient(Protocol):
    """The part of `mlflow.MlflowClient` used here (a fake in the unit tests)."""

    def get_experiment_by_name(self, name: str) -> Any: ...
    def create_experiment(self, name: str, tags: dict[str, str] | None = None) -> str: ...
    def search_runs(self, experiment_ids: list[str], filter_string: str = "", max_results: int = ...) -> Any: ...
    def create_run(
        self, experiment_id: str, start_time: int | None = None, tags: dict[str, str] | None = None,
        run_name: str | None = None,
    ) -> Any: ...  # fmt: skip
    def get_run(self, run_id: str) -> Any: ...
    def update_run(self, run_id: str, status: str | None = None, name: str | None = None) -> None: ...
    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None: ...
    def set_terminated(self, run_id: str, status: str | None = None, end_time: int | None = None) -> None: ...


@dataclass(frozen=True)
class TrackingTarget:
    """Where and as what the sweep is tracked: from the run spec."""

    tracking_uri: str
    experiment_name: str
    namespace: str
    sweep: str
    run_id: str
    run_root: str

    @classmethod
    def of(cls, run_spec: RunSpec) -> TrackingTarget | None:
        tracking = run_spec.spec.tracking
        mlflow = tracking.mlflow if tracking is not None else None
        if mlflow is None:
            return None
        return cls(
            tracking_uri=mlflow.tracking_uri,
            experiment_name=mlflow.experiment_name
            or contract.default_experiment_name(run_spec.namespace, run_spec.sweep),
            namespace=run_spec.namespace,
            sweep=run_spec.sweep,
            run_id=run_spec.run_id,
            run_root=run_spec.run_root,
        )

    def tags(self, role: str) -> dict[str, str]:
        return {
            contract.TAG_NAMESPACE: self.namespace,
            contract.TAG_SWEEP: self.sweep,
            contract.TAG_RUN_ID: self.run_id,
            contract.TAG_ROLE: role,
        }

    def run_filter(self, role: str, trial_id: str | None = None) -> str:
        """MLflow's search filter for this sweep's parent run (or one trial's run): by tags, never by name."""
        tags = self.tags(role)
        if trial_id is not None:
            tags[contract.TAG_TRIAL_ID] = trial_id
        return " and ".join(f"tags.`{key}` = '{_quoted(value)}'" for key, value in tags.items())


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _key(name: str) -> str | None:
    """A metric/param key MLflow takes, or None (MLflow refuses a whole batch over one bad key)."""
    return name if len(name) <= _KEY_MAX and _KEY_RE.match(name) else None


def _flat(values: Mapping[str, Any], prefix: str = "", depth: int = 0) -> Iterable[tuple[str, Any]]:
    for name, value in values.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping) and depth < 4:
            yield from _flat(value, f"{key}/", depth + 1)
        else:
            yield key, value


def metric_values(result: Mapping[str, Any]) -> dict[str, float]:
    """The loop's finite numbers of one Tune result, nested dicts flattened with '/'; Tune's bookkeeping left out."""
    values: dict[str, float] = {}
    for name, value in _flat({k: v for k, v in result.items() if k not in _BOOKKEEPING}):
        key = _key(name)
        if key is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            values[key] = float(value)
    return values


def param_values(config: Mapping[str, Any]) -> dict[str, str]:
    """A trial's hyper-parameters as MLflow params (flattened with '/', values as text, cut at MLflow's bound)."""
    params: dict[str, str] = {}
    for name, value in _flat(config):
        key = _key(name)
        if key is not None:
            params[key] = str(value)[:_PARAM_VALUE_MAX]
    return params
