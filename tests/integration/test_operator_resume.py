"""Resume of an ended sweep through the whole operator (issue 16): API emulator, KubeRay stand-in, moto S3 and the
operator on 127.0.0.1. A sweep stopped at its deadline continues as attempt 2 on the same run root after the run
root verifies, and the guard releases both attempts at the end; an unverified run root is refused with the missing
objects named; failurePolicy.resumeOnClusterLoss continues a sweep whose cluster KubeRay reports lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from sweep_contracts import constants
from sweep_contracts.runtime_env import run_spec_of
from sweep_sandbox.kuberay import Outcome
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

DEADLINES = {"activeSeconds": 3600, "startupSeconds": 60, "gracefulStopSeconds": 5}


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server)
    try:
        yield environment
    finally:
        stop()


@pytest.fixture(scope="module")
def kubeconfig(env: OperatorEnv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return env.server.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")


def sweepctl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sweep_operator.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        timeout=180,
    )


def put_json(env: OperatorEnv, bucket: str, key: str, doc: dict[str, Any]) -> None:
    env.s3_client.put_object(Bucket=bucket, Key=key, Body=json.dumps(doc).encode())


def get_json(env: OperatorEnv, bucket: str, key: str) -> dict[str, Any]:
    return json.loads(env.s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())


def timeline(env: OperatorEnv, name: str) -> list[tuple[Any, ...]]:
    """(phase, verifiedAt, attempts' outcomes, RayJob) of every stored version: what a failure message shows."""
    rows = []
    for version in env.server.history(constants.GROUP, constants.VERSION, constants.PLURAL, "default", name):
        status = version.get("status") or {}
        row = (
            status.get("phase"),
            (status.get("checkpoints") or {}).get("verifiedAt"),
            status.get("finishedAt"),
            tuple(a.get("outcome") for a in status.get("attempts") or []),
            status.get("rayJobName"),
            {k: v for k, v in (status.get("kueue") or {}).items() if k in ("state", "admissions", "lastAdmissionAt")},
        )
        if not rows or rows[-1] != row:
            rows.append(row)
    return rows


def stopped_at_deadline(env: OperatorEnv, prefix: str, **changes: Any) -> tuple[str, str, str, Any]:
    """A sweep whose driver stopped its trials at the deadline (result.json deadlineReached, exit 0): it ends
    DeadlineExceeded with its checkpoints verified. Returns (name, bucket, prefix, the synthetic run)."""
    doc = env.new_sweep(prefix, spec__deadlines=DEADLINES, **changes)
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.succeed(4.0, startup=0.3))
    env.apply(doc)
    bucket, root = env.run_root(name)
    synthetic = write_sweep(env.s3_client, bucket, root, trials=2, checkpoints=1, files=1)
    put_json(
        env,
        bucket,
        f"{root}/_sweep/result.json",
        {**get_json(env, bucket, f"{root}/_sweep/result.json"), "deadlineReached": True},
    )
    env.wait_status(
        name,
        lambda s: s.get("phase") == "DeadlineExceeded" and (s.get("checkpoints") or {}).get("verifiedAt"),
        "DeadlineExceeded, verified",
    )
    return name, bucket, root, synthetic


