"""The namespace's GPU-hour ledger (reconcile.hours_ledger, pure): one table row per leak of issue 27, each failing
on the accounting it replaces, plus the ledger's bounds and its object's round trip."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from sweep_contracts.api import LEDGER_MAX_ENTRIES, LEDGER_MAX_RESERVATIONS, LEDGER_MAX_SWEEPS, GPUHourLedgerStatus
from sweep_operator.gpu_time import HOUR, NamespaceBudget, PodInterval, UsageLedger
from sweep_operator.policy import Admit, Queue, Reject
from sweep_operator.reconcile.hours_ledger import (
    ENTRY_INTERVALS,
    TERMINATION_GRACE_SECONDS,
    HoursLedger,
    LedgerEntry,
    Reservation,
    bounded,
    decide_reservation,
    record_usage,
    release,
)
from sweep_operator.reconcile.usage import ReservationFacts, decide_reservation_stop

T0 = 1_800_000_000.0
NOW = T0 + 100 * HOUR
BUDGET = NamespaceBudget(gpu_hours=100.0, window_seconds=7 * 24 * HOUR)


def used(name: str, hours: float, gpus: float = 1.0, *, deleted: bool = False, ended: float = NOW) -> LedgerEntry:
    """A sweep that held `gpus` GPUs until `ended`, `hours` GPU-hours in all."""
    start = ended - hours * HOUR / gpus
    return LedgerEntry(name, f"uid-{name}", (PodInterval(f"{name}-pod", "c", gpus, start, ended),), deleted=deleted)


def ask(ledger: HoursLedger, **kwargs: Any) -> tuple[Any, HoursLedger | None]:
    base: dict[str, Any] = {
        "uid": "uid-new",
        "name": "new",
        "attempt": "initial",
        "worst_case": 10.0,
        "run_until_exhausted": False,
        "sweep_left": None,
        "now": NOW,
    }
    return decide_reservation(ledger, **{**base, **kwargs})


# ----------------------------------------------------------------------------------------------- one row per leak

LEAKS = [
    pytest.param(
        # 1. deleting a sweep erases its spend: the deleted sweep's 95 GPU-hours stay in the window
        HoursLedger(BUDGET, (used("gone", 95.0, deleted=True),)),
        {},
        Queue,
        id="1-a deleted sweep's hours stay",
    ),
    pytest.param(
        # 2. a burst: the first of the burst reserved its worst case; the second sees it, whatever worker runs it
        HoursLedger(BUDGET, (LedgerEntry("first", "uid-first", reservation=Reservation(95.0, NOW, "initial")),)),
        {},
        Queue,
        id="2-the burst's reservations count",
    ),
    pytest.param(
        # 3. a resume: the sweep's own 95.9 GPU-hours count; the attempt's worst case is 4 GPUs x 3 days
        HoursLedger(BUDGET, (used("new", 95.9, 4.0),)),
        {"uid": "uid-new", "attempt": "resume-2", "worst_case": 4 * 3 * 24.0},
        Reject,  # 288 GPU-hours could never fit 100
        id="3-a resume's own past hours and its own deadline",
    ),
    pytest.param(
        HoursLedger(BUDGET, (used("new", 95.9, 4.0),)),
        {"uid": "uid-new", "attempt": "resume-2", "worst_case": 4 * 1.25},
        Queue,  # 4.1 left, 5 wanted: it would fit only without the sweep's own 95.9
        id="3-a resume's own past hours count",
    ),
    pytest.param(
        # 4. Kueue: five queued 16-GPU sweeps each reserved their worst case at creation, admitted by Kueue or not
        HoursLedger(
            BUDGET,
            tuple(LedgerEntry(f"k{i}", f"uid-k{i}", reservation=Reservation(0.5, NOW, "initial")) for i in range(5)),
        ),
        {"worst_case": 99.0},
        Queue,
        id="4-kueue sweeps reserve from their creation",
    ),
    pytest.param(
        # 5. runUntilExhausted with 4 GPU-hours left: admitted, reserving the 4 (not 0)
        HoursLedger(BUDGET, (used("busy", 96.0),)),
        {"worst_case": 1152.0, "run_until_exhausted": True},
        Admit,
        id="5-run until exhausted reserves what is left",
    ),
]


@pytest.mark.parametrize(("ledger", "kwargs", "expected"), LEAKS)
def test_each_leak_of_issue_27_is_closed(ledger: HoursLedger, kwargs: dict[str, Any], expected: type) -> None:
    decision, write = ask(ledger, **kwargs)
    assert isinstance(decision, expected), decision
    assert (write is not None) is (expected is Admit)


def test_run_until_exhausted_reserves_what_is_left_and_is_stopped_when_it_is_spent() -> None:
    decision, write = ask(HoursLedger(BUDGET, (used("busy", 96.0),)), worst_case=1152.0, run_until_exhausted=True)
    assert isinstance(decision, Admit) and decision.gpu_hours == pytest.approx(4.0)
    assert write is not None
    entry = write.entry("uid-new")
    reservation = entry.reservation if entry is not None else None
    assert reservation is not None
    assert reservation.gpu_hours == pytest.approx(4.0) and reservation.run_until_exhausted
    assert (reservation.since, reservation.attempt) == (NOW, "initial")
    facts = ReservationFacts(reservation.gpu_hours, reservation.since, True)
    running = UsageLedger((PodInterval("p", "c", 16.0, NOW, None),))  # 16 GPUs: 4 GPU-hours in 15 minutes
    assert decide_reservation_stop(running, facts, NOW + 10 * 60) == ""
    assert "nearly spent" in decide_reservation_stop(running, facts, NOW + 10 * 60, graceful_stop_seconds=300)
    assert "namespace GPU budget spent" in decide_reservation_stop(running, facts, NOW + 15 * 60)
    # a deadline-bound attempt reserved its worst case: stopped only once it is actually spent
    bound = ReservationFacts(4.0, NOW, False)
    assert decide_reservation_stop(running, bound, NOW + 10 * 60, graceful_stop_seconds=300) == ""


def test_the_same_attempt_asked_again_finds_its_reservation_and_writes_nothing() -> None:
    _, written = ask(HoursLedger(BUDGET))
    assert written is not None
    again, write = ask(replace(written, resource_version="7"))
    assert isinstance(again, Admit) and write is None


def test_a_burst_admits_exactly_what_fits_whatever_the_order() -> None:
    """Eight asks of 30 GPU-hours each against 100: the first three reserve, the rest queue."""
    ledger = HoursLedger(BUDGET)
    admitted = []
    for i in range(8):
        _, write = ask(ledger, uid=f"uid-{i}", name=f"s{i}", worst_case=30.0)
        if write is not None:
            ledger = write
            admitted.append(i)
    assert admitted == [0, 1, 2]


def test_a_resumes_reservation_does_not_subtract_earlier_attempts_usage() -> None:
    earlier = used("s", 50.0)
    ledger = HoursLedger(BUDGET, (replace(earlier, reservation=Reservation(50.0, NOW - 60 * HOUR, "initial")),))
    _, write = ask(ledger, uid=earlier.uid, attempt="resume-2", worst_case=20.0)
    assert write is not None
    entry = write.entry(earlier.uid)
    assert entry is not None and entry.reserved_left(NOW) == pytest.approx(20.0)  # the new attempt's, whole
    assert write.used(NOW) + write.reserved(NOW) == pytest.approx(70.0)


# ----------------------------------------------------------------------------------------------- records


def test_recording_is_a_copy_of_the_sweeps_record_and_deletion_keeps_the_hours() -> None:
    intervals = [PodInterval("p1", "c", 2.0, NOW - HOUR, None)]
    ledger = HoursLedger(BUDGET)
    ledger = record_usage(ledger, uid="u", name="s", intervals=intervals, ended=False, now=NOW) or ledger
    assert record_usage(ledger, uid="u", name="s", intervals=intervals, ended=False, now=NOW) is None  # idempotent
    # a pod still running: the totals kubectl shows are rewritten once they are refresh_seconds old, not before
    stored = replace(ledger, updated_at=NOW)
    assert (
        record_usage(stored, uid="u", name="s", intervals=intervals, ended=False, now=NOW + 30, refresh_seconds=60)
        is None
    )
    assert record_usage(stored, uid="u", name="s", intervals=intervals, ended=False, now=NOW + 60, refresh_seconds=60)
    assert ledger.used(NOW) == pytest.approx(2.0)
    ledger = release(ledger, uid="u", deleted=True, now=NOW) or ledger
    entry = ledger.entry("u")
    assert entry is not None and entry.deleted and entry.intervals[0].end == NOW + TERMINATION_GRACE_SECONDS
    assert ledger.used(NOW + HOUR) == pytest.approx(2.0 * (1 + TERMINATION_GRACE_SECONDS / HOUR))


def test_an_ended_run_releases_its_reservation_but_not_its_hours() -> None:
    ledger = HoursLedger(BUDGET, (replace(used("s", 10.0), reservation=Reservation(30.0, NOW - 10 * HOUR, "initial")),))
    assert ledger.reserved(NOW) == pytest.approx(20.0)
    entry = ledger.entry("uid-s")
    assert entry is not None
    ended = record_usage(ledger, uid="uid-s", name="s", intervals=entry.intervals, ended=True, now=NOW)
    assert ended is not None and ended.reserved(NOW) == 0 and ended.used(NOW) == pytest.approx(10.0)


def test_the_ledger_object_stays_bounded_whatever_the_number_of_sweeps() -> None:
    """1,000 sweeps of 64 GPU pods each in one window, recorded one at a time and each bounded as every write
    bounds it: the object stays far below etcd's 1.5 MiB and keeps every GPU-second of the window."""

    ledger, total = HoursLedger(BUDGET), 0.0
    for s in range(1000):
        pods = [
            PodInterval(f"pod-{s}-{p}", f"c-{s}", 1.0, NOW - 50 * HOUR + s * 60 + p, NOW - 49 * HOUR + s * 60 + p)
            for p in range(64)
        ]
        total += sum(p.gpu_seconds(NOW) for p in pods) / HOUR
        ledger = record_usage(ledger, uid=f"uid-{s}", name=f"sweep-{s}", intervals=pods, ended=True, now=NOW) or ledger
        ledger = release(ledger, uid=f"uid-{s}", deleted=True, now=NOW) or ledger
        ledger = bounded(ledger, NOW)
    obj = ledger.to_object("team", NOW)
    size = len(json.dumps(obj))
    assert size < 512 * 1024, size
    assert len(obj["status"]["sweeps"]) <= LEDGER_MAX_SWEEPS
    assert all(len(s["intervals"]) <= ENTRY_INTERVALS for s in obj["status"]["sweeps"])
    assert HoursLedger.from_object(obj, BUDGET).used(NOW) == pytest.approx(total, rel=1e-3)
    GPUHourLedgerStatus.model_validate(obj["status"])  # the CRD's schema (unknown fields forbidden)


