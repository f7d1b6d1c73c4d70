"""Complete, Failed and Ready as a Kubernetes Job has them (`kubectl wait --for=condition=...` returns for either
outcome), decided in one place (status.lifecycle_conditions) and stored by every status write; the DEADLINE,
FINISHED and BEST columns' fields."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_operator import status as status_rules
from sweep_operator.crd import PRINTER_COLUMNS
from sweep_operator.metrics import OperatorMetrics
from sweep_operator.reconcile.cache import Cache
from sweep_operator.reconcile.status_writer import PhaseCallback, StatusWriter
from sweep_operator.settings import Settings
from sweep_operator.status import best_summary, read_status, rfc3339, status_document
from tests.support.factories import gpu_sweep
from tests.support.fake_kube import FakeKube
from tests.support.fakes import T0

DEADLINE = rfc3339(T0 + 3600)


# The rules take and return the parsed status; these tests read and write stored documents, as kubectl shows them.
def settled(status: dict[str, Any], generation: int, now: float) -> dict[str, Any]:
    return status_document(status_rules.settled(read_status(status), generation, now))


def updated(status: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    return status_document(status_rules.updated(read_status(status), changes))


def lifecycle_conditions(status: dict[str, Any]) -> tuple[Any, ...]:
    return status_rules.lifecycle_conditions(read_status(status))


VERIFIED = {
    "type": "CheckpointsVerified",
    "status": "True",
    "reason": "Verified",
    "message": "4 checkpoints, 1000 bytes verified",
    "lastTransitionTime": rfc3339(T0 + 20),
}
NOT_VERIFIED = {
    **VERIFIED,
    "status": "False",
    "reason": "NotVerified",
    "message": "missing-file: train/t1/checkpoint_epoch-000002/model.pt",
}
ENDED = {"finishedAt": rfc3339(T0 + 10), "checkpoints": {"verifiedAt": rfc3339(T0 + 20)}}


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """type -> (status, reason, message) as `settled` stores them."""
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in settled(status, 3, T0)["conditions"]}


@pytest.mark.parametrize("phase", ["Pending", "Queued", "Starting", "Running", "Suspended"])
def test_before_the_end_nothing_is_complete_failed_or_ready(phase: str) -> None:
    got = conditions({"phase": phase, "message": "RayJob digits-r1: Running"})
    assert got == {
        "Complete": ("False", phase, "the sweep has not finished"),
        "Failed": ("False", phase, "the sweep has not finished"),
        "Ready": ("False", phase, "the sweep has not finished"),
    }


def test_a_succeeded_sweep_is_complete_and_ready_once_its_checkpoints_are_verified() -> None:
    got = conditions({"phase": "Succeeded", "message": "succeeded", **ENDED, "conditions": [VERIFIED]})
    assert got["Complete"] == ("True", "Succeeded", "succeeded")
    assert got["Failed"] == ("False", "Succeeded", "the sweep succeeded")
    assert got["Ready"] == ("True", "Succeeded", "sweep succeeded and its checkpoints are verified")


def test_a_succeeded_sweep_with_unverified_checkpoints_is_complete_not_ready_and_says_why() -> None:
    got = conditions({"phase": "Succeeded", "message": "succeeded", **ENDED, "conditions": [NOT_VERIFIED]})
    assert got["Complete"][0] == "True"
    assert got["Ready"] == (
        "False",
        "Succeeded",
        "the sweep succeeded, but its checkpoints are not verified: "
        "missing-file: train/t1/checkpoint_epoch-000002/model.pt",
    )
    # Before the end-of-run verification is recorded, an earlier attempt's verdict does not make it Ready.
    pending = {"phase": "Succeeded", "finishedAt": rfc3339(T0 + 10), "conditions": [VERIFIED]}
    pending["checkpoints"] = {"verifiedAt": rfc3339(T0 - 100)}
    assert conditions(pending)["Ready"] == (
        "False",
        "Succeeded",
        "the sweep succeeded; its checkpoints are being verified",
    )


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ({"phase": "Failed", "reason": "AppFailed"}, "AppFailed"),  # KubeRay's reason
        (
            {
                "phase": "Failed",
                "conditions": [
                    {
                        "type": "Running",
                        "status": "False",
                        "reason": "StartupDeadlineExceeded",
                        "message": "not Running within startupSeconds",
                        "lastTransitionTime": rfc3339(T0),
                    }
                ],
            },
            "StartupDeadlineExceeded",
        ),
        ({"phase": "Failed", "reason": "not camel case"}, "Failed"),
        ({"phase": "DeadlineExceeded"}, "DeadlineExceeded"),
        ({"phase": "BudgetExhausted"}, "BudgetExhausted"),
        ({"phase": "Invalid"}, "Invalid"),
    ],
    ids=["kuberay-reason", "startup-deadline", "plain", "deadline", "budget", "invalid"],
)
def test_every_other_end_is_failed_with_the_reason_and_the_message_saying_why(
    status: dict[str, Any], reason: str
) -> None:
    why = "not Running within startupSeconds=60: 2 worker pods Pending (Insufficient nvidia.com/gpu)"
    got = conditions({**status, "message": why, **ENDED, "conditions": [VERIFIED, *status.get("conditions", [])]})
    assert got["Failed"] == ("True", reason, why)
    assert got["Complete"] == ("False", status["phase"], f"the sweep ended {status['phase']}")
    assert got["Ready"] == ("False", status["phase"], why)  # verified checkpoints do not make a failure Ready


def test_a_deletion_does_not_undo_how_the_run_ended() -> None:
    ended = settled({"phase": "Succeeded", "message": "succeeded", **ENDED, "conditions": [VERIFIED]}, 3, T0)
    deleting = updated(ended, {"phase": "Deleting", "message": "verifying checkpoints before deletion"})
    assert lifecycle_conditions(deleting) == ()
    assert settled(deleting, 3, T0 + 50)["conditions"] == ended["conditions"]


def test_transition_times_move_only_when_a_condition_flips_and_a_resume_clears_the_end() -> None:
    running = settled({"phase": "Running"}, 1, T0)
    again = settled(updated(running, {"message": "still running"}), 1, T0 + 30)
    assert again["conditions"] == running["conditions"]
    failed = settled(updated(again, {"phase": "Failed", "message": "the driver exited 1"}), 1, T0 + 60)
    times = {c["type"]: c["lastTransitionTime"] for c in failed["conditions"]}
    assert times == {"Complete": rfc3339(T0), "Failed": rfc3339(T0 + 60), "Ready": rfc3339(T0)}
    resumed = settled(updated(failed, {"phase": "Starting"}), 2, T0 + 90)
    by_type = {c["type"]: c for c in resumed["conditions"]}
    assert by_type["Failed"]["status"] == "False" and by_type["Failed"]["lastTransitionTime"] == rfc3339(T0 + 90)
    assert {c["observedGeneration"] for c in resumed["conditions"]} == {2}


def test_the_deadline_column_shows_the_deadline_only_until_the_run_ends() -> None:
    running = settled({"phase": "Running", "deadlineAt": DEADLINE}, 1, T0)
    assert running["activeDeadlineAt"] == DEADLINE
    ended = settled(updated(running, {"phase": "DeadlineExceeded", "finishedAt": DEADLINE}), 1, T0 + 3600)
    assert "activeDeadlineAt" not in ended and ended["deadlineAt"] == DEADLINE  # the record stays
    deleting = settled(updated(running, {"phase": "Deleting"}), 1, T0)
    assert deleting["activeDeadlineAt"] == DEADLINE  # a held sweep's RayJob still runs to its deadline
    columns = {c["name"]: c for c in PRINTER_COLUMNS}
    assert columns["Deadline"]["jsonPath"] == ".status.activeDeadlineAt"
    assert (columns["Finished"]["jsonPath"], columns["Finished"]["type"]) == (".status.finishedAt", "date")


def test_the_best_column_names_its_metric() -> None:
    assert best_summary({"metric": "val_loss", "value": 0.123456}) == "val_loss=0.1235"
    assert best_summary({"value": 0.123456}) == "0.1235"
    long = best_summary({"metric": "m" * 100, "value": 2.0})
    assert long == "m" * 37 + "...=2" and len(long) < 50


def test_every_status_write_stores_the_lifecycle_conditions() -> None:
    """No decision sets them: the one status writer derives them from the status it writes."""
    kube, now = FakeKube(), [T0]
    kube.add("TrainingSweep", {**gpu_sweep(), "status": {"phase": "Running", "deadlineAt": DEADLINE}})
    emitted: list[Any] = []

    def emit(*event: Any) -> None:
        emitted.append(event)

    writer = StatusWriter(
        kube,  # type: ignore[arg-type]  # FakeKube is KubeApi's duck-typed double
        Cache(Settings()),
        emit,
        [PhaseCallback(emit, OperatorMetrics())],
        clock=lambda: now[0],
    )
    body = kube.get_sweep("ml", "digits")
    assert body is not None
    now[0] = T0 + 5
    failed = status_rules.updated(read_status(body["status"]), {"phase": "Failed", "message": "the driver exited 1"})
    written = writer.write(body, failed)
    by_type = {c["type"]: c for c in written["status"]["conditions"]}
    assert (by_type["Failed"]["status"], by_type["Failed"]["lastTransitionTime"]) == ("True", rfc3339(T0 + 5))
    assert by_type["Failed"]["observedGeneration"] == body["metadata"]["generation"]
    assert "activeDeadlineAt" not in written["status"]
    stored = kube.get_sweep("ml", "digits")
    assert stored is not None and stored["status"]["conditions"] == written["status"]["conditions"]
