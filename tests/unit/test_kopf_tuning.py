"""kopf's scheduler, tuned: spawning a worker per new object no longer yields the event loop each time,
and every spawned coroutine still runs (docs/benchmarks.md has the measurement behind it)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from kopf._cogs.aiokits import aiotasks

from sweep_operator import kopf_tuning


async def _loop_turns_while_spawning(count: int) -> tuple[int, int]:
    """(event-loop turns another task got while `count` coroutines were spawned back to back, how many ran)."""
    ran: list[int] = []
    turns = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1
            await asyncio.sleep(0)

    async def job(i: int) -> None:
        ran.append(i)

    scheduler = aiotasks.Scheduler()
    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = turns
    for i in range(count):  # what kopf's watcher does for a burst of new objects
        await scheduler.spawn(job(i), name=f"job-{i}")
    during = turns - before
    await scheduler.wait()
    stop.set()
    await ticking
    await scheduler.close()
    return during, len(ran)


@pytest.fixture
def original_spawn() -> Iterator[Any]:
    """kopf's scheduler as kopf ships it for the test (an in-process operator may have tuned it), then as it was."""
    found = aiotasks.Scheduler.spawn
    aiotasks.Scheduler.spawn = kopf_tuning.UNTUNED_SPAWN  # type: ignore[method-assign]  # restoring kopf's own
    yield kopf_tuning.UNTUNED_SPAWN
    aiotasks.Scheduler.spawn = found  # type: ignore[method-assign]  # as the test found it


def test_untuned_kopf_yields_once_per_spawn_and_tuned_kopf_does_not(original_spawn: Any) -> None:
    during, ran = asyncio.run(_loop_turns_while_spawning(200))
    assert ran == 200 and during >= 200  # one loop turn per new object: the backlog the benchmark measured
    assert kopf_tuning.tune_kopf() is True
    assert kopf_tuning.tune_kopf() is True  # idempotent
    assert kopf_tuning._YIELD not in inspect.getsource(aiotasks.Scheduler.spawn)
    during, ran = asyncio.run(_loop_turns_while_spawning(200))
    assert ran == 200  # every spawned coroutine still runs
    assert during == 0  # and the watcher kept the loop until its burst was queued


def test_another_kopf_version_is_left_alone(original_spawn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf_tuning.importlib.metadata, "version", lambda name: "9.9.9")
    assert kopf_tuning.tune_kopf() is False
    assert aiotasks.Scheduler.spawn is original_spawn


def test_the_closed_scheduler_still_refuses_new_work(original_spawn: Any) -> None:
    kopf_tuning.tune_kopf()

    async def scenario() -> None:
        scheduler = aiotasks.Scheduler()
        await scheduler.close()

        async def job() -> None:
            raise AssertionError("must not run")

        with pytest.raises(RuntimeError, match="closed"):
            await scheduler.spawn(job())

    asyncio.run(scenario())


def test_the_tuning_can_be_left_off_for_a_measurement(original_spawn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kopf_tuning.UNTUNED_ENV, "1")
    assert kopf_tuning.tune_kopf() is False
    assert aiotasks.Scheduler.spawn is kopf_tuning.UNTUNED_SPAWN