def test_hours_out_of_the_window_leave_the_ledger() -> None:
    old = used("old", 10.0, ended=NOW - 8 * 24 * HOUR)
    obj = HoursLedger(BUDGET, (old, used("new", 5.0))).to_object("team", NOW)
    assert [s["name"] for s in obj["status"]["sweeps"]] == ["new"]
    assert obj["status"]["usedGpuHours"] == pytest.approx(5.0)
    assert obj["spec"] == {"gpuHours": 100.0, "windowSeconds": 7 * 24 * 3600}
    assert obj["status"]["window"] == "7d"


def test_the_ledger_says_when_budget_frees_up() -> None:
    obj = HoursLedger(BUDGET, (used("full", 100.0, 10.0, ended=NOW - HOUR),)).to_object("team", NOW)
    assert obj["status"]["leftGpuHours"] == 0 and obj["status"]["freesAt"] > obj["status"]["updatedAt"]


def test_sandbox_up_takes_the_operators_budget_settings_and_names_a_bad_one() -> None:
    import argparse

    from sweep_operator.cli.common import UsageError
    from sweep_operator.cli.sandbox import budget_overrides

    def args(**kwargs: Any) -> argparse.Namespace:
        base = {"namespace_gpu_hours": None, "namespace_gpu_hour_budget": [], "gpu_hours_window_seconds": None}
        return argparse.Namespace(**{**base, **kwargs})

    assert budget_overrides(args()) == {}
    assert budget_overrides(args(namespace_gpu_hour_budget=["team-a=0.01"], gpu_hours_window_seconds=3600)) == {
        "namespace_gpu_hour_budgets": ("team-a=0.01",),
        "gpu_hours_window_seconds": 3600,
    }
    with pytest.raises(UsageError, match="SWEEP_GPU_HOURS_WINDOW_SECONDS"):
        budget_overrides(args(gpu_hours_window_seconds=0))
    with pytest.raises(UsageError, match="team-a"):
        budget_overrides(args(namespace_gpu_hour_budget=["team-a=lots"]))


