"""One graceful stop, operator to driver (issue 26 section 0; issue 28 item 5), through the operator on loopback:
a delete of a running sweep first asks the RayJob's head to stop its job (Ray's Jobs API, served by the KubeRay
stand-in's `JobsApiServer` as ray 2.58's job_head.py `stop_job` answers), holds the RayJob until the job stopped,
verifies what the driver committed during its graceful window, and only then deletes the RayJob. The scripted run
stops `stop_seconds` after it is asked, as a driver on SIGTERM does (`JobSupervisor.run` keeps the job RUNNING
until the driver exits)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator import ray_jobs
from sweep_sandbox.kuberay import Outcome, ScriptedRun
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
STOP_SECONDS = 2.0


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server)
    try:
        yield environment
    finally:
        stop()


def scripted_run(env: OperatorEnv, rayjob: str) -> ScriptedRun:
    return wait_for(
        lambda: next(r for r in reversed(env.runner.runs) if r.rayjob_key[1] == rayjob), TIMEOUT, what="the run"
    )


def test_the_jobs_api_stop_of_the_standin_answers_as_rays_and_the_job_stays_running_until_the_driver_exits(
    env: OperatorEnv,
) -> None:
    """`ray_jobs.stop_job` against the stand-in's Jobs API: `stopped: true` for a running job (which stays RUNNING
    through the driver's window, then STOPPED), then, as KubeRay's StopJob accepts, `stopped: false` for a job
    already terminal; 404 for an unknown job."""
    doc = env.new_sweep("jobsapi")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(stop_seconds=STOP_SECONDS))
    env.apply(doc)
    rayjob_name = env.wait_phase(name, "Running")["rayJobName"]
    rayjob = env.get(constants.RAYJOB_PLURAL, rayjob_name)
    assert rayjob is not None
    url, job_id = ray_jobs.job_of(rayjob) or ("", "")
    assert url == f"{rayjob['status']['rayClusterName']}-head-svc.default.svc.cluster.local:8265"  # FetchHeadServiceURL
    assert env.standin.jobs_api is not None
    url = env.standin.jobs_api.route(url) or ""  # the loopback server the head Service's name reaches here
    assert url.startswith("127.0.0.1:")
    assert ray_jobs.stop_job(url, job_id) == ray_jobs.StopOutcome(asked=True)
    assert scripted_run(env, rayjob_name).stop_requests
    time.sleep(0.5)
    rayjob = env.get(constants.RAYJOB_PLURAL, rayjob_name) or {}
    assert rayjob["status"]["jobStatus"] == "RUNNING", "the job stopped before its driver's window"
    assert ray_jobs.job_status(url, job_id) == "RUNNING"  # the head's own view, as `GET /api/jobs/<id>` gives it
    wait_for(
        lambda: (env.get(constants.RAYJOB_PLURAL, rayjob_name) or {}).get("status", {}).get("jobStatus") == "STOPPED",
        TIMEOUT,
        what="STOPPED once the driver exited",
    )
    assert ray_jobs.job_status(url, job_id) == "STOPPED"
    assert ray_jobs.stop_job(url, job_id) == ray_jobs.StopOutcome(asked=True, already_ended=True)
    assert ray_jobs.job_status(url, "no-such-job") is None
    assert not ray_jobs.stop_job(url, "no-such-job").asked
    assert not ray_jobs.stop_job("127.0.0.1:1", job_id, timeout_s=1).asked  # nothing listens: an outcome, no raise


def test_deleting_a_running_sweep_stops_its_job_gracefully_verifies_the_last_checkpoints_then_deletes_the_rayjob(
    env: OperatorEnv,
) -> None:
    """The done-when of issue 26 section 0: `kubectl delete tsw` of a running sweep. The stop request reaches the
    head first; while the driver stops, it commits one more checkpoint (its trials' last reports); the RayJob is
    deleted only after its job is STOPPED, and the guard verified the three checkpoints, not the two it had before."""
    doc = env.new_sweep("gstop")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(stop_seconds=STOP_SECONDS))
    env.apply(doc)
    bucket, prefix = env.run_root(name)
    write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=2, files=1)
    rayjob_name = env.wait_phase(name, "Running")["rayJobName"]
    run = scripted_run(env, rayjob_name)

    def driver_commits_its_last_report_when_told() -> None:
        wait_for(lambda: run.stop_requests, TIMEOUT, what="the stop request")
        write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=3, files=1)

    seen: dict[str, Any] = {}

    def watch() -> None:
        while env.get(constants.RAYJOB_PLURAL, rayjob_name) is not None:
            job = env.get(constants.RAYJOB_PLURAL, rayjob_name)
            if job is not None and job["metadata"].get("deletionTimestamp") and "deleting" not in seen:
                found = ray_jobs.job_of(job)  # the head's own view: the RayJob's jobStatus trails it a little
                head = env.standin.jobs_api.job_status(*found) if found and env.standin.jobs_api else None
                seen["deleting"] = (time.time(), job["status"].get("jobStatus"), head)
            time.sleep(0.02)

    controller = env.operator.controller
    verify = controller.verify
    verifications: list[tuple[float, int, bool]] = []

    def recording_verify(*args: Any, **kwargs: Any) -> Any:
        result = verify(*args, **kwargs)
        verifications.append((time.time(), result.checked, result.verified))
        return result

    driver = threading.Thread(target=driver_commits_its_last_report_when_told, daemon=True)
    watcher = threading.Thread(target=watch, daemon=True)
    controller.verify = recording_verify
    try:
        driver.start()
        watcher.start()
        env.delete_sweep(name)
        wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="the sweep released")
        wait_for(lambda: env.get(constants.RAYJOB_PLURAL, rayjob_name) is None, TIMEOUT, what="the RayJob gone")
        watcher.join(TIMEOUT)
    finally:
        controller.verify = verify

    assert env.standin.jobs_api is not None
    stops = [r for r in env.standin.jobs_api.requests if r[0] == "POST"]
    assert stops and stops[0][1].endswith("/stop"), "the stop never reached the head's Jobs API"
    deleted_at, job_status, head_status = seen["deleting"]
    assert stops[0][2] < deleted_at and run.stop_requests[0] < deleted_at
    assert "STOPPED" in (job_status, head_status), "the RayJob was deleted while its job still ran"
    assert run.stop_requests[0] + STOP_SECONDS <= deleted_at, "deleted before the driver's stop could end"
    # Nothing was verified before the job was told to stop; what the guard verified before the RayJob went is the
    # list the driver committed during its window (3 checkpoints), not the older one (2).
    assert verifications and all(at > stops[0][2] for at, _, _ in verifications)
    # (A check that ran while the driver was still writing may hold; only a verified list can release.)
    released_on = [checked for at, checked, ok in verifications if ok and at < deleted_at]
    assert released_on and set(released_on) == {3}, f"the guard released on the older list: {verifications}"


# ------------------------------------------------------------------------------ the head's address


def test_a_head_service_a_tenant_turned_into_externalname_gets_no_request_and_the_delete_goes_on(
    env: OperatorEnv,
) -> None:
    """status.dashboardURL is the head Service's name (utils.FetchHeadServiceURL over the Service that
    common/service.go BuildServiceForHeadPod made). A tenant with edit rights on Services turns it into an
    ExternalName to aim the operator's POST at a host of their choosing: the operator checks the Service first, sends
    nothing, says why on the sweep (a Warning Event naming the Service and its type, nothing of the tenant's target)
    and deletes the RayJob without a graceful stop (KubeRay's StopJob stops the job)."""
    doc = env.new_sweep("headsvc")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(stop_seconds=STOP_SECONDS))
    env.apply(doc)
    bucket, prefix = env.run_root(name)
    write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    rayjob_name = env.wait_phase(name, "Running")["rayJobName"]
    rayjob = env.get(constants.RAYJOB_PLURAL, rayjob_name) or {}
    _, job_id = ray_jobs.job_of(rayjob) or ("", "")
    service = f"{rayjob['status']['rayClusterName']}-head-svc"
    made = env.core.read_namespaced_service(service, "default")
    assert made.spec.type in (None, "ClusterIP") and made.metadata.owner_references[0].kind == "RayCluster"
    target = "attacker-controlled.example.com"
    env.core.patch_namespaced_service(
        service, "default", {"spec": {"type": "ExternalName", "externalName": target, "clusterIP": None}}
    )
    env.delete_sweep(name)
    wait_for(lambda: "GracefulStopRefused" in env.event_reasons(name), TIMEOUT, what="the refusal on the sweep")
    wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="the sweep released")
    (message,) = [e.message for e in env.events(name) if e.reason == "GracefulStopRefused"]
    assert f"head Service {service} is of type ExternalName" in message and target not in message, message
    assert env.standin.jobs_api is not None
    assert not [r for r in env.standin.jobs_api.requests if job_id in r[1]], "a request went to the tenant's target"


