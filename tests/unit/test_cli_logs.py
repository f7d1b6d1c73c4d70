"""`sweepctl logs` / `kubectl sweep logs`: a trial's log from its run root's records, the driver's pod, the verb."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sweep_operator.cli import main as sweepctl
from sweep_operator.cli.kubectl_plugin import sweepctl_argv
from sweep_operator.cli.logs import LogsError, RunRoot, newest_pod, result_line, trial_log
from sweep_operator.cli.report_records import LocalStore
from tests.support.report_fixture import FIXTURE

ROW = json.loads((FIXTURE / "tune" / "48bfa_00000" / "result.json").read_text().splitlines()[0])


def test_a_result_line_shows_when_the_iteration_the_metrics_and_the_checkpoint_not_tunes_bookkeeping() -> None:
    line = result_line(ROW)
    assert line.startswith("2026-12-03 11:47:38  iteration 1 (21.2 s)  epoch=0  train_loss=2.05  ")
    assert "val_loss=1.297" in line and "val_accuracy=0.8123" in line and "lr=0.0933" in line
    assert line.endswith("  checkpoint checkpoint_epoch-000000")
    for bookkeeping in ("pid", "hostname", "node_ip", "date", "config", "ranks_reported", "rank_spread", "done"):
        assert bookkeeping not in line, bookkeeping


def test_a_trial_log_names_its_folder_config_results_and_error() -> None:
    text = trial_log("t_00001", "s3://b/p/", [ROW], {"lr": 0.1, "_sweep": {"x": 1}}, "Traceback\nValueError: x\n")
    assert text.splitlines() == [
        "trial t_00001  (s3://b/p/tune/t_00001)",
        "config: lr=0.1",
        "1 result(s) reported:",
        f"  {result_line(ROW)}",
        "error (error.txt):",
        "  Traceback",
        "  ValueError: x",
    ]
    quiet = trial_log("t_00002", "/runs/r", [], None, None).splitlines()
    assert quiet == ["trial t_00002  (/runs/r/tune/t_00002)", "0 result(s) reported", "no error recorded"]


def test_a_trial_of_a_local_run_root_and_one_that_does_not_exist(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(FIXTURE, root)
    (root / "tune" / "48bfa_00002" / "error.txt").write_text("RuntimeError: out of memory\n")
    run_root = RunRoot(str(root), LocalStore(str(root)))
    text = run_root.trial("48bfa_00002")
    assert text.splitlines()[-2:] == ["error (error.txt):", "  RuntimeError: out of memory"]
    with pytest.raises(LogsError) as missing:
        run_root.trial("48bfa_00007")
    assert str(missing.value) == (
        f'trial "48bfa_00007" not found under {root}/tune (its trials: 48bfa_00000, 48bfa_00001, 48bfa_00002, '
        "48bfa_00003)"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LogsError, match=r"\(its trials: none yet\)"):
        RunRoot(str(empty), LocalStore(str(empty))).trial("48bfa_00000")


def test_the_driver_pod_is_the_submitters_newest() -> None:
    def pod(name: str, created: str) -> dict[str, object]:
        return {"metadata": {"name": name, "creationTimestamp": created}}

    pods = [pod("s-aaaaa", "2026-12-07T10:00:00Z"), pod("s-bbbbb", "2026-12-07T10:05:00Z")]
    assert newest_pod(pods) == pods[1]
    assert newest_pod([]) is None


def test_kubectl_sweep_logs_runs_sweepctl_logs_with_the_connection_flags() -> None:
    argv = sweepctl_argv("logs", {"namespace": "team", "context": "emu"}, ["digits", "--trial", "t_1"])
    assert argv == ["logs", "digits", "--namespace", "team", "--context", "emu", "--trial", "t_1"]


def test_a_negative_tail_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert sweepctl(["logs", "digits", "--tail", "-1"]) == 2
    assert "sweepctl logs: --tail -1: must be 0 or more" in capsys.readouterr().err
