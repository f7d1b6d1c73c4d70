"""GPU-hour accounting (reconcile.usage): pod facts, the status.usage ledger, and the budget decisions."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sweep_contracts.status_models import UsageStatus
from sweep_operator.gpu_time import (
    HOUR,
    MAX_POD_INTERVALS,
    NamespaceBudget,
    PodInterval,
    SweepUsage,
    UsageLedger,
    budget_frees_at,
    epoch,
    fold,
    observe_pod,
    pod_ended_at,
    pod_gpus,
    pod_scheduled_at,
    reserved_gpu_hours,
    still_holding,
    unlisted_open_pods,
    worst_case_gpu_hours,
)
from sweep_operator.policy import Admit, Queue, Reject
from sweep_operator.reconcile.usage import decide_budget_admission, decide_budget_stop, needs_write, with_thresholds
from sweep_operator.status import read_status, rfc3339, updated

T0 = epoch("2026-12-03T10:00:00Z")
assert T0 is not None


def at(seconds: float) -> str:
    return rfc3339(T0 + seconds)


def pod(
    name: str,
    *,
    gpus: int = 1,
    scheduled: float | None = 0.0,
    cluster: str = "c1",
    uid: str | None = None,
    finished: list[float | None] | None = None,
    phase: str = "Running",
    deleted: float | None = None,
    init_gpus: int = 0,
    request_only: bool = False,
) -> dict[str, Any]:
    """A Pod as kube-scheduler and the kubelet leave it (condition and containerStatuses shapes of core/v1)."""
    resources = {"requests": {"nvidia.com/gpu": str(gpus)}} if request_only else {"limits": {"nvidia.com/gpu": gpus}}
    containers = [{"name": "ray-worker", "resources": resources if gpus else {}}]
    conditions = []
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": at(scheduled)})
    else:
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": at(0)}
        )
    statuses = []
    for end in finished or [None]:
        state = (
            {"terminated": {"exitCode": 0, "finishedAt": at(end), "startedAt": at(scheduled or 0)}}
            if end is not None
            else {"running": {"startedAt": at(scheduled or 0)}}
        )
        statuses.append({"name": "ray-worker", "state": state})
    body: dict[str, Any] = {
        "metadata": {"name": name, "uid": uid or f"uid-{name}", "labels": {"ray.io/cluster": cluster}},
        "spec": {"containers": containers},
        "status": {"phase": phase, "conditions": conditions, "containerStatuses": statuses},
    }
    if init_gpus:
        body["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": init_gpus}}}]
    if deleted is not None:
        body["metadata"]["deletionTimestamp"] = at(deleted)
    return body


# ------------------------------------------------------------------------------------------ pod facts


@pytest.mark.parametrize(
    "body, expected",
    [
        (pod("a", gpus=1), 1),
        (pod("a", gpus=4), 4),
        (pod("a", gpus=2, request_only=True), 2),
        (pod("head", gpus=0), 0),
        (pod("a", gpus=1, init_gpus=2), 2),  # PodRequests: max(sum of containers, largest init container)
    ],
)
def test_pod_gpus_as_the_scheduler_sizes_the_pod(body: dict[str, Any], expected: int) -> None:
    assert pod_gpus(body) == expected


def _gpus(n: int, **extra: Any) -> dict[str, Any]:
    return {"name": f"c{n}-{len(extra)}", "resources": {"limits": {"nvidia.com/gpu": n}}, **extra}


SIDECAR = {"restartPolicy": "Always"}


@pytest.mark.parametrize(
    "containers, inits, expected",
    [
        ([_gpus(1)], [_gpus(2, **SIDECAR)], 3),  # a native sidecar runs beside the app containers: added
        ([_gpus(1)], [_gpus(1, **SIDECAR), _gpus(3)], 4),  # an init container runs beside the sidecars before it
        ([_gpus(1)], [_gpus(3), _gpus(1, **SIDECAR)], 3),  # ... not beside those started after it
        ([_gpus(2), _gpus(2)], [_gpus(3)], 4),  # app containers add up
        ([_gpus(0)], [_gpus(8)], 8),
    ],
)
def test_pod_gpus_count_native_sidecars_as_kubernetes_pod_requests_does(
    containers: list[dict[str, Any]], inits: list[dict[str, Any]], expected: int
) -> None:
    """k8s.io/component-helpers/resource/helpers.go `PodRequests` (`aggregateContainerResourcesByFn`): the app
    containers' sum plus the restartable init containers, or the largest init container with the sidecars started
    before it, whichever is larger. A sidecar asking for GPUs holds them as long as the pod."""
    body = pod("a", gpus=0)
    body["spec"] = {"containers": containers, "initContainers": inits}
    assert pod_gpus(body) == expected


def test_scheduled_at_is_the_pod_scheduled_condition_time() -> None:
    assert pod_scheduled_at(pod("a", scheduled=12.0)) == T0 + 12
    assert pod_scheduled_at(pod("a", scheduled=None)) is None  # Unschedulable: holds no GPU


@pytest.mark.parametrize(
    "body, expected",
    [
        (pod("a"), None),  # still running
        (pod("a", finished=[100.0]), 100.0),  # its container terminated
        (pod("a", finished=[100.0, None]), None),  # one container still runs
        (pod("a", finished=[90.0, 100.0], phase="Failed"), 100.0),
        (pod("a", deleted=130.0), 130.0),  # grace period's end: nothing runs after it
        (pod("a", deleted=130.0, finished=[110.0]), 110.0),  # terminated before the grace period ended
    ],
)
def test_pod_end_is_the_earliest_record_that_it_stopped(body: dict[str, Any], expected: float | None) -> None:
    assert pod_ended_at(body) == (None if expected is None else T0 + expected)


def test_a_succeeded_pod_without_container_times_ends_when_it_became_unready() -> None:
    body = pod("a", phase="Succeeded")
    body["status"]["containerStatuses"] = []
    body["status"]["conditions"].append({"type": "Ready", "status": "False", "lastTransitionTime": at(50)})
    assert pod_ended_at(body) == T0 + 50


def test_pods_without_gpus_or_never_scheduled_are_not_observed() -> None:
    assert observe_pod(pod("head", gpus=0)) is None
    assert observe_pod(pod("w", scheduled=None)) is None
    seen = observe_pod(pod("w", gpus=2, scheduled=5.0, cluster="sweep-abc-raycluster-x"))
    assert seen == PodInterval("uid-w", "sweep-abc-raycluster-x", 2.0, T0 + 5, None, "w")


# ------------------------------------------------------------------------------------------ the ledger


def observe(*bodies: dict[str, Any]) -> list[PodInterval]:
    return [i for i in (observe_pod(b) for b in bodies) if i is not None]


def test_fold_is_idempotent_and_ignores_an_older_read() -> None:
    running = observe(pod("w1", scheduled=10.0), pod("w2", scheduled=20.0))
    ended = observe(pod("w1", scheduled=10.0, finished=[610.0]), pod("w2", scheduled=20.0))
    ledger = fold(UsageLedger(), running, T0 + 300, listed_clusters={"c1"})
    newer = fold(ledger, ended, T0 + 700, listed_clusters={"c1"})
    assert fold(newer, ended, T0 + 700, listed_clusters={"c1"}) == newer
    # a stale read (a cache behind the status) must not reopen w1
    again = fold(newer, running, T0 + 700, listed_clusters={"c1"})
    assert again.intervals == newer.intervals
    assert newer.gpu_seconds(T0 + 700) == pytest.approx(600 + 680)


def test_a_running_pod_counts_up_to_now() -> None:
    ledger = fold(UsageLedger(), observe(pod("w1", gpus=4, scheduled=0.0)), T0 + 60, listed_clusters={"c1"})
    assert ledger.gpu_hours(T0 + 1800) == pytest.approx(2.0)
    assert ledger.gpus_held() == 4


def test_an_absent_pod_of_a_listed_cluster_is_closed_when_noticed() -> None:
    ledger = fold(UsageLedger(), observe(pod("w1", scheduled=0.0)), T0 + 60, listed_clusters={"c1"})
    unlisted = fold(ledger, [], T0 + 120, listed_clusters=set())
    assert unlisted.intervals[0].end is None  # nothing known about c1: still open
    gone = fold(ledger, [], T0 + 120, listed_clusters={"c1"})
    assert gone.intervals[0].end == T0 + 120  # upper bound: never undercounts
    assert gone.gpu_seconds(T0 + 999) == pytest.approx(120)


def test_an_open_pod_missing_from_its_clusters_listing_is_looked_up_by_name_and_uid() -> None:
    """The listing selects by the `ray.io/cluster` label, which a pod's editors can change: each open interval of a
    listed cluster whose pod the listing lacks is read by name; only the same uid keeps it (a name is reused)."""
    w1, w2 = pod("w1", scheduled=0.0, uid="u1"), pod("w2", scheduled=0.0, uid="u2")
    ledger = fold(UsageLedger(), observe(w1, w2), T0 + 60, listed_clusters={"c1"})
    status = read_status({"usage": ledger.to_status(T0 + 60)})
    assert status.usage is not None
    assert unlisted_open_pods(status, [w1, w2], {"c1"}) == []
    assert unlisted_open_pods(status, [w1], {"c1"}) == [("w2", "u2")]
    assert unlisted_open_pods(status, [w1], set()) == []  # c1 not listed: nothing is closed, nothing looked up
    relabelled = pod("w2", scheduled=0.0, uid="u2", cluster="elsewhere")
    assert still_holding(relabelled, "u2") and not still_holding(pod("w2", uid="u9"), "u2")
    assert not still_holding(None, "u2")
    kept = fold(ledger, observe(w1, relabelled), T0 + 120, listed_clusters={"c1"})
    assert all(i.end is None and i.cluster == "c1" for i in kept.intervals), kept.intervals
    closed = fold(ledger, observe(w1), T0 + 120, listed_clusters={"c1"})  # gone: closed when noticed
    assert {i.pod: i.end for i in closed.intervals} == {"u1": None, "u2": T0 + 120}


def test_a_pod_that_cannot_be_read_by_name_measures_nothing_rather_than_close_it() -> None:
    """Reads.pods_still_holding: each wanted pod by name, kept only with its uid; an API error is None (the pass
    skips the measurement: closing a live pod's interval would undercount)."""
    from sweep_operator.reconcile.reads import Reads
    from sweep_operator.settings import Settings

    class Kube:
        def __init__(self, pods: dict[str, dict[str, Any]], failing: bool = False) -> None:
            self.pods, self.failing, self.asked = pods, failing, []

        def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
            raise AssertionError("not listed here")

        def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
            self.asked.append((namespace, name))
            if self.failing:
                raise OSError("connection reset")
            return self.pods.get(name)

    relabelled = pod("w2", uid="u2", cluster="elsewhere")
    kube = Kube({"w2": relabelled, "w3": pod("w3", uid="other")})

    def reads(kube: Kube) -> Reads:
        return Reads(Settings(), kube, None, None, None, None)  # type: ignore[arg-type]  # only the kube is read

    wanted = [("w2", "u2"), ("w3", "u3"), ("w4", "u4")]
    assert reads(kube).pods_still_holding("team", wanted) == [relabelled]
    assert kube.asked == [("team", "w2"), ("team", "w3"), ("team", "w4")]
    assert reads(Kube({}, failing=True)).pods_still_holding("team", wanted) is None


def test_the_status_record_survives_a_restart_without_double_counting() -> None:
    """The ledger written to status, read back by a new operator and folded with the same pods, is the same."""
    reads = observe(pod("w1", scheduled=3.0), pod("w2", scheduled=4.0, finished=[400.0]))
    ledger = fold(UsageLedger(), reads, T0 + 500, listed_clusters={"c1"})
    stored = ledger.to_status(T0 + 500, budget_gpu_hours=10.0)
    restarted = UsageLedger.from_status(stored)
    refolded = fold(restarted, reads, T0 + 900, listed_clusters={"c1"})
    assert refolded.gpu_seconds(T0 + 900) == pytest.approx(ledger.gpu_seconds(T0 + 900))
    assert refolded.to_status(T0 + 900)["podIntervals"] == stored["podIntervals"]


def test_stored_times_round_outward_so_the_record_never_loses_a_second() -> None:
    interval = PodInterval("p", "c", 1.0, T0 + 0.4, T0 + 10.2)
    back = PodInterval.from_status(interval.to_status())
    assert back is not None and back.start <= interval.start and back.end is not None and back.end >= interval.end


def test_accounting_against_the_pod_timestamps_of_a_scripted_scenario() -> None:
    """Two attempts (a KubeRay retry makes a new RayCluster): attempt 1 holds 2 x 1-GPU workers for 30 min and one
    dies after 10; attempt 2 holds 2 x 2-GPU workers for 15 min and one is still running at the end."""
    a1 = "sweep-x-raycluster-a"
    a2 = "sweep-x-raycluster-b"
    timeline = [
        (600.0, [pod("a-w1", cluster=a1, scheduled=0.0), pod("a-w2", cluster=a1, scheduled=60.0, finished=[600.0])]),
        (1800.0, [pod("a-w1", cluster=a1, scheduled=0.0, deleted=1800.0)]),
        (
            1900.0,
            [pod("b-w1", cluster=a2, gpus=2, scheduled=1900.0), pod("b-w2", cluster=a2, gpus=2, scheduled=1900.0)],
        ),
        (
            2800.0,
            [
                pod("b-w1", cluster=a2, gpus=2, scheduled=1900.0, finished=[2800.0]),
                pod("b-w2", cluster=a2, gpus=2, scheduled=1900.0),
            ],
        ),
    ]
    ledger = UsageLedger()
    for now, pods in timeline:
        ledger = fold(
            ledger, observe(*pods), T0 + now, listed_clusters={p["metadata"]["labels"]["ray.io/cluster"] for p in pods}
        )
    now = T0 + 2800
    expected = {
        a1: (1800 - 0) * 1 + (600 - 60) * 1,
        a2: (2800 - 1900) * 2 + (2800 - 1900) * 2,
    }
    attempts = {a.cluster: a for a in ledger.attempts(now)}
    assert {c: a.gpu_seconds for c, a in attempts.items()} == pytest.approx(expected)
    assert attempts[a1].ended_at == T0 + 1800 and attempts[a2].ended_at is None
    assert ledger.gpu_hours(now) == pytest.approx(sum(expected.values()) / HOUR)
    status = ledger.to_status(now, budget_gpu_hours=5.0)
    assert [a["rayClusterName"] for a in status["attempts"]] == [a1, a2]
    assert status["gpuHours"] == pytest.approx(round(sum(expected.values()) / HOUR, 4))
    assert status["leftGpuHours"] == pytest.approx(round(5.0 - sum(expected.values()) / HOUR, 4))


def test_the_record_is_bounded_and_keeps_gpu_seconds_and_attempts() -> None:
    many = [
        pod(f"w{i}", cluster="c1" if i % 2 else "c2", scheduled=float(i * 10), finished=[float(i * 10 + 5)])
        for i in range(200)
    ]
    ledger = fold(
        UsageLedger(),
        observe(*many, pod("live", scheduled=0.0, cluster="c3")),
        T0 + 5000,
        listed_clusters={"c1", "c2", "c3"},
    )
    assert len(ledger.intervals) <= MAX_POD_INTERVALS
    assert ledger.gpu_seconds(T0 + 5000) == pytest.approx(200 * 5 + 5000)
    attempts = {a.cluster: a.gpu_seconds for a in ledger.attempts(T0 + 5000)}
    assert attempts == pytest.approx({"c1": 500, "c2": 500, "c3": 5000})
    assert any(i.pod == "uid-live" and i.end is None for i in ledger.intervals)  # open intervals never merge


def test_needs_write_only_when_the_record_changed_or_is_stale() -> None:
    def record(ledger: UsageLedger, now: float) -> UsageStatus:
        return UsageStatus.model_validate(ledger.to_status(now))

    ledger = fold(UsageLedger(), observe(pod("w1", scheduled=0.0)), T0 + 60, listed_clusters={"c1"})
    stored = record(ledger, T0 + 60)
    assert not needs_write(stored, record(ledger, T0 + 65), refresh_seconds=30)
    assert needs_write(stored, record(ledger, T0 + 95), refresh_seconds=30)
    ended = fold(ledger, observe(pod("w1", scheduled=0.0, finished=[62.0])), T0 + 65, listed_clusters={"c1"})
    assert needs_write(stored, record(ended, T0 + 65), refresh_seconds=30)
    assert needs_write(None, record(ledger, T0 + 65), refresh_seconds=30)


# ------------------------------------------------------------------------------------------ the namespace window


def test_window_usage_is_the_overlap_with_the_window() -> None:
    ledger = UsageLedger((PodInterval("p", "c", 2.0, T0, T0 + 4 * HOUR),))
    assert ledger.window_gpu_seconds(T0 + 5 * HOUR, 3 * HOUR) / HOUR == pytest.approx(2.0 * 2)  # [2h, 4h] of it
    assert ledger.window_gpu_seconds(T0 + 10 * HOUR, 3 * HOUR) == 0


@pytest.mark.parametrize(
    "needed, expected_hours_after",
    [
        (0.0, 0.0),  # 8 used of 10: 2 left now
        (2.0, 0.0),
        (4.0, 1.0),  # the 8 GPU-h interval [0h, 1h] leaves a 10 h window from 10h on: 2 GPU-h per 15 min
        (9.0, None),  # 8 + ... reservations 1.5 leave at most 8.5
    ],
)
def test_budget_frees_at_the_earliest_time_enough_falls_out_of_the_window(
    needed: float, expected_hours_after: float | None
) -> None:
    budget = NamespaceBudget(gpu_hours=10.0, window_seconds=10 * HOUR)
    intervals = [PodInterval("p", "c", 8.0, T0, T0 + HOUR)]
    now = T0 + 9 * HOUR
    reserved = 1.5 if needed == 9.0 else 0.0
    frees = budget_frees_at(intervals, budget, now, needed, reserved)
    if expected_hours_after is None:
        assert frees is None
        return
    assert frees is not None
    if needed <= 2.0:
        assert frees == now
    else:
        # at t = 10h + x: used = 8 * (1h - x) ; fits when 8 * (1 - x) + 4 <= 10  ->  x = 0.25 h
        assert frees == pytest.approx(T0 + 10 * HOUR + 0.25 * HOUR)


def test_budget_frees_counts_open_intervals_as_ending_now() -> None:
    """What a running sweep uses from now on is in its reservation; projecting its pods as well would count it twice."""
    budget = NamespaceBudget(gpu_hours=10.0, window_seconds=10 * HOUR)
    frees = budget_frees_at([PodInterval("p", "c", 8.0, T0, None)], budget, T0 + HOUR, 4.0)
    assert frees == pytest.approx(T0 + 10 * HOUR + 0.25 * HOUR)


# ------------------------------------------------------------------------------------------ decisions

NS = NamespaceBudget(gpu_hours=100.0, window_seconds=7 * 24 * HOUR)


def admission(**kwargs: Any) -> Any:
    base: dict[str, Any] = {"worst_case": 10.0, "sweep_budget": None, "run_until_exhausted": False, "now": T0 + 1000}
    return decide_budget_admission(**{**base, **kwargs})


def busy(hours: float, reserved: float = 0.0, name: str = "other") -> SweepUsage:
    return SweepUsage(name, UsageLedger((PodInterval(f"{name}-p", "c", 1.0, T0, T0 + hours * HOUR),)), reserved)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, Admit),
        ({"sweep_budget": 20.0}, Admit),
        ({"sweep_budget": 5.0}, Reject),  # worst case 10 > 5
        ({"sweep_budget": 5.0, "run_until_exhausted": True}, Admit),  # the budget stops it
        ({"sweep_budget": 5.0, "sweep_used": 5.0, "run_until_exhausted": True}, Reject),  # nothing left at all
    ],
)
def test_budget_admission(kwargs: dict[str, Any], expected: type) -> None:
    kwargs.setdefault("now", T0 + 100 * HOUR)
    assert isinstance(admission(**kwargs), expected)