def test_the_first_write_creates_the_ledger_seeded_from_the_sweeps_records_and_a_stale_write_is_decided_again() -> None:
    """An operator upgraded from one without a ledger: the namespace's sweeps' own records seed it. Two writers
    deciding on the same copy that both fit: the second write is refused (resourceVersion) and decided again."""
    from sweep_operator.reconcile.ports import GpuHourLedgers
    from tests.support.fake_kube import FakeKube

    kube = FakeKube()
    record = UsageLedger((PodInterval("p", "c", 1.0, NOW - 95 * HOUR, NOW),)).to_status(NOW)
    sweep = {"metadata": {"name": "old", "namespace": "team", "uid": "u-old"}, "status": {"usage": record}}
    kube.add("TrainingSweep", sweep)
    one = GpuHourLedgers(kube, kube.list_sweeps)  # type: ignore[arg-type]  # the fake has KubeApi's surface
    two = GpuHourLedgers(kube, kube.list_sweeps)  # type: ignore[arg-type]  # another worker, or a new leader

    def reserve(uid: str, hours: float) -> Any:
        return lambda ledger: ask(ledger, uid=uid, name=uid, worst_case=hours)

    assert isinstance(one.change("team", BUDGET, NOW, reserve("a", 3.0)), Admit)  # 95 + 3 <= 100
    stored = kube.get_ledger("team")
    assert stored is not None and {s["name"] for s in stored["status"]["sweeps"]} == {"old", "a"}
    two.read("team", BUDGET, NOW)  # both hold the copy with 2 GPU-hours left
    assert isinstance(one.change("team", BUDGET, NOW, reserve("b", 2.0)), Admit)
    assert isinstance(two.change("team", BUDGET, NOW, reserve("c", 2.0)), Queue)  # refused, decided again
    stored = kube.get_ledger("team")
    assert stored is not None and stored["status"]["leftGpuHours"] == pytest.approx(0.0)


