"""`sweepctl report NAME` against the operator and the KubeRay stand-in: a RayJob retried once shows two attempts
on the timeline (one per RayCluster KubeRay created), with the phases from the sweep's status."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator.cli import main as sweepctl
from sweep_sandbox.kuberay import Outcome
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server)
    try:
        yield environment
    finally:
        stop()


def test_a_retried_rayjob_shows_two_attempts_on_the_timeline(env: OperatorEnv, tmp_path: Path) -> None:
    doc = env.new_sweep("retried", spec__failurePolicy__jobRetries=1)
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.fail(2.0), Outcome.hang())
    env.apply(doc)
    bucket, prefix = env.run_root(name)
    write_sweep(
        env.s3_client, bucket, prefix, trials=2, checkpoints=1, files=1
    )  # the guard lets the retry's cluster go
    rayjob = env.wait_status(name, lambda s: s.get("rayJobName"), "a RayJob")["rayJobName"]
    created = wait_for(
        lambda: (
            [e for e in env.events(rayjob) if e.reason == "CreatedRayCluster"][1:]
            and [e for e in env.events(rayjob) if e.reason == "CreatedRayCluster"]
        ),
        TIMEOUT,
        what="a second attempt",
    )
    env.wait_phase(name, "Running")
    kubeconfig = env.server.write_kubeconfig(tmp_path / "kubeconfig")
    assert sweepctl(["report", name, "--kubeconfig", str(kubeconfig), "--out", str(tmp_path / "r")]) == 0
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    attempts = [s for s in data["timeline"]["spans"] if s["kind"] == "attempt"]
    assert [a["label"] for a in attempts] == ["attempt 1", "attempt 2"]
    starts = sorted((e.last_timestamp or e.event_time or e.first_timestamp).timestamp() for e in created)
    assert [a["start"] for a in attempts] == pytest.approx(starts, abs=1.0)
    assert attempts[0]["end"] == attempts[1]["start"] and attempts[1]["end"] is None  # the second still runs
    assert {s["label"] for s in data["timeline"]["spans"] if s["kind"] == "phase"} >= {"Starting", "Running"}
    assert sorted(c["trial"] for c in data["checkpoints"]) == ["trial_0000", "trial_0001"]
    env.annotate_sweep(name, {constants.ANNOTATION_SKIP_VERIFICATION: "true"})
    env.delete_sweep(name)
    wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="cleanup")