# ------------------------------------------------------------------------------ section 4: a Kueue preemption

QUEUE = "gs-team"


@pytest.fixture(scope="module")
def kueue_env(s3_server: Any) -> Iterator[OperatorEnv]:
    from sweep_sandbox.kueue import cluster_queue, local_queue, resource_flavor

    environment, stop = start_operator_env(s3_server, kueue_default_queue=QUEUE)
    assert environment.kueue is not None
    environment.kueue.apply_queues(resource_flavor(), local_queue("default", QUEUE, "gs-cq"))
    environment.kueue.apply(cluster_queue("gs-cq", {"cpu": 64, "memory": "256Gi", constants.GPU_RESOURCE: 8}))
    try:
        yield environment
    finally:
        stop()


def test_a_kueue_preemption_checkpoints_first_then_verifies_releases_and_readmits(kueue_env: OperatorEnv) -> None:
    """Issue 26 section 4. Kueue evicts the Workload and suspends the RayJob; KubeRay deletes the RayCluster without
    stopping the job (v1.7.0 `Suspending`). The guard holding the cluster first stops the job through the head's Jobs
    API (the RayJob's jobStatus is stale while KubeRay suspends: the head's own job status says when it ended), the
    driver commits its last reports, the guard verifies those and releases the cluster; Kueue readmits the sweep as
    before (docs/kueue.md)."""
    from sweep_sandbox.kueue import workload_name

    env = kueue_env
    doc = env.new_sweep("gsq", **{"spec.deadlines": {"activeSeconds": 3600, "startupSeconds": 600}})
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(stop_seconds=STOP_SECONDS), Outcome.hang(stop_seconds=STOP_SECONDS))
    env.apply(doc)
    running = env.wait_phase(name, "Running")
    cluster, rayjob_name = running["rayClusterName"], running["rayJobName"]
    bucket, prefix = env.run_root(name)
    write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=2, files=1)
    run = scripted_run(env, rayjob_name)

    def driver_commits_its_last_report_when_told() -> None:
        wait_for(lambda: run.stop_requests, TIMEOUT, what="the stop request")
        write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=3, files=1)

    controller = env.operator.controller
    verify = controller.verify
    verifications: list[tuple[float, int, bool]] = []

    def recording_verify(*args: Any, **kwargs: Any) -> Any:
        result = verify(*args, **kwargs)
        verifications.append((time.time(), result.checked, result.verified))
        return result

    driver = threading.Thread(target=driver_commits_its_last_report_when_told, daemon=True)
    controller.verify = recording_verify
    try:
        driver.start()
        assert env.kueue is not None
        env.kueue.evict("default", workload_name(env.get(constants.RAYJOB_PLURAL, rayjob_name) or {}))
        wait_for(
            lambda: not [c for c in env.rayclusters(name) if c["metadata"]["name"] == cluster],
            TIMEOUT,
            what="the preempted cluster released",
        )
        released_at = time.time()
    finally:
        controller.verify = verify
    assert env.standin.jobs_api is not None
    stops = [r for r in env.standin.jobs_api.requests if r[0] == "POST" and r[1].endswith("/stop")]
    assert stops and run.stop_requests, "the preempted job was never asked to stop"
    assert all(at > stops[0][2] for at, _, _ in verifications), "verified before the job was told to stop"
    released_on = [checked for at, checked, ok in verifications if ok and at < released_at]
    assert released_on and set(released_on) == {3}, f"the guard released on the older list: {verifications}"
    released = wait_for(  # kopf posts the Event on its own queue: the cluster can be seen gone first
        lambda: [e for e in env.events(cluster) if e.reason == "CheckpointGuardReleased"] or None,
        TIMEOUT,
        what="the CheckpointGuardReleased Event",
    )
    assert released and "verified" in released[0].message
    env.wait_status(
        name, lambda s: (s.get("kueue") or {}).get("admissions") == 2 and s.get("phase") == "Running", "readmitted"
    )
    env.delete_sweep(name)
    wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="the sweep released by the guard")
