"""The Phase enum is the one list of a sweep's phases and of which are terminal, warn, or may be resumed (issue 29)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sweep_contracts.api import RESUMABLE_PHASES, TERMINAL_PHASES, WAITING_PHASES, WARNING_PHASES, Phase
from sweep_operator.crd import build_crd

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "sweep_operator"


def test_the_crd_enum_is_the_phase_enum_and_stored_values_are_plain_strings():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["status"]["properties"]["phase"]["enum"] == [p.value for p in Phase]
    assert json.dumps({"phase": Phase.DEADLINE_EXCEEDED}) == '{"phase": "DeadlineExceeded"}'
    assert "DeadlineExceeded" in TERMINAL_PHASES and Phase("Failed") is Phase.FAILED


def test_the_phase_sets_are_consistent():
    assert set(RESUMABLE_PHASES) <= TERMINAL_PHASES
    assert WARNING_PHASES <= TERMINAL_PHASES
    assert not WAITING_PHASES & TERMINAL_PHASES
    assert Phase.INVALID in TERMINAL_PHASES and Phase.INVALID not in RESUMABLE_PHASES


def test_no_module_lists_phases_of_its_own():
    """A set or tuple of two or more phase names written out is a second list that a new phase would miss."""
    names = "|".join(p.value for p in Phase)
    listed = re.compile(rf'[({{]\s*"({names})",\s*"({names})"')
    offenders = [
        f"{path.relative_to(OPERATOR)}:{n}"
        for path in sorted(OPERATOR.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if listed.search(line)
    ]
    assert offenders == []
