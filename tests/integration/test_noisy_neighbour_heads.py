"""Other namespaces' Ray heads cannot hold a namespace's stop: every request to a head ends at its deadline and runs
on the head calls' pool, never on the guard's or the stop queue's workers, which look again shortly.

Twelve noisy teams (more than the guard has workers) serve their heads' dashboards from their training code and
answer the operator's Jobs API requests one byte a second; each deletes a running sweep, then team B deletes one.
Team B's sweep is stopped gracefully (its head asked, its job stopped, then released) without waiting for any of the
noisy requests to reach its deadline (they are given a long one here, so a wait behind them shows). Each noisy
request ends at its deadline as one GracefulStopFailed outcome of its own sweep. With a socket timeout per read,
the noisy heads held every guard worker for as long as they trickled; with a deadline, each held a guard worker
until it, and more namespaces than workers, one worker each, held them all."""

from __future__ import annotations

import http.server
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from sweep_contracts import constants
from sweep_operator import ray_jobs
from sweep_operator.handlers import GUARD_WORKERS
from sweep_sandbox.kuberay import Outcome
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
TRICKLE_BYTES = 120  # two minutes of answer at one byte a second: far past any wait below
MARGIN_S = 8.0  # the guard's own work around the stop (reads, the delete, the verification) on a loaded machine
TEAM_A_DEADLINE_S = 2 * MARGIN_S  # team A's calls' deadline: a wait behind one of them exceeds the margin


class TricklingHead(http.server.BaseHTTPRequestHandler):
    """Team A's heads: a status line and headers at once, then a JSON body one byte a second."""

    connections: ClassVar[list[float]] = []

    def _answer(self) -> None:
        type(self).connections.append(time.monotonic())
        try:
            self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n")
            for _ in range(TRICKLE_BYTES):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(1.0)
        except OSError:  # the operator hung up at its deadline
            return

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server)
    try:
        yield environment
    finally:
        stop()


@pytest.fixture
def trickling_head() -> Iterator[tuple[type[TricklingHead], str]]:
    handler = type("TeamAHead", (TricklingHead,), {"connections": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield handler, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_heads_trickling_in_more_namespaces_than_guard_workers_hold_none_of_another_namespaces_stop(
    env: OperatorEnv, trickling_head: tuple[type[TricklingHead], str]
) -> None:
    head, address = trickling_head
    tag = uuid.uuid4().hex[:4]
    noisy = [f"team-a{i}-{tag}" for i in range(GUARD_WORKERS + 4)]  # each holding a worker would hold them all
    team_b = f"team-b-{tag}"
    controller = env.operator.controller
    routed_stop, routed_status = controller.stop_job, controller.job_status

    def noisy_head(url: str) -> bool:  # the noisy teams' heads' names reach their own code
        return any(f".{namespace}.svc." in url for namespace in noisy)

    def stop_job(url: str, job_id: str) -> ray_jobs.StopOutcome:
        if noisy_head(url):
            return ray_jobs.stop_job(address, job_id, timeout_s=TEAM_A_DEADLINE_S)
        return routed_stop(url, job_id)

    def job_status(url: str, job_id: str) -> str | None:
        if noisy_head(url):
            return ray_jobs.job_status(address, job_id, timeout_s=TEAM_A_DEADLINE_S)
        return routed_status(url, job_id)

    sweeps = [env.new_sweep("noisy", namespace=namespace) for namespace in noisy]
    quiet = env.new_sweep("quiet", namespace=team_b)
    for doc in (*sweeps, quiet):
        env.runner.script(doc["metadata"]["name"], Outcome.hang(stop_seconds=0.5))
        env.apply(doc)
    for doc in (*sweeps, quiet):
        name, namespace = doc["metadata"]["name"], doc["metadata"]["namespace"]
        env.wait_phase(name, "Running", namespace=namespace)
        bucket, prefix = env.run_root(name, namespace)
        write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    quiet_name = quiet["metadata"]["name"]
    quiet_job = env.get(constants.RAYJOB_PLURAL, env.status(quiet_name, team_b)["rayJobName"], team_b) or {}
    _, quiet_job_id = ray_jobs.job_of(quiet_job) or ("", "")
    jobs_api = env.standin.jobs_api
    assert jobs_api is not None
    controller.stop_job, controller.job_status = stop_job, job_status
    try:
        for doc in sweeps:
            env.delete_sweep(doc["metadata"]["name"], doc["metadata"]["namespace"])
        # As many noisy stops in flight as the guard has workers (all of them, were the requests made on those).
        wait_for(lambda: len(head.connections) >= GUARD_WORKERS, TIMEOUT, what="the noisy heads' stops in flight")
        deleted_at = time.time()  # the Jobs API server records its requests on the wall clock
        env.delete_sweep(quiet_name, team_b)
        asked = wait_for(
            lambda: next(
                (at for method, path, at in jobs_api.requests if path.endswith(f"{quiet_job_id}/stop")),
                None,
            ),
            TEAM_A_DEADLINE_S * 2 + MARGIN_S * 3,
            what="team B's head asked to stop",
        )
        waited = asked - deleted_at
        assert waited < MARGIN_S, f"team B's stop waited {waited:.1f} s behind the noisy teams' heads"
        wait_for(lambda: env.sweep(quiet_name, team_b) is None, TIMEOUT, what="team B's sweep released")
        wait_for(
            lambda: all(env.sweep(d["metadata"]["name"], d["metadata"]["namespace"]) is None for d in sweeps),
            TIMEOUT,
            what="the noisy teams' sweeps released once their stops failed",
        )
    finally:
        controller.stop_job, controller.job_status = routed_stop, routed_status
    failed = [
        e.message
        for d in sweeps
        for e in env.events(d["metadata"]["name"], d["metadata"]["namespace"])
        if e.reason == "GracefulStopFailed"
    ]
    assert len(failed) == len(sweeps), failed  # each head asked once
    assert all(f"the head did not answer within {TEAM_A_DEADLINE_S:g} s" in m for m in failed), failed