def test_a_resume_continues_on_the_same_run_root_as_attempt_two_and_the_guard_releases_both(
    env: OperatorEnv, kubeconfig: Path
) -> None:
    name, bucket, root, _ = stopped_at_deadline(env, "resume")
    first = env.status(name)
    # Attempt 2 finishes the trials (no deadlineReached); it runs long enough to be seen.
    result = get_json(env, bucket, f"{root}/_sweep/result.json")
    put_json(env, bucket, f"{root}/_sweep/result.json", {k: v for k, v in result.items() if k != "deadlineReached"})
    env.runner.script(f"{first['rayJobName']}-a2", Outcome.succeed(4.0, startup=0.3))

    done = sweepctl(kubeconfig, "resume", name, "--active-seconds", "600", "--num-samples", "3", "--wait", "120")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("Started: resuming (spec.resume.generation 1): attempt 2")

    status = env.wait_status(
        name,
        lambda s: (
            s.get("phase") == "Succeeded"
            and (s.get("checkpoints") or {}).get("verifiedAt")
            and len(s.get("attempts") or []) == 2
            and (s["attempts"][1].get("endedAt"))
        ),
        "attempt 2 Succeeded, verified",
    )
    one, two = status["attempts"]
    assert (one["attempt"], one["rayJobName"], one["outcome"]) == (1, first["rayJobName"], "DeadlineExceeded")
    assert (two["attempt"], two["rayJobName"], two["trigger"], two["outcome"]) == (
        2,
        f"{first['rayJobName']}-a2",
        "Resume",
        "Succeeded",
    )
    assert two["activeSeconds"] == 600 and two["numSamples"] == 3
    assert two["checkpointsAtStart"] == 2 and two["checkpointsVerified"] == 2
    assert status["totalRanSeconds"] == one["ranSeconds"] + two["ranSeconds"] > 0
    assert status["runId"] == first["runId"] and status["guard"] == first["guard"]  # the same run root
    assert status["resumedGeneration"] == 1 and status["lastResume"]["outcome"] == "Started"

    rayjobs = {r["metadata"]["name"]: r for r in env.rayjobs(name)}
    assert set(rayjobs) == {first["rayJobName"], f"{first['rayJobName']}-a2"}
    again = rayjobs[f"{first['rayJobName']}-a2"]
    run_spec = run_spec_of(again)
    assert run_spec.attempt == 2 and run_spec.run_root == f"s3://{bucket}/{root}"
    assert run_spec.spec.deadlines.active_seconds == 600 and run_spec.spec.tune.num_samples == 3
    for key in (constants.ANNOTATION_GUARD,):  # guarded as the first attempt
        assert again["metadata"]["annotations"][key] == rayjobs[first["rayJobName"]]["metadata"]["annotations"][key]
    assert constants.FINALIZER in again["metadata"]["finalizers"]
    wait_for(lambda: "Resumed" in env.event_reasons(name), TIMEOUT, what="a Resumed Event")

    env.delete_sweep(name)  # the guard verifies and releases everything of both attempts
    wait_for(
        lambda: env.sweep(name) is None and not env.rayjobs(name) and not env.rayclusters(name),
        TIMEOUT,
        what="the sweep and both attempts' RayJobs and RayClusters released",
    )
    assert not env.pruned(), f"writes whose fields a real API server would drop: {env.pruned()[:10]}"


@pytest.mark.parametrize("column", ["complete", "file-missing"])
def test_the_guard_holds_a_resumed_second_attempt_on_the_shared_run_root(env: OperatorEnv, column: str) -> None:
    """The guard matrix's resumed-attempt row (issue 25): attempt 2 runs on attempt 1's run root, resumed by a spec
    edit that also turns spec.deletion.verifyCheckpoints off (defect 2: what the chart's policy refuses a tenant,
    here without the policy). Attempt 2's RayJob is deleted with one of attempt 1's files missing: held, the
    verification of the shared root saw it; complete: released by a passing verification, never by the flag."""
    name, bucket, root, synthetic = stopped_at_deadline(env, f"rsm-{column[:4]}")
    first = env.status(name)
    result = get_json(env, bucket, f"{root}/_sweep/result.json")
    put_json(env, bucket, f"{root}/_sweep/result.json", {k: v for k, v in result.items() if k != "deadlineReached"})
    second = f"{first['rayJobName']}-a2"
    env.runner.script(second, Outcome.hang())
    env.custom.patch_namespaced_custom_object(
        constants.GROUP,
        constants.VERSION,
        "default",
        constants.PLURAL,
        name,
        {"spec": {"resume": {"generation": 1, "activeSeconds": 900}, "deletion": {"verifyCheckpoints": False}}},
    )
    env.wait_status(name, lambda s: s.get("phase") == "Running" and s.get("rayJobName") == second, "attempt 2 runs")
    guarded = json.loads(
        env.get(constants.RAYJOB_PLURAL, second)["metadata"]["annotations"][constants.ANNOTATION_GUARD]
    )
    assert guarded["verify"] is True and guarded["runRoot"] == f"s3://{bucket}/{root}", guarded
    missing = synthetic.delete_file() if column == "file-missing" else ""
    env.delete_ray(constants.RAYJOB_PLURAL, second)
    if column == "complete":
        wait_for(lambda: env.get(constants.RAYJOB_PLURAL, second) is None, TIMEOUT, what="attempt 2 released")
        released = wait_for(  # kopf posts the Event on its own queue: the RayJob can be seen gone first
            lambda: [e.message for e in env.events(second) if e.reason == "CheckpointGuardReleased"] or None,
            TIMEOUT,
            what="the CheckpointGuardReleased Event",
        )
        assert released and "verified complete" in released[0], env.event_reasons(second)
        return
    wait_for(
        lambda: sum(r == "CheckpointsNotVerified" for r in env.event_reasons(second)) >= 2,
        TIMEOUT,
        what="attempt 2's RayJob held through two verifications",
    )
    assert env.get(constants.RAYJOB_PLURAL, second) is not None
    held = [e.message for e in env.events(second) if e.reason == "CheckpointsNotVerified"]
    assert any(missing.split("/")[-1] in m for m in held), held
    assert "CheckpointGuardBypassed" not in env.event_reasons(second), "released on the spec's verify flag"
    write_sweep(env.s3_client, bucket, root, trials=2, checkpoints=1, files=1)
    wait_for(lambda: env.get(constants.RAYJOB_PLURAL, second) is None, TIMEOUT, what="released once repaired")


