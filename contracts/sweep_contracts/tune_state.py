"""Tune 2.58's experiment state (`experiment_state-*.json`), read in one place: the operator's verifier asks which
trials checkpointed, the training image's resume which trials to continue.

ray/tune/execution/tune_controller.py (TuneController.CKPT_FILE_TMPL, save_to_dir) writes
`{"trial_data": [[trial JSON, run-metadata JSON], ...], "runner_data": ...}`; ray/tune/trainable/metadata.py
(_TrainingRunMetadata) holds `last_result`; ray/tune/integration/ray_train.py (TuneReportCallback) adds the checkpoint
path to it. Pure: no I/O, no Ray import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .checkpoint_manifest import FormatError

EXPERIMENT_STATE_PREFIX: Final = "experiment_state-"  # TuneController.CKPT_FILE_TMPL: experiment_state-{}.json
TUNE_CHECKPOINT_PATH_KEY: Final = "checkpoint_path"  # what TuneReportCallback puts in a trial's result


@dataclass(frozen=True)
class TrialRecord:
    """One row of `trial_data`: Tune's trial document and its run metadata, both decoded."""

    trial: dict[str, Any]  # Trial.get_json_state(): trial_id, status, ...
    metadata: dict[str, Any]  # _TrainingRunMetadata: last_result, num_failures, ...

    @property
    def trial_id(self) -> str:
        return str(self.trial["trial_id"])

    @property
    def last_result(self) -> dict[str, Any]:
        last = self.metadata.get("last_result") or {}
        return last if isinstance(last, dict) else {}

    @property
    def checkpoint_path(self) -> str | None:
        """The checkpoint the trial's last result names (Tune over Train), or None."""
        path = self.last_result.get(TUNE_CHECKPOINT_PATH_KEY)
        return path if isinstance(path, str) and path else None


def trial_records(state: Mapping[str, Any], what: str = "experiment state") -> list[TrialRecord]:
    """Every trial of one experiment-state document; FormatError (a ValueError) naming the row that is not Tune's."""
    return list(iter_trial_records(state, what))


def iter_trial_records(
    state: Mapping[str, Any], what: str = "experiment state", decode: Callable[[str], Any] = json.loads
) -> Iterator[TrialRecord]:
    """The trials of one experiment-state document one at a time, each row's two JSON documents decoded by `decode`
    (a bounded decoder for a reader that must not hold or parse more than it can afford); FormatError as
    `trial_records`, and whatever else `decode` raises."""
    rows = state.get("trial_data")
    if not isinstance(rows, list):
        raise FormatError(
            f"{what}: trial_data: got {type(rows).__name__}; expected Tune's list of [trial, run metadata] pairs"
        )
    for i, row in enumerate(rows):
        unreadable = FormatError(f"{what}: trial_data[{i}]: expected two JSON documents")
        try:
            trial_json, metadata_json = row
        except (TypeError, ValueError):
            raise unreadable from None
        if not isinstance(trial_json, str) or not isinstance(metadata_json, str):
            raise unreadable
        try:
            trial, metadata = decode(trial_json), decode(metadata_json)
        except json.JSONDecodeError:
            raise unreadable from None
        if not isinstance(trial, dict) or not isinstance(trial.get("trial_id"), str) or not trial["trial_id"]:
            raise FormatError(f"{what}: trial_data[{i}]: the trial document has no trial_id")
        if not isinstance(metadata, dict) or not isinstance(metadata.get("last_result") or {}, dict):
            raise FormatError(f"{what}: trial_data[{i}]: the run metadata or its last_result is not an object")
        yield TrialRecord(trial, metadata)
