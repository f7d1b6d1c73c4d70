"""The operator's /metrics over HTTP after a scenario (admit, queue, guard hold, release, deadline stop): the
numbers, the `namespace`/`sweep` labels and the histogram buckets; and after a restart the steady sweeps are
counted at once (issue 12, defect 10: gauges set only on transitions read 0 after a restart)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sweep_contracts import constants
from sweep_contracts.timestamps import epoch_seconds as unix  # the one RFC 3339 reader
from sweep_operator.settings import OperatorLimits
from sweep_sandbox.kuberay import Outcome
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
NS = "metrics-ns"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    # Each GPU sweep here needs 2 GPUs (2 workers x 1 GPU, one trial at a time): one fits the namespace, two do not.
    environment, stop = start_operator_env(s3_server, limits=OperatorLimits(max_gpus_per_namespace=2))
    try:
        yield environment
    finally:
        stop()


class Scrape:
    """GET /metrics from the operator's own HTTP server, parsed as Prometheus parses it."""

    def __init__(self, env: OperatorEnv) -> None:
        self.server = env.operator.controller.metrics.serve(0, addr="127.0.0.1")
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"

    def __call__(self) -> Samples:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            text = response.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def close(self) -> None:
        self.server.shutdown()


def value(samples: Samples, metric: str, **labels: str) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


def series(samples: Samples, metric: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of `metric` whose labels include `labels`."""
    return {k[1]: v for k, v in samples.items() if k[0] == metric and labels.items() <= dict(k[1]).items()}


def await_metrics(scrape: Scrape, predicate: Any, what: str) -> Samples:
    found: dict[str, Samples] = {}

    def check() -> bool:
        found["samples"] = scrape()
        return bool(predicate(found["samples"]))

    wait_for(check, TIMEOUT, what=what)
    return found["samples"]


def assert_histogram(samples: Samples, name: str, **labels: str) -> None:
    """Cumulative buckets ending at +Inf == _count, with the operator's bucket bounds."""
    buckets = sorted(((float(dict(k)["le"]), v) for k, v in series(samples, f"{name}_bucket", **labels).items()))
    assert buckets and buckets[-1][0] == float("inf")
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), buckets
    assert counts[-1] == value(samples, f"{name}_count", **labels) > 0
    assert value(samples, f"{name}_sum", **labels) >= 0