def test_a_resume_of_an_unverified_run_root_is_refused_naming_the_missing_objects(
    env: OperatorEnv, kubeconfig: Path
) -> None:
    name, _, _, synthetic = stopped_at_deadline(env, "refuse")
    missing = synthetic.delete_file()  # a checkpoint object vanished after the run ended
    done = sweepctl(kubeconfig, "resume", name, "--active-seconds", "600", "--wait", "120")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Refused: resume refused: the run root" in done.stdout and "is not verified" in done.stdout
    assert missing.split("/", 3)[-1] in done.stdout  # the object, named
    status = env.status(name)
    assert status["phase"] == "DeadlineExceeded" and status["resumedGeneration"] == 1
    assert any(missing.split("/", 3)[-1] in item for item in status["lastResume"]["missing"])
    assert [r["metadata"]["name"] for r in env.rayjobs(name)] == [status["rayJobName"]]  # nothing started
    wait_for(lambda: "ResumeRefused" in env.event_reasons(name), TIMEOUT, what="a ResumeRefused Event")
    env.annotate_sweep(name, {constants.ANNOTATION_SKIP_VERIFICATION: "true"})  # let the broken run go
    env.delete_sweep(name)
    wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="the sweep deleted")


def test_a_lost_cluster_is_resumed_automatically_when_the_policy_allows(env: OperatorEnv) -> None:
    """KubeRay v1.7.0 (rayjob_controller.go, checkSubmitterAndUpdateStatusIfNeeded, K8sJobMode): the submitter
    (`ray job submit`, following the logs) loses the head and its Job fails; the RayJob goes Failed with reason
    SubmissionFailed while jobStatus is still RUNNING, and jobRetries 0 retries nothing."""
    doc = env.new_sweep("lost", spec__deadlines=DEADLINES, spec__failurePolicy__resumeOnClusterLoss=1)
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(startup=0.3))
    env.apply(doc)
    bucket, root = env.run_root(name)
    write_sweep(env.s3_client, bucket, root, trials=2, checkpoints=1, files=1)
    env.report_trials_running(bucket, root)  # the driver had not ended: it wrote Running last
    first = env.wait_phase(name, "Running")
    env.runner.script(f"{first['rayJobName']}-a2", Outcome.succeed(3.0, startup=0.3))

    batch = kubernetes.client.BatchV1Api(env.server.api_client())
    now = "2026-12-03T15:00:00Z"
    batch.patch_namespaced_job_status(
        first["rayJobName"],
        "default",
        {
            "status": {
                "failed": 3,
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                        "lastTransitionTime": now,
                    }
                ],
            }
        },
    )
    # KubeRay watches the Jobs it owns (SetupWithManager: Owns(&batchv1.Job{})); the stand-in watches RayJobs only,
    # so an annotation stands in for that Job event.
    env.custom.patch_namespaced_custom_object(
        constants.RAY_GROUP,
        constants.RAY_VERSION_API,
        "default",
        constants.RAYJOB_PLURAL,
        first["rayJobName"],
        {"metadata": {"annotations": {"test/job-event": "1"}}},
    )

    status = env.wait_status(name, lambda s: len(s.get("attempts") or []) == 2, "attempt 2 started")
    one, two = status["attempts"]
    assert (one["outcome"], one["reason"]) == ("Failed", "SubmissionFailed")
    assert (two["trigger"], two["rayJobName"]) == ("ClusterLoss", f"{first['rayJobName']}-a2")
    assert 0 < two["activeSeconds"] <= DEADLINES["activeSeconds"]  # what was left of attempt 1's budget
    wait_for(lambda: {"AutoResume", "Resumed"} <= set(env.event_reasons(name)), TIMEOUT, what="AutoResume Event")
    auto = next(e for e in env.events(name) if e.reason == "AutoResume")
    assert "SubmissionFailed" in auto.message and "automatic resume 1/1" in auto.message
    put_json(env, bucket, f"{root}/_sweep/status.json", get_json(env, bucket, f"{root}/_sweep/result.json"))
    env.wait_status(
        name,
        lambda s: s.get("phase") == "Succeeded" and (s.get("checkpoints") or {}).get("verifiedAt"),
        "attempt 2 Succeeded",
    )
    env.delete_sweep(name)
    wait_for(lambda: env.sweep(name) is None and not env.rayjobs(name), TIMEOUT, what="everything released")


