"""The operator's webhook wiring (issue 15): kopf's admission server re-reads its certificate files at the
configured interval, and the validation handler is a coroutine (kopf awaits it on its event loop, never in the
thread pool where the guards wait on S3: kopf/_core/actions/invocation.py invoke()), which hands the validation to
the webhook's own bounded threads: off the loop, a bounded number at once, each within a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

import kopf
import pytest

from sweep_contracts import constants
from sweep_operator.handlers import (
    WEBHOOK_ID,
    OperatorWiring,
    ReloadingWebhookServer,
    build_controller,
    build_registry,
    configure_kopf,
)
from sweep_operator.settings import Settings, SettingsError
from sweep_operator.webhook_bounds import MAX_REFUSAL_CHARS, ValidationBusy, ValidationPool
from tests.support.factories import cpu_sweep


def test_the_admission_server_reloads_its_certificate_at_the_configured_interval() -> None:
    kopf_settings = kopf.OperatorSettings()
    configure_kopf(
        kopf_settings, Settings(webhook_port=9443, webhook_cert_dir="/certs", webhook_cert_check_seconds=3.0)
    )
    server = kopf_settings.admission.server
    assert isinstance(server, ReloadingWebhookServer)
    assert (server.certfile, server.pkeyfile, server.file_check_interval) == ("/certs/tls.crt", "/certs/tls.key", 3.0)


class NoController:
    """Only what build_registry and the admission handler touch."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    def admission_problems(self, body: Any, old: Any) -> list[str]:
        self.asked.append(body)
        return ["spec.storage.endpointUrl: got 'http://169.254.169.254'; not allowed"]


def test_the_validation_handler_is_a_coroutine_that_refuses_with_the_problems() -> None:
    controller = NoController()
    registry = build_registry(OperatorWiring(Settings(webhook_port=9443), controller))
    (handler,) = [h for h in registry._webhooks.get_all_handlers() if h.id == WEBHOOK_ID]
    assert asyncio.iscoroutinefunction(handler.fn)
    try:
        asyncio.run(handler.fn(body={"spec": {}}, old=None))
    except kopf.AdmissionError as refused:
        assert "spec.storage.endpointUrl" in str(refused) and refused.code == 422
    else:
        raise AssertionError("the handler admitted a refused sweep")
    assert controller.asked == [{"spec": {}}]


def test_the_webhook_logs_who_sets_the_escape_hatch(caplog: pytest.LogCaptureFixture) -> None:
    controller = NoController()
    registry = build_registry(OperatorWiring(Settings(webhook_port=9443), controller))
    (handler,) = [h for h in registry._webhooks.get_all_handlers() if h.id == WEBHOOK_ID]
    body = {
        "metadata": {
            "name": "digits",
            "namespace": "team-a",
            "annotations": {constants.ANNOTATION_SKIP_VERIFICATION: "true"},
        },
        "spec": {},
    }
    userinfo = {"username": "alice@team-a", "groups": ["team-a:developers"]}
    with caplog.at_level(logging.WARNING, logger="sweep_operator.handlers"):
        with contextlib.suppress(kopf.AdmissionError):
            asyncio.run(handler.fn(body=body, old=None, userinfo=userinfo))
        try:  # a spec change that leaves the annotation as it was: not a new use
            asyncio.run(handler.fn(body=body, old=body, userinfo=userinfo))
        except kopf.AdmissionError:
            pass
    (line,) = [r.getMessage() for r in caplog.records if "escape hatch" in r.getMessage()]
    assert "team-a/digits" in line and "alice@team-a" in line and "team-a:developers" in line


# --- the webhook's bounds: validation off the event loop, bounded in number and time ---------------------------------


