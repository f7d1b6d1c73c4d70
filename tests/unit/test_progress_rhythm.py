"""The progress rhythm: a poll that backs off while the document does not change, and progress alone written at most
once per mirror interval, while anything else is written at once with it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sweep_operator.reconcile.cache import Cache
from sweep_operator.reconcile.facts import ObjectRef
from sweep_operator.reconcile.progress_rhythm import mirror_wait, next_poll_seconds, routine_fields
from sweep_operator.settings import Settings, SettingsError
from sweep_operator.status import PROGRESS_FIELDS, progress_patch, read_status, status_document, updated

INTERVAL = {"pod": "w1", "gpus": 1, "start": "2026-12-07T09:00:00Z"}
RUNNING_CONDITION = {
    "type": "Running",
    "status": "True",
    "reason": "Running",
    "lastTransitionTime": "2026-12-07T09:00:00Z",
}
RUNNING = {
    "phase": "Running",
    "trials": {"total": 2, "running": 2},
    "trialsSummary": "0/2 (2 running)",
    "usage": {"gpuHours": 1.0, "lastMeasuredAt": "2026-12-07T10:00:00Z", "podIntervals": [INTERVAL]},
    "conditions": [RUNNING_CONDITION],
}
PROGRESSED = {**RUNNING, "trials": {"total": 2, "running": 1, "terminated": 1}, "trialsSummary": "1/2 (1 running)"}
TOTALS = {**RUNNING, "usage": {**RUNNING["usage"], "gpuHours": 1.5, "lastMeasuredAt": "2026-12-07T10:01:00Z"}}
POD_ENDED = {**RUNNING, "usage": {**RUNNING["usage"], "podIntervals": [{**INTERVAL, "end": "2026-12-07T10:00:30Z"}]}}
ENDED = {**PROGRESSED, "phase": "Succeeded"}
COMMITTED = {**RUNNING_CONDITION, "type": "CheckpointsCommitted", "reason": "Committed"}
CONDITION = {**PROGRESSED, "conditions": [RUNNING_CONDITION, COMMITTED]}
GUARD = {**PROGRESSED, "guard": {"runRoot": "s3://b/ml/x"}}
STOP = {**PROGRESSED, "gracefulStop": {"rayJobUid": "u", "requestedAt": "2026-12-07T10:00:00Z"}}


@pytest.mark.parametrize(
    "new,last,events,wait",
    [
        (PROGRESSED, None, 0, 0.0),  # the first progress of this process: at once
        (PROGRESSED, 100.0, 0, 90.0),  # 30 s after the last mirror: waits for its slot at 220
        (PROGRESSED, 50.0, 0, 40.0),
        (PROGRESSED, 0.0, 0, 0.0),  # the slot has come
        (TOTALS, 100.0, 0, 90.0),  # status.usage's totals refreshed: they wait too
        (PROGRESSED, 100.0, 1, 0.0),  # an Event goes with it: at once
        (POD_ENDED, 100.0, 0, 0.0),  # a pod's GPUs freed is a fact: at once
        (ENDED, 100.0, 0, 0.0),  # a phase: at once, with the progress
        (CONDITION, 100.0, 0, 0.0),  # a condition: at once
        (GUARD, 100.0, 0, 0.0),  # the guard's record: at once
        (STOP, 100.0, 0, 0.0),  # a stop: at once
        (RUNNING, 100.0, 0, 0.0),  # nothing changed: nothing waits (nothing is written either)
    ],
)
def test_only_progress_alone_waits_for_the_mirror_slot(
    new: dict[str, Any], last: float | None, events: int, wait: float
) -> None:
    old, changed = read_status(RUNNING), read_status(new)
    assert set(status_document(changed)) == set(new), "every case parses whole"
    assert mirror_wait(old, changed, last_mirrored=last, now=130.0, every=120.0, events=events) == wait


def test_a_mirror_interval_of_zero_writes_every_change_at_once() -> None:
    assert mirror_wait(read_status(RUNNING), read_status(PROGRESSED), last_mirrored=129.0, now=130.0, every=0.0) == 0.0


def test_progress_fields_are_every_field_a_progress_document_writes() -> None:
    doc = {
        "trials": {"total": 2, "running": 1},
        "pending": {"trials": 1, "resources": {"GPU": 1}},
        "bestTrial": {"id": "t1", "metric": "val_loss", "value": 0.5},
        "tracking": {"uri": "http://mlflow:5000", "ok": True},
    }
    patch = progress_patch(doc)
    assert set(patch) <= PROGRESS_FIELDS
    assert routine_fields(read_status({}), updated(read_status({}), patch)) == (
        {k for k, v in patch.items() if v is not None},
        set(),
    )


@pytest.mark.parametrize(
    "previous,changed,wait",
    [
        (None, False, 15.0),  # the first read
        (15.0, False, 30.0),  # unchanged: doubled
        (30.0, False, 60.0),
        (60.0, False, 120.0),
        (120.0, False, 120.0),  # at the cap
        (90.0, False, 120.0),
        (120.0, True, 15.0),  # a change: the base again
        (5.0, False, 15.0),  # never below the base
    ],
)
def test_the_poll_backs_off_while_the_document_does_not_change(
    previous: float | None, changed: bool, wait: float
) -> None:
    assert next_poll_seconds(previous, changed, base=15.0, cap=120.0) == wait


def test_a_cap_below_the_base_keeps_the_base_and_a_zero_base_polls_every_pass() -> None:
    assert next_poll_seconds(15.0, False, base=15.0, cap=5.0) == 15.0
    assert next_poll_seconds(15.0, False, base=0.0, cap=120.0) == 0.0


def test_the_cache_backs_the_poll_off_and_a_rayjob_event_or_a_waiting_write_brings_it_back() -> None:
    cache, ref = Cache(Settings(status_poll_seconds=15.0, status_poll_max_seconds=60.0)), ObjectRef("ml", "digits")
    assert cache.poll_due(ref, 0.0, take=True)
    cache.polled(ref, changed=True)
    assert not cache.poll_due(ref, 14.0, take=False) and cache.poll_due(ref, 15.0, take=True)
    cache.polled(ref, changed=False)  # unchanged at 15: next at 45
    assert not cache.poll_due(ref, 44.0, take=False) and cache.poll_due(ref, 45.0, take=True)
    cache.polled(ref, changed=False)  # next at 105
    assert not cache.poll_due(ref, 104.0, take=False) and cache.poll_due(ref, 105.0, take=True)
    cache.polled(ref, changed=False)  # at the cap: next at 165
    assert not cache.poll_due(ref, 164.0, take=False)
    cache.poll_by(ref, 130.0)  # a progress write waits for its slot at 130: the poll comes by then
    assert not cache.poll_due(ref, 129.0, take=False) and cache.poll_due(ref, 130.0, take=True)
    cache.polled(ref, changed=False)  # 130 + 60
    assert not cache.poll_due(ref, 145.0, take=False)
    rayjob = {
        "metadata": {"name": "digits-r1", "namespace": "ml", "uid": "u1", "labels": {"sweeps.dev/sweep": "digits"}}
    }
    assert cache.rayjob_has_news({**rayjob, "status": {"jobDeploymentStatus": "Running"}})
    assert cache.poll_due(ref, 145.0, take=False), "a RayJob event: the base rhythm again"
    cache.forget_sweep(ref)
    assert cache.poll_due(ref, 0.0, take=False) and cache.last_mirrored(ref) is None


@pytest.mark.parametrize("name", ["SWEEP_STATUS_POLL_MAX_SECONDS", "SWEEP_PROGRESS_MIRROR_SECONDS"])
def test_the_rhythm_settings_refuse_a_negative_number(name: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: "-1"})
    assert replace(Settings(), status_poll_max_seconds=0, progress_mirror_seconds=0)