@pytest.fixture(scope="module")
def kueue_env(s3_server: Any) -> Iterator[OperatorEnv]:
    from sweep_sandbox.kueue import cluster_queue, local_queue, resource_flavor

    environment, stop = start_operator_env(s3_server, kueue_default_queue="team")
    environment.kueue.apply_queues(resource_flavor(), local_queue("default", "team", "kueue-cq"))
    environment.kueue.apply(cluster_queue("kueue-cq", {"cpu": 64, "memory": "256Gi", constants.GPU_RESOURCE: 8}))
    try:
        yield environment
    finally:
        stop()


def test_in_kueue_mode_the_resumed_attempt_is_queued_by_kueue_and_gets_its_own_deadline(kueue_env: OperatorEnv) -> None:
    """A resume made with a spec edit (what `kubectl apply` of the edited manifest sends): the attempt's RayJob is
    created suspended in the LocalQueue, the sweep is Queued until Kueue admits it, its deadline counts from there."""
    env = kueue_env
    name, bucket, root, _ = stopped_at_deadline(env, "kq-resume")
    first = env.status(name)
    result = get_json(env, bucket, f"{root}/_sweep/result.json")
    put_json(env, bucket, f"{root}/_sweep/result.json", {k: v for k, v in result.items() if k != "deadlineReached"})
    # The attempt runs long enough for a pass to see its Workload admitted on a loaded machine. An admission that ends
    # before any pass saw it is counted by the pass that finds the Workload Finished (tests/unit/test_kueue_decisions
    # .py); but once the sweep is terminal no pass reads Kueue again, so a 3 s attempt could still end uncounted.
    env.runner.script(f"{first['rayJobName']}-a2", Outcome.succeed(8.0, startup=0.3))
    env.custom.patch_namespaced_custom_object(
        constants.GROUP,
        constants.VERSION,
        "default",
        constants.PLURAL,
        name,
        {"spec": {"resume": {"generation": 1, "activeSeconds": 900}}},
    )
    try:
        status = env.wait_status(
            name,
            lambda s: (
                s.get("phase") == "Succeeded" and len(s.get("attempts") or []) == 2 and s["attempts"][1].get("endedAt")
            ),
            "attempt 2 admitted by Kueue, ended and verified",
        )
    except TimeoutError:
        raise AssertionError("\n".join(map(str, timeline(env, name)))) from None
    again = next(r for r in env.rayjobs(name) if r["metadata"]["name"] == f"{first['rayJobName']}-a2")
    assert again["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team"
    assert status["kueue"]["admissions"] == 1 and status["attempts"][1].get("outcome") == "Succeeded", "\n".join(
        map(str, timeline(env, name))
    )
    assert status["attempts"][1]["activeSeconds"] == 900 and run_spec_of(again).attempt == 2
    phases = [
        (s.get("status") or {}).get("phase")
        for s in env.server.history(constants.GROUP, constants.VERSION, constants.PLURAL, "default", name)
    ]
    assert "Queued" in phases[phases.index("DeadlineExceeded") :]  # Kueue admitted attempt 2, not the operator
    env.delete_sweep(name)
    wait_for(lambda: env.sweep(name) is None and not env.rayjobs(name), TIMEOUT, what="everything released")
