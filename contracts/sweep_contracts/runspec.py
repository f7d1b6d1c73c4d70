"""The run spec: what the operator hands the in-cluster entrypoint through `SWEEP_RUN_SPEC` (JSON).

Both sides use this module: the renderer writes it, `training_entrypoints.sweep` reads it and parses
`spec` with the same API models, so a field means the same thing on both ends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from . import constants, s3_layout
from .api import SweepSpec
from .spec_checks import parse_spec

RUN_SPEC_VERSION = 1


@dataclass(frozen=True)
class RunSpec:
    """One run of one sweep: identity, storage root and the normalised spec."""

    namespace: str
    sweep: str
    run_id: str
    run_root: str
    spec: SweepSpec
    # Attempt N of this run (optional, default 1): N > 1 is a resume of the ended run on the same run root; a KubeRay
    # retry inside an attempt keeps its number. training_entrypoints.resume says what the entrypoint does with it.
    attempt: int = 1

    @property
    def layout(self) -> s3_layout.RunLayout:
        return s3_layout.RunLayout(self.run_root)

    def to_json(self) -> str:
        return self._json

    @cached_property
    def _json(self) -> str:
        # Encoded once per run spec (its fields and the frozen API models never change): the operator compares every
        # RayJob's run spec with the digest it recorded on each pass, and the encoding is most of that comparison.
        body = {
            "version": RUN_SPEC_VERSION,
            "apiVersion": constants.API_VERSION,
            "namespace": self.namespace,
            "sweep": self.sweep,
            "runId": self.run_id,
            "runRoot": self.run_root,
            "spec": self.spec.model_dump(by_alias=True, mode="json", exclude_none=True),
        }
        if self.attempt != 1:  # absent means 1: run specs of first attempts stay as they were
            body["attempt"] = self.attempt
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        """Parse `SWEEP_RUN_SPEC`; ValueError (SpecError for the spec) naming what is wrong."""
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{constants.ENV_RUN_SPEC} is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ValueError(f"{constants.ENV_RUN_SPEC} must be a JSON object")
        missing = [k for k in ("namespace", "sweep", "runId", "runRoot", "spec") if k not in body]
        if missing:
            raise ValueError(f"{constants.ENV_RUN_SPEC} lacks {', '.join(missing)}")
        if body.get("version", RUN_SPEC_VERSION) != RUN_SPEC_VERSION:
            raise ValueError(f"{constants.ENV_RUN_SPEC} version {body.get('version')} is not {RUN_SPEC_VERSION}")
        attempt = body.get("attempt", 1)
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise ValueError(f"{constants.ENV_RUN_SPEC} attempt: got {attempt!r}; expected an integer >= 1")
        return cls(
            namespace=body["namespace"],
            sweep=body["sweep"],
            run_id=body["runId"],
            run_root=body["runRoot"],
            spec=parse_spec(body["spec"]),
            attempt=attempt,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RunSpec:
        text = env.get(constants.ENV_RUN_SPEC)
        if not text:
            raise ValueError(f"{constants.ENV_RUN_SPEC} is not set: this entrypoint runs inside a sweep's RayJob")
        return cls.from_json(text)


class NamedSpec(Protocol):
    """What a run spec needs of a parsed sweep (the operator's `validation.Sweep`)."""

    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def spec(self) -> SweepSpec: ...


def build_run_spec(sweep: NamedSpec, run_id: str, storage_uri: str | None = None, *, attempt: int = 1) -> RunSpec:
    """The run spec for `sweep`'s run `run_id`, attempt `attempt` (storage root from the S3 layout module)."""
    root = s3_layout.run_root(storage_uri or sweep.spec.storage.uri, sweep.namespace, sweep.name, run_id)
    return RunSpec(
        namespace=sweep.namespace, sweep=sweep.name, run_id=run_id, run_root=root, spec=sweep.spec, attempt=attempt
    )


def deadline_from_env(env: Mapping[str, Any]) -> float | None:
    """`SWEEP_DEADLINE_AT` (epoch seconds) or None when unset; ValueError when malformed."""
    raw = env.get(constants.ENV_DEADLINE_AT)
    if raw in (None, ""):
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{constants.ENV_DEADLINE_AT}={raw!r} is not epoch seconds") from None