def test_refusal_names_the_field_the_worst_case_and_the_opt_in() -> None:
    decision = admission(
        sweep_budget=5.0, worst_case_text="2 workers x 1 GPU x 2 trials x 21600s = 24 GPU-hours", worst_case=24.0
    )
    assert isinstance(decision, Reject)
    assert decision.problems[0].path == "spec.budget.gpuHours"
    assert "2 workers x 1 GPU x 2 trials x 21600s = 24 GPU-hours" in decision.reason
    assert "exceeds the 5 GPU-hours left" in decision.reason and "runUntilExhausted" in decision.reason


def test_queued_message_says_when_budget_frees_up() -> None:
    from sweep_operator.reconcile.hours_ledger import HoursLedger, LedgerEntry, decide_reservation

    now = T0 + 100 * HOUR
    old = LedgerEntry("old", "u-old", (PodInterval("p", "c", 8.0, now - 9 * HOUR, now - 8 * HOUR),), deleted=True)
    ledger = HoursLedger(NamespaceBudget(10.0, 10 * HOUR), (old,))
    decision, write = decide_reservation(
        ledger,
        uid="u",
        name="new",
        attempt="initial",
        worst_case=4.0,
        run_until_exhausted=False,
        sweep_left=None,
        now=now,
    )
    assert isinstance(decision, Queue) and write is None
    assert decision.frees_at == pytest.approx(now + 1.25 * HOUR)
    assert f"budget frees up at {rfc3339(math.ceil(now + 1.25 * HOUR))}" in decision.reason
    assert "10 GPU-hours per 10h has 2 left" in decision.reason


