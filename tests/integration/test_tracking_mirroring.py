"""The operator mirrors what the driver says about its MLflow server (the `tracking` block of `_sweep/status.json`):
status.tracking with a link built from the admitted spec's tracking URI, the TrackingAvailable condition, a Warning
Event when the server stops answering and a Normal one when it answers again; the phase never changes for it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sweep_contracts import tracking as contract
from sweep_sandbox.kuberay import Outcome
from tests.support.operator_env import OperatorEnv, start_operator_env

pytestmark = pytest.mark.integration
TRACKING_URI = "https://mlflow.example.com"


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server)
    try:
        yield environment
    finally:
        stop()


def write_progress(env: OperatorEnv, bucket: str, prefix: str, tracking: dict[str, Any]) -> None:
    doc = {
        "phase": "Running",
        "trials": {"total": 1, "running": 1},
        "tracking": {"backend": "mlflow", **tracking},
        "updatedAt": "2026-12-07T10:00:00Z",
    }
    env.s3_client.put_object(Bucket=bucket, Key=f"{prefix}/_sweep/status.json", Body=json.dumps(doc).encode())


def test_a_down_tracking_server_warns_once_and_its_return_is_said_with_the_phase_untouched(env: OperatorEnv) -> None:
    doc = env.new_sweep("tracked", spec__tracking={"mlflow": {"trackingUri": TRACKING_URI}})
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(stop_seconds=0.5))
    env.apply(doc)
    env.wait_phase(name, "Running")
    bucket, prefix = env.run_root(name)

    down = {"experimentId": "3", "runId": "0a1b2c", "available": False, "pending": 12, "dropped": 0}
    write_progress(env, bucket, prefix, {**down, "error": "ConnectionError: refused"})
    status = env.wait_status(name, lambda s: (s.get("tracking") or {}).get("available") is False, "tracking down")
    assert status["tracking"]["url"] == f"{TRACKING_URI}/#/experiments/3/runs/0a1b2c"
    assert status["tracking"]["lastError"] == "ConnectionError: refused" and status["phase"] == "Running"
    condition = env.condition(name, contract.CONDITION)
    assert condition is not None and condition["status"] == "False"
    assert condition["reason"] == contract.REASON_UNAVAILABLE and TRACKING_URI in condition["message"]
    env.wait_status(name, lambda _: contract.REASON_UNAVAILABLE in env.event_reasons(name), "the Warning Event")

    write_progress(env, bucket, prefix, {**down, "pending": 30})  # still down, more buffered: no second Event
    env.wait_status(name, lambda s: s["tracking"]["pending"] == 30, "the new pending count")
    write_progress(env, bucket, prefix, {**down, "available": True, "pending": 0})
    env.wait_status(name, lambda s: s["tracking"]["available"] is True, "tracking back")
    env.wait_status(name, lambda _: contract.REASON_CAUGHT_UP in env.event_reasons(name), "the Normal Event")
    assert env.event_reasons(name).count(contract.REASON_UNAVAILABLE) == 1
    condition = env.condition(name, contract.CONDITION)
    assert condition is not None and condition["status"] == "True" and condition["reason"] == contract.REASON_AVAILABLE
    assert env.status(name)["phase"] == "Running"
    assert [p for p in env.pruned() if "tracking" in p[1]] == []  # every field written is in the CRD's schema
