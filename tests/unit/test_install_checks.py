"""The operator's startup checks of its install (issue 28): a missing KubeRay identity is said loudly (an ERROR line
and a gauge), never silently; the settings behind them refuse bad input naming the variable."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from sweep_operator.install_checks import (
    KUBERAY_IDENTITY_METRIC,
    check_kuberay_identity,
    judge_kuberay_identity,
    start_webhook_certificate,
)
from sweep_operator.settings import Settings, SettingsError

KUBERAY = "kuberay-system/kuberay-operator"


def test_a_missing_kuberay_account_names_the_identity_and_the_values_that_fix_it() -> None:
    result = judge_kuberay_identity(KUBERAY, exists=False)
    assert not result.ok
    for needed in ("system:serviceaccount:kuberay-system:kuberay-operator", "kuberay.namespace", "default/kuberay"):
        assert needed in result.message
    assert judge_kuberay_identity(KUBERAY, exists=True).ok
    unknown = judge_kuberay_identity(KUBERAY, exists=None, error="403 Forbidden")
    assert not unknown.ok and "403 Forbidden" in unknown.message
    assert judge_kuberay_identity("", exists=None).ok  # not configured: nothing to check


@pytest.mark.parametrize(
    ("answer", "missing"),
    [(True, 0.0), (False, 1.0), (PermissionError("403 Forbidden"), 1.0)],
    ids=["found", "absent", "unreadable"],
)
def test_the_startup_check_logs_an_error_and_sets_the_gauge_when_kuberay_is_not_there(
    caplog: pytest.LogCaptureFixture, answer: bool | Exception, missing: float
) -> None:
    registry = CollectorRegistry()
    asked: list[tuple[str, str]] = []

    def read(namespace: str, name: str) -> bool:
        asked.append((namespace, name))
        if isinstance(answer, Exception):
            raise answer
        return answer

    settings = Settings(kuberay_service_account=KUBERAY)
    with caplog.at_level(logging.INFO, logger="sweep_operator.install_checks"):
        for _ in range(2):  # kopf may run a startup handler again; the gauge is registered once
            check_kuberay_identity(settings, read, registry)
    assert asked == [("kuberay-system", "kuberay-operator")] * 2
    assert registry.get_sample_value(KUBERAY_IDENTITY_METRIC) == missing
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert bool(errors) is bool(missing)


def test_without_settings_nothing_is_looked_up_or_started() -> None:
    def never(namespace: str, name: str) -> bool:
        raise AssertionError("no lookup without SWEEP_KUBERAY_SERVICE_ACCOUNT")

    assert check_kuberay_identity(Settings(), never, CollectorRegistry()).ok
    assert start_webhook_certificate(Settings(webhook_port=9443), api_client=None) is None


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SWEEP_KUBERAY_SERVICE_ACCOUNT": "kuberay-operator"}, "SWEEP_KUBERAY_SERVICE_ACCOUNT"),
        ({"SWEEP_KUBERAY_SERVICE_ACCOUNT": "*/kuberay-operator"}, "SWEEP_KUBERAY_SERVICE_ACCOUNT"),
        ({"SWEEP_WEBHOOK_CERT_SECRET": "tls"}, "SWEEP_WEBHOOK_CERT_SECRET"),
        ({"SWEEP_WEBHOOK_CERT_RENEW_BEFORE_DAYS": "400"}, "SWEEP_WEBHOOK_CERT_RENEW_BEFORE_DAYS"),
        ({"SWEEP_WEBHOOK_CERT_SYNC_SECONDS": "0"}, "SWEEP_WEBHOOK_CERT_SYNC_SECONDS"),
        ({"SWEEP_WEBHOOK_CONFIGURATIONS": "Deployment/x"}, "SWEEP_WEBHOOK_CONFIGURATIONS"),
    ],
)
def test_bad_install_settings_are_refused_naming_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        Settings.from_env(env)