def test_worst_case_and_reservation() -> None:
    assert worst_case_gpu_hours(2, 1, 2, 21600) == pytest.approx(24.0)
    assert reserved_gpu_hours(24.0, None, 4.0) == pytest.approx(20.0)
    assert reserved_gpu_hours(24.0, 10.0, 4.0) == pytest.approx(6.0)
    assert reserved_gpu_hours(24.0, 10.0, 12.0) == 0.0


def test_thresholds_are_reported_once_each() -> None:
    ledger = UsageLedger((PodInterval("p", "c", 1.0, T0, None),))
    first = decide_budget_stop(ledger, 1.0, T0 + 0.85 * HOUR)
    assert first.crossed == (80,) and not first.stop
    ledger = with_thresholds(ledger, first.crossed)
    assert decide_budget_stop(ledger, 1.0, T0 + 0.9 * HOUR).crossed == ()
    spent = decide_budget_stop(ledger, 1.0, T0 + 1.0 * HOUR)
    assert spent.crossed == (100,) and spent.stop and "spent" in spent.stop_reason
    # read back from status, a restarted operator does not report them again
    restarted = UsageLedger.from_status(with_thresholds(ledger, spent.crossed).to_status(T0 + HOUR))
    assert decide_budget_stop(restarted, 1.0, T0 + 1.1 * HOUR).crossed == ()


