"""A sweep's status is typed at the edges: parsed into the contracts' model once per resourceVersion when read,
serialised when written; reconcile/'s decisions read attributes, never keys, and take and return the model."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts.status_models import SweepStatus
from sweep_operator import status as status_rules
from sweep_operator.metrics import OperatorMetrics
from sweep_operator.reconcile import facts as facts_module
from sweep_operator.reconcile.cache import Cache
from sweep_operator.reconcile.facts import SweepFacts
from sweep_operator.reconcile.reads import Reads
from sweep_operator.settings import Settings
from tests.support.factories import gpu_sweep
from tests.support.fake_kube import FakeKube

RECONCILE = Path(status_rules.__file__).parent / "reconcile"
# A receiver that is a sweep's status: `status`, `facts.status`, `judged_status` and the like, or what `status_of` /
# `read_status` return. Another object's status read from its body (a RayJob's, a Workload's) goes by its own name
# (`rayjob_status`, `workload_status`).
_STATUS_RECEIVER = re.compile(
    r"(^|\.)(status|judged_status|sweep_status|old_status|new_status)$|^(status_of|read_status)\("
)
# Parameters that carry a sweep's status through the decisions.
_STATUS_PARAMETERS = frozenset({"status", "decided", "judged", "sweep_status", "old_status", "new_status"})


def _sources() -> list[tuple[str, ast.Module]]:
    return [(path.name, ast.parse(path.read_text())) for path in sorted(RECONCILE.glob("*.py"))]


def _receiver(node: ast.expr) -> str:
    return ast.unparse(node).strip()


def key_reads_in(name: str, tree: ast.AST) -> list[str]:
    """Each `<status>.get(...)`, `<status>[...]` and `dict(<status>)` in `tree`, as name:line text."""
    found = []
    for node in ast.walk(tree):
        receiver = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            receiver = _receiver(node.func.value)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            receiver = _receiver(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and node.args:
            receiver = _receiver(node.args[0])
        if receiver is not None and _STATUS_RECEIVER.search(receiver):
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def untyped_parameters_in(name: str, tree: ast.AST) -> list[str]:
    """Functions in `tree` taking a sweep's status as a mapping (or a dict, or Any) instead of the model."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
            hint = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            if arg.arg in _STATUS_PARAMETERS and re.search(r"Mapping|dict|Any", hint):
                found.append(f"{name}:{node.lineno}: {node.name}({arg.arg}: {hint})")
    return found


def test_no_decision_reads_a_status_by_key() -> None:
    assert [read for name, tree in _sources() for read in key_reads_in(name, tree)] == []


def test_decisions_take_the_status_model() -> None:
    assert [found for name, tree in _sources() for found in untyped_parameters_in(name, tree)] == []


def test_the_scans_find_what_they_look_for_in_code_written_the_old_way() -> None:
    tree = ast.parse(
        "def rule(status: Mapping[str, Any], now: float, rayjob: Mapping[str, Any]) -> bool:\n"
        "    ended = (rayjob.get('status') or {}).get('jobStatus') or rayjob['metadata']\n"
        "    return status.get('deadlineAt') or facts.status['phase'] or status_of(body).get('runId') or ended\n"
        "def copy(judged: dict[str, Any]) -> dict[str, Any]:\n"
        "    return dict(judged_status)\n"
    )
    assert len(key_reads_in("old.py", tree)) == 4  # three reads of line 3, dict() of line 5; none of the RayJob's
    assert untyped_parameters_in("old.py", tree) == [
        "old.py:1: rule(status: Mapping[str, Any])",
        "old.py:4: copy(judged: dict[str, Any])",
    ]


def test_a_status_is_parsed_once_per_resource_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass over an unchanged sweep shares one parsed (frozen) status; a new resourceVersion is parsed anew."""
    parsed: list[Any] = []
    real = facts_module.read_status

    def counting(raw: Any) -> SweepStatus:
        parsed.append(raw)
        return real(raw)

    monkeypatch.setattr(facts_module, "read_status", counting)
    cache = Cache(Settings())
    reads = Reads(Settings(), FakeKube(), cache, lambda *_: None, None, OperatorMetrics())  # type: ignore[arg-type]  # doubles: sweep_facts reads only the cache
    body = {**gpu_sweep(), "status": {"phase": "Running", "runId": "r1", "deadlineAt": "2026-12-07T20:00:00Z"}}
    body["metadata"] = {**body["metadata"], "uid": "u1", "resourceVersion": "7"}
    first, second = (reads.sweep_facts(body, 0.0) for _ in range(2))
    assert first.status is second.status and first.status.phase == "Running" and len(parsed) == 1
    newer = {**body, "metadata": {**body["metadata"], "resourceVersion": "8"}, "status": {"phase": "Succeeded"}}
    assert reads.sweep_facts(newer, 0.0).status.phase == "Succeeded" and len(parsed) == 2
    with pytest.raises(Exception, match="frozen"):
        first.status.phase = "Failed"  # type: ignore[misc]  # what the frozen model refuses
    assert SweepFacts(body, 0.0, Settings().limits).status.run_id == "r1"  # built without the cache: parsed here


def test_the_gpu_record_reads_the_same_from_the_model_as_from_the_document() -> None:
    """The pass reads status.usage's record from the parsed model (no document in between); the CLI from the stored
    document: one record either way."""
    from sweep_operator.gpu_time import UsageLedger

    usage = {
        "lastMeasuredAt": "2026-12-07T10:00:00Z",
        "thresholdsReported": [80, 50],
        "podIntervals": [
            {"pod": "u1", "name": "w1", "cluster": "c1", "gpus": 2, "start": "2026-12-07T09:00:00Z"},
            {"pod": "u2", "cluster": "c1", "gpus": 1.5, "start": "2026-12-07T09:00:00Z", "end": "2026-12-07T09:30:00Z"},
        ],
    }
    parsed = status_rules.read_status({"usage": usage}).usage
    assert parsed is not None
    from_model, from_document = UsageLedger.from_status(parsed), UsageLedger.from_status(usage)
    assert from_model == from_document and len(from_model.intervals) == 2 and from_model.thresholds_reported == (50, 80)
