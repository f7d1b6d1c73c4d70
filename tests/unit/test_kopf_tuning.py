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


class _Settings:
    """Stands for kopf's OperatorSettings: the filter is an attribute set on it."""


def _watched(events: list[Any], settings: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What kopf's watcher receives from the tuned `infinite_watch` when the API streams `events`."""

    async def stream(**_: Any) -> Any:
        for event in events:
            yield event

    monkeypatch.setattr(kopf_tuning, "UNTUNED_INFINITE_WATCH", stream)

    async def collect() -> list[Any]:
        resource = type("Resource", (), {"plural": "trainingsweeps"})()
        watch = kopf_tuning._routed_infinite_watch(settings=settings, resource=resource, namespace=None)
        return [event async for event in watch]

    return asyncio.run(collect())


def _event(type_: Any, rv: str) -> dict[str, Any]:
    return {"type": type_, "object": {"metadata": {"name": "s", "resourceVersion": rv}}}


def test_the_router_drops_only_added_and_modified_events_its_predicate_calls_echoes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kopf._cogs.clients import watching

    asked: list[tuple[str, str]] = []

    def is_echo(plural: str, obj: Any) -> bool:
        asked.append((plural, obj["metadata"]["resourceVersion"]))
        return bool(obj["metadata"]["resourceVersion"] == "7")

    events = [
        watching.Bookmark.LISTED,
        _event(None, "7"),  # the listing: kopf's view of the world after a (re)list is never thinned
        _event("ADDED", "7"),
        _event("MODIFIED", "7"),
        _event("MODIFIED", "8"),
        _event("DELETED", "7"),
        {"type": "ERROR", "object": {"code": 410}},
    ]
    settings = _Settings()
    router = kopf_tuning.WatchRouter(is_echo)
    kopf_tuning.set_watch_router(settings, router)
    assert _watched(events, settings, monkeypatch) == [events[0], events[1], events[4], events[5], events[6]]
    assert asked == [("trainingsweeps", "7"), ("trainingsweeps", "7"), ("trainingsweeps", "8")]
    assert router.dropped == {"trainingsweeps": 2} and not router.routed
    # An operator that registered no router (another kopf operator in the process) gets every event.
    assert _watched(events, _Settings(), monkeypatch) == events


def test_a_routed_resources_events_go_to_its_route_and_never_to_kopf(monkeypatch: pytest.MonkeyPatch) -> None:
    from kopf._cogs.clients import watching

    router = kopf_tuning.WatchRouter(lambda plural, obj: obj["metadata"]["resourceVersion"] == "7")
    handled: list[tuple[Any, str]] = []

    def take(raw: Any) -> bool:  # takes all but what still carries kopf's legacy finalizer
        if raw["object"]["metadata"].get("finalizers"):
            return False
        handled.append((raw["type"], raw["object"]["metadata"]["resourceVersion"]))
        return True

    router.route("trainingsweeps", take)
    router.route("rayjobs", lambda raw: pytest.fail("another resource's route"))
    error = {"type": "ERROR", "object": {"code": 410}}
    events = [
        watching.Bookmark.LISTED,
        _event(None, "5"),
        _event("ADDED", "6"),
        _event("MODIFIED", "7"),  # our own write's echo: dropped, not handled
        _event("MODIFIED", "8"),
        _event("DELETED", "9"),
        error,
        {"type": "MODIFIED", "object": {"metadata": {"name": "s", "resourceVersion": "10", "finalizers": ["k"]}}},
    ]
    settings = _Settings()
    kopf_tuning.set_watch_router(settings, router)
    # kopf gets only its own, and what the route leaves to it.
    assert _watched(events, settings, monkeypatch) == [watching.Bookmark.LISTED, error, events[-1]]
    assert handled == [(None, "5"), ("ADDED", "6"), ("MODIFIED", "8"), ("DELETED", "9")]
    assert router.routed == {"trainingsweeps": 4} and router.dropped == {"trainingsweeps": 1}


def test_the_tuned_json_patch_is_kopfs_for_every_patch_and_copies_nothing_for_an_empty_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kopf._cogs.structs import patches

    body = {
        "apiVersion": "sweeps.dev/v1alpha1",
        "kind": "TrainingSweep",
        "metadata": {"name": "s", "finalizers": ["a"], "labels": {"x": "1"}, "resourceVersion": "7"},
        "spec": {"tune": {"numSamples": 4}, "big": list(range(50))},
        "status": {"phase": "Running"},
    }
    merges: list[dict[str, Any]] = [
        {"metadata": {"finalizers": ["a", "sweeps.dev/guard"]}},
        {"metadata": {"labels": {"x": None, "y": "2"}}, "status": {"phase": "Failed", "new": {"k": [1]}}},
        {"spec": {"tune": None}},
        {"metadata": {"annotations": {"n": "v"}}},  # a field the body lacks
        {"data": {"k": "v"}},  # a top-level key the body lacks
        {"status": None},
        {"metadata": {"labels": {"absent": None}}},  # removing what is not there: no operation
    ]
    for merge in merges:
        expected = kopf_tuning.UNTUNED_AS_JSON_PATCH(patches.Patch(merge, body=body))
        assert kopf_tuning._as_json_patch(patches.Patch(merge, body=body)) == expected, merge
    with_fn = patches.Patch(fns=[lambda b: b["spec"].update(extra=1)], body=body)
    assert kopf_tuning._as_json_patch(with_fn) == [{"op": "add", "path": "/spec/extra", "value": 1}]
    copies: list[Any] = []
    monkeypatch.setattr(kopf_tuning.copy, "deepcopy", lambda obj: copies.append(obj) or obj)
    assert kopf_tuning._as_json_patch(patches.Patch(body=body)) == []
    assert copies == []  # an empty patch (every validation's answer) copies nothing


def _watching() -> Any:
    from kopf._cogs.clients import watching

    return watching


def _patch_class() -> Any:
    from kopf._cogs.structs import patches

    return patches.Patch


@pytest.mark.parametrize(
    ("tune", "owner", "attribute", "untuned", "tuned"),
    [
        ("tune_watch_router", _watching, "infinite_watch", "UNTUNED_INFINITE_WATCH", "_routed_infinite_watch"),
        ("tune_json_patch", _patch_class, "as_json_patch", "UNTUNED_AS_JSON_PATCH", "_as_json_patch"),
    ],
)
def test_an_adjustment_is_installed_once_and_left_alone_for_another_kopf_or_when_switched_off(
    tune: str, owner: Any, attribute: str, untuned: str, tuned: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kopf as it ships for the test (an in-process operator may have tuned it); monkeypatch puts back what it found."""
    target, original = owner(), getattr(kopf_tuning, untuned)
    monkeypatch.setattr(target, attribute, original)
    monkeypatch.setenv(kopf_tuning.UNTUNED_ENV, "1")
    assert getattr(kopf_tuning, tune)() is False and getattr(target, attribute) is original
    monkeypatch.delenv(kopf_tuning.UNTUNED_ENV)
    with monkeypatch.context() as m:
        m.setattr(kopf_tuning.importlib.metadata, "version", lambda name: "9.9.9")
        assert getattr(kopf_tuning, tune)() is False and getattr(target, attribute) is original
    assert getattr(kopf_tuning, tune)() is True
    assert getattr(kopf_tuning, tune)() is True  # idempotent
    assert getattr(target, attribute) is getattr(kopf_tuning, tuned)