# ------------------------------------------------------------------------------------ more reservations than before


def test_more_admitted_gpu_attempts_than_the_ledger_once_held_keep_every_write_valid() -> None:
    """260 one-GPU-hour attempts in one namespace with room for all: entries that reserve never merge, so past 128
    every write was one the CRD refuses (a wedge). Now up to LEDGER_MAX_RESERVATIONS are admitted, every write fits
    the CRD's schema (the fake refuses one that does not, as the API server does), the rest wait Queued saying why,
    and one ending lets the next in."""
    from sweep_operator.reconcile.ports import GpuHourLedgers
    from tests.support.fake_kube import FakeKube

    kube = FakeKube()
    ledgers = GpuHourLedgers(kube, kube.list_sweeps)  # type: ignore[arg-type]  # the fake has KubeApi's surface
    roomy = NamespaceBudget(gpu_hours=10_000.0, window_seconds=7 * 24 * HOUR)

    def reserve(n: int) -> Any:
        return lambda ledger: ask(ledger, uid=f"uid-{n}", name=f"s{n}", worst_case=1.0)

    answers = [ledgers.change("team", roomy, NOW, reserve(n)) for n in range(LEDGER_MAX_RESERVATIONS + 4)]
    admitted = [n for n, a in enumerate(answers) if isinstance(a, Admit)]
    assert LEDGER_MAX_RESERVATIONS > 128 and admitted == list(range(LEDGER_MAX_RESERVATIONS))
    queued = answers[LEDGER_MAX_RESERVATIONS:]
    assert all(isinstance(q, Queue) and "the most its GPU-hour ledger tracks" in q.reason for q in queued), queued[0]
    stored = kube.get_ledger("team")
    assert stored is not None and len(stored["status"]["sweeps"]) == LEDGER_MAX_RESERVATIONS
    # one ends: its reservation goes, and the first of those waiting is admitted (every write still valid)
    ledgers.change("team", roomy, NOW, lambda ledger: (None, release(ledger, uid="uid-0", deleted=True, now=NOW)))
    assert isinstance(ledgers.change("team", roomy, NOW, reserve(LEDGER_MAX_RESERVATIONS)), Admit)
    assert isinstance(ledgers.change("team", roomy, NOW, reserve(LEDGER_MAX_RESERVATIONS + 1)), Queue)