def test_the_stop_begins_a_graceful_window_before_the_budget_runs_out() -> None:
    """The guard keeps the pods while it verifies; the stop starts early enough for that time to fit the budget."""
    ledger = UsageLedger((PodInterval("p", "c", 4.0, T0, None),))  # 4 GPU-h per hour
    assert not decide_budget_stop(ledger, 2.0, T0 + 1490, graceful_stop_seconds=300).stop  # 1.656 + 0.333 < 2
    early = decide_budget_stop(ledger, 2.0, T0 + 1500.1, graceful_stop_seconds=300)
    assert early.stop and "nearly spent" in early.stop_reason
    assert early.exhausts_at == pytest.approx(T0 + 1800)
    assert not decide_budget_stop(ledger, None, T0 + 10 * HOUR).stop  # no budget: never


# ------------------------------------------------------------------------------------------ configuration


def test_chart_namespace_budgets_reach_the_operator_settings() -> None:
    """budgets.* in the chart's values -> the settings ConfigMap -> Settings.namespace_gpu_hour_budget."""
    from sweep_operator.settings import Settings
    from tests.unit.test_chart import grants, of_kind, render_values, settings_env

    docs = render_values(
        {
            "budgets": {
                "namespaceGpuHours": 500,
                "namespaces": {"team-b": 1000000, "team-a": 120.5, "sandbox": 0},
                "windowSeconds": 86400,
            }
        }
    )
    settings = Settings.from_env(settings_env(docs))
    assert settings.gpu_hours_window_seconds == 86400
    assert settings.namespace_gpu_hour_budget("team-a") == 120.5
    assert settings.namespace_gpu_hour_budget("team-b") == 1000000
    assert settings.namespace_gpu_hour_budget("sandbox") is None  # 0 turns it off there
    assert settings.namespace_gpu_hour_budget("elsewhere") == 500
    # the pods the accounting reads
    assert {"get", "list", "watch"} <= grants(of_kind(docs, "ClusterRole"))[("", "pods")]