def test_metrics_follow_admit_queue_hold_release_and_deadline(env: OperatorEnv) -> None:
    scrape = Scrape(env)
    try:
        # Deadline: activeSeconds 30 (the API's minimum), 2 s graceful window; it runs meanwhile (CPU only: no budget).
        late = env.new_sweep(
            "late", namespace=NS, spec__deadlines={"activeSeconds": 30, "startupSeconds": 20, "gracefulStopSeconds": 2}
        )
        env.runner.script(late["metadata"]["name"], Outcome.hang())
        env.apply(late)
        bucket, prefix = env.run_root(late["metadata"]["name"], NS)
        write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
        env.report_trials_running(bucket, prefix)  # a trial runs: the startup clock (20 s) stops before the deadline

        first = env.new_sweep("first", namespace=NS, gpu=True, spec__tune__maxConcurrentTrials=1)
        second = env.new_sweep("second", namespace=NS, gpu=True, spec__tune__maxConcurrentTrials=1)
        a, b = first["metadata"]["name"], second["metadata"]["name"]
        env.runner.script(a, Outcome.hang())
        env.runner.script(b, Outcome.hang())
        env.apply(first)
        env.wait_phase(a, "Running", namespace=NS)
        env.apply(second)
        queued = env.wait_phase(b, "Queued", namespace=NS)

        samples = await_metrics(
            scrape,
            lambda s: (
                value(s, "trainingsweep_queued_sweeps", namespace=NS) == 1
                and value(s, "trainingsweep_sweep_phase", namespace=NS, sweep=a, phase="Running") == 1
            ),
            "admit + queue",
        )
        assert value(samples, "trainingsweep_sweeps", namespace=NS, phase="Queued") == 1
        assert value(samples, "trainingsweep_sweep_phase", namespace=NS, sweep=b, phase="Queued") == 1
        assert value(samples, "trainingsweep_sweep_queued_timestamp_seconds", namespace=NS, sweep=b) == unix(
            queued["queuedAt"]
        )
        assert value(samples, "trainingsweep_admitted_gpus", namespace=NS) == 2
        assert value(samples, "trainingsweep_namespace_gpu_budget", namespace=NS) == 2
        assert value(samples, "trainingsweep_guard_holding_objects", namespace=NS, kind="TrainingSweep") == 0

        # Hold: a's run is missing a file when it is deleted.
        bucket, prefix = env.run_root(a, NS)
        synthetic = write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=2)
        key = synthetic.file_key()
        body = env.s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
        env.s3_client.delete_object(Bucket=bucket, Key=key)
        env.delete_sweep(a, NS)
        env.wait_status(
            a,
            lambda s: any(
                c["type"] == "CheckpointsVerified" and c["status"] == "False" for c in s.get("conditions") or []
            ),
            "held",
            NS,
        )
        deleting = (env.sweep(a, NS) or {})["metadata"]["deletionTimestamp"]
        # The gauge counts a deleting sweep from the operator's cache; the counter moves when the guard's pass
        # decides to hold, which may come a moment after the status condition it writes: wait for both.
        samples = await_metrics(
            scrape,
            lambda s: (
                value(s, "trainingsweep_guard_holding_objects", namespace=NS, kind="TrainingSweep") == 1
                and (value(s, "trainingsweep_guard_holds_total", namespace=NS, sweep=a, kind="TrainingSweep") or 0) >= 1
            ),
            "hold",
        )
        assert value(
            samples,
            "trainingsweep_guard_holding_since_timestamp_seconds",
            namespace=NS,
            sweep=a,
            kind="TrainingSweep",
            name=a,
        ) == unix(deleting)
        assert value(samples, "trainingsweep_verification_failures_total", namespace=NS, sweep=a) >= 1
        assert value(samples, "trainingsweep_verifications_total", namespace=NS, sweep=a, result="not_verified") >= 1
        assert value(samples, "trainingsweep_queued_sweeps", namespace=NS) == 1  # b still waits behind the held a
        assert_histogram(samples, "trainingsweep_verification_duration_seconds", namespace=NS)

        # Release: the file is back, the guard verifies, a goes and b is admitted into its GPUs.
        env.s3_client.put_object(Bucket=bucket, Key=key, Body=body)
        wait_for(lambda: env.sweep(a, NS) is None, TIMEOUT, what="released once verified")
        env.wait_phase(b, "Starting", "Running", namespace=NS)
        samples = await_metrics(
            scrape,
            lambda s: (
                value(s, "trainingsweep_queued_sweeps", namespace=NS) == 0
                and value(s, "trainingsweep_guard_holding_objects", namespace=NS, kind="TrainingSweep") == 0
                # the sweep's RayJob and RayCluster are released by guard passes of their own, which may come later
                and not series(s, "trainingsweep_guard_holding_since_timestamp_seconds", namespace=NS, sweep=a)
            ),
            "release",
        )
        assert value(samples, "trainingsweep_verifications_total", namespace=NS, sweep=a, result="verified") >= 1
        assert not series(samples, "trainingsweep_sweep_phase", namespace=NS, sweep=a)
        assert not series(samples, "trainingsweep_guard_holding_since_timestamp_seconds", namespace=NS, sweep=a)
        assert value(samples, "trainingsweep_admitted_gpus", namespace=NS) == 2

        # Deadline: the operator stops the late sweep's RayJob once its deadline and graceful window passed.
        late_name = late["metadata"]["name"]
        env.wait_phase(late_name, "DeadlineExceeded", namespace=NS, timeout=TIMEOUT + 40)
        samples = await_metrics(
            scrape,
            lambda s: value(s, "trainingsweep_deadline_stops_total", namespace=NS, sweep=late_name) == 1,
            "deadline stop",
        )
        assert value(samples, "trainingsweep_sweep_phase", namespace=NS, sweep=late_name, phase="DeadlineExceeded") == 1
        assert sum(series(samples, "trainingsweep_deadline_stops_total", namespace=NS).values()) == 1
        assert_histogram(samples, "trainingsweep_reconcile_duration_seconds")
        assert {dict(k)["le"] for k in series(samples, "trainingsweep_reconcile_duration_seconds_bucket")} >= {
            "0.005",
            "1.0",
            "60.0",
            "+Inf",
        }
    finally:
        scrape.close()


def test_after_a_restart_steady_sweeps_are_counted_at_once(env: OperatorEnv) -> None:
    """No transition happens after the restart: the new operator must count what it knows, not what it saw change."""
    ns = "restart-metrics"
    docs = [env.new_sweep(f"steady{i}", namespace=ns) for i in range(2)]
    for doc in docs:
        env.runner.script(doc["metadata"]["name"], Outcome.hang())
        env.apply(doc)
    for doc in docs:
        env.wait_phase(doc["metadata"]["name"], "Running", namespace=ns)
    env.operator.stop()
    env.operator = type(env.operator)(env.settings, env.server.url, s3_client_for=env.s3_switch)
    env.operator.start()
    scrape = Scrape(env)
    try:
        samples = await_metrics(
            scrape,
            lambda s: value(s, "trainingsweep_sweeps", namespace=ns, phase="Running") == 2,
            "steady sweeps after restart",
        )
        for doc in docs:
            assert (
                value(
                    samples, "trainingsweep_sweep_phase", namespace=ns, sweep=doc["metadata"]["name"], phase="Running"
                )
                == 1
            )
        # Nothing changed phase in the new operator: the counts came from its sweep cache.
        assert all(env.status(d["metadata"]["name"], ns)["phase"] == "Running" for d in docs)
    finally:
        scrape.close()
        for doc in docs:
            env.annotate_sweep(doc["metadata"]["name"], {constants.ANNOTATION_SKIP_VERIFICATION: "true"}, ns)
            env.delete_sweep(doc["metadata"]["name"], ns)
