"""The only status write, against the in-memory API: one merge patch of what changed, onto the resourceVersion it
was computed from (else Stale), the echo remembered, then the callbacks and the decision's Events."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_operator.metrics import OperatorMetrics
from sweep_operator.reconcile.actions import Event
from sweep_operator.reconcile.cache import Cache
from sweep_operator.reconcile.status_writer import PhaseCallback, Stale, StatusWriter
from sweep_operator.settings import Settings
from sweep_operator.status import merge_patch, read_status, status_document, updated
from tests.support.factories import gpu_sweep
from tests.support.fake_kube import FakeKube


class Recorder:
    def __init__(self) -> None:
        self.writes: list[tuple[Any, Any]] = []

    def after_write(self, body: Any, old: Any, new: Any) -> None:
        self.writes.append((old.phase, new.phase))


def setup() -> tuple[FakeKube, Cache, StatusWriter, list[tuple[str, str, str]], Recorder, OperatorMetrics]:
    kube, cache, events, recorder, metrics = FakeKube(), Cache(Settings()), [], Recorder(), OperatorMetrics()

    def emit(body: Any, type_: str, reason: str, message: str) -> None:
        events.append((type_, reason, message))

    kube.add(
        "TrainingSweep",
        {**gpu_sweep(), "status": {"phase": "Starting", "message": "starting", "waitingFor": "2 worker pods Pending"}},
    )
    writer = StatusWriter(kube, cache, emit, [PhaseCallback(emit, metrics), recorder])  # type: ignore[arg-type]  # FakeKube is KubeApi's duck-typed double
    return kube, cache, writer, events, recorder, metrics


def patches(kube: FakeKube) -> int:
    return len([c for c in kube.calls if c[0] == "patch_sweep_status"])


def test_one_patch_of_what_changed_then_the_callbacks_and_the_events() -> None:
    kube, cache, writer, events, recorder, _ = setup()
    body = kube.get_sweep("ml", "digits")
    assert body is not None
    new = updated(read_status(body["status"]), {"phase": "Running", "message": "running", "waitingFor": None})
    written = writer.write(body, new, [Event("Normal", "Resume", "resumed")])
    conditions = written["status"].pop("conditions")  # what follows from the phase (test_lifecycle_conditions.py)
    assert written["status"] == {"phase": "Running", "message": "running"}  # None removed the field
    assert [c["type"] for c in conditions] == ["Complete", "Failed", "Ready"]
    written["status"]["conditions"] = conditions
    assert patches(kube) == 1 and recorder.writes == [("Starting", "Running")]
    assert events == [("Normal", "Running", "running"), ("Normal", "Resume", "resumed")]
    assert cache.is_echo(written)  # its watch event starts no reconcile
    writer.write(written, read_status(written["status"]))  # nothing changed: no request, no callback
    assert patches(kube) == 1 and len(recorder.writes) == 1


def test_a_write_computed_from_an_older_copy_is_refused() -> None:
    kube, _, writer, events, recorder, _ = setup()
    stale = kube.get_sweep("ml", "digits")
    assert stale is not None
    kube._bump(kube.objects[("TrainingSweep", "ml", "digits")])  # someone else wrote meanwhile
    with pytest.raises(Stale):
        writer.write(stale, updated(read_status(stale["status"]), {"phase": "Failed", "message": "x"}))
    assert kube.get_sweep("ml", "digits")["status"]["phase"] == "Starting"  # type: ignore[index]  # the fake has it
    assert events == [] and recorder.writes == []  # nothing is announced that was not written


def test_update_applies_the_change_to_the_newest_status_on_a_conflict() -> None:
    kube, _, writer, _, _, _ = setup()
    stale = kube.get_sweep("ml", "digits")
    assert stale is not None
    stored = kube.objects[("TrainingSweep", "ml", "digits")]
    stored["status"]["trials"] = {"total": 3}
    kube._bump(stored)
    written = writer.update(stale, lambda status: updated(status, {"phase": "Deleting"}))
    assert written is not None and written["status"]["phase"] == "Deleting"
    assert written["status"]["trials"] == {"total": 3}  # the other writer's field survives


def test_a_stored_field_that_does_not_parse_is_left_out_of_decisions_and_never_patched() -> None:
    """A hand-edited or older field: `read_status` leaves it out, and the writer patches only what differs between
    the two parsed documents, so the stored value is neither read nor removed (the API server, whose schema the
    fake checks, keeps or refuses it as it stands)."""
    raw = {"phase": "Starting", "trials": {"total": "many"}, "fromAnOlderOperator": {"x": 1}, "runId": "abc"}
    status = read_status(raw)
    assert status.trials is None and status.phase == "Starting" and status.run_id == "abc"
    patch = merge_patch(status_document(status), status_document(updated(status, phase="Running")))
    assert patch == {"phase": "Running"}
    assert read_status({"phase": "NoSuchPhase", "runId": 7}) == read_status({})  # wrong types: nothing guessed
    assert read_status(["not", "a", "mapping"]) == read_status(None)  # type: ignore[arg-type]  # what a tenant may store


def test_phase_events_warn_on_failures_and_deleting_is_left_to_the_guard() -> None:
    kube, _, writer, events, _, metrics = setup()
    body = kube.get_sweep("ml", "digits")
    assert body is not None
    body = writer.write(
        body, updated(read_status(body["status"]), {"phase": "DeadlineExceeded", "message": "deadline"})
    )
    writer.write(body, updated(read_status(body["status"]), {"phase": "Deleting", "message": "verifying"}))
    assert events == [("Warning", "DeadlineExceeded", "deadline")]
    assert metrics.total("trainingsweep_deadline_stops_total") == 1


def test_a_field_removed_inside_a_nested_object_is_removed_from_the_stored_one() -> None:
    """The API server merges a patch's object into the stored object (RFC 7386): a field the new status leaves out
    of status.kueue must go as a null, or the stored clock would keep an admission that has ended."""
    kube, _, writer, _, _, _ = setup()
    stored = kube.objects[("TrainingSweep", "ml", "digits")]
    stored["status"]["kueue"] = {"admittedSince": "2026-12-07T10:00:00Z", "admissions": 1, "state": "Admitted"}
    kube._bump(stored)
    body = kube.get_sweep("ml", "digits")
    assert body is not None
    status = read_status(body["status"])
    assert status.kueue is not None
    preempted = status.kueue.model_copy(update={"admitted_since": None, "preemptions": 1, "state": "Preempted"})
    written = writer.write(body, updated(status, kueue=preempted))
    assert written["status"]["kueue"] == {"admissions": 1, "preemptions": 1, "state": "Preempted"}
    assert merge_patch({"k": {"x": 1, "y": 2}, "l": [1, 2]}, {"k": {"x": 1}, "l": [1]}) == {"k": {"y": None}, "l": [1]}