@pytest.mark.parametrize(
    "env, field_name",
    [
        ({"SWEEP_NAMESPACE_GPU_HOUR_BUDGETS": "team-a"}, "SWEEP_NAMESPACE_GPU_HOUR_BUDGETS"),
        ({"SWEEP_NAMESPACE_GPU_HOUR_BUDGETS": "team-a=-3"}, "SWEEP_NAMESPACE_GPU_HOUR_BUDGETS"),
        ({"SWEEP_NAMESPACE_GPU_HOURS": "-1"}, "SWEEP_NAMESPACE_GPU_HOURS"),
        ({"SWEEP_GPU_HOURS_WINDOW_SECONDS": "0"}, "SWEEP_GPU_HOURS_WINDOW_SECONDS"),
    ],
)
def test_bad_budget_settings_name_the_variable(env: dict[str, str], field_name: str) -> None:
    from sweep_operator.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match=field_name):
        Settings.from_env(env)


# ------------------------------------------------------------------------------------------ metrics


def test_budget_gauges_are_computed_from_the_sweep_records_at_scrape() -> None:
    from sweep_operator.metrics import OperatorMetrics

    now = [T0 + HOUR]
    running = UsageLedger((PodInterval("p1", "c", 2.0, T0, None),)).to_status(T0 + 60)
    ended = UsageLedger((PodInterval("p2", "c", 4.0, T0 - 2 * HOUR, T0 - HOUR),)).to_status(T0)
    sweeps = [
        {
            "metadata": {"namespace": "ml", "name": "a", "uid": "1"},
            "spec": {"budget": {"gpuHours": 10}},
            "status": {"phase": "Running", "usage": running},
        },
        {"metadata": {"namespace": "ml", "name": "b", "uid": "2"}, "status": {"phase": "Succeeded", "usage": ended}},
        {"metadata": {"namespace": "other", "name": "c", "uid": "3"}, "status": {"phase": "Pending"}},
    ]
    metrics = OperatorMetrics(clock=lambda: now[0])
    metrics.follow(lambda: sweeps, gpu_hour_budget=lambda ns: NamespaceBudget(50.0, 2.5 * HOUR) if ns == "ml" else None)
    assert metrics.total("trainingsweep_sweep_gpu_hours", namespace="ml", sweep="a") == pytest.approx(2.0)
    assert metrics.total("trainingsweep_sweep_gpu_hours_budget", sweep="a") == 10
    assert metrics.total("trainingsweep_sweep_gpu_hours", sweep="b") == pytest.approx(4.0)
    # window [T0 - 1.5h, T0 + 1h]: a's 2 GPUs for 1 h, b's 4 GPUs for 0.5 h
    assert metrics.total("trainingsweep_namespace_gpu_hours", namespace="ml") == pytest.approx(2.0 + 2.0)
    assert metrics.total("trainingsweep_namespace_gpu_hours_budget", namespace="ml") == 50
    assert metrics.total("trainingsweep_namespace_gpu_hours_budget", namespace="other") == 0  # no budget there
    now[0] = T0 + 2 * HOUR  # a running pod's hours grow between status writes
    assert metrics.total("trainingsweep_sweep_gpu_hours", sweep="a") == pytest.approx(4.0)
    metrics.budget_threshold_crossed("ml", "a", 80)
    assert metrics.total("trainingsweep_budget_thresholds_total", sweep="a", threshold="80") == 1
    assert {"trainingsweep_sweep_gpu_hours", "trainingsweep_budget_thresholds_total"} <= metrics.metric_names()


