"""`sweepctl render`: the RayJob the operator would create, with its run spec readable."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sweep_contracts import constants
from sweep_contracts.runtime_env import env_vars_of, run_spec_of
from sweep_operator.cli import main as sweepctl
from sweep_operator.rendering import build_rayjob
from sweep_operator.settings import OperatorLimits
from sweep_operator.validation import parse_sweep

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits-cpu.yaml"


def test_render_shows_the_run_spec_one_field_a_line_and_it_reads_as_the_operators(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 28: the run spec was one 2,000-character line of JSON inside runtimeEnvYAML."""
    assert sweepctl(["render", "-f", str(EXAMPLE), "--run-id", "abc123", "--deadline-at", "1800000000"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) < 300
    shown = yaml.safe_load(out)
    text = env_vars_of(shown)[constants.ENV_RUN_SPEC]
    assert text.startswith("{\n") and '\n  "runId": "abc123",\n' in text
    sweep = parse_sweep(yaml.safe_load(EXAMPLE.read_text()))
    operators = build_rayjob(sweep, "abc123", OperatorLimits(), deadline_at=1800000000)
    assert run_spec_of(shown) == run_spec_of(operators)  # the driver and the guard read the same spec
    assert {k: v for k, v in env_vars_of(shown).items() if k != constants.ENV_RUN_SPEC} == {
        k: v for k, v in env_vars_of(operators).items() if k != constants.ENV_RUN_SPEC
    }
    shown["spec"].pop("runtimeEnvYAML")
    operators["spec"].pop("runtimeEnvYAML")
    assert shown == operators


def test_render_of_a_pbt_sweep_says_what_pbt_costs_above_a_rayjob_that_still_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["tune"]["numSamples"] = 4
    doc["spec"]["tune"]["scheduler"] = {"type": "pbt", "hyperparamMutations": ["lr"], "perturbationInterval": 3}
    manifest = tmp_path / "pbt.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    assert sweepctl(["render", "-f", str(manifest), "--run-id", "abc123", "--deadline-at", "1800000000"]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("# ")]
    assert any("training_iteration every 3" in n and "Train run is stopped" in n for n in notes), notes
    assert any("new worker group" in n and "reload of its checkpoint" in n for n in notes)
    assert any("numToKeep is not applied" in n for n in notes)
    assert yaml.safe_load(out)["kind"] == "RayJob"
    assert sweepctl(["render", "-f", str(EXAMPLE), "--run-id", "abc123", "--deadline-at", "1800000000"]) == 0
    assert not capsys.readouterr().out.startswith("#")
