"""kopf's settings as the operator configures them: kopf never owns the guard's finalizer, its per-object log lines
become Events only from WARNING up, and the success line of the handlers that run on every event is dropped."""

from __future__ import annotations

import logging

import kopf
import pytest

from sweep_contracts import constants
from sweep_operator.handlers import ROUTINE_HANDLERS, RoutineHandlerSuccess, configure_kopf, quiet_routine_handler_logs
from sweep_operator.settings import Settings


def _record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)


def test_kopf_never_manages_the_guards_finalizer_and_posts_only_warnings() -> None:
    """kopf removes its configured finalizer from objects no deletion handler needs, and stores handler progress
    a tenant can forge: the guard's finalizer must not be kopf's (R22)."""
    settings = kopf.OperatorSettings()
    configure_kopf(settings, Settings())
    assert settings.persistence.finalizer != constants.FINALIZER
    assert settings.posting.enabled and settings.posting.level == logging.WARNING
    assert any(isinstance(f, RoutineHandlerSuccess) for f in logging.getLogger("kopf.objects").filters)


@pytest.mark.parametrize("handler", ROUTINE_HANDLERS)
def test_the_success_line_of_a_routine_handler_is_dropped(handler: str) -> None:
    kind = "Timer" if handler == "sweep_tick" else "Handler"
    assert not RoutineHandlerSuccess().filter(_record(f"{kind} 'build_registry.<locals>.{handler}' succeeded."))


@pytest.mark.parametrize(
    "message, level",
    [
        ("Handler 'build_registry.<locals>.sweep_deleted' succeeded.", logging.INFO),  # the guard's: kept
        ("Handler 'build_registry.<locals>.sweep_changed' failed temporarily: boom", logging.ERROR),
        ("Handler 'build_registry.<locals>.sweep_changed' succeeded.", logging.DEBUG),  # --verbose keeps all
        ("Handler 'build_registry.<locals>.not_sweep_changed_at_all' succeeded.", logging.INFO),
        ("Timer 'build_registry.<locals>.sweep_tick' failed with an exception. Will retry.", logging.ERROR),
    ],
)
def test_everything_else_is_kept(message: str, level: int) -> None:
    assert RoutineHandlerSuccess().filter(_record(message, level))


def test_the_filter_is_installed_once() -> None:
    quiet_routine_handler_logs()
    quiet_routine_handler_logs()
    filters = [f for f in logging.getLogger("kopf.objects").filters if isinstance(f, RoutineHandlerSuccess)]
    assert len(filters) == 1


def test_no_kopf_deletion_handler_is_registered() -> None:
    """A progress-tracked on.delete handler is what a forged `sweeps.dev/<handler>: {"success": true}` annotation
    short-circuits; the guard's pipeline is driven by watch events only (R22)."""
    from unittest import mock

    from sweep_operator.handlers import OperatorWiring, build_registry

    registry = build_registry(OperatorWiring(Settings(), mock.MagicMock()))
    changing = list(registry._changing.get_all_handlers())
    assert not changing, f"kopf change/delete handlers registered: {[h.id for h in changing]}"
    assert list(registry._watching.get_all_handlers()), "the event handlers drive the guard"


def test_kopf_needs_no_finalizer_of_its_own() -> None:
    """kopf adds its own finalizer to every object a timer, daemon or change handler covers (a patch per sweep, its
    echo, and a pass that waits for it): the operator registers none, so kopf adds nothing (ticks: SweepTicks)."""
    from unittest import mock

    from sweep_operator.handlers import OperatorWiring, build_registry

    registry = build_registry(OperatorWiring(Settings(), mock.MagicMock()))
    assert not list(registry._spawning.get_all_handlers()), "a kopf timer or daemon requires kopf's finalizer"
    assert not list(registry._changing.get_all_handlers())


def test_sweep_ticks_reconcile_a_due_sweep_every_interval_until_it_is_deleted() -> None:
    """kopf.timer's job: a followed sweep is looked at each interval while it exists and is not deleting; a due one
    is reconciled, a steady one costs nothing, a deleting or forgotten one is no longer ticked."""
    import threading
    from unittest import mock

    from sweep_operator.handlers import SweepTicks
    from sweep_operator.reconcile.facts import ObjectRef
    from tests.support.waiting import wait_for

    body = {"metadata": {"name": "digits", "namespace": "ml"}, "status": {"phase": "Running"}}
    copies = {"body": body}
    asked: list[tuple[str, str]] = []
    looked = threading.Semaphore(0)
    controller = mock.MagicMock()
    controller.cache.sweep.side_effect = lambda ref: copies["body"]

    def tick_due(b: object) -> bool:
        looked.release()
        return bool(copies.get("due"))

    controller.tick_due.side_effect = tick_due
    controller.request_reconcile.side_effect = lambda ns, name: asked.append((ns, name))
    ticks = SweepTicks(controller, 0.02)
    try:
        ticks.follow(body)
        for _ in range(3):  # steady: looked at again and again, never reconciled
            assert looked.acquire(timeout=10)
        assert asked == []
        copies["due"] = True
        wait_for(lambda: len(asked) >= 2, what="a due sweep reconciled on each tick")
        assert set(asked) == {("ml", "digits")}
        copies["body"] = {**body, "metadata": {**body["metadata"], "deletionTimestamp": "2026-12-05T00:00:00Z"}}
        ref = ObjectRef("ml", "digits")
        wait_for(lambda: not ticks.queue.delayed(ref) and ticks.queue.pending() == 0, what="no tick after deletion")
        ticks.follow(copies["body"])  # a deleting sweep's event schedules none either
        assert not ticks.queue.delayed(ref)
    finally:
        ticks.stop()


def test_kopf_builds_no_per_object_info_line_unless_verbose() -> None:
    """kopf's per-object INFO lines are the routine handlers' successes: not built at all (one per watch event);
    warnings still are (they become Events), and --verbose (DEBUG) keeps everything."""
    logger, root = logging.getLogger("kopf.objects"), logging.getLogger()
    levels = logger.level, root.level
    try:
        logger.setLevel(logging.NOTSET)
        root.setLevel(logging.INFO)
        quiet_routine_handler_logs()
        assert not logger.isEnabledFor(logging.INFO) and logger.isEnabledFor(logging.WARNING)
        logger.setLevel(logging.NOTSET)
        root.setLevel(logging.DEBUG)
        quiet_routine_handler_logs()
        assert logger.isEnabledFor(logging.DEBUG)
    finally:
        logger.setLevel(levels[0])
        root.setLevel(levels[1])
