"""A namespace's GPU-hour ledger that vanished is refused, not re-created from the sweeps that still exist (which would
give the namespace back the hours of its deleted sweeps): the operator keeps a record of the ledgers it created in its
own namespace, tells "never had one" (create it) from "had one and it is gone" (refuse what needs it, with a Warning
Event and a condition), and an administrator's removal of the record's entry re-creates it on purpose."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator.gpu_time import HOUR, NamespaceBudget, PodInterval
from sweep_operator.policy import Admit, Queue
from sweep_operator.reconcile.controller import SweepController
from sweep_operator.reconcile.hours_ledger import (
    MISSING_REASON,
    RecordedLedger,
    decide_reservation,
    record_usage,
    release,
    vanished,
)
from sweep_operator.reconcile.ports import GpuHourLedgers
from sweep_operator.settings import OperatorLimits, Settings
from tests.support.factories import gpu_sweep
from tests.support.fake_kube import FakeKube
from tests.support.fake_s3 import FakeS3
from tests.support.fakes import Clock, FakeVerifier

NOW = 1_800_000_000.0
BUDGET = NamespaceBudget(gpu_hours=100.0, window_seconds=7 * 24 * HOUR)
RECORD = (constants.LEDGER_RECORD_FALLBACK_NAMESPACE, constants.LEDGER_RECORD_NAME)


def reserve(uid: str, hours: float) -> Any:
    def decide(ledger: Any) -> Any:
        return decide_reservation(
            ledger,
            uid=uid,
            name=uid,
            attempt="initial",
            worst_case=hours,
            run_until_exhausted=False,
            sweep_left=None,
            now=NOW,
        )

    return decide


def spent(uid: str, hours: float) -> Any:
    """A sweep that used `hours` GPU-hours and was deleted: its entry stays, deleted."""
    pods = [PodInterval(f"{uid}-pod", "c", 1.0, NOW - hours * HOUR, NOW)]

    def decide(ledger: Any) -> Any:
        used = record_usage(ledger, uid=uid, name=uid, intervals=pods, ended=True, now=NOW)
        return None, release(used, uid=uid, deleted=True, now=NOW) if used is not None else None

    return decide


def namespace(kube: FakeKube, name: str, uid: str) -> None:
    kube.objects[("Namespace", "", name)] = {"metadata": {"name": name, "uid": uid}}


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    namespace(kube, "team", "ns-1")
    return kube


def ledgers(kube: FakeKube) -> GpuHourLedgers:
    """A fresh operator process's (nothing in memory)."""
    return GpuHourLedgers(kube, kube.list_sweeps)  # type: ignore[arg-type]  # the fake has KubeApi's surface


def test_a_ledger_that_vanished_is_refused_not_made_again_without_the_deleted_sweeps_hours(kube: FakeKube) -> None:
    """A deleted sweep used 95 of the namespace's 100 GPU-hours; the ledger deleted (past the policy: an admin, the
    policy off), an operator restarted: a new ledger seeded from the sweeps left would admit 50 more GPU-hours."""
    first = ledgers(kube)
    first.change("team", BUDGET, NOW, spent("gone", 95.0))
    assert isinstance(first.change("team", BUDGET, NOW, reserve("a", 5.0)), Admit)
    kube.delete_ledger("team")
    answer = ledgers(kube).change("team", BUDGET, NOW, reserve("b", 50.0))
    assert isinstance(answer, Queue) and answer.cause == MISSING_REASON
    assert f"GPU-hour ledger team/{constants.LEDGER_NAME} is gone" in answer.reason
    assert f"removing the key team from ConfigMap {RECORD[0]}/{RECORD[1]}" in answer.reason
    assert kube.get_ledger("team") is None, "never made again by an admission"
    again = ledgers(kube)
    for decide in (spent("a", 1.0), lambda ledger: (None, release(ledger, uid="a", deleted=False, now=NOW))):
        again.change("team", BUDGET, NOW, decide)
    assert kube.get_ledger("team") is None, "nor by a usage record or a release"
    assert again.for_admission("team", BUDGET, NOW).missing == answer.reason


def test_the_first_ledger_of_a_namespace_is_made_and_entered_in_the_record(kube: FakeKube) -> None:
    assert isinstance(ledgers(kube).change("team", BUDGET, NOW, reserve("a", 5.0)), Admit)
    stored = kube.get_ledger("team")
    record = kube.get_config_map(*RECORD)
    assert stored is not None and record is not None
    entry = RecordedLedger.from_value(record["data"]["team"])
    assert entry == RecordedLedger(stored["metadata"]["uid"], "ns-1", "2027-01-15T08:00:00Z")


def test_a_ledger_found_without_a_record_is_entered_at_its_first_read(kube: FakeKube) -> None:
    """Ledgers an operator without the record made (an upgrade): found, they are entered, so their loss is seen."""
    made = kube.write_ledger(
        {
            "apiVersion": constants.API_VERSION,
            "kind": constants.LEDGER_KIND,
            "metadata": {"name": "gpu-hours", "namespace": "team"},
            "spec": {"gpuHours": 100.0, "windowSeconds": 604800},
        }
    )
    assert kube.get_config_map(*RECORD) is None
    ledgers(kube).read("team", BUDGET, NOW)
    record = kube.get_config_map(*RECORD)
    entry = RecordedLedger.from_value((record or {}).get("data", {}).get("team"))
    assert entry is not None and entry.ledger_uid == made["metadata"]["uid"]
    writes = len([c for c in kube.calls if c[0] == "write_config_map"])
    ledgers(kube).read("team", BUDGET, NOW)
    assert len([c for c in kube.calls if c[0] == "write_config_map"]) == writes, "entered once"