def test_the_accounting_is_pure() -> None:
    import subprocess
    import sys

    code = (
        "import sys, sweep_operator.reconcile.usage\n"
        "print(sorted(m for m in ('kopf', 'kubernetes', 'boto3') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


# ------------------------------------------------------------------------------------------ alerts


def test_budget_alerts_fire_at_80_and_100_percent(tmp_path: Any) -> None:
    """promtool rule tests over the chart's PrometheusRule: a sweep's and a namespace's usage climbing past 80% and
    100% of its budget (series as metrics.py exports them, one sample a minute)."""
    import subprocess

    import yaml

    from tests.unit.test_chart_monitoring import _promtool, rule_spec

    promtool = _promtool()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_spec()))
    series = [
        # 1 GPU-hour a minute against a budget of 10: 80% at minute 8, 100% at minute 10
        {"series": 'trainingsweep_sweep_gpu_hours{namespace="ml",sweep="s"}', "values": "0+1x20"},
        {"series": 'trainingsweep_sweep_gpu_hours_budget{namespace="ml",sweep="s"}', "values": "10+0x20"},
        {"series": 'trainingsweep_sweep_gpu_hours{namespace="ml",sweep="unbudgeted"}', "values": "0+100x20"},
        {"series": 'trainingsweep_namespace_gpu_hours{namespace="team"}', "values": "0+5x20"},
        {"series": 'trainingsweep_namespace_gpu_hours_budget{namespace="team"}', "values": "50+0x20"},
    ]
    nearly = "A sweep or namespace has used 80% of its GPU-hour budget"
    spent = "A sweep or namespace has spent its GPU-hour budget"
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": "7m", "alertname": "TrainingSweepGpuBudgetNearlySpent", "exp_alerts": []},
                {
                    "eval_time": "8m",
                    "alertname": "TrainingSweepGpuBudgetNearlySpent",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning", "namespace": "ml", "sweep": "s"},
                            "exp_annotations": {
                                "summary": nearly,
                                "description": "Sweep ml/s has used 80% of its GPU-hour budget; at 100% the sweep stops (BudgetExhausted) "
                                "or new sweeps queue. sweepctl status shows used and left.",
                            },
                        },
                        {
                            "exp_labels": {"severity": "warning", "namespace": "team"},
                            "exp_annotations": {
                                "summary": nearly,
                                "description": "Namespace team (its rolling window) has used 80% of its GPU-hour budget; at 100% the sweep "
                                "stops (BudgetExhausted) or new sweeps queue. sweepctl status shows used and left.",
                            },
                        },
                    ],
                },
                {"eval_time": "9m", "alertname": "TrainingSweepGpuBudgetSpent", "exp_alerts": []},
                {"eval_time": "10m", "alertname": "TrainingSweepGpuBudgetNearlySpent", "exp_alerts": []},
                {
                    "eval_time": "10m",
                    "alertname": "TrainingSweepGpuBudgetSpent",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning", "namespace": "ml", "sweep": "s"},
                            "exp_annotations": {
                                "summary": spent,
                                "description": "Sweep ml/s has spent its spec.budget.gpuHours (100%): it stops gracefully, checkpoints "
                                "verified (phase BudgetExhausted).",
                            },
                        },
                        {
                            "exp_labels": {"severity": "warning", "namespace": "team"},
                            "exp_annotations": {
                                "summary": spent,
                                "description": "Namespace team has spent its GPU-hour budget for the window (100%): new sweeps wait Queued "
                                "until usage falls out of the window.",
                            },
                        },
                    ],
                },
            ],
        }
    ]
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False)
    )
    done = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ------------------------------------------------------------------------------------------ sweepctl status


