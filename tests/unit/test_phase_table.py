"""The phase table (sweep_operator.phases) against the CRD's phase enum: every phase reachable, every row's phases in
the enum, an ended sweep left only the ways the design allows, and the decisions taking their phase from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sweep_contracts.api import RESUMABLE_PHASES, TERMINAL_PHASES, Phase
from sweep_operator.phases import TABLE, TERMINAL_EXITS, Fact, allowed, to, transition
from sweep_operator.status import RayJobFacts, kuberay_fact, phase_for

ROOT = Path(__file__).resolve().parents[2]


def crd_phases() -> set[str]:
    crd = yaml.safe_load((ROOT / "crds" / "trainingsweeps.sweeps.dev.yaml").read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    return set(status["properties"]["phase"]["enum"])


def test_every_row_names_phases_of_the_crd_and_every_phase_is_reachable() -> None:
    enum = crd_phases()
    assert enum == {str(p) for p in Phase}
    for row in TABLE:
        assert row.to in enum, row
        assert {str(p) for p in row.sources if p is not None} <= enum, row
    assert {str(row.to) for row in TABLE} == enum, "a phase no fact leads to"
    assert sorted(row.fact for row in TABLE) == sorted(Fact), "each fact has one row"


def test_an_ended_sweep_leaves_only_by_a_resume_a_fixed_spec_or_a_deletion() -> None:
    for phase in TERMINAL_PHASES:
        exits = {row.fact for row in TABLE if Phase(phase) in row.sources}
        assert exits <= TERMINAL_EXITS, (phase, exits - TERMINAL_EXITS)
        assert Fact.DELETION_STARTED in exits
        if phase == Phase.INVALID:
            assert Fact.RAYJOB_CREATED in exits and Fact.RESUME_STARTED not in exits  # a fixed spec is admitted
        else:
            assert (Fact.RESUME_STARTED in exits) == (phase in RESUMABLE_PHASES)
            assert exits - {Fact.RESUME_STARTED, Fact.DELETION_STARTED} == set(), phase
    for fact in (Fact.RAYJOB_RUNNING, Fact.SWEEP_DEADLINE_PASSED, Fact.BUDGET_SPENT, Fact.KUEUE_PREEMPTED):
        assert not any(allowed(phase, fact) for phase in TERMINAL_PHASES), fact
    assert allowed(None, Fact.RAYJOB_CREATED) and not allowed(Phase.RUNNING, Fact.RAYJOB_CREATED)
    assert allowed(Phase.SUSPENDED, Fact.KUEUE_ADMITTED) and not allowed(Phase.RUNNING, Fact.KUEUE_ADMITTED)


@pytest.mark.parametrize(
    "deployment,job,reason,running_fact",
    [
        ("Initializing", "", "", Fact.RAYJOB_STARTING),
        ("Running", "RUNNING", "", Fact.RAYJOB_RUNNING),
        ("Suspended", "", "", Fact.RAYJOB_SUSPENDED),
        ("Complete", "SUCCEEDED", "", Fact.RAYJOB_SUCCEEDED),
        ("Complete", "FAILED", "", Fact.RAYJOB_FAILED),
        ("Failed", "", "DeadlineExceeded", Fact.RAYJOB_DEADLINE),
        ("Failed", "", "AppFailed", Fact.RAYJOB_FAILED),
    ],
)
def test_kuberays_state_is_a_fact_and_its_phase_the_tables_answer(
    deployment: str, job: str, reason: str, running_fact: Fact
) -> None:
    facts = RayJobFacts("j", deployment_status=deployment, job_status=job, reason=reason)
    assert kuberay_fact(facts) is running_fact
    assert phase_for(facts) == to(running_fact) == transition(running_fact).to


def test_no_decision_spells_the_phase_it_sets() -> None:
    """The places that set a phase propose a fact and take the table's answer: none assigns a Phase member."""
    setting = re.compile(r"""["']phase["']: Phase\.|phase=Phase\.|new_phase = Phase\.|return Phase\.""")
    package = ROOT / "operator" / "sweep_operator"
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "phases.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if setting.search(line)
    ]
    assert found == [], "propose a fact (sweep_operator.phases) and take the table's phase"