def test_a_full_ledger_of_running_reservations_and_ended_sweeps_fits_its_object() -> None:
    """The most the object holds: LEDGER_MAX_RESERVATIONS running sweeps of 16 GPU pods with a finished one each, and
    more ended sweeps than LEDGER_MAX_SWEEPS: bounded as every write bounds it, it fits the CRD and stays under 1 MiB
    (etcd takes 1.5)."""
    from tests.support.schemas import errors, ledger_validator

    running = tuple(
        LedgerEntry(
            f"running-sweep-with-a-long-name-{s:03d}",
            f"0b8d5c6e-3f0a-4c1e-9a55-{s:012d}",
            (
                *(PodInterval(f"7c1e4b2a-0d3f-4e5a-8b6c-{s:06d}{p:06d}", "c", 1.0, NOW - HOUR) for p in range(16)),
                PodInterval(f"finished-{s}", "c", 1.0, NOW - 2 * HOUR, NOW - HOUR),
            ),
            Reservation(40.0, NOW - HOUR, "resume-12", run_until_exhausted=True),
        )
        for s in range(LEDGER_MAX_RESERVATIONS)
    )
    ended = tuple(
        LedgerEntry(
            f"ended-sweep-{s:03d}",
            f"uid-ended-{s}",
            tuple(PodInterval(f"p-{s}-{p}", "c", 1.0, NOW - 3 * HOUR + p, NOW - 2 * HOUR + p) for p in range(16)),
            deleted=True,
        )
        for s in range(2 * LEDGER_MAX_SWEEPS)
    )
    ledger = bounded(HoursLedger(BUDGET, running + ended), NOW)
    obj = ledger.to_object("team", NOW)
    size = len(json.dumps(obj))
    assert size < 1024 * 1024, size
    assert errors(ledger_validator(), obj) == []
    assert sum(1 for s in obj["status"]["sweeps"] if s.get("reservation")) == LEDGER_MAX_RESERVATIONS


def test_reservations_past_what_the_object_holds_are_charged_as_used_never_dropped() -> None:
    """A ledger seeded from more running sweeps than admission lets reserve: the newest reservations past the CRD's
    bound count as used now (in the merged entry), so what is left never grows and the write is still accepted."""
    roomy = NamespaceBudget(gpu_hours=10_000.0, window_seconds=7 * 24 * HOUR)
    entries = tuple(
        LedgerEntry(
            f"s{n}",
            f"uid-{n}",
            (PodInterval(f"pod-{n}", "c", 1.0, NOW - HOUR),),
            Reservation(3.0, NOW - HOUR + n, "seeded"),
        )
        for n in range(LEDGER_MAX_ENTRIES + 10)
    )
    ledger = HoursLedger(roomy, entries)
    before = ledger.left(NOW)
    kept = bounded(ledger, NOW)
    assert len(kept.entries) <= LEDGER_MAX_ENTRIES
    assert kept.left(NOW) == pytest.approx(before) and kept.left(NOW) <= before + 1e-6
    newest = {f"uid-{n}" for n in range(LEDGER_MAX_ENTRIES - 1, LEDGER_MAX_ENTRIES + 10)}
    assert not newest & {e.uid for e in kept.entries if e.reservation is not None}
    GPUHourLedgerStatus.model_validate(kept.to_object("team", NOW)["status"])
