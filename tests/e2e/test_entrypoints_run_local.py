"""`sweepctl run-local` on real Ray: the field review's scalar example end to end (its own local Ray, 2 cores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweep_operator.cli import main

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.timeout(420)
def test_review_scalar_example_through_run_local_picks_x_3_with_score_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The review's check: two trials of score = -(x - 3)^2 (steps 0 and 1); the best is x=3 with score 0."""
    code = main(
        [
            "run-local",
            "-f", str(EXAMPLES / "review-scalar.yaml"),
            "--storage", str(tmp_path / "store"),
            "--run-id", "review1",
            "--log-dir", str(tmp_path / "logs"),
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    print(err[-3000:])
    assert code == 0, (tmp_path / "logs" / "driver.log").read_text()[-5000:]

    result = json.loads((tmp_path / "store/default/review-scalar-review1/_sweep/result.json").read_text())
    assert result["trials"] == {"total": 2, "pending": 0, "running": 0, "terminated": 2, "errored": 0}
    assert result["bestTrial"]["config"] == {"x": 3} and result["bestTrial"]["value"] == 0
    assert sorted((t["config"]["x"], t["value"]) for t in result["trialResults"]) == [(1, -4.0), (3, 0.0)]

    best_row = next(line for line in out.splitlines() if line.startswith("*"))
    assert best_row.split()[2:5] == ["TERMINATED", "x=3", "0"]
    assert "run-local: succeeded" in err
