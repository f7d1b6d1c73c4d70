"""The records a verification reads: Ray's checkpoint-manager snapshot, our `_sweep/result.json` and `status.json`, and
Tune's experiment states.

The snapshot is Ray 2.58's; Tune's states are parsed by sweep_contracts.tune_state, shared with the training image.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sweep_contracts import s3_layout
from sweep_contracts.checkpoint_manifest import (
    FormatError,
    load_json_object,
)
from sweep_contracts.tune_state import iter_trial_records

from ..memory_budget import DocumentBounds, load_json


@dataclass(frozen=True)
class Snapshot:
    """What the verifier reads from Ray 2.58's `_CheckpointManagerState` JSON."""

    committed: tuple[str, ...]  # checkpoint_results[].checkpoint_dir_name, plus the latest, in order
    latest: str | None  # latest_checkpoint_result.checkpoint_dir_name
    ray_version: str | None


def _checkpoint_dir_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or "/" in value or value in (".", ".."):
        raise FormatError(f"{where}: got {value!r}; expected a directory name (no '/')")
    return value


def parse_snapshot(data: bytes) -> Snapshot:
    """Parse Ray's commit record; raises FormatError naming the field that is wrong."""
    doc = load_json_object(data, s3_layout.SNAPSHOT_FILE)
    results = doc.get("checkpoint_results")
    if not isinstance(results, list):
        raise FormatError(f"checkpoint_results: got {results!r}; expected a list")
    committed: list[str] = []
    for i, item in enumerate(results):
        if not isinstance(item, dict):
            raise FormatError(f"checkpoint_results[{i}]: got {item!r}; expected an object")
        committed.append(
            _checkpoint_dir_name(item.get("checkpoint_dir_name"), f"checkpoint_results[{i}].checkpoint_dir_name")
        )
    latest_doc = doc.get("latest_checkpoint_result")
    latest: str | None = None
    if latest_doc is not None:
        if not isinstance(latest_doc, dict):
            raise FormatError(f"latest_checkpoint_result: got {latest_doc!r}; expected an object or null")
        latest = _checkpoint_dir_name(
            latest_doc.get("checkpoint_dir_name"), "latest_checkpoint_result.checkpoint_dir_name"
        )
        if latest not in committed:  # Ray never deletes the latest; verify it even if a snapshot omits it
            committed.append(latest)
    ray_version = doc.get("ray_version")
    return Snapshot(tuple(dict.fromkeys(committed)), latest, ray_version if isinstance(ray_version, str) else None)


def best_checkpoint_uri(data: bytes) -> str | None:
    """`bestTrial.checkpointUri` of `_sweep/result.json` (None when the sweep has no best checkpoint)."""
    doc = load_json_object(data, s3_layout.RESULT_KEY)
    best = doc.get("bestTrial")
    if best is None:
        return None
    if not isinstance(best, dict):
        raise FormatError(f"bestTrial: got {best!r}; expected an object or null")
    uri = best.get("checkpointUri")
    if uri is not None and (not isinstance(uri, str) or not uri):
        raise FormatError(f"bestTrial.checkpointUri: got {uri!r}; expected an s3:// URI or null")
    return uri


def recorded_checkpoints(data: bytes, what: str) -> dict[str, str]:
    """{trial id: checkpoint URI} for every trial `_sweep/status.json` or `result.json` records with a checkpoint
    (`trialResults[]`, and `bestTrial`); raises FormatError naming the field that is wrong."""
    doc = load_json_object(data, what)
    found: dict[str, str] = {}
    rows = doc.get("trialResults", [])
    if not isinstance(rows, list):
        raise FormatError(f"{what}: trialResults: got {rows!r}; expected a list")
    best = doc.get("bestTrial")
    for i, row in enumerate([*rows, *([best] if isinstance(best, dict) else [])]):
        if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not row["id"]:
            raise FormatError(f"{what}: trialResults[{i}]: got {row!r}; expected an object with an id")
        uri = row.get("checkpointUri")
        if uri is not None and (not isinstance(uri, str) or not uri):
            raise FormatError(f"{what}: trialResults[{i}].checkpointUri: got {uri!r}; expected a URI or null")
        if uri:
            found.setdefault(row["id"], uri)
    return found


def experiment_state_checkpoints(data: bytes | str, what: str, bounds: DocumentBounds | None = None) -> dict[str, str]:
    """{trial id: checkpoint path} for every trial of one Tune experiment state whose last result names a checkpoint
    (Tune over Train: the path TuneReportCallback forwards, R18); raises FormatError when the file is not Tune's.
    With `bounds`, the document and each trial's records nested in it are checked before they are parsed
    (DocumentTooLarge), and the trials are parsed one at a time, each dropped once its checkpoint is taken."""
    if bounds is None:
        state = load_json_object(data if isinstance(data, bytes) else data.encode(), what)
        decode: Callable[[str], Any] = json.loads
    else:
        try:
            state = load_json(data, what, bounds)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{what} is not valid JSON ({exc})") from None
        if not isinstance(state, dict):
            raise FormatError(f"{what} must be a JSON object, got {type(state).__name__}")

        def decode(text: str) -> Any:
            return load_json(text, f"{what}: a trial's record", bounds)

    return {
        record.trial_id: record.checkpoint_path
        for record in iter_trial_records(state, what, decode)
        if record.checkpoint_path
    }