class ThreadNoting(NoController):
    """Notes which thread validates, and can hold a validation until released."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []
        self.entered, self.release = threading.Event(), threading.Event()
        self.release.set()

    def admission_problems(self, body: Any, old: Any) -> list[str]:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        self.release.wait(30)
        return []


def sweep_handler(wiring: OperatorWiring) -> Any:
    (handler,) = [h for h in build_registry(wiring)._webhooks.get_all_handlers() if h.id == WEBHOOK_ID]
    return handler.fn


def test_the_validation_runs_on_the_webhooks_own_threads_not_the_event_loop() -> None:
    controller = ThreadNoting()
    handler = sweep_handler(OperatorWiring(Settings(webhook_port=9443), controller))

    async def validate() -> str:
        await handler(body={"spec": {}}, old=None)
        return threading.current_thread().name

    loop_thread = asyncio.run(validate())
    assert controller.threads and controller.threads[0] != loop_thread
    assert controller.threads[0].startswith("admission")


def test_the_next_validation_is_refused_as_busy_at_once_when_every_slot_is_taken() -> None:
    controller = ThreadNoting()
    controller.release.clear()
    wiring = OperatorWiring(Settings(webhook_port=9443), controller)
    wiring.validation_pool = ValidationPool(workers=1, waiting=1)
    handler = sweep_handler(wiring)

    async def scenario() -> kopf.AdmissionError:
        held = [asyncio.ensure_future(handler(body={"spec": {}}, old=None)) for _ in range(2)]
        await asyncio.to_thread(controller.entered.wait, 10)
        try:
            await handler(body={"spec": {}}, old=None)
        except kopf.AdmissionError as refused:
            return refused
        finally:
            controller.release.set()
            await asyncio.gather(*held)
        raise AssertionError("a third validation was queued past the pool's two slots")

    refused = asyncio.run(scenario())
    assert refused.code == 429 and "busy" in str(refused) and "retry" in str(refused)
    assert len(controller.threads) == 2  # the refused one never reached a thread


def test_a_validation_past_its_deadline_is_refused_and_keeps_its_slot_until_it_ends() -> None:
    pool = ValidationPool(workers=1, waiting=0, deadline_seconds=0.05)
    release = threading.Event()

    async def scenario() -> None:
        with pytest.raises(ValidationBusy, match="no answer within"):
            await pool.run(release.wait, 30)
        with pytest.raises(ValidationBusy, match="in flight"):  # the late one still runs: its slot is not free
            await pool.run(lambda: "next")
        release.set()
        deadline = asyncio.get_running_loop().time() + 10
        while True:  # the slot comes back once the late validation ends
            try:
                assert await pool.run(lambda: "next") == "next"
                return
            except ValidationBusy:
                assert asyncio.get_running_loop().time() < deadline, "the slot never came back"
                await asyncio.sleep(0.01)

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        pool.shutdown()


def test_a_refusal_message_is_cut_saying_how_much_was_left_out() -> None:
    class Echoing(NoController):
        def admission_problems(self, body: Any, old: Any) -> list[str]:
            return ["spec.paramSpace.x: " + "{'a': 1}, " * 50_000 + "values must be constants"]

    handler = sweep_handler(OperatorWiring(Settings(webhook_port=9443), Echoing()))
    with pytest.raises(kopf.AdmissionError) as refused:
        asyncio.run(handler(body={"spec": {}}, old=None))
    message = str(refused.value)
    assert message.startswith("spec.paramSpace.x: ") and len(message) < MAX_REFUSAL_CHARS + 100
    assert message.endswith(f"({500_019 + len('values must be constants') - MAX_REFUSAL_CHARS} more characters)")


def test_the_webhooks_parses_are_not_remembered_by_the_reconciles_parse_cache() -> None:
    """Anyone who reaches the webhook chooses the specs it parses (a dry run, a forged review): each remembered would
    hold hundreds of KiB in a cache of 4,096 entries."""
    made = build_controller(Settings(), None)
    for i in range(20):
        forged = cpu_sweep(f"forged-{i}", "team-a")
        forged["spec"]["paramSpace"]["x"] = {"choice": [f"{i}-{j}" for j in range(1000)]}
        assert made.admission_problems(forged, None) == []
    assert not made.cache.parsed._items
    made.cache.parse(cpu_sweep("digits", "team-a"))  # a reconcile's parse is still remembered
    assert len(made.cache.parsed._items) == 1


def test_the_request_cap_reaches_the_admission_server_and_is_bounded() -> None:
    kopf_settings = kopf.OperatorSettings()
    configure_kopf(kopf_settings, Settings(webhook_port=9443, webhook_max_request_bytes=128 * 1024))
    server = kopf_settings.admission.server
    assert isinstance(server, ReloadingWebhookServer)
    assert server.review_bounds.max_bytes == 128 * 1024 and server.review_bounds.max_elements == 8192
    assert Settings.from_env({"SWEEP_WEBHOOK_MAX_REQUEST_BYTES": "65536"}).webhook_max_request_bytes == 65536
    for wrong in ("1000", str(4 * 1024 * 1024)):
        with pytest.raises(SettingsError, match="SWEEP_WEBHOOK_MAX_REQUEST_BYTES"):
            Settings.from_env({"SWEEP_WEBHOOK_MAX_REQUEST_BYTES": wrong})


def test_the_escape_hatch_line_says_it_is_the_reviews_word_and_marks_a_dry_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any caller that reaches the webhook's port can send a review naming any user: the line says whose word it is
    (docs/security.md: authoritative where networkPolicy.webhookFrom admits only the API server)."""
    handler = sweep_handler(OperatorWiring(Settings(webhook_port=9443), NoController()))
    meta = {"name": "digits", "namespace": "team-a", "annotations": {constants.ANNOTATION_SKIP_VERIFICATION: "true"}}
    body = {"metadata": meta, "spec": {}}
    with caplog.at_level(logging.WARNING, logger="sweep_operator.handlers"), contextlib.suppress(kopf.AdmissionError):
        asyncio.run(handler(body=body, old=None, userinfo={"username": "bob"}, dryrun=True))
    (line,) = [r.getMessage() for r in caplog.records if "escape hatch" in r.getMessage()]
    assert "by bob" in line and "as the admission review says" in line and "dry run" in line
