"""The RayJob's runtime env (`spec.runtimeEnvYAML`): the one codec between the operator and the in-cluster
entrypoint. Encode and decode live together; no kopf, kubernetes or boto3 here."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import yaml

from . import constants
from .runspec import RunSpec

# libyaml where PyYAML has it (the wheels do): the pure-Python emitter was 8% of the operator's CPU while admitting
# a burst of sweeps, and the loader ~2 ms per RayJob read. Same documents for these inputs (tested).
_DUMPER: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def encode(run_spec: RunSpec, deadline_at: int | None) -> str:
    """`runtimeEnvYAML` for a run: its spec, Train V2 pinned, the worker-group start timeout, the stop window, the sweep
    deadline."""
    spec = run_spec.spec
    env_vars = {
        constants.ENV_RUN_SPEC: run_spec.to_json(),
        # V2 is the default in 2.58; stating it keeps a base image's setting from flipping it (R2).
        constants.ENV_TRAIN_V2: "1",
        # An unsatisfiable ScalingConfig fails after the startup budget instead of waiting forever (R6, R12).
        constants.ENV_WORKER_GROUP_START_TIMEOUT: str(spec.deadlines.startup_seconds),
        # Ray's Jobs API stop (KubeRay's StopJob, the operator's graceful stop) SIGTERMs the driver and SIGKILLs it
        # after this many seconds (Ray's default 3): the driver's window to let each trial report and commit once more.
        constants.ENV_JOB_STOP_WAIT: str(spec.deadlines.graceful_stop_seconds),
    }
    if deadline_at is not None:
        env_vars[constants.ENV_DEADLINE_AT] = str(int(deadline_at))
    return yaml.dump({"env_vars": env_vars}, Dumper=_DUMPER, sort_keys=True, width=1_000_000)


# Anyone who may edit a RayJob may rewrite its runtimeEnvYAML, and the operator reads it on every pass: the text is
# bounded (the operator's own runtime env is a few KiB) and only scalars are ever turned into text, so a small
# document of nested aliases (a "billion laughs") cannot make the operator expand it in memory.
MAX_RUNTIME_ENV_CHARS = 512 * 1024
_SCALARS = (str, int, float, bool)


def decode(text: str | None) -> dict[str, Any]:
    """A runtimeEnvYAML document as KubeRay reads it: a YAML mapping, or nothing ({}) for an empty or null document.
    ValueError, naming the field, when it is not YAML or not a mapping (KubeRay rejects both; the schema inside is
    Ray's to check), or when it is longer than MAX_RUNTIME_ENV_CHARS or nested too deep to read (a key that is a
    structure, unhashable, is refused by the loader). Keys come back as strings, as KubeRay's YAML-to-JSON step makes them."""
    if text is not None and len(text) > MAX_RUNTIME_ENV_CHARS:
        raise ValueError(f"runtimeEnvYAML is {len(text)} characters long, more than {MAX_RUNTIME_ENV_CHARS}")
    try:
        doc = yaml.load(text or "", Loader=_LOADER)
    except yaml.YAMLError as e:
        raise ValueError(f"runtimeEnvYAML is not YAML: {e}") from e
    except RecursionError as e:
        raise ValueError("runtimeEnvYAML is nested too deep to read") from e
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ValueError(f"runtimeEnvYAML must be a YAML mapping, not {type(doc).__name__}")
    return {str(k): v for k, v in doc.items()}


def env_vars(text: str | None) -> dict[str, str]:
    """The `env_vars` a runtimeEnvYAML document carries ({} when absent or unreadable). Ray takes strings; a value
    that is not a scalar (a list, a mapping) is left out rather than turned into text."""
    try:
        found = decode(text).get("env_vars")
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): str(v) for k, v in found.items() if isinstance(k, _SCALARS) and isinstance(v, _SCALARS)}


def env_vars_of(rayjob: Mapping[str, Any]) -> dict[str, str]:
    text = (rayjob.get("spec") or {}).get("runtimeEnvYAML")
    return env_vars(text if isinstance(text, str) else None)


class _Parsed:
    """Run specs by runtime-env digest: a run's runtime env never changes, and every RayJob event asks for it."""

    def __init__(self, size: int = 4096) -> None:
        self._items: OrderedDict[bytes, RunSpec | None] = OrderedDict()
        self._lock = threading.Lock()
        self._size = size

    def get(self, text: str) -> RunSpec | None:
        key = hashlib.sha256(text.encode()).digest()
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        try:
            parsed: RunSpec | None = RunSpec.from_json(env_vars(text)[constants.ENV_RUN_SPEC])
        except (KeyError, TypeError, ValueError, RecursionError):  # a run spec nested too deep is unreadable too
            parsed = None
        with self._lock:
            self._items[key] = parsed
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return parsed


_RUN_SPECS = _Parsed()


def run_spec_of(rayjob: Mapping[str, Any]) -> RunSpec | None:
    """The run spec a RayJob carries (None when absent or unreadable)."""
    text = (rayjob.get("spec") or {}).get("runtimeEnvYAML") or ""
    return _RUN_SPECS.get(text) if isinstance(text, str) else None


def run_spec_digest(run_spec: RunSpec) -> str:
    """The sha256 of a run spec as the runtime env carries it (RunSpec.to_json: a decoded one encodes the same)."""
    return hashlib.sha256(run_spec.to_json().encode()).hexdigest()


def run_spec_intact(rayjob: Mapping[str, Any], run_spec: RunSpec) -> bool:
    """Whether `run_spec` (read from the RayJob's runtimeEnvYAML) is the one the operator recorded at the create
    (the protected ANNOTATION_RUN_SPEC); a RayJob from before the record keeps its run spec."""
    recorded = ((rayjob.get("metadata") or {}).get("annotations") or {}).get(constants.ANNOTATION_RUN_SPEC)
    return not recorded or recorded == run_spec_digest(run_spec)


def deadline_of(rayjob: Mapping[str, Any]) -> float | None:
    """SWEEP_DEADLINE_AT (epoch seconds) a RayJob carries, or None."""
    try:
        return float(env_vars_of(rayjob)[constants.ENV_DEADLINE_AT])
    except (KeyError, ValueError):
        return None
