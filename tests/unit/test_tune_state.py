"""sweep_contracts.tune_state: the one reader of Tune's experiment state, shared by the verifier and resume."""

from __future__ import annotations

import json

import pytest

from sweep_contracts.checkpoint_manifest import FormatError
from sweep_contracts.tune_state import trial_records
from tests.support.sweep_factory import REAL_TUNE_EXPERIMENT_STATE


def test_the_real_tune_experiment_state_gives_each_trial_with_its_last_checkpoint() -> None:
    """Tune 2.58.0's own file: every trial, its status, and the checkpoint path TuneReportCallback put in its result."""
    records = trial_records(json.loads(REAL_TUNE_EXPERIMENT_STATE.read_text()))
    assert [r.trial_id for r in records] == ["993a1_00000", "993a1_00001"]
    assert all(isinstance(r.trial["status"], str) for r in records)
    assert [r.checkpoint_path for r in records] == [
        "bucket/run/train/t1/checkpoint_epoch-000001",
        "bucket/run/train/t3/checkpoint_epoch-000001",
    ]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"trial_data": 3}, r"trial_data: got int"),
        ({"trial_data": [["{", "{}"]]}, r"trial_data\[0\]: expected two JSON documents"),
        ({"trial_data": [["{}", "{}", "{}"]]}, r"trial_data\[0\]: expected two JSON documents"),
        ({"trial_data": [['{"status": "RUNNING"}', "{}"]]}, r"trial_data\[0\]: the trial document has no trial_id"),
        ({"trial_data": [['{"trial_id": "a"}', "[]"]]}, r"trial_data\[0\]: the run metadata"),
        ({"trial_data": [['{"trial_id": "a"}', '{"last_result": 5}']]}, r"trial_data\[0\]: the run metadata"),
    ],
)
def test_a_row_that_is_not_tunes_is_a_format_error_naming_it(state: dict[str, object], message: str) -> None:
    with pytest.raises(FormatError, match=message):
        trial_records(state, "tune/experiment_state-x.json")


def test_a_trial_without_a_checkpoint_in_its_last_result_has_none() -> None:
    row = [json.dumps({"trial_id": "a", "status": "TERMINATED"}), json.dumps({"last_result": {"done": True}})]
    (record,) = trial_records({"trial_data": [row]})
    assert record.checkpoint_path is None and record.last_result == {"done": True}
