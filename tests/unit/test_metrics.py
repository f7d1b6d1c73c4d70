"""The operator's Prometheus metrics: names by Prometheus' conventions, state gauges computed from the sweeps the
operator knows (right after a restart), thread-safe phase transitions, per-sweep labels."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sweep_contracts.timestamps import epoch_seconds as unix  # the one RFC 3339 reader
from sweep_operator.metrics import PHASES, STATE_GAUGES, OperatorMetrics, run_root_identity

T0 = 1_796_000_000.0


def samples(metrics: OperatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} parsed from the text exposition, as Prometheus would read it."""
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics: OperatorMetrics, metric: str, **labels: str) -> float | None:
    return samples(metrics).get((metric, tuple(sorted(labels.items()))))


def sweep(name: str, namespace: str, phase: str, **status: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"}
    if "deletionTimestamp" in status:
        meta["deletionTimestamp"] = status.pop("deletionTimestamp")
    return {"metadata": meta, "status": {"phase": phase, **status}}


STEADY = [
    sweep("a", "team-a", "Running", runId="r1", replicas={"workers": 4, "gpus": 4}),
    sweep("b", "team-a", "Running", runId="r2", replicas={"workers": 2, "gpus": 2}),
    sweep("c", "team-a", "Queued", queuedAt="2026-12-03T10:00:00Z"),
    sweep("d", "team-b", "Succeeded", runId="r3", replicas={"workers": 8, "gpus": 8}),
    sweep("e", "team-b", "Starting", runId="r4", replicas={"workers": 1, "gpus": 1}),
    sweep("f", "team-b", "Deleting", runId="r5", replicas={"gpus": 4}, deletionTimestamp="2026-12-03T11:00:00Z"),
]


def test_state_gauges_come_from_the_known_sweeps_without_any_transition_seen() -> None:
    """Defect 10 of issue 12: a restarted operator sees no transition of its steady sweeps; the gauges are computed
    from the sweeps it knows (the controller's cache), so they are not 0."""
    metrics = OperatorMetrics()
    metrics.follow(lambda: STEADY, gpu_budget=16)
    assert value(metrics, "trainingsweep_sweeps", namespace="team-a", phase="Running") == 2
    assert value(metrics, "trainingsweep_sweeps", namespace="team-a", phase="Queued") == 1
    assert value(metrics, "trainingsweep_sweeps", namespace="team-b", phase="Succeeded") == 1
    assert value(metrics, "trainingsweep_sweeps", namespace="team-b", phase="Running") == 0
    assert sum(value(metrics, "trainingsweep_sweeps", namespace="team-a", phase=p) for p in PHASES) == 3
    assert value(metrics, "trainingsweep_sweep_phase", namespace="team-a", sweep="c", phase="Queued") == 1
    assert value(metrics, "trainingsweep_queued_sweeps", namespace="team-a") == 1
    assert value(metrics, "trainingsweep_queued_sweeps", namespace="team-b") == 0
    assert value(metrics, "trainingsweep_sweep_queued_timestamp_seconds", namespace="team-a", sweep="c") == unix(
        "2026-12-03T10:00:00Z"
    )
    # Budget held as the ledger counts it: admitted (runId), not terminal, not being deleted.
    assert value(metrics, "trainingsweep_admitted_gpus", namespace="team-a") == 6
    assert value(metrics, "trainingsweep_admitted_gpus", namespace="team-b") == 1
    assert value(metrics, "trainingsweep_namespace_gpu_budget", namespace="team-b") == 16
    # The sweep being deleted is held by its guard since its deletionTimestamp.
    assert value(metrics, "trainingsweep_guard_holding_objects", namespace="team-b", kind="TrainingSweep") == 1
    assert value(
        metrics,
        "trainingsweep_guard_holding_since_timestamp_seconds",
        namespace="team-b",
        sweep="f",
        kind="TrainingSweep",
        name="f",
    ) == unix("2026-12-03T11:00:00Z")


def test_the_gauges_follow_the_source_at_each_scrape() -> None:
    known = list(STEADY)
    metrics = OperatorMetrics()
    metrics.follow(lambda: known)
    assert value(metrics, "trainingsweep_queued_sweeps", namespace="team-a") == 1
    known[2] = sweep("c", "team-a", "Starting", runId="r6", replicas={"gpus": 2})
    assert value(metrics, "trainingsweep_queued_sweeps", namespace="team-a") == 0
    assert value(metrics, "trainingsweep_admitted_gpus", namespace="team-a") == 8
    assert value(metrics, "trainingsweep_sweep_queued_timestamp_seconds", namespace="team-a", sweep="c") is None


def test_observe_phase_from_eight_workers_at_once_loses_nothing() -> None:
    """observe_phase runs in the controller's 8 reconcile workers (workqueue): unlocked, a tally over the dict
    while another worker inserted raised 'dictionary changed size during iteration' or miscounted."""
    metrics = OperatorMetrics()
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        try:
            start.wait()
            for i in range(400):
                uid = f"w{n}-{i}"
                metrics.observe_phase(uid, "Starting", "ns", uid)
                metrics.observe_phase(uid, "Running", "ns", uid)
                if i % 4 == 0:
                    metrics.observe_phase(uid, None)
                if i % 50 == 0:
                    metrics.exposition()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert value(metrics, "trainingsweep_sweeps", namespace="ns", phase="Running") == 8 * 300
    assert value(metrics, "trainingsweep_sweeps", namespace="ns", phase="Starting") == 0


def test_transitions_count_without_a_source() -> None:
    metrics = OperatorMetrics()
    metrics.observe_phase("u1", "Queued", "ml", "s1")
    metrics.observe_phase("u2", "Running", "ml", "s2")
    metrics.observe_phase("u1", "Starting", "ml", "s1")
    assert value(metrics, "trainingsweep_sweeps", namespace="ml", phase="Starting") == 1
    assert value(metrics, "trainingsweep_queued_sweeps", namespace="ml") == 0
    metrics.observe_phase("u2", None)
    assert value(metrics, "trainingsweep_sweeps", namespace="ml", phase="Running") == 0


def test_events_are_labelled_by_namespace_and_sweep() -> None:
    metrics = OperatorMetrics(clock=lambda: T0)
    metrics.deadline_stopped("ml", "digits")
    metrics.deadline_stopped("ml", "digits")
    metrics.verification_finished("s3://bucket/sweeps/ml/digits-a1b2c3", 0.7, verified=False)
    metrics.verification_finished("s3://bucket/sweeps/ml/digits-a1b2c3", 3.0, verified=True)
    rayjob = {
        "metadata": {
            "name": "digits-a1b2c3",
            "namespace": "ml",
            "labels": {"sweeps.dev/sweep": "digits"},
            "deletionTimestamp": "2026-12-03T11:00:00Z",
        }
    }
    metrics.guard_held("RayJob", rayjob)
    metrics.guard_held("RayJob", rayjob)
    assert value(metrics, "trainingsweep_deadline_stops_total", namespace="ml", sweep="digits") == 2
    assert value(metrics, "trainingsweep_verification_failures_total", namespace="ml", sweep="digits") == 1
    assert value(metrics, "trainingsweep_verifications_total", namespace="ml", sweep="digits", result="verified") == 1
    assert (
        value(metrics, "trainingsweep_verifications_total", namespace="ml", sweep="digits", result="not_verified") == 1
    )
    assert value(metrics, "trainingsweep_verification_duration_seconds_bucket", namespace="ml", le="0.5") == 0
    assert value(metrics, "trainingsweep_verification_duration_seconds_bucket", namespace="ml", le="1.0") == 1
    assert value(metrics, "trainingsweep_verification_duration_seconds_bucket", namespace="ml", le="5.0") == 2
    assert value(metrics, "trainingsweep_verification_duration_seconds_count", namespace="ml") == 2
    assert value(metrics, "trainingsweep_verification_duration_seconds_sum", namespace="ml") == pytest.approx(3.7)
    assert value(metrics, "trainingsweep_guard_holds_total", namespace="ml", sweep="digits", kind="RayJob") == 2
    assert value(metrics, "trainingsweep_guard_holding_objects", namespace="ml", kind="RayJob") == 1
    assert value(
        metrics,
        "trainingsweep_guard_holding_since_timestamp_seconds",
        namespace="ml",
        sweep="digits",
        kind="RayJob",
        name="digits-a1b2c3",
    ) == unix("2026-12-03T11:00:00Z")
    metrics.guard_released("RayJob", rayjob)
    assert value(metrics, "trainingsweep_guard_holding_objects", namespace="ml", kind="RayJob") == 0
    assert metrics.total("trainingsweep_deadline_stops_total") == 2


def test_names_follow_prometheus_conventions_and_metric_names_lists_every_exported_series() -> None:
    metrics = OperatorMetrics()
    metrics.follow(lambda: STEADY, gpu_budget=8)
    metrics.reconcile_finished(0.02)
    metrics.deadline_stopped("ml", "s")
    metrics.verification_finished("s3://b/p/ml/s-r1", 1.0, verified=False)
    metrics.guard_held("RayCluster", {"metadata": {"name": "c", "namespace": "ml"}}, "s")
    families = list(text_string_to_metric_families(metrics.exposition().decode()))
    exported = {s.name for f in families for s in f.samples}
    assert exported <= metrics.metric_names()
    assert set(STATE_GAUGES) <= exported
    for family in families:
        assert family.name.startswith("trainingsweep_"), family.name
        if family.type == "counter":
            assert {s.name for s in family.samples} <= {f"{family.name}_total", f"{family.name}_created"}
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name
        if "timestamp" in family.name:
            assert family.name.endswith("_timestamp_seconds")
        for s in family.samples:
            if "sweep" in s.labels:
                assert "namespace" in s.labels, s
    buckets = {
        s.labels["le"]
        for f in families
        if f.name == "trainingsweep_reconcile_duration_seconds"
        for s in f.samples
        if "le" in s.labels
    }
    assert {"0.005", "0.05", "1.0", "+Inf"} <= buckets


def test_run_root_identity_reads_the_layout() -> None:
    assert run_root_identity("s3://bucket/sweeps/team-a/digits-gpu-x1y2z3") == ("team-a", "digits-gpu")
    assert run_root_identity("/tmp/store/default/d-r1") == ("default", "d")


def test_a_gone_sweeps_counter_series_go_after_a_retention_not_at_once_and_not_a_live_namesakes() -> None:
    """Per-sweep counters would grow /metrics with every sweep a long-running operator ever ran: a sweep's series
    go SERIES_RETENTION_S after it left (a bypass counted as it goes is scraped first), removed when a later sweep
    goes; a sweep of the same name known again (created anew) keeps its series."""
    from sweep_operator.metrics import SERIES_RETENTION_S

    now = [T0]
    known: list[dict[str, Any]] = []
    metrics = OperatorMetrics(clock=lambda: now[0])
    metrics.follow(lambda: known)
    bypasses = "trainingsweep_guard_bypasses_total"
    for name in ("old", "again", "late"):
        metrics.guard_bypassed("TrainingSweep", "team-a", name)
        metrics.idle_gpus("team-a", name, "stopping", 12.0)
        metrics.deadline_stopped("team-a", name)
    metrics.sweep_gone("team-a", "old")
    metrics.sweep_gone("team-a", "again")
    assert value(metrics, bypasses, namespace="team-a", sweep="old", kind="TrainingSweep") == 1, "kept for a while"
    known.append(sweep("again", "team-a", "Running", runId="r9"))  # created again under its name
    samples(metrics)  # a scrape sees it
    now[0] += SERIES_RETENTION_S
    metrics.sweep_gone("team-a", "late")
    series = samples(metrics)
    assert not [k for k in series if ("sweep", "old") in k[1]], "the gone sweep's series stayed"
    assert value(metrics, bypasses, namespace="team-a", sweep="again", kind="TrainingSweep") == 1
    assert value(metrics, bypasses, namespace="team-a", sweep="late", kind="TrainingSweep") == 1, "not yet due"
    assert value(metrics, "trainingsweep_idle_gpu_seconds_total", namespace="team-a", sweep="late", cause="stopping")
