"""`kubectl sweep` parses kubectl's connection flags as kubectl does and runs the matching sweepctl command
(the path through the real kubectl binary is tests/integration/test_kubectl_sweep.py)."""

from __future__ import annotations

import pytest

from sweep_operator.cli.kubectl_plugin import _split_globals, main, sweepctl_argv


@pytest.mark.parametrize(
    "args",
    [
        ["status", "-n", "ml", "--context", "prod", "--kubeconfig", "/k"],
        ["status", "--namespace=ml", "--context=prod", "--kubeconfig=/k"],
        ["-nml", "status", "--context", "prod", "--kubeconfig", "/k"],
    ],
)
def test_connection_flags_are_found_in_every_spelling_kubectl_accepts(args: list[str]) -> None:
    found, rest = _split_globals(args)
    assert found == {"namespace": "ml", "context": "prod", "kubeconfig": "/k"}
    assert rest == ["status"]


def test_status_and_report_pass_the_connection_on_to_sweepctl() -> None:
    found, rest = _split_globals(["digits", "-n", "ml", "--context", "prod", "--json"])
    assert sweepctl_argv("status", found, rest) == [
        "status",
        "digits",
        "--namespace",
        "ml",
        "--context",
        "prod",
        "--json",
    ]
    found, rest = _split_globals(["digits", "--out", "r", "--kubeconfig", "/k"])
    assert sweepctl_argv("report", found, rest) == ["report", "digits", "--kubeconfig", "/k", "--out", "r"]


def test_validate_and_render_of_a_file_need_no_cluster() -> None:
    assert sweepctl_argv("validate", {}, ["-f", "sweep.yaml"]) == ["validate", "-f", "sweep.yaml"]
    assert sweepctl_argv("render", {}, ["--filename=sweep.yaml", "--run-id", "r1"]) == [
        "render",
        "--filename=sweep.yaml",
        "--run-id",
        "r1",
    ]


def test_resume_runs_sweepctl_resume_with_the_connection() -> None:
    found, rest = _split_globals(["digits", "-n", "ml", "--active-seconds", "3600", "--num-samples", "12"])
    assert sweepctl_argv("resume", found, rest) == [
        "resume",
        "digits",
        "--namespace",
        "ml",
        "--active-seconds",
        "3600",
        "--num-samples",
        "12",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status"], "status: name a TrainingSweep"),
        (["delete", "x"], "unknown verb 'delete'"),
        (["status", "x", "--context"], "--context needs a value"),
    ],
)
def test_usage_errors_exit_2_with_the_usage(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "usage: kubectl sweep VERB NAME" in err