def test_a_namespace_deleted_and_created_again_starts_a_new_ledger(kube: FakeKube) -> None:
    """Deleting a namespace (a platform admin's act) takes its ledger; one created again under the same name is
    another namespace (another uid): its first GPU sweep makes a new ledger."""
    ledgers(kube).change("team", BUDGET, NOW, reserve("a", 5.0))
    kube.delete_ledger("team")
    namespace(kube, "team", "ns-2")
    assert isinstance(ledgers(kube).change("team", BUDGET, NOW, reserve("b", 5.0)), Admit)
    assert kube.get_ledger("team") is not None


@pytest.mark.parametrize(
    "entry,namespace_uid,gone",
    [
        (None, "ns-1", False),
        (RecordedLedger("l-1", "ns-1"), "ns-1", True),
        (RecordedLedger("l-1", "ns-1"), "ns-2", False),
        (RecordedLedger("l-1", "ns-1"), None, True),  # the namespace unreadable: fail closed
        (RecordedLedger("l-1", ""), "ns-2", True),  # recorded where namespaces were unreadable
        (RecordedLedger.from_value("not json"), "ns-1", True),  # an entry that does not parse still says it existed
    ],
)
def test_vanished_is_decided_from_the_record_and_the_namespace(
    entry: RecordedLedger | None, namespace_uid: str | None, gone: bool
) -> None:
    assert vanished(entry, namespace_uid) is gone


def test_an_administrator_removing_the_entry_recreates_the_ledger_on_purpose(kube: FakeKube) -> None:
    first = ledgers(kube)
    first.change("team", BUDGET, NOW, spent("gone", 95.0))
    kube.delete_ledger("team")
    operator = ledgers(kube)
    assert isinstance(operator.change("team", BUDGET, NOW, reserve("b", 50.0)), Queue)
    record = kube.get_config_map(*RECORD)
    assert record is not None
    kube.write_config_map({**record, "data": {k: v for k, v in record["data"].items() if k != "team"}})
    # the same process sees the removal at the next admission (the record is read afresh where a ledger is missing)
    assert isinstance(operator.change("team", BUDGET, NOW, reserve("b", 50.0), fresh=True), Admit)
    stored = kube.get_ledger("team")
    assert stored is not None and [s["name"] for s in stored["status"]["sweeps"]] == ["b"]


# ------------------------------------------------------------------------------------------- through the controller


@pytest.fixture
def controller(kube: FakeKube) -> tuple[SweepController, list[tuple[str, str, str, str]]]:
    events: list[tuple[str, str, str, str]] = []
    settings = Settings(
        limits=OperatorLimits(max_gpus_per_namespace=8), status_poll_seconds=0, namespace_gpu_hours=1000.0
    )
    s3 = FakeS3()
    made = SweepController(
        settings,
        kube,  # type: ignore[arg-type]  # FakeKube is KubeApi's duck-typed double
        lambda endpoint, region: s3,
        lambda body, type_, reason, message: events.append((body["metadata"]["name"], type_, reason, message)),
        verifier=FakeVerifier(),
        clock=Clock(),
    )
    return made, events


def test_a_gpu_sweep_in_a_namespace_whose_ledger_vanished_waits_queued_with_a_warning_event_once(
    kube: FakeKube, controller: tuple[SweepController, list[tuple[str, str, str, str]]]
) -> None:
    operator, events = controller
    namespace(kube, "ml", "ns-ml")

    def reconcile(name: str) -> dict[str, Any]:
        kube.ensure_finalizer(kube.get_sweep("ml", name) or {})
        operator.reconcile_sweep(kube.get_sweep("ml", name) or {})
        return (kube.get_sweep("ml", name) or {}).get("status") or {}

    kube.add("TrainingSweep", gpu_sweep(name="first"))
    assert reconcile("first").get("runId"), "the namespace's first GPU sweep: its ledger is made"
    kube.delete_ledger("ml")
    kube.add("TrainingSweep", gpu_sweep(name="digits"))
    for _ in range(3):
        reconcile("digits")
    status = (kube.get_sweep("ml", "digits") or {})["status"]
    assert status["phase"] == "Queued" and not status.get("runId")
    assert f"GPU-hour ledger ml/{constants.LEDGER_NAME} is gone" in status["message"]
    (admitted,) = [c for c in status["conditions"] if c["type"] == "Admitted"]
    assert (admitted["status"], admitted["reason"]) == ("False", MISSING_REASON)
    warnings = [e for e in events if e[2] == MISSING_REASON]
    assert len(warnings) == 1 and warnings[0][1] == "Warning" and "removing the key ml" in warnings[0][3]
    assert len(kube.rayjob_names()) == 1 and kube.get_ledger("ml") is None