def test_sweepctl_status_shows_used_and_left_for_the_sweep_and_its_namespace() -> None:
    from sweep_operator.cli.status import format_status
    from sweep_operator.reconcile.hours_ledger import HoursLedger, LedgerEntry, Reservation

    usage = UsageLedger((PodInterval("p", "c", 2.0, T0, None),)).to_status(T0 + 60, budget_gpu_hours=10.0)
    usage["namespace"] = {"gpuHours": 1.0, "budgetGpuHours": 500, "leftGpuHours": 499, "windowSeconds": 7 * 86400}
    status = {"phase": "Running", "usage": usage}
    text = format_status("s", "ml", status, now=T0 + 1.5 * HOUR)
    assert "gpu-hours:   3 used of 10 (7 left); 2 GPUs held now" in text  # recomputed to now, not the stored 0.03
    assert "namespace:   1 used of 500 per 7d (499 left)" in text
    # with the namespace's ledger: every sweep's hours in the window, the deleted one's too, and the reservations
    me = LedgerEntry("s", "u1", (PodInterval("p", "c", 2.0, T0, None),), Reservation(20.0, T0, "initial"))
    gone = LedgerEntry("old", "u0", (PodInterval("q", "c", 4.0, T0 - HOUR, T0),), deleted=True)
    ledger = HoursLedger(NamespaceBudget(500.0, 7 * 86400), (me, gone)).to_object("ml", T0)
    text = format_status("s", "ml", status, now=T0 + 1.5 * HOUR, ledger=ledger)
    assert "namespace:   7 used, 17 reserved of 500 per 7d (476 left)" in text
    assert "    old (deleted): 4 used" in text and "    s: 3 used, 17 reserved" in text
    assert "gpu-hours" not in format_status("s", "ml", {"phase": "Pending"})


# ------------------------------------------------------------------------------------------ one reconcile pass