def test_tune_gc_raises_the_thresholds_and_freezes_what_start_up_left(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from sweep_operator.kopf_tuning import GC_THRESHOLDS, UNTUNED_GC_ENV, tune_gc

    before = gc.get_threshold()
    monkeypatch.setenv(UNTUNED_GC_ENV, "1")
    assert not tune_gc() and gc.get_threshold() == before
    monkeypatch.delenv(UNTUNED_GC_ENV)
    try:
        assert tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0, "start-up's objects are out of the collector's reach"
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.fixture
def original_json() -> Iterator[Any]:
    """kopf's watch decoding as kopf ships it for the test (an in-process operator may have tuned it), then as it
    was."""
    from kopf._cogs.clients import api

    found = api.json
    api.json = kopf_tuning.UNTUNED_JSON
    yield kopf_tuning.UNTUNED_JSON
    api.json = found


def test_watch_lines_are_decoded_by_orjson_and_what_it_refuses_by_json(original_json: Any) -> None:
    import json

    from kopf._cogs.clients import api

    assert api.json is json
    assert kopf_tuning.tune_watch_decoding() is True
    assert kopf_tuning.tune_watch_decoding() is True  # idempotent
    assert type(api.json).__name__ == "_WatchJson"
    line = '{"type": "ADDED", "object": {"metadata": {"name": "s1", "resourceVersion": "7"}, "spec": {"x": [1, 2.5]}}}'
    assert api.json.loads(line) == json.loads(line)
    # A tenant's spec that orjson refuses must not stop the watch: decoded as kopf always did.
    huge = '{"object": {"spec": {"paramSpace": {"n": 123456789012345678901234567890, "f": NaN}}}}'
    decoded = api.json.loads(huge)["object"]["spec"]["paramSpace"]
    assert decoded["n"] == 123456789012345678901234567890 and decoded["f"] != decoded["f"]
    assert api.json.dumps({"a": 1}) == json.dumps({"a": 1})  # the rest of `json` is json's


def test_watch_decoding_is_left_alone_for_another_kopf_or_when_switched_off(
    original_json: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kopf._cogs.clients import api

    monkeypatch.setenv(kopf_tuning.UNTUNED_ENV, "1")
    assert kopf_tuning.tune_watch_decoding() is False and api.json is original_json
    monkeypatch.delenv(kopf_tuning.UNTUNED_ENV)
    monkeypatch.setattr(kopf_tuning.importlib.metadata, "version", lambda name: "9.9.9")
    assert kopf_tuning.tune_watch_decoding() is False and api.json is original_json


# ------------------------------------------------------------------------------------- cause detection (issue 30)
@pytest.fixture
def original_detection() -> Iterator[Any]:
    """kopf's cause detection as kopf ships it for the test (an in-process operator may have tuned it), then as it
    was."""
    from kopf._core.reactor import processing

    found = processing._detect_causes
    processing._detect_causes = kopf_tuning.UNTUNED_DETECT_CAUSES
    yield kopf_tuning.UNTUNED_DETECT_CAUSES
    processing._detect_causes = found


def _detect(registry: Any, settings: Any, builds: list[Any]) -> Any:
    """One ADDED event of a sweep through `processing._detect_causes` as kopf calls it (process_resource_causes),
    counting the diff-base builds it makes."""
    from kopf._cogs.structs import bodies, patches, references
    from kopf._core.actions import loggers
    from kopf._core.engines import indexing
    from kopf._core.reactor import inventory, processing

    resource = references.Resource("sweeps.dev", "v1alpha1", "trainingsweeps", namespaced=True)
    raw_event: Any = {
        "type": "ADDED",
        "object": {
            "apiVersion": "sweeps.dev/v1alpha1",
            "kind": "TrainingSweep",
            "metadata": {"name": "s1", "namespace": "team-a", "uid": "u1", "resourceVersion": "7"},
            "spec": {"tune": {"numSamples": 4}},
        },
    }
    body = bodies.Body(raw_event["object"])
    storage = settings.persistence.diffbase_storage
    build = storage.build

    def counted(**kwargs: Any) -> Any:
        builds.append(kwargs)
        return build(**kwargs)

    storage.build = counted  # the instance attribute shadows the method for this settings object only

    async def in_loop() -> Any:  # kopf's per-object memory reads the running loop's clock, as in an operator
        return processing._detect_causes(
            indexers=indexing.OperatorIndexers(),
            registry=registry,
            settings=settings,
            resource=resource,
            raw_event=raw_event,
            body=body,
            patch=patches.Patch(),
            memory=inventory.ResourceMemory(),
            local_logger=loggers.LocalObjectLogger(body=body, settings=settings),
            event_logger=loggers.ObjectLogger(body=body, settings=settings),
        )

    return asyncio.run(in_loop())


def _registry(*, changing: bool) -> Any:
    import kopf

    registry = kopf.OperatorRegistry()

    @kopf.on.event("sweeps.dev", "v1alpha1", "trainingsweeps", registry=registry)
    async def seen(**_: Any) -> None:
        return None

    if changing:

        @kopf.on.update("sweeps.dev", "v1alpha1", "trainingsweeps", registry=registry)
        async def updated(**_: Any) -> None:
            return None

    return registry


def test_a_watch_only_resource_gets_kopfs_causes_without_the_diff(original_detection: Any) -> None:
    import kopf

    as_shipped: list[Any] = []
    expected = _detect(_registry(changing=False), kopf.OperatorSettings(), as_shipped)
    assert len(as_shipped) == 1  # kopf diffs the body on every event, whatever handlers there are
    assert kopf_tuning.tune_event_processing() is True
    assert kopf_tuning.tune_event_processing() is True  # idempotent
    tuned: list[Any] = []
    found = _detect(_registry(changing=False), kopf.OperatorSettings(), tuned)
    assert tuned == []  # no diff-base built
    assert found.spawning_cause is None and found.changing_cause is None
    assert expected.spawning_cause is None and expected.changing_cause is None  # what kopf decided too
    for field in ("type", "event", "body", "resource"):
        assert getattr(found.watching_cause, field) == getattr(expected.watching_cause, field), field


def test_a_resource_with_changing_handlers_keeps_kopfs_own_detection(original_detection: Any) -> None:
    import kopf

    assert kopf_tuning.tune_event_processing() is True
    builds: list[Any] = []
    found = _detect(_registry(changing=True), kopf.OperatorSettings(), builds)
    assert len(builds) == 1 and found.changing_cause is not None and found.watching_cause is not None


def test_event_processing_is_left_alone_for_another_kopf_or_when_switched_off(
    original_detection: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kopf._core.reactor import processing

    monkeypatch.setenv(kopf_tuning.UNTUNED_ENV, "1")
    assert kopf_tuning.tune_event_processing() is False and processing._detect_causes is original_detection
    monkeypatch.delenv(kopf_tuning.UNTUNED_ENV)
    monkeypatch.setattr(kopf_tuning.importlib.metadata, "version", lambda name: "9.9.9")
    assert kopf_tuning.tune_event_processing() is False and processing._detect_causes is original_detection
