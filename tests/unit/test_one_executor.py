"""One way to change the cluster: only the executor calls the Kubernetes client's write methods and the status writer,
and what the guard records is returned as actions (a table over its decisions)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from sweep_operator.reconcile.actions import ChangeStatus, PostEvent
from sweep_operator.reconcile.facts import DeletionFacts
from sweep_operator.reconcile.guard import GuardFacts, GuardTarget, recorded
from sweep_operator.reconcile.verdicts import Hold, Release
from sweep_operator.status import read_status
from tests.support.fakes import FakeResult

RECONCILE = Path(__file__).resolve().parents[2] / "operator" / "sweep_operator" / "reconcile"
WRITERS = {"executor.py", "status_writer.py"}  # the executor, and the status writer's own retry (update -> write)
KUBE_WRITES = ("create_", "patch_", "delete_")
FINALIZERS = {"add_finalizer", "remove_finalizer"}


def _receiver(node: ast.expr) -> str:
    """The last name of a call's receiver: `self.kube.x()` -> kube, `kube.x()` -> kube."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def writes_in(path: Path) -> list[str]:
    """Calls of the client's write methods (on a `kube`) and of the status writer's (on a `.status` attribute)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        method, receiver = node.func.attr, _receiver(node.func.value)
        kube_write = receiver == "kube" and (method.startswith(KUBE_WRITES) or method in FINALIZERS)
        status_write = isinstance(node.func.value, ast.Attribute) and receiver == "status"
        if kube_write or (status_write and method in {"write", "update"}):
            found.append(f"{path.name}:{node.lineno} {receiver}.{method}")
    return found


def test_only_the_executor_writes_to_the_cluster_or_the_status() -> None:
    found = [hit for path in sorted(RECONCILE.glob("*.py")) if path.name not in WRITERS for hit in writes_in(path)]
    assert found == [], "carry these out as actions (reconcile/actions.py) through the executor"


def test_the_scan_finds_the_executors_own_writes() -> None:
    hits = {hit.split(" ", 1)[1] for hit in writes_in(RECONCILE / "executor.py")}
    expected = {"create_rayjob", "delete_rayjob", "delete_pod", "patch_raycluster", "add_finalizer", "remove_finalizer"}
    assert {f"kube.{m}" for m in expected} | {"status.write", "status.update"} <= hits, sorted(hits)


TARGET = GuardTarget("s3://b/sweeps/ml/digits-abc123", "http://127.0.0.1:9", "us-east-1", True, 60, "digits", "abc123")
SWEEP = {
    "metadata": {"name": "digits", "namespace": "ml", "generation": 3},
    "spec": {},
    "status": {"phase": "Deleting"},
}
NEWER = {**SWEEP, "metadata": {**SWEEP["metadata"], "resourceVersion": "9"}}
RAYJOB = {"metadata": {"name": "digits-abc123", "namespace": "ml"}}
NOW = 1_800_000_000.0
VERIFIED, BROKEN = FakeResult(True), FakeResult(False)
RELEASED, HELD = Release("checkpoints verified complete in S3"), Hold("checkpoints missing", 60)


@pytest.mark.parametrize(
    ("case", "kind", "sweep", "result", "decision", "shape", "verified"),
    [
        # (what was deleted, its sweep, the verification, the decision) -> the actions in order, what they record
        ("verified release", "RayJob", SWEEP, VERIFIED, RELEASED, ["status", "Normal:CheckpointGuardReleased"], True),
        ("verified hold", "RayJob", SWEEP, BROKEN, HELD, ["status", "Warning:CheckpointsNotVerified"], False),
        ("hold, no verification", "RayJob", SWEEP, None, HELD, ["Warning:CheckpointsNotVerified", "status"], False),
        ("release, no verification", "RayJob", SWEEP, None, Release("never admitted"), ["Normal:CheckpointGuardReleased"], None),
        ("no sweep: events only", "RayJob", None, VERIFIED, RELEASED, ["Normal:CheckpointGuardReleased"], None),
        ("the sweep itself", "TrainingSweep", SWEEP, None, HELD, ["Warning:CheckpointsNotVerified", "status"], False),
    ],
)  # fmt: skip
def test_what_a_guard_decision_records_is_a_list_of_actions_in_order(
    case: str, kind: str, sweep: Any, result: Any, decision: Any, shape: list[str], verified: bool | None
) -> None:
    body = SWEEP if kind == "TrainingSweep" else RAYJOB
    deletion = DeletionFacts(kind, body, attempt=0, sweep=sweep)
    actions = recorded(deletion, GuardFacts(kind, "digits", target=TARGET), decision, result, NOW, NEWER)
    assert [a.type + ":" + a.reason if isinstance(a, PostEvent) else "status" for a in actions] == shape, case
    changes = [a for a in actions if isinstance(a, ChangeStatus)]
    assert all(a.sweep is NEWER and not a.failure for a in changes), case  # onto the newer copy; a failure holds
    if changes:
        (change,) = changes
        status = change.change(read_status({"phase": "Deleting"}))
        (condition,) = status.conditions or []
        assert condition.type == "CheckpointsVerified" and condition.status == str(verified), case
        assert (status.checkpoints is not None) is (result is not None), case
    events = [a for a in actions if isinstance(a, PostEvent)]
    assert events[0].targets[0] is body, case
