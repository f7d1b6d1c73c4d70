"""README.md's capture of `make demo` against the shape of what the demo prints (tools/demo_capture.py): the capture
is regenerated from a real run, never patched with prose, and a change to the demo's printers shows here."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep_operator.cli import sandbox
from tools.demo_capture import capture_of, check, demo_command, kinds_of, with_capture

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_the_readmes_demo_capture_is_the_shape_of_what_the_demo_prints() -> None:
    assert check(capture_of(README)) == []


def test_the_capture_is_not_patched_with_prose_and_comes_from_the_makefiles_demo() -> None:
    section = README.split("## What the demo shows", 1)[1].split("\n## ", 1)[0]
    assert "predates" not in section and "now reads" not in section
    command = demo_command((REPO / "Makefile").read_text())
    assert (
        command
        == ".venv/bin/sweepctl sandbox run --sweep examples/digits-cpu.yaml --track --then-delete --state-dir .demo"
    )
    assert f"`make demo` runs `{command.removeprefix('.venv/bin/')}`" in section


def test_a_line_the_demo_no_longer_prints_or_a_missing_one_is_caught() -> None:
    capture = capture_of(README)
    without_kept = "\n".join(line for line in capture.splitlines() if not line.startswith("sandbox: kept "))
    assert check(without_kept) == ["missing: the kept line"]
    renamed = capture.replace("result:      ", "outcome:     ", 1)
    problems = check(renamed)
    assert problems[0].startswith("line ") and "'outcome:     " in problems[0]
    assert "missing: the result line" in problems


def test_regenerating_replaces_the_capture_and_nothing_else() -> None:
    updated = with_capture(README, "sandbox: starting\n", "A run captured today.")
    assert capture_of(updated) == "sandbox: starting\n"
    before, after = README.split("<!-- demo-capture:", 1), updated.split("<!-- demo-capture:", 1)
    assert before[0] == after[0]
    assert README.rsplit("<!-- demo-capture: end -->", 1)[1] == updated.rsplit("<!-- demo-capture: end -->", 1)[1]


STATUSES = [
    {},
    {
        "phase": "Starting",
        "trialsSummary": "0/2",
        "message": "admitted (2 workers, 0 GPUs); RayJob digits-cpu-ab12 created",
    },
    {
        "phase": "Running",
        "trialsSummary": "1/2 (1 running)",
        "bestTrial": {"metric": "val_loss", "value": 0.5535},
        "message": "running: RayJob digits-cpu-ab12 Running",
    },
]
FINAL = {
    "phase": "Succeeded",
    "message": "succeeded: RayJob digits-cpu-ab12 Complete",
    "bestTrial": {
        "id": "dd27e_00000",
        "metric": "val_loss",
        "value": 0.5534514739733785,
        "config": {"batch_size": 64, "lr": 0.0623},
        "checkpointUri": "s3://sweeps-sandbox/sweeps/default/digits-cpu-ab12/train/dd27e_00000/checkpoint_epoch-000005",
    },
    "checkpoints": {"verified": True, "checked": 4, "bytes": 286392, "summary": "4 full-state"},
}


def test_the_demos_printers_print_lines_the_shape_knows(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A printer changed without the shape (and so the README's capture) following fails here."""
    lines = [sandbox._line(12.5, "digits-cpu", status) for status in STATUSES]
    lines.append(f"  trials {sandbox._bar(1, 2)} 1/2")
    sandbox._report(FINAL)
    lines += capsys.readouterr().out.splitlines()
    kept = sandbox.Kept(tmp_path / "run-root" / "default" / "digits-cpu-ab12", tmp_path / "report" / "report.html")
    lines += sandbox.next_steps(kept, "digits-cpu")
    text = "\n".join(lines)
    unknown = [line for line, kind in zip([x for x in lines if x.strip()], kinds_of(text), strict=True) if kind == "?"]
    assert unknown == []
    assert kinds_of(text)[-6:] == ["result", "report path", "next", "next command", "next command", "next command"]


class _Listing:
    """boto3's list_objects_v2 paginator over a dict of keys (one page), and get_object."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects

    def get_paginator(self, operation: str) -> _Listing:
        assert operation == "list_objects_v2"
        return self

    def paginate(self, Bucket: str, Prefix: str) -> list[dict[str, object]]:
        return [{"Contents": [{"Key": k} for k in sorted(self.objects) if k.startswith(Prefix)]}]

    def get_object(self, Bucket: str, Key: str) -> dict[str, object]:
        import io

        return {"Body": io.BytesIO(self.objects[Key])}


def test_the_kept_run_root_is_a_local_run_root_naming_itself(tmp_path: Path) -> None:
    """The demo's copy out of S3: folders for directory markers, every object, and the driver's records naming the
    copy instead of S3 (so `sweepctl verify` of the copy checks the copy)."""
    root = "s3://sweeps-sandbox/sweeps/default/digits-cpu-ab12"
    best = "train/t_00000/checkpoint_epoch-000005"
    objects = {
        "sweeps/default/digits-cpu-ab12/_sweep/": b"",
        "sweeps/default/digits-cpu-ab12/_sweep/result.json": f'{{"best": "{root}/{best}"}}'.encode(),
        "sweeps/default/digits-cpu-ab12/_sweep/status.json": b'{"root": "sweeps-sandbox/sweeps/default/digits-cpu-ab12"}',
        f"sweeps/default/digits-cpu-ab12/{best}/model.pt": b"weights",
        "sweeps/default/digits-cpu-ab12-other/_sweep/result.json": b"{}",
    }
    dest = tmp_path / "run-root" / "default" / "digits-cpu-ab12"
    assert sandbox._copy_run_root(_Listing(objects), root, dest) == 3
    assert (dest / best / "model.pt").read_bytes() == b"weights"
    here = str(dest.resolve())
    assert (dest / "_sweep" / "result.json").read_text() == f'{{"best": "{here}/{best}"}}'
    assert (dest / "_sweep" / "status.json").read_text() == f'{{"root": "{here}"}}'
