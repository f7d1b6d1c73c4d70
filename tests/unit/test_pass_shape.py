"""A sweep's pass reads, decides once and acts once (issue 29), checked on the controller's source: `_admit` and
`_run` hand one decision to `_execute`, ask one combining decision of `run_pass`, and change nothing themselves; what
changes the world is reached from `_execute` only."""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "operator" / "sweep_operator" / "reconcile" / "controller.py"
# What changes the cluster, the ledgers or the metrics (kube writes, the budgets' records, the idle-GPU metric).
CHANGES = {
    "create_rayjob",
    "delete_rayjob",
    "patch_rayjob",
    "reserve",
    "record_hours",
    "release_hours",
    "idle_gpus",
    "deadline_stopped",
    "write",
    "update",
    "apply",
}
# The controller's methods `_execute` runs (directly or through each other).
ACTING = {
    "_execute",
    "_create_first_attempt",
    "_create_rayjob",
    "_release_and_admit_next",
    "_admit_next",
}


def methods() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(SOURCE.read_text())
    (controller,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SweepController"]
    return {n.name: n for n in controller.body if isinstance(n, ast.FunctionDef)}


def called(function: ast.FunctionDef) -> list[str]:
    """The attribute names called in `function` (`self._execute(...)` -> `_execute`), in order."""
    return [n.func.attr for n in ast.walk(function) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]


def referenced(function: ast.FunctionDef) -> list[str]:
    """Every attribute named in `function` (a decision handed to `partial` is named, not called)."""
    return [n.attr for n in ast.walk(function) if isinstance(n, ast.Attribute)]


def test_admit_and_run_act_once_on_one_run_pass_decision() -> None:
    found = methods()
    for name in ("_admit", "_run"):
        calls = called(found[name])
        assert calls.count("_execute") == 1, f"{name} acts once: {calls}"
        decisions = [c for c in referenced(found[name]) if c.startswith("decide_") or c == "resume_step"]
        assert decisions and set(decisions) <= {"decide_admit_pass", "decide_run_pass"}, (name, decisions)
        assert not set(calls) & CHANGES, f"{name} changes nothing itself: {sorted(set(calls) & CHANGES)}"


def test_what_changes_the_world_in_a_pass_is_reached_from_act_only() -> None:
    found = methods()
    pass_methods = {"_pass", "_held_pass", "_reconcile", "_admit", "_run", "_pods_read"}
    for name in pass_methods:
        changing = set(called(found[name])) & CHANGES
        assert not changing, f"{name} changes the world outside _execute: {sorted(changing)}"
    for name in ACTING:
        assert name in found, f"{name} is gone: update ACTING"
    reached = set(called(found["_execute"]))
    assert {"_create_first_attempt", "apply"} <= reached, sorted(reached)