def test_measure_folds_the_pods_reports_thresholds_once_and_skips_idle_writes() -> None:
    from sweep_operator.reconcile.usage import measure

    pods = [pod("w1", gpus=2, scheduled=0.0), pod("head", gpus=0)]
    first = measure(read_status({}), pods, {"c1"}, T0 + 0.45 * HOUR, budget_gpu_hours=1.0, refresh_seconds=60)
    assert first.usage is not None and first.usage.gpu_hours == pytest.approx(0.9)
    assert first.facts.crossed == (80,) and [e[1] for e in first.events] == ["GpuBudget80"]
    status = updated(read_status({}), usage=first.usage)
    again = measure(status, pods, {"c1"}, T0 + 0.45 * HOUR + 10, budget_gpu_hours=1.0, refresh_seconds=60)
    assert again.usage is None and again.events == ()  # nothing new within the refresh interval, no second Event
    spent = measure(status, pods, {"c1"}, T0 + 0.5 * HOUR, budget_gpu_hours=1.0, refresh_seconds=60)
    assert spent.facts.stop and [e[1] for e in spent.events] == ["GpuBudget100"]
    assert spent.usage is not None and spent.usage.thresholds_reported == [80, 100]
    assert measure(read_status({}), [], set(), T0, budget_gpu_hours=None).usage is None  # no GPUs, no budget


def test_reservations_and_clusters_to_read_come_from_the_status() -> None:
    from sweep_operator.gpu_time import clusters_to_read, holding_gpus, sweep_usage_of

    usage = UsageLedger((PodInterval("p", "old-cluster", 2.0, T0, None),)).to_status(T0 + HOUR)
    running = {
        "metadata": {"name": "a"},
        "spec": {"budget": {"gpuHours": 100}},
        "status": {
            "phase": "Running",
            "runId": "r",
            "rayClusterName": "new-cluster",
            "usage": usage,
            "replicas": {"gpus": 4},
            "startedAt": at(0),
            "deadlineAt": at(6 * HOUR),
        },
    }
    assert clusters_to_read(read_status(running["status"])) == {"old-cluster", "new-cluster"}
    assert holding_gpus(read_status(running["status"]))
    a = sweep_usage_of(running, T0 + HOUR)
    assert a.reserved_gpu_hours == pytest.approx(4 * 6 - 2)  # worst case 24, 2 used
    ended = {**running, "status": {**running["status"], "phase": "Succeeded"}}
    assert sweep_usage_of(ended, T0 + HOUR).reserved_gpu_hours == 0


@pytest.mark.parametrize(
    ("status", "sweep_hours", "namespace_hours", "expected"),
    [
        ({"rayClusterName": "c1"}, None, None, {"c1"}),  # a cluster to measure, no budget anywhere
        ({}, None, None, None),  # no cluster, no budget: nothing to read or to keep current
        ({}, 10.0, None, set()),  # the sweep's budget: status.usage is kept, with no pod to read
        ({}, None, 50.0, set()),  # the namespace's budget: status.usage.namespace is kept
    ],
)
def test_a_pass_measures_when_there_is_a_cluster_or_a_budget(
    status: dict[str, Any], sweep_hours: float | None, namespace_hours: float | None, expected: set[str] | None
) -> None:
    from sweep_operator.reconcile.facts import SweepFacts
    from sweep_operator.reconcile.usage import clusters_to_measure
    from sweep_operator.settings import OperatorLimits
    from sweep_operator.validation import parse_sweep
    from tests.support.factories import gpu_sweep

    body = gpu_sweep()
    if sweep_hours is not None:
        body["spec"]["budget"] = {"gpuHours": sweep_hours}
    facts = SweepFacts({**body, "status": {"phase": "Running", **status}}, T0, OperatorLimits(), parse_sweep(body))
    namespace = NamespaceBudget(namespace_hours, 86400) if namespace_hours is not None else None
    assert clusters_to_measure(facts, namespace) == expected


def test_an_ended_run_is_measured_until_its_gpu_pods_are_gone_a_deleting_sweep_included() -> None:
    from sweep_operator.reconcile.usage import usage_open

    holding = {"usage": UsageLedger((PodInterval("p", "c1", 2.0, T0, None),)).to_status(T0 + HOUR)}
    assert usage_open(read_status({"phase": "Succeeded", **holding}))
    assert usage_open(read_status({"phase": "Deleting", **holding}))  # the guard may hold its pods
    assert not usage_open(read_status({"phase": "Succeeded"}))


def test_threshold_metric_is_counted_once_after_the_write_that_records_it() -> None:
    from sweep_operator.metrics import OperatorMetrics
    from sweep_operator.reconcile.status_writer import BudgetThresholdCallback

    metrics = OperatorMetrics()
    callback = BudgetThresholdCallback(metrics)
    body = {"metadata": {"namespace": "ml", "name": "s"}}
    eighty, both = (read_status({"usage": {"thresholdsReported": t}}) for t in ([80], [80, 100]))
    callback.after_write(body, read_status({}), eighty)
    callback.after_write(body, eighty, both)
    callback.after_write(body, both, both)
    assert metrics.total("trainingsweep_budget_thresholds_total", sweep="s", threshold="80") == 1
    assert metrics.total("trainingsweep_budget_thresholds_total", sweep="s", threshold="100") == 1
