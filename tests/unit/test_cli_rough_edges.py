"""What the CLI prints a user, said once and in the words kubectl uses: the trial counts, an API error, the version,
and a demand of one worker or one trial."""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest
from kubernetes.client import ApiException

from sweep_contracts.spec_checks import parse_spec
from sweep_operator.cli import main as sweepctl
from sweep_operator.cli.common import api_error_text
from sweep_operator.cli.kubectl_plugin import main as kubectl_sweep
from sweep_operator.cli.status import format_status
from sweep_operator.policy import Demand, Reject, decide_admission
from sweep_operator.settings import OperatorLimits
from tests.support.factories import changed, gpu_sweep


def test_status_counts_running_trials_once() -> None:
    status = {
        "trialsSummary": "3/8 (1 running)",
        "trials": {"total": 8, "pending": 4, "running": 1, "terminated": 3, "errored": 0},
    }
    text = format_status("s", "team", status, now=0.0)
    trials = next(line for line in text.splitlines() if line.startswith("  trials:"))
    assert trials == "  trials:      3/8  (4 pending, 1 running, 3 terminated)"
    assert text.count("running") == 1
    # Without per-state counts the summary is the whole line.
    assert "  trials:      3/8 (1 running)" in format_status("s", "team", {"trialsSummary": "3/8 (1 running)"}, now=0)


def _api_error(status: int, reason: str, body: dict | None = None) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps(body) if body is not None else None
    return exc


def test_an_api_error_reads_as_kubectl_prints_it() -> None:
    missing = _api_error(
        404, "Not Found", {"kind": "Status", "reason": "NotFound", "message": "the server's own words"}
    )
    assert api_error_text(missing, "nope") == 'Error from server (NotFound): trainingsweeps.sweeps.dev "nope" not found'
    forbidden = _api_error(
        403,
        "Forbidden",
        {"reason": "Forbidden", "message": 'trainingsweeps.sweeps.dev "x" is forbidden: User "u" cannot get'},
    )
    assert api_error_text(forbidden, "x") == (
        'Error from server (Forbidden): trainingsweeps.sweeps.dev "x" is forbidden: User "u" cannot get'
    )
    assert api_error_text(_api_error(500, "Internal Server Error"), "x").startswith(
        "Error from server (Internal Server Error): "
    )


def test_sweepctl_and_the_plugin_print_the_distribution_version(capsys: pytest.CaptureFixture[str]) -> None:
    expected = version("trainingsweep-operator")
    with pytest.raises(SystemExit) as done:
        sweepctl(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"sweepctl {expected}"
    assert kubectl_sweep(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kubectl-sweep {expected}"


def test_a_demand_of_one_worker_is_singular() -> None:
    spec = parse_spec(changed(gpu_sweep(), {"spec.trial.workers": 1, "spec.tune.maxConcurrentTrials": 2})["spec"])
    decision = decide_admission(spec, OperatorLimits(max_workers_per_sweep=8, max_gpus_per_sweep=1), Demand())
    assert isinstance(decision, Reject)
    assert "(1 worker x 2 concurrent trials x 1 GPU)" in decision.reason, decision.reason
