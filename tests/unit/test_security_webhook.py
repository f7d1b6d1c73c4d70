"""The operator's webhook wiring (issue 15): kopf's admission server re-reads its certificate files at the
configured interval, and the validation handler is a coroutine (kopf runs it on its event loop, never in the
thread pool where the guards wait on S3: kopf/_core/actions/invocation.py invoke())."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf
import pytest

from sweep_contracts import constants
from sweep_operator.handlers import WEBHOOK_ID, OperatorWiring, ReloadingWebhookServer, build_registry, configure_kopf
from sweep_operator.settings import Settings


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
