"""Every escape-hatch release is recorded (issue 15): the sweep's CheckpointsVerified condition, the
trainingsweep_guard_bypasses_total counter and a WARNING log line naming the field manager that set the
annotation (managedFields: the API records managers, not users)."""

from __future__ import annotations

import logging

import pytest

from sweep_contracts import constants
from sweep_operator.audit import BYPASS_REASON, annotation_setters
from sweep_operator.status import get_condition, read_status
from tests.unit.test_controller import World, ran, world  # noqa: F401  (the fixture)

SKIP = constants.ANNOTATION_SKIP_VERIFICATION


def managed_by(manager: str) -> dict[str, object]:
    """A managedFields entry as the API server writes it for `kubectl annotate` (fieldsV1 of metadata.annotations)."""
    return {
        "manager": manager,
        "operation": "Update",
        "apiVersion": "sweeps.dev/v1alpha1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, f"f:{SKIP}": {}}}},
    }


def test_a_release_through_the_escape_hatch_is_counted_logged_and_on_the_sweep(
    world: World,  # noqa: F811  the fixture imported above, used as a parameter
    caplog: pytest.LogCaptureFixture,
) -> None:
    status = ran(world)
    world.verifier.verified = False
    sweep = world.kube.objects[("TrainingSweep", "ml", "digits")]
    sweep["metadata"]["annotations"] = {SKIP: "true"}
    sweep["metadata"]["managedFields"] = [
        managed_by("kubectl-annotate"),
        {"manager": "kopf", "fieldsV1": {"f:metadata": {"f:finalizers": {}}}},
    ]
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    before = world.controller.metrics.total("trainingsweep_guard_bypasses_total")
    with caplog.at_level(logging.WARNING, logger="sweep_operator.audit"):
        world.controller.guard_rayjob_deletion(rayjob, attempt=0)
    assert (
        world.controller.metrics.total(
            "trainingsweep_guard_bypasses_total", namespace="ml", sweep="digits", kind="RayJob"
        )
        == before + 1
    )
    (line,) = [r.getMessage() for r in caplog.records if "BYPASSED" in r.getMessage()]
    assert "RayJob ml/" in line and "kubectl-annotate" in line and "TrainingSweep digits" in line
    condition = get_condition(read_status(world.status("digits")).conditions, "CheckpointsVerified")
    assert condition is not None and condition.status == "False" and condition.reason == BYPASS_REASON
    assert "kubectl-annotate" in condition.message and SKIP in condition.message


def test_an_ordinary_release_records_no_bypass(world: World) -> None:  # noqa: F811  the fixture imported above, used as a parameter
    status = ran(world)
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    world.controller.guard_rayjob_deletion(rayjob, attempt=0)
    assert world.controller.metrics.total("trainingsweep_guard_bypasses_total") == 0
    condition = get_condition(read_status(world.status("digits")).conditions, "CheckpointsVerified")
    assert condition is not None and condition.reason != BYPASS_REASON


def test_setters_are_the_managers_that_own_the_annotation() -> None:
    body = {
        "metadata": {
            "managedFields": [
                managed_by("kubectl-annotate"),
                managed_by("argocd-controller"),
                {"manager": "kubectl-edit", "fieldsV1": {"f:metadata": {"f:labels": {}}}},
            ]
        }
    }
    assert annotation_setters(body) == ["argocd-controller", "kubectl-annotate"]
    assert annotation_setters({"metadata": {}}) == []
